"""A run's log holds epr's own INFO lines and other libraries' only from WARNING up, unless --verbose (issue 78:
36 lines of accelerate's checkpoint notes in `make demo`'s log)."""

from __future__ import annotations

import re
import subprocess
import sys

from .test_own_data import ROWS, write_csv

LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO|DEBUG) ([\w.]+):", re.M)


def run_log(tmp_path, minilm_dir, *extra: str) -> str:
    tmp_path.mkdir()
    p = write_csv(tmp_path / "mine.csv", ROWS)
    sets = [f"run_root={tmp_path / 'runs'}", "name=mine", "data.task=jsonl", f"data.path={p}",
            "data.input_field=question", "data.output_field=answer", "data.eval_size=4", "labels.source=bm25",
            "candidates.rounds=1", "select.size=0", "candidates.L=6", "labels.k_pos=2", "labels.k_neg=2",
            f"models.encoder={minilm_dir}", "train.batch_size=4", "train.epochs=1", "train.dev_size=2",
            "train.chunk_size=0"]  # fmt: skip
    argv = [sys.executable, "-m", "epr.cli", "run", "--until", "encoder", *extra]
    for s in sets:
        argv += ["--set", s]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def test_third_party_info_lines_only_with_verbose(tmp_path, minilm_dir):
    quiet = {m.group(2).split(".")[0] for m in LINE.finditer(run_log(tmp_path / "a", minilm_dir))}
    assert quiet == {"epr"}, quiet
    loud = {m.group(2).split(".")[0] for m in LINE.finditer(run_log(tmp_path / "b", minilm_dir, "--verbose"))}
    assert "epr" in loud and loud - {"epr"}, (
        loud
    )  # negative control: accelerate's (and others') lines are there
