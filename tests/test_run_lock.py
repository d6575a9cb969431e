"""One writer per run folder (epr.run_lock): a second writer is refused with exit 2 naming the first, the first's
outputs are those of a run alone, a killed holder leaves no lock, readers never wait; and the score cache two runs
share under one run root ends the same whether they score at once or one after the other."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epr.cli import main
from epr.run_lock import HOLDER_NAME, LOCK_NAME, RunLocked, holder, run_lock

ROOT = Path(__file__).resolve().parents[1]


def sets(run_root: Path, data_dir, lm_dir, *extra: str) -> list[str]:
    """A tiny demo-layout run that scores with the tiny LM (a few seconds)."""
    items = [
        f"run_root={run_root}",
        "name=t",
        f"data.data_dir={data_dir}",
        f"models.lm={lm_dir}",
        "models.dtype=fp32",
        "candidates.L=6",
        "labels.k_pos=2",
        "labels.k_neg=2",
        "scoring.chunk_size=4",
        "scoring.batch_tokens=256",
        "candidates.rounds=1",  # one round: the runs stop at labels / scores, before any training
        "select.size=0",
        *extra,
    ]
    return [x for s in items for x in ("--set", s)]


def epr_process(*argv: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [sys.executable, "-m", "epr.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    t0 = time.time()
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the holder ended before taking the lock: {proc.stderr.read()[-3000:]}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.02)


def outputs(run: Path) -> dict[str, str]:
    """Every file of a run folder by its bytes' digest, except what names a moment (manifests: seconds taken;
    the lock and its holder's side file)."""
    skip = {"manifest.json", LOCK_NAME, HOLDER_NAME}
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def test_second_run_on_one_folder_exits_2_naming_the_first(tmp_path, tiny_task_files, tiny_lm_dir, capsys):
    """Two `epr run` on one folder: the second (started while the first holds the run) gets exit 2 and one
    paragraph naming the first's pid, host and command; the first finishes with the outputs of a run alone."""
    argv = ["run", "--until", "labels", *sets(tmp_path / "a", tiny_task_files, tiny_lm_dir)]
    first = epr_process(*argv)
    run = tmp_path / "a" / "t"
    wait_for(run / HOLDER_NAME, first)
    capsys.readouterr()
    rc = main(argv)  # in this process: it asks for the lock within milliseconds of seeing the first hold it
    err = capsys.readouterr().err
    out, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err[-3000:]
    assert rc == 2, err
    assert "Traceback" not in err and err.count("epr: error:") == 1
    assert f"pid {first.pid} on " in err and "`epr run --until labels" in err and "since" in err
    assert str(run) in err and "--set name=" in err

    assert main(["run", "--until", "labels", *sets(tmp_path / "b", tiny_task_files, tiny_lm_dir)]) == 0
    alone = outputs(tmp_path / "b" / "t")
    assert "labels/labels.jsonl" in alone and "scores/scores.jsonl" in alone
    assert outputs(run) == alone  # byte for byte: the refused writer touched nothing
    assert not (run / HOLDER_NAME).exists()  # released at the end of the command


HOLD = """
import sys, time
from epr.run_lock import run_lock
with run_lock(sys.argv[1], command="epr run -c held.yaml"):
    time.sleep(600)
"""


def hold(folder: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], env=env, stderr=subprocess.PIPE, text=True
    )
    wait_for(folder / HOLDER_NAME, p)
    return p


def test_kill_9_holder_leaves_no_lock(tmp_path, capsys):
    run = tmp_path / "runs" / "t"
    p = hold(run)
    try:
        with pytest.raises(RunLocked, match=f"pid {p.pid} on .*`epr run -c held.yaml`"):
            with run_lock(run):
                pass
        assert holder(run)["pid"] == p.pid
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert (run / HOLDER_NAME).exists()  # the dead holder's side file is still there: it holds nothing
    with run_lock(run, command="epr run again"):  # the kernel released the lock with the process
        assert holder(run)["command"] == "epr run again" and holder(run)["pid"] == os.getpid()
    rc = main(["run", "--until", "examples", "--set", f"run_root={tmp_path / 'runs'}", "--set", "name=t"])
    assert rc == 0, capsys.readouterr().err


def test_readers_never_wait_for_a_writer(tmp_path, capsys):
    run = tmp_path / "runs" / "t"
    base = ["--set", f"run_root={tmp_path / 'runs'}", "--set", "name=t"]
    p = hold(run)
    try:
        t0 = time.time()
        assert main(["status", *base]) == 0
        assert main(["config", *base]) == 0
        rc = main(["inspect", "turn on the lights", *base])  # no trained encoder yet: its own message
        err = capsys.readouterr().err
        assert rc == 2 and "epr run --until" in err and "being written" not in err
        assert (
            main(["cache", "export", str(tmp_path / "x.json.gz"), *base]) == 2
        )  # nothing scored: not the lock
        assert "being written" not in capsys.readouterr().err
        assert time.time() - t0 < 60
        rc = main(["examples", *base])  # a stage command is a writer
        assert rc == 2 and f"pid {p.pid}" in capsys.readouterr().err
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def test_cache_import_takes_the_score_stores_lock(tmp_path, capsys):
    stores = tmp_path / "runs" / ".cache" / "scores"
    p = hold(stores)
    try:
        rc = main(["cache", "import", str(tmp_path / "x.json.gz"), "--set", f"run_root={tmp_path / 'runs'}"])
        err = capsys.readouterr().err
        assert rc == 2 and "score stores" in err and f"pid {p.pid}" in err
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()


def test_two_runs_sharing_a_run_root_score_at_once(tmp_path, tiny_task_files, tiny_lm_dir):
    """Two configs (L=6 and L=5: every pair of the second is a pair of the first) scoring at once into one run
    root's score cache: both finish, each with the scores of a run alone, and the cache ends holding exactly
    what the two runs made one after the other."""
    from epr.config import load_config
    from epr.lm.factory import scoring_key
    from epr.lm.score_cache import ScoreCache

    def argv(root: Path, name: str, L: int) -> list[str]:
        return ["run", "--until", "scores", *sets(root, tiny_task_files, tiny_lm_dir, f"name={name}", f"candidates.L={L}")]  # fmt: skip

    together = [epr_process(*argv(tmp_path / "at-once", n, L)) for n, L in (("six", 6), ("five", 5))]
    for p in together:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
    for n, L in (("six", 6), ("five", 5)):
        assert main(argv(tmp_path / "in-turn", n, L)) == 0

    def cache(root: Path) -> dict[str, float]:
        cfg = load_config([], argv(root, "six", 6)[4::2])
        return ScoreCache(root / ".cache" / "scores", scoring_key(cfg)).items()

    assert cache(tmp_path / "at-once") == cache(tmp_path / "in-turn") != {}
    for n in ("six", "five"):
        a, b = (tmp_path / r / n / "scores" / "scores.jsonl" for r in ("at-once", "in-turn"))
        assert a.read_bytes() == b.read_bytes()
    rows = [json.loads(x) for x in (tmp_path / "at-once" / "five" / "scores" / "scores.jsonl").open()]
    assert rows and all(len(r["ids"]) == 5 for r in rows)


@pytest.mark.slow
def test_two_process_stage_takes_the_lock_once(tmp_path, tiny_task_files, tiny_lm_dir):
    """Under torchrun only the main process holds the lock and tells the other: a 2-process scoring stage goes
    through (no process waits at a barrier for another that left), and on a held folder the launch stops with
    the lock's message instead of running or hanging. (The scores stage, as the 2-process test of
    tests/stages/test_pipeline.py runs it: a launch that ends on a main-process-only stage, such as
    `run --until examples`, sometimes loses gloo's connection at its last barrier, with or without the lock.)"""
    from tests.conftest import torchrun

    argv = ["-m", "epr.cli", "scores", *sets(tmp_path / "r", tiny_task_files, tiny_lm_dir)]
    assert main(["run", "--until", "candidates", *argv[3:]]) == 0
    r = torchrun(argv, port=29541, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "r" / "t" / "scores" / "manifest.json").exists()
    p = hold(tmp_path / "r" / "t")
    try:
        r = torchrun([*argv, "--force"], port=29542, timeout=300)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert r.returncode != 0 and f"pid {p.pid} on" in r.stdout + r.stderr, r.stderr[-3000:]
