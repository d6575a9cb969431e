"""What an encoder length that cuts no demonstration costs the dual encoder's training (issue 74, item 4): per data
set, the pool's token lengths (queries and demonstrations, with [CLS]/[SEP]), the length ``train.max_length: 0``
takes from them (``epr.encoder.data.length_from_data``), the share of demonstrations 64 tokens cut, and one training
step at 64 against that length, in the same run on the same machine.

The step is the recipe's shape (32 queries x 8 demonstrations drawn from the pool, bf16 autocast where the CPU runs
bf16, GradCache sub-batches of 4 queries so that long sequences fit in memory), each configuration in its own
process (``benchmarks.training.one``), the mean of ``--steps`` steps after a warm-up; random MiniLM-initialised
weights learn nothing here, the time does not depend on them.

    python -m benchmarks.encoder_length [--steps 3] [--tasks mtop,break,smcalflow] [--data-dir ../shared/data]

Writes ``benchmarks/results/encoder-length-<machine>.{json,md}``, naming the machine.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import describe, machine, machine_slug, save
from benchmarks.training import _run_one


def lengths(task_name: str, data_dir: str) -> dict:
    from transformers import AutoTokenizer

    from epr.config import DataConfig
    from epr.encoder.data import demo_text, length_from_data, token_lengths, truncation
    from epr.lm.models import resolve_encoder
    from epr.tasks import get_task

    task = get_task(DataConfig(task=task_name, data_dir=data_dir))
    pool, _ = task.load()
    tok = AutoTokenizer.from_pretrained(resolve_encoder("minilm"))
    demos = token_lengths(tok, [demo_text(task, e) for e in pool])
    queries = token_lengths(tok, [e.input for e in pool])
    cut = truncation(demos, 64)
    return {"pool": len(pool), "demo_p50": cut["tokens_p50"], "demo_p99": cut["tokens_p99"],
            "demo_max": int(max(demos)), "query_max": int(max(queries)), "cut_at_64": cut["share"],
            "from_data": length_from_data([*demos, *queries], min(512, tok.model_max_length))}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tasks", default="mtop,break,smcalflow")
    ap.add_argument("--data-dir", default="../shared/data")
    a = ap.parse_args(argv)
    from epr.lm.identity import resolve_dtype

    precision = "bf16" if resolve_dtype("auto", "cpu") == "bf16" else "no"
    m, rows = machine(), []
    for t in a.tasks.split(","):
        info = lengths(t, a.data_dir)
        steps = {
            n: _run_one(32, 4, a.steps, a.data_dir, precision, 8, 1, t, n) for n in (64, info["from_data"])
        }
        s64, sdata = steps[64]["sec_per_step"], steps[info["from_data"]]["sec_per_step"]
        rows.append({"task": t, **info, "sec_per_step_64": s64, "sec_per_step_data": sdata, "ratio": sdata / s64,
                     "peak_rss_mb_64": steps[64]["peak_rss_mb"],
                     "peak_rss_mb_data": steps[info["from_data"]]["peak_rss_mb"]})  # fmt: skip
    md = [
        f"# The encoder's length from the data: what it costs a training step ({describe(m)})",
        "",
        f"Recipe step: 32 queries x 8 pool demonstrations, {precision} autocast, GradCache sub-batches of 4 queries, "
        f"MiniLM; mean of {a.steps} steps after a warm-up, each configuration in its own process, one run.",
        "",
        "| data set | pool | demo tokens p50 / p99 / max | cut at 64 | length from the data | s / step at 64 | "
        "s / step at that length | x | peak RSS MB (64 / data) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(f"| {r['task']} | {r['pool']} | {r['demo_p50']} / {r['demo_p99']} / {r['demo_max']} | "
                  f"{100 * r['cut_at_64']:.1f}% | {r['from_data']} | {r['sec_per_step_64']:.2f} | "
                  f"{r['sec_per_step_data']:.2f} | {r['ratio']:.2f} | {r['peak_rss_mb_64']:.0f} / "
                  f"{r['peak_rss_mb_data']:.0f} |")  # fmt: skip
    md += ["", "Padding follows the longest text of each sub-batch, so a longer limit costs only where long texts "
           "are drawn; the training's cost per epoch scales with the step time.", "",
           f"Command: `python -m benchmarks.encoder_length --steps {a.steps} --tasks {a.tasks}`.", ""]  # fmt: skip
    slug = machine_slug(m)
    raw = {"machine": m, "steps": a.steps, "precision": precision, "rows": rows}
    save(f"encoder-length-{slug}", raw, "\n".join(md))
    return {
        "rows": [{k: (float(v) if isinstance(v, np.floating) else v) for k, v in r.items()} for r in rows]
    }


if __name__ == "__main__":
    main()
