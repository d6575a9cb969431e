"""``epr export`` never reaches into a run: a destination inside the run folder (its ``encoder/``, ``labels/``) or
the run root is refused with or without ``--overwrite``, nothing changes, and no refusal suggests a flag that
would be refused too. The guard is checked before anything is loaded, so the run needs no trained encoder here."""

from __future__ import annotations

from pathlib import Path

import pytest

from epr.cli import main
from epr.shipping import check_destination
from epr.types import InputError

from .test_bad_input import assert_clean_error, cli, snapshot


@pytest.fixture
def run(tmp_path) -> Path:
    """A run folder with the files a trained run has where export could do harm."""
    run = tmp_path / "runs" / "mine"
    for f in ("encoder/model/model.safetensors", "encoder/manifest.json", "labels/labels.jsonl"):
        (run / f).parent.mkdir(parents=True, exist_ok=True)
        (run / f).write_text(f"the run's own {f}\n")
    (tmp_path / "runs" / "other" / "labels").mkdir(parents=True)
    (tmp_path / "runs" / "other" / "labels" / "labels.jsonl").write_text("another run's labels\n")
    return run


def export(tmp_path: Path, out, *more: str) -> list[str]:
    return ["export", "--set", f"run_root={tmp_path / 'runs'}", "--set", "name=mine", str(out), *more]


@pytest.mark.parametrize(
    "target,what",
    [
        ("encoder", "inside the run folder"),
        ("labels", "inside the run folder"),
        ("encoder/model", "inside the run folder"),
        ("new-inside-run", "inside the run folder"),
        ("run-root", "is the run root"),
        ("other-run", "inside the run root"),
        ("new-in-run-root", "inside the run root"),
    ],
)
@pytest.mark.parametrize("overwrite", [True, False])
def test_export_into_a_run_is_refused(target, what, overwrite, run, tmp_path, capsys):
    out = {
        "encoder": run / "encoder",
        "labels": run / "labels",
        "encoder/model": run / "encoder" / "model",
        "new-inside-run": run / "shipped",
        "run-root": run.parent,
        "other-run": run.parent / "other",
        "new-in-run-root": run.parent / "shipped",
    }[target]
    before = snapshot(tmp_path, tmp_path / "nothing")
    rc, err = cli(capsys, *export(tmp_path, out, *(["--overwrite"] if overwrite else [])))
    assert_clean_error(rc, err, what, "with or without --overwrite")
    assert "pass --overwrite" not in err
    assert snapshot(tmp_path, tmp_path / "nothing") == before  # not a byte changed, and nothing created
    assert not out.exists() or target not in ("new-inside-run", "new-in-run-root")


def test_export_overwrite_into_encoder_refused(run, tmp_path, capsys):
    """The reported case: `--overwrite runs/<name>/encoder` replaced the trained encoder and exited 0."""
    rc, err = cli(capsys, *export(tmp_path, run / "encoder", "--overwrite"))
    assert_clean_error(rc, err, str(run / "encoder"), "the run folder it exports from")
    assert (run / "encoder" / "model" / "model.safetensors").read_text().startswith("the run's own")


def test_export_overwrite_into_labels_refused(run, tmp_path, capsys):
    """The reported case: `--overwrite runs/<name>/labels` deleted labels.jsonl."""
    rc, err = cli(capsys, *export(tmp_path, run / "labels", "--overwrite"))
    assert_clean_error(rc, err, str(run / "labels"))
    assert (run / "labels" / "labels.jsonl").exists()


def test_export_overwrite_into_run_root_refused(run, tmp_path, capsys):
    rc, err = cli(capsys, *export(tmp_path, run.parent, "--overwrite"))
    assert_clean_error(rc, err, "the run root")
    assert (run / "labels" / "labels.jsonl").exists() and (run.parent / "other").exists()


def test_export_refusal_never_suggests_a_refused_flag(run, tmp_path, monkeypatch):
    """Every refusal that suggests --overwrite is accepted with it; every other refusal names no flag to pass.
    Over every kind of destination: the run, inside it, the run root, another run, above them, the current and
    the home folder (non-empty), a plain non-empty folder, an empty one, a file."""
    home, work = tmp_path / "home", tmp_path / "work"
    for d in (home / "x", work / "y", tmp_path / "plain" / "z"):
        d.mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    kw = {"protect": [run], "roots": [run.parent]}
    places = [
        run,
        run / "encoder",
        run / "labels",
        run.parent,
        run.parent / "other",
        tmp_path,
        Path("."),
        home,
    ]
    places += [tmp_path / "plain", tmp_path / "empty", tmp_path / "notes.txt", tmp_path / "new"]
    suggested = 0
    for out in places:
        try:
            check_destination(out, overwrite=False, **kw)
            continue  # accepted as it is
        except InputError as e:
            msg = str(e)
        if "pass --overwrite" in msg:
            suggested += 1
            check_destination(out, overwrite=True, **kw)  # the suggestion holds: no InputError
        else:
            with pytest.raises(InputError):
                check_destination(out, overwrite=True, **kw)
    assert suggested == 1  # only the plain non-empty folder


def test_api_save_pretrained_refuses_inside_its_run(tmp_path):
    """save_pretrained(..., run=...) keeps the same rule as the command: never inside the run it came from."""
    run = tmp_path / "runs" / "mine"
    (run / "encoder").mkdir(parents=True)
    (run / "encoder" / "f").write_text("x")
    with pytest.raises(InputError, match="inside the run folder"):
        check_destination(run / "encoder", overwrite=True, protect=[run])
    with pytest.raises(InputError, match="inside the run folder"):
        check_destination(run / "new", overwrite=False, protect=[run])


def test_export_of_a_missing_run_creates_nothing(tmp_path, capsys):
    """No run folder: the export's own message, and no run folder (or lock file) made by asking."""
    rc = main(export(tmp_path, tmp_path / "out"))
    assert rc == 2 and not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
