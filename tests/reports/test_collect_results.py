"""epr experiment collect: a finished run's comparison found where the pipeline writes it (``evaluate/``,
``locked/evaluate/``, or a pre-rename ``compare/``), and an unfinished one refused with the folder named."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def collect():
    return importlib.import_module("epr.experiments.collect_results")


def _finished(d: Path, tag: str) -> None:
    d.mkdir(parents=True)
    (d / "manifest.json").write_text("{}")
    (d / "results.md").write_text(tag)


def test_copies_the_evaluate_stage_and_the_training_history(collect, tmp_path):
    run = tmp_path / "runs" / "mtop"
    _finished(run / "evaluate", "dev")
    _finished(run / "locked" / "evaluate", "locked")
    (run / "encoder").mkdir()
    (run / "encoder" / "history.json").write_text("[]")
    copied = collect.collect(run, tmp_path / "dev")
    assert copied == ["results.md", "training_history.json"]
    assert (tmp_path / "dev" / "results.md").read_text() == "dev"
    collect.collect(run, tmp_path / "locked", "locked")
    assert (tmp_path / "locked" / "results.md").read_text() == "locked"


def test_a_run_made_before_the_stage_was_renamed(collect, tmp_path):
    run = tmp_path / "old"
    _finished(run / "compare", "old")
    collect.collect(run, tmp_path / "out")
    assert (tmp_path / "out" / "results.md").read_text() == "old"


def test_an_unfinished_comparison_is_an_error_naming_the_folder(collect, tmp_path, capsys):
    run = tmp_path / "runs" / "mtop"
    (run / "evaluate").mkdir(parents=True)  # started, no manifest
    with pytest.raises(FileNotFoundError, match=r"evaluate: no finished comparison"):
        collect.collect(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing copied
    from epr.cli.tools import collect_results_main

    assert (
        collect_results_main(["mtop", "--run-root", str(tmp_path / "runs"), "--dest", str(tmp_path / "o")])
        == 1
    )
    assert "no finished comparison" in capsys.readouterr().err
