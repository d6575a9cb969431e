"""The served retriever of a finished run against the unsupervised ones, from the run's own rows
(``epr.reports.served``): the paper's metric (the task's, read from the run; ``--metric`` to choose) with exact
McNemar tests, gold log-prob with Wilcoxon and the mean's t-test (and its 95% CI), Holm over the two primary tests.

    python scripts/run_report.py runs/mtop                 # the dev part (runs/mtop/evaluate/)
    python scripts/run_report.py runs/mtop --part locked   # the locked part (runs/mtop/locked/evaluate/)
    python scripts/run_report.py runs/break --part locked --out results/break-default-recipe/locked.md

Reads ``<run>/[locked/]evaluate/per_query.jsonl`` and ``<run>/select/report.json``; prints Markdown (and writes it to
``--out``, with the raw numbers beside it as ``.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from epr.experiments.record import paper_metric
from epr.reports.served import served_report
from epr.stages.select import read_selection


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--part", choices=("dev", "locked"), default="dev")
    ap.add_argument(
        "--metric", help="per-example key: correct (exact match), lf_em, ...; default: the task's"
    )
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    ev = a.run / ("locked/evaluate" if a.part == "locked" else "evaluate")
    rows = [json.loads(x) for x in (ev / "per_query.jsonl").read_text().splitlines()]
    sel = read_selection(a.run)
    if sel is None:
        raise SystemExit(f"{a.run}: no finished select stage")
    md, raw = served_report(rows, sel, a.part, a.run.name, a.metric or paper_metric(a.run)[1])
    print(md)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(md)
        a.out.with_suffix(".json").write_text(json.dumps(raw, indent=2) + "\n")


if __name__ == "__main__":
    main()
