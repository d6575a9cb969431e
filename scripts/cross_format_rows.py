"""Arm X of ``results/mtop-chat-prompt`` (issue 73): one run's trained encoder serving another run's prompts.

    python scripts/cross_format_rows.py -c configs/mtop.yaml --set prompt.chat=true --set name=mtop-chat \\
        --set run_root=RUNS --encoder-run RUNS/mtop-raw --out results/mtop-chat-prompt/cross-format.json

The run given by ``-c`` / ``--set`` (the *serving* run: its dev examples, prompt format, budget and inference LM)
builds and scores the prompts; for each retriever (``epr``, ``hybrid``) its own trained encoder and the encoder of
``--encoder-run`` (trained on labels scored in another format) rank its pool. Both sides are read the same way, off
one forward pass per prompt (``epr.stages.dense_metric.DenseMetric``): the gold answer's log-prob and exact match read
off the gold pass (``epr.stages.predict.greedy_exact``, a lower bound of generated exact match), paired by example:
the mean gain with its Student 95% interval and Wilcoxon p, and McNemar's exact p on exact match. Both runs must hold
the same pool (their ``examples`` stages' keys are compared). Writes the per-example values and the summary as JSON;
with ``--rows DIR``, also each side's per-example rows as ``DIR/per_query-cross.jsonl.gz`` (the other run's encoder)
and ``DIR/per_query-own-gold.jsonl.gz`` (the serving run's own, exact match read off the same gold pass), the format
``epr experiment check`` pairs (``cross:epr`` against ``own-gold:epr``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
from pathlib import Path

import numpy as np

from epr.cache import read_manifest
from epr.config import load_config
from epr.context import Context
from epr.reports.machine import describe, machine
from epr.reports.stats import mcnemar_exact, paired_gain
from epr.stages.dense_metric import DenseMetric
from epr.types import UpstreamError

log = logging.getLogger("cross_format_rows")


def serving_with(ctx: Context, encoder_run: Path) -> Context:
    """``ctx`` whose learned retrievers use ``encoder_run``'s trained encoder (its other retrievers unchanged)."""
    other = Context(ctx.cfg)
    mine = other.encoder_dir
    other.encoder_dir = lambda r: (encoder_run / "encoder" / "model") if r in ("epr", "hybrid") else mine(r)
    return other


def same_pool(ctx: Context, encoder_run: Path) -> None:
    a, b = read_manifest(ctx.cfg.run_dir / "examples"), read_manifest(encoder_run / "examples")
    if a is None or b is None or read_manifest(encoder_run / "encoder") is None:
        raise UpstreamError(f"{ctx.cfg.run_dir} and {encoder_run} need finished examples and encoder stages")
    if a["config"] != b["config"]:
        raise UpstreamError(
            f"{encoder_run}: its examples differ from {ctx.cfg.run_dir}'s: pool ids would not match"
        )


def compare(ctx: Context, encoder_run: Path, retrievers: list[str]) -> dict:
    same_pool(ctx, encoder_run)
    cross = serving_with(ctx, encoder_run)
    dm = DenseMetric(ctx, greedy=True)
    rows: dict[str, dict] = {}
    for name in retrievers:
        for side, c in (("own", ctx), ("cross", cross)):
            r = dm(c, name)
            em = dm.greedy_em(c, name)
            rows[f"{side}:{name}"] = {
                "gold_logprob": r["gold_logprob"],
                "em": 100 * float(np.mean(em["correct"])),
                "per_query_logprob": r["per_query_logprob"],
                "correct": em["correct"],
            }
            log.info(
                "%s:%s gold log-prob %.3f, EM %.1f",
                side,
                name,
                r["gold_logprob"],
                rows[f"{side}:{name}"]["em"],
            )
    tests = {}
    for name in retrievers:
        own, cr = rows[f"own:{name}"], rows[f"cross:{name}"]
        lp = [np.array([np.nan if v is None else v for v in x["per_query_logprob"]]) for x in (cr, own)]
        a, b = np.array(cr["correct"]), np.array(own["correct"])
        tests[f"cross:{name} vs own:{name}"] = {
            **paired_gain(lp[0], lp[1]),
            "em_cross": cr["em"],
            "em_own": own["em"],
            "em_p_mcnemar": mcnemar_exact(int(np.sum(a & ~b)), int(np.sum(b & ~a))),
        }
    return {
        "machine": describe(machine()),
        "serving_run": templated(ctx.cfg.run_dir, ctx.cfg.run_root),
        "encoder_run": templated(encoder_run, ctx.cfg.run_root),
        "encoders": {
            "own": read_manifest(ctx.cfg.run_dir / "encoder")["fingerprint"],
            "cross": read_manifest(encoder_run / "encoder")["fingerprint"],
        },
        "idx": [e.idx for e in dm.ev],
        "em_method": "greedy (read off the gold pass)",
        "tests": tests,
        "rows": rows,
    }


def templated(path: Path, run_root) -> str:
    """``path`` as ``{run_root}/...`` where it lies under the run root: no file under results/ names one machine's
    folders."""
    p, root = Path(path).resolve(), Path(run_root).resolve()
    return "{run_root}/" + p.relative_to(root).as_posix() if p.is_relative_to(root) else str(path)


def write_rows(got: dict, dest: Path) -> list[Path]:
    """Each side's per-example rows (``idx``, then per retriever its gold log-prob and ``correct``), gzip'd
    reproducibly, as ``per_query-cross.jsonl.gz`` and ``per_query-own-gold.jsonl.gz``."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for side, variant in (("cross", "cross"), ("own", "own-gold")):
        names = [k.split(":", 1)[1] for k in got["rows"] if k.startswith(f"{side}:")]
        lines = []
        for j, idx in enumerate(got["idx"]):
            row = {"idx": idx}
            for n in names:
                r = got["rows"][f"{side}:{n}"]
                row[n] = {"gold_logprob": r["per_query_logprob"][j], "correct": bool(r["correct"][j])}
            lines.append(json.dumps(row, sort_keys=True))
        f = dest / f"per_query-{variant}.jsonl.gz"
        f.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
        out.append(f)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", action="append", default=[], help="the serving run's YAML config(s)")
    ap.add_argument("--set", action="append", default=[], help="the serving run's overrides")
    ap.add_argument("--encoder-run", required=True, type=Path, help="the run folder whose encoder serves")
    ap.add_argument("--retrievers", default="epr,hybrid")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rows", type=Path, help="also write each side's per-example rows into this folder")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = Context(load_config(args.config, args.set))
    got = compare(ctx, args.encoder_run, [r.strip() for r in args.retrievers.split(",") if r.strip()])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(got, indent=1) + "\n", encoding="utf-8")
    if args.rows is not None:
        for f in write_rows(got, args.rows):
            log.info("wrote %s", f)
    for k, t in got["tests"].items():
        log.info("%s: %+.3f nats (95%% CI %.3f to %.3f), EM %.1f vs %.1f (McNemar p = %.3g)", k, t["gain"],
                 *t["gain_ci"], t["em_cross"], t["em_own"], t["em_p_mcnemar"])  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
