"""``epr truthfulqa``: the TruthfulQA stages (``tqa_contexts`` -> ``tqa_score`` -> ``tqa_report``) through the
pipeline, with ``configs/truthfulqa.yaml`` unless ``-c`` names other configs. Everything is a config value::

    epr truthfulqa                                                  # six variants, all 817 questions
    epr truthfulqa --set truthfulqa.limit=50 --set truthfulqa.sweep=0,0.25,0.5,0.75,1
    epr truthfulqa --set truthfulqa.version=v0 --set models.dtype=fp32
    epr truthfulqa -c configs/truthfulqa_epr.yaml                  # + the learned retriever (tqa_labels, tqa_encoders)

The same as ``epr run -c configs/truthfulqa.yaml --until tqa_report``. The paper's three findings across LMs, from
finished runs' report folders: ``epr truthfulqa findings DIR [DIR ...] --out FILE.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["CONFIG", "STAGES", "add_parser", "run", "findings_main"]

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "truthfulqa.yaml"
STAGES = ("tqa_labels", "tqa_encoders", "tqa_contexts", "tqa_score", "tqa_report")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "truthfulqa",
        help="RAGSys variants on TruthfulQA (MC1/MC2/MC3, DPO): the tqa_* stages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-c", "--config", action="append", default=[], help=f"YAML config (repeatable; default {CONFIG.name})"
    )
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. truthfulqa.version=v0"
    )
    p.add_argument(
        "--force", action="append", default=[], choices=STAGES, help="rerun this stage even if fresh"
    )
    p.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    from epr import pipeline
    from epr.config import load_config
    from epr.context import Context, Dist
    from epr.run_lock import run_lock

    ctx = Context(load_config(args.config or [CONFIG], args.set), Dist.from_env())
    with run_lock(ctx.cfg.run_dir, "this run", dist=ctx.dist):  # one writer per run (epr.run_lock)
        ran = pipeline.run(ctx, until="tqa_report", force=tuple(args.force))
    if ctx.dist.is_main:
        out = ctx.stage_dir("tqa_report")
        sys.stdout.write("\n" + (out / "results.md").read_text(encoding="utf-8"))  # the sweep included
        sys.stdout.write(f"\nran: {', '.join(ran) or 'nothing (all fresh)'}; report: {out / 'report.html'}\n")
    return 0


def findings_main(argv: list[str] | None = None) -> int:
    """``epr truthfulqa findings``: the findings across LMs (``epr.truthfulqa.findings``)."""
    from epr.truthfulqa import findings

    p = argparse.ArgumentParser(
        prog="epr truthfulqa findings",
        description=findings.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dirs", nargs="+", type=Path, help="tqa_report output folders, one per LM")
    p.add_argument("--out", type=Path, required=True, help="the Markdown file to write (a .json beside it)")
    args = p.parse_args(argv)
    sys.stdout.write(findings.write_findings(args.dirs, args.out))
    return 0
