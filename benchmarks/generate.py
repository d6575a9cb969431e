"""Inference-LM generation with plain vs oneDNN-packed linear layers (``epr.cpu_linear``), one run.

Prompts: ``--n`` packaged demo commands, each after ``--demos`` seeded pool demonstrations (the compare stage's prompt
layout). The same ``epr.generate.Generator`` runs them twice with SmolLM2 loaded once with ``pack=off`` and once with
``pack=auto``, in alternating rounds (best round kept); the outputs must be identical. Also times the linear products
of one decoding step (M rows) both ways, the shapes where the difference comes from.

    python -m benchmarks.generate [--n 32] [--demos 4] [--batch 16] [--tag NAME]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.common import describe, machine, save
from epr.config import DataConfig
from epr.cpu_linear import PackedLinear, packing_supported
from epr.generate import Generator
from epr.models import load_lm
from epr.tasks import get_task


def _prompts(n: int, demos: int, seed: int = 0) -> list[str]:
    task = get_task(DataConfig(task="demo"))
    pool, ev = task.load()
    rng = np.random.default_rng(seed)
    out = []
    for ex in ev[:n]:
        picks = rng.choice(len(pool), demos, replace=False)
        out.append("".join(task.format_demo(pool[i]) for i in picks) + task.format_query(ex.input))
    return out


def _gemm_rates(rows: tuple[int, ...], shapes: tuple[tuple[int, int], ...], reps: int = 20) -> list[dict]:
    res = []
    for m in rows:
        for k, n in shapes:
            x, w = torch.randn(m, k), torch.randn(n, k)
            p = PackedLinear(w)
            row = {"M": m, "K": k, "N": n}
            with torch.inference_mode():
                fns = {"plain": functools.partial(F.linear, x, w), "packed": functools.partial(p, x)}
                for name, f in fns.items():
                    f()
                    t = time.perf_counter()
                    for _ in range(reps):
                        f()
                    row[name] = 2 * m * k * n * reps / (time.perf_counter() - t) / 1e9
            res.append(row)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--demos", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    if not packing_supported(torch.float32):
        raise SystemExit("oneDNN weight packing is not available in this torch build: nothing to compare")

    prompts = _prompts(a.n, a.demos)
    gens = {}
    for mode in ("off", "auto"):
        model, tok = load_lm("smollm2", dtype="fp32", pack=mode)
        gens[mode] = (Generator(model, tok, max_new_tokens=a.max_new_tokens, batch_size=a.batch), tok)
    n_prompt = sum(len(gens["off"][1](p)["input_ids"]) for p in prompts)
    times: dict[str, list[float]] = {"off": [], "auto": []}
    outs = {}
    gens["off"][0].generate(prompts[:2])  # warm-up
    gens["auto"][0].generate(prompts[:2])
    for _ in range(a.rounds):
        for mode, (g, _) in gens.items():
            t = time.perf_counter()
            outs[mode] = g.generate(prompts)
            times[mode].append(time.perf_counter() - t)
    same = outs["off"] == outs["auto"]
    n_new = sum(len(gens["off"][1](o)["input_ids"]) + 1 for o in outs["off"])  # + the stop token
    t_off, t_on = min(times["off"]), min(times["auto"])
    rates = _gemm_rates((1, 8, 16, 64, 512), ((576, 1536), (1536, 576), (576, 49152)))
    raw = {
        "machine": machine(),
        "n_prompts": a.n,
        "demos": a.demos,
        "batch": a.batch,
        "prompt_tokens": n_prompt,
        "generated_tokens": n_new,
        "seconds": times,
        "speedup": t_off / t_on,
        "identical_outputs": same,
        "gemm_gflops": rates,
    }
    gemm = "\n".join(
        f"| {r['M']} | {r['K']}x{r['N']} | {r['plain']:.1f} | {r['packed']:.1f} | {r['packed'] / r['plain']:.2f}x |"
        for r in rates
    )
    md = f"""# Generation: plain vs oneDNN-packed linear layers (SmolLM2-135M, fp32)

Machine: {describe(raw["machine"])}. {a.n} demo prompts ({a.demos} seeded demonstrations each, {n_prompt} prompt
tokens in all), greedy, batch {a.batch}, {n_new} generated tokens; best of {a.rounds} alternating rounds.

| linear layers | seconds | prompt+generated tokens/s |
|---|---|---|
| plain (`F.linear`, MKL) | {t_off:.1f} | {(n_prompt + n_new) / t_off:.0f} |
| packed (`epr.cpu_linear`, oneDNN) | {t_on:.1f} | {(n_prompt + n_new) / t_on:.0f} |

**Speed-up: {raw["speedup"]:.2f}x**; outputs identical: {same}.

Linear products alone (GFLOP/s; M rows: 8-16 is a decoding step, 512 a prefill chunk; 576x49152 is the LM head):

| M | K x N | plain | packed | ratio |
|---|---|---|---|---|
{gemm}
"""
    save("generate" + (f"-{a.tag}" if a.tag else ""), raw, md)


if __name__ == "__main__":
    main()
