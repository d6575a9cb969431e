"""How much of each pool's demonstrations the dual encoder sees at a given ``train.max_length``: per config, the
share of pool demonstrations (input + output, as the prompt encoder reads them) longer than 64 / 128 / 256 encoder
tokens, and the length quantiles. The rule the ``*_len256`` configs follow: the smallest of those lengths that keeps
>= 99% of the pool's demonstrations whole.

    python scripts/demo_lengths.py configs/mtop_curve.yaml configs/break_curve.yaml configs/smcalflow_curve.yaml

Writes ``results/encoder-lengths/lengths.{json,md}`` naming the machine (no LM is run; seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from epr import pipeline
from epr.artifacts import atomic_write_text
from epr.config import load_config
from epr.context import Context
from epr.encoder.data import demo_text, token_lengths, truncation
from epr.reports.machine import describe, machine

ROOT = Path(__file__).resolve().parents[1]

LENGTHS = (64, 128, 256)
KEEP = 0.99


def pool_lengths(config: str, run_root: str) -> tuple[str, list[int]]:
    from transformers import AutoTokenizer

    from epr.lm.models import resolve_encoder

    ctx = Context(load_config([config], [f"run_root={run_root}"]))
    pipeline.run(ctx, until="examples")
    pool = ctx.examples("pool")
    tok = AutoTokenizer.from_pretrained(resolve_encoder(ctx.cfg.models.encoder, ctx.cfg.models.cache_dir))
    return ctx.cfg.name, token_lengths(tok, [demo_text(ctx.task, e) for e in pool])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--run-root", default="runs")
    ap.add_argument("--out", default=str(ROOT / "results" / "encoder-lengths"))
    a = ap.parse_args(argv)
    rows = []
    for c in a.configs:
        name, lengths = pool_lengths(c, a.run_root)
        cuts = {m: truncation(lengths, m) for m in LENGTHS}
        rule = next((m for m in LENGTHS if 1 - cuts[m]["share"] >= KEEP), None)
        rows.append({"config": c, "name": name, "pool": len(lengths), "cut": cuts, "rule_max_length": rule})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / "lengths.json", json.dumps({"machine": describe(machine()), "rows": rows}, indent=1) + "\n"
    )
    lines = [
        "# Pool demonstrations vs the dual encoder's max_length",
        "",
        f"Machine: {describe(machine())}. Command: `python scripts/demo_lengths.py {' '.join(a.configs)}`. Encoder tokens "
        "with [CLS]/[SEP] of each pool demonstration (input + output, as the prompt encoder reads it).",
        "",
        "| config | pool | median | 90% | 99% | cut at 64 | cut at 128 | cut at 256 | rule (>= 99% whole) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cut"][64]
        shares = " | ".join(f"{100 * r['cut'][m]['share']:.1f}%" for m in LENGTHS)
        lines.append(
            f"| {r['name']} | {r['pool']} | {c.get('tokens_p50')} | {c.get('tokens_p90')} | {c.get('tokens_p99')} "
            f"| {shares} | {r['rule_max_length']} |"
        )
    atomic_write_text(out / "lengths.md", "\n".join(lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
