"""Copy a finished run's comparison and training outputs into the committed ``results/`` folder.

    python scripts/collect_results.py mtop break smcalflow      # runs/<name>/ -> results/<name>/
    python scripts/collect_results.py mtop --run-root runs --dest results/mtop
    python scripts/collect_results.py mtop --part locked       # a data.eval_part=locked run -> results/mtop-locked/

What is copied: the comparison table (Markdown, CSV, JSON), its bar plot, the HTML report and the per-query dump from
the ``evaluate`` stage (``<run>/evaluate/``; ``<run>/locked/evaluate/`` for the locked part; ``<run>/compare/`` in
runs made before the stage was renamed), and the encoder's training history and curve from ``<run>/encoder/``. A run
without a finished comparison is an error naming the folder it looked in; nothing is copied then.
"""

from __future__ import annotations

import argparse
import shutil
import sys
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("names", nargs="+", help="run names (the config's `name`)")
    ap.add_argument("--run-root", default=str(ROOT / "runs"))
    ap.add_argument("--dest", help="destination folder (one name only); default results/<name>[-locked]")
    ap.add_argument(
        "--part", choices=("dev", "locked"), default="dev", help="the compared part (data.eval_part)"
    )
    a = ap.parse_args(argv)
    if a.dest and len(a.names) > 1:
        ap.error("--dest takes one run name")
    for name in a.names:
        dest = (
            Path(a.dest) if a.dest else ROOT / "results" / (name + ("-locked" if a.part == "locked" else ""))
        )
        try:
            copied = collect(Path(a.run_root) / name, dest, a.part)
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{name}: {', '.join(copied)} -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
