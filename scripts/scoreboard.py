"""Write ``results/SCOREBOARD.md``: every committed learning curve's learned rows against max(BM25, SBERT).

    python scripts/scoreboard.py                      # from results/*/curve.json, nothing recomputed
    python scripts/scoreboard.py --check              # exit 1 if the committed file is not what the rows give

See ``epr.reports.scoreboard`` for what each column means.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from epr.reports.scoreboard import entries, load_curves, markdown

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument(
        "--check", action="store_true", help="compare with the committed file instead of writing it"
    )
    a = ap.parse_args(argv)
    md = markdown(entries(load_curves(a.results)))
    out = a.results / "SCOREBOARD.md"
    if a.check:
        if not out.exists() or out.read_text() != md:
            print(f"{out}: out of date; run python scripts/scoreboard.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(md)
    print(f"wrote {out} ({md.count(chr(10)) - 4} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
