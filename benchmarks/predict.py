"""The predict stage's two LM passes vs one: lean generation + the scorer's gold log-prob (a second forward over
every prompt) against ``Generator.generate_with_gold`` (the gold tokens read off the generation's own prefill), on
the same MTOP prompts (the BM25 row of ``configs/mtop_curve.yaml``), in one process, alternating, best of rounds.

    python -m benchmarks.predict [--n 200] [--dtype fp32] [--rounds 2] [--data-dir ../shared/data] [--tag NAME]

Reports the speed-up, whether the predictions are identical, and how far the gold log-probs are from the scorer's.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.common import describe, machine, save
from benchmarks.generate import ROOT, mtop_examples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--dtype", default="fp32", help="fp32 | bf16 | auto")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--tag", default="", help="suffix of the result files (one per machine)")
    a = ap.parse_args()

    from epr.config import load_config
    from epr.lm.factory import inference_lm, lm_spec

    prompts, ev, task = mtop_examples(a.n, a.data_dir)
    golds = [task.format_target(e.output) for e in ev]
    cfg = load_config(
        [str(ROOT / "configs/mtop_curve.yaml")], [f"models.dtype={a.dtype}", f"data.data_dir={a.data_dir}"]
    )
    gen, scorer = inference_lm(cfg, task.stop)
    assert gen.engine == "lean", "the one-pass path needs the lean decoder"
    gen.generate_with_gold(prompts[:4], golds[:4])  # warm-up
    two, one = [], []
    for _ in range(a.rounds):
        t = time.perf_counter()
        preds2 = gen.generate(prompts)
        lp2 = scorer.score(prompts, golds)
        two.append(time.perf_counter() - t)
        t = time.perf_counter()
        preds1, lp1 = gen.generate_with_gold(prompts, golds)
        one.append(time.perf_counter() - t)
    diff = np.abs(np.asarray(lp1) - np.asarray(lp2))
    raw = {
        "machine": machine(),
        "prompts": len(prompts),
        "dtype": lm_spec(cfg, inference=True).dtype,
        "seconds_two_passes": min(two),
        "seconds_one_pass": min(one),
        "speedup_one_pass": min(two) / min(one),
        "identical_predictions": preds1 == preds2,
        "same_predictions": int(sum(x == y for x, y in zip(preds1, preds2))),
        "gold_max_abs_diff": float(diff.max()),
        "gold_mean_abs_diff": float(diff.mean()),
        "rounds": {"two_passes": two, "one_pass": one},
    }
    md = f"""# Predict stage: generation + gold log-prob in one pass vs two (SmolLM2-135M, {raw["dtype"]})

Machine: {describe(raw["machine"])}.
{len(prompts)} MTOP prompts (BM25 row of `configs/mtop_curve.yaml`), greedy, `generate.max_new_tokens`
{cfg.generate.max_new_tokens}; best of {a.rounds} alternating rounds. Command: `python -m benchmarks.predict --n {a.n}
--dtype {a.dtype}`.

| way | seconds | prompts / s |
|---|---|---|
| two passes: lean generation, then the scorer's gold log-prob | {min(two):.1f} | {len(prompts) / min(two):.2f} |
| one pass: `Generator.generate_with_gold` | {min(one):.1f} | {len(prompts) / min(one):.2f} |

**Speed-up {raw["speedup_one_pass"]:.2f}x.** Predictions identical: {raw["identical_predictions"]}
({raw["same_predictions"]}/{len(prompts)}). Gold log-probs vs the scorer's: at most {raw["gold_max_abs_diff"]:.1e}
nats apart (mean {raw["gold_mean_abs_diff"]:.1e}).
"""
    save("predict" + (f"-{a.tag}" if a.tag else ""), raw, md)


if __name__ == "__main__":
    main()
