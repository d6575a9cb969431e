"""`epr export` never deletes: a killed or failed export leaves the previous one intact, --overwrite replaces it
whole, and the folder is readable as the umask says."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from epr.cli import main


def tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def export(shipped_dir: Path, out: Path, *more: str) -> int:
    run_root = shipped_dir.parent / "runs"  # the fixture's run: <tmp>/runs/mine, shipped to <tmp>/shipped
    return main(["export", "--set", f"run_root={run_root}", "--set", "name=mine", str(out), *more])


@pytest.fixture
def previous(shipped, tmp_path):
    """A previous export at <tmp_path>/ret, and what it held."""
    out = tmp_path / "ret"
    assert export(shipped[0], out) == 0
    return out, tree(out)


KILL = """
import os, signal, sys
from epr import shipping
from epr.api import PromptRetriever

r = PromptRetriever.from_pretrained(sys.argv[1])
import epr.retrieval.index

def killed(*a, **k):  # the process dies mid-write, after the encoder and the pool were written
    os.kill(os.getpid(), signal.SIGKILL)

epr.retrieval.index.save_index = killed
shipping.save(r, sys.argv[2], overwrite=True)
"""


def test_killed_export_leaves_the_previous_one_intact(shipped, previous, tmp_path):
    out, before = previous
    p = subprocess.run(
        [sys.executable, "-c", KILL, str(shipped[0]), str(out)], capture_output=True, text=True
    )
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert tree(out) == before  # the old export, untouched
    partial = list(tmp_path.glob(".ret.partial-*"))
    assert len(partial) == 1 and (partial[0] / "pool.jsonl").exists()  # it was killed mid-write
    # the next export tidies what the killed one left and replaces the folder whole
    assert export(shipped[0], out, "--overwrite") == 0
    assert not list(tmp_path.glob(".ret.*"))
    assert set(tree(out)) == set(before)


def test_failed_export_leaves_the_previous_one_intact(shipped, previous, tmp_path, monkeypatch):
    import epr.retrieval.index

    out, before = previous

    def broken(*a, **k):
        raise OSError(28, "No space left on device", str(out))

    monkeypatch.setattr(epr.retrieval.index, "save_index", broken)
    assert export(shipped[0], out, "--overwrite") == 2
    assert tree(out) == before
    assert not list(tmp_path.glob(".ret.*"))  # the half-written copy removed


def test_killed_between_the_renames_puts_the_previous_one_back(shipped, previous, tmp_path):
    out, before = previous
    aside = tmp_path / ".ret.old-deadbeef"
    os.rename(out, aside)  # where a kill between "move the old aside" and "rename the new in" leaves it
    from epr.shipping import _tidy

    _tidy(out)
    assert tree(out) == before and not aside.exists()


def test_overwrite_replaces_whole_and_keeps_the_umask(shipped, previous, tmp_path):
    out, _ = previous
    (out / "stray.txt").write_text("from an older export")
    old = os.umask(0o022)
    try:
        assert export(shipped[0], out, "--overwrite") == 0
    finally:
        os.umask(old)
    assert not (out / "stray.txt").exists()
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    for p in out.rglob("*"):
        want = 0o755 if p.is_dir() else 0o644
        assert stat.S_IMODE(p.stat().st_mode) == want, p


def test_manifest_lists_every_file(previous):
    import json

    out, before = previous
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert set(files) == set(before) - {"manifest.json"}
    assert all(files[f]["sha256"] == before[f] for f in files)


def test_export_into_an_empty_folder_is_fine(shipped, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert export(shipped[0], out) == 0
    assert (out / "retriever.json").exists()


def test_export_warns_when_the_run_is_not_what_these_settings_make(
    shipped, tmp_path, caplog, minilm_dir, tiny_lm_dir
):
    """``epr export`` ships what the run holds; where that is stale under the -c/--set it was given (a setting
    changed since the run), it says so, naming the stage, instead of shipping an older encoder without a word."""
    import logging

    from epr.cli.ending import not_fresh as _not_fresh
    from epr.context import Context

    from .test_own_data import own_config

    same = (
        shipped[0].parent / "runs",
        minilm_dir,
        f"models.lm={tiny_lm_dir}",
        "retrieve.retrievers=[epr+div+bias]",
    )
    assert _not_fresh(Context(own_config(*same)), ["encoder"]) == []  # the settings the run was made with
    assert _not_fresh(Context(own_config(*same, "train.lr=3e-5")), ["encoder"]) == ["encoder stale"]
    caplog.set_level(logging.WARNING)
    assert export(shipped[0], tmp_path / "ret") == 0  # the demo config's settings, not the run's
    assert "epr export:" in caplog.text and "encoder stale" in caplog.text
