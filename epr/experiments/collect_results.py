"""Copy a finished run's comparison and training outputs into the committed ``results/`` folder.

    epr experiment collect mtop break smcalflow      # runs/<name>/ -> results/<name>/
    epr experiment collect mtop --run-root runs --dest results/mtop
    epr experiment collect mtop --part locked       # a data.eval_part=locked run -> results/mtop-locked/

What is copied: the comparison table (Markdown, CSV, JSON), its bar plot, the HTML report and the per-query dump from
the ``evaluate`` stage (``<run>/evaluate/``; ``<run>/locked/evaluate/`` for the locked part; ``<run>/compare/`` in
runs made before the stage was renamed), and the encoder's training history and curve from ``<run>/encoder/``. A run
without a finished comparison is an error naming the folder it looked in; nothing is copied then.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
COMPARE_FILES = (
    "results.md", "results.csv", "results.json", "paired.md", "paired.json", "em.png", "report.html", "per_query.jsonl",
)  # fmt: skip
ENCODER_FILES = {"history.json": "training_history.json", "training_curve.png": "training_curve.png"}


def comparison_dir(run: Path, part: str = "dev") -> Path:
    """The finished ``evaluate`` stage of ``run`` (as ``Context.stage_dir`` places it); FileNotFoundError if none."""
    tried = [run / "locked" / "evaluate"] if part == "locked" else [run / "evaluate", run / "compare"]
    for d in tried:
        if (d / "manifest.json").exists():
            return d
    raise FileNotFoundError(f"{tried[0]}: no finished comparison (manifest.json missing)")


def collect(run: Path, dest: Path, part: str = "dev") -> list[str]:
    """Copy the files; returns what was copied. Raises FileNotFoundError if the comparison is not finished."""
    src = comparison_dir(run, part)
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for f in COMPARE_FILES:
        if (src / f).exists():
            shutil.copy(src / f, dest / f)
            copied.append(f)
    for src, name in ENCODER_FILES.items():
        if (run / "encoder" / src).exists():
            shutil.copy(run / "encoder" / src, dest / name)
            copied.append(name)
    return copied
