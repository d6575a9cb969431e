"""The scorer's backbone forward: the lean Llama forward (``epr.lm.fastlm``) vs the transformers forward, one run.

Same weights, same batch of token ids (seeded), the dtype the pipeline picks (``auto``); each forward timed in two
alternating rounds of ``--reps`` calls after a warm-up, and the faster round kept.

    python -m benchmarks.forward [--batch 16] [--length 128] [--reps 3] [--tag NAME]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import describe, machine, matmul_tflops, save
from epr.lm.fastlm import fast_backbone
from epr.lm.models import load_lm


def _time(f, ids: torch.Tensor, reps: int) -> float:
    f(ids)
    t = time.perf_counter()
    for _ in range(reps):
        f(ids)
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--tag", default="")
    a = ap.parse_args()

    model, _ = load_lm("smollm2", dtype=a.dtype)
    fast = fast_backbone(model)

    def hf(x):
        return model.base_model(input_ids=x).last_hidden_state

    ids = torch.randint(
        0, model.config.vocab_size, (a.batch, a.length), generator=torch.Generator().manual_seed(0)
    )
    times: dict[str, list[float]] = {"hf": [], "fast": []}
    with torch.inference_mode():
        for _ in range(2):
            times["hf"].append(_time(hf, ids, a.reps))
            times["fast"].append(_time(fast, ids, a.reps))
        diff = float((fast(ids).float() - hf(ids).float()).abs().max())
    # the CPU's matrix rates (bf16 at n=512: where it is emulated, a 2048^3 product takes minutes)
    peak = {"fp32": matmul_tflops(torch.float32), "bf16_n512": matmul_tflops(torch.bfloat16, n=512, reps=2)}
    n = a.batch * a.length
    t_hf, t_fast = min(times["hf"]), min(times["fast"])
    dt = str(next(model.parameters()).dtype).replace("torch.", "")
    raw = {
        "machine": machine(),
        "dtype": dt,
        "batch": a.batch,
        "length": a.length,
        "reps": a.reps,
        "seconds": times,
        "hf_tok_s": n / t_hf,
        "fast_tok_s": n / t_fast,
        "speedup": t_hf / t_fast,
        "max_abs_diff": diff,
    }
    md = f"""# Backbone forward: lean (`epr.lm.fastlm`) vs transformers (SmolLM2-135M, {dt})

Machine: {describe(raw["machine"])}. Batch {a.batch} x {a.length} tokens, best of 2 rounds of {a.reps} calls.

| forward | seconds / batch | tokens/s |
|---|---|---|
| transformers (`model.base_model`) | {t_hf:.3f} | {n / t_hf:.0f} |
| lean (`epr.lm.fastlm.FastLlama`) | {t_fast:.3f} | {n / t_fast:.0f} |

**Speed-up: {raw["speedup"]:.2f}x**; final hidden states differ by at most {diff:.1e}.
Matrix products on this CPU: fp32 {peak["fp32"]:.3f} TFLOP/s (2048^3), bf16 {peak["bf16_n512"]:.4f} TFLOP/s (512^3).
"""
    save("forward" + (f"-{a.tag}" if a.tag else ""), raw, md)


if __name__ == "__main__":
    main()
