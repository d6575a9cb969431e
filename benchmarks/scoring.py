"""Scoring throughput: EPR's reference way vs ours, on the same MTOP candidate sequences, in one run.

Reference (as in EPR's code): one sequence at a time, fp32, full-vocabulary logits at every position.
Ours: ``LMScorer`` (length-sorted token-budget batches, the dtype the pipeline picks (``auto``: bf16 where the CPU
has AMX / AVX512-BF16, else fp32), LM head only at answer positions), with the lean forward (and with the transformers one: ``--hf``), and prefix-shared (``LMScorer.score_prefixed``: each
distinct demonstration's key/value cache once for every query it is a candidate of).

The sequences are one chunk of the scores stage labelling MTOP's whole training pool with prefix sharing on: BM25
over outputs proposes L candidates for every pool example, queries are ordered by output (the stage's chunk order),
and a seeded run of ``--queries`` consecutive queries is taken, so the sharing is the pipeline's own.

    python -m benchmarks.scoring [--queries 200] [--L 16] [--data-dir ../shared/data] [--tag zen5]

``--tag`` names the result files (``scoring[-TAG].{md,json}``), so runs on different machines sit side by side.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import describe, machine, matmul_tflops, mtop_sequences, save
from epr.lm.models import load_lm
from epr.lm.scoring import LMScorer, reference_score


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--hf", action="store_true", help="also time the transformers forward")
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--tag", default="")
    a = ap.parse_args()

    ctxs, tgts, demos = mtop_sequences(a.data_dir, a.queries, a.L)

    m32, tok = load_lm("smollm2", dtype="fp32")
    mbf, _ = load_lm("smollm2", dtype=a.dtype)
    dt = next(mbf.parameters()).dtype
    dname = "bf16" if dt == torch.bfloat16 else "fp32"
    fast = LMScorer(mbf, tok, batch_tokens=a.batch_tokens)  # the lean forward (epr.lm.fastlm)
    hf = LMScorer(mbf, tok, batch_tokens=a.batch_tokens, forward="hf")  # same batching, transformers forward
    pairs = fast.encode(ctxs, tgts)
    n_tok = sum(len(c) + len(t) for c, t in pairs)
    flops_per_tok = 2 * sum(p.numel() for n, p in mbf.named_parameters() if "embed" not in n)

    peak = {"fp32": matmul_tflops(torch.float32)}
    if dname == "bf16":
        peak["bf16"] = matmul_tflops(torch.bfloat16)
    fast.score_ids(pairs[:32])  # warm-up
    t = time.perf_counter()
    ours = fast.score_ids(pairs)
    t_ours = time.perf_counter() - t
    fast.score_prefixed(demos[:32], ctxs[:32], tgts[:32])  # warm-up
    t = time.perf_counter()
    pre = fast.score_prefixed(demos, ctxs, tgts)
    t_pre = time.perf_counter() - t
    pre_tok = fast.tok(sorted(set(demos)), add_special_tokens=True)["input_ids"]
    demo_tok = dict(zip(sorted(set(demos)), (len(x) for x in pre_tok)))
    prefix_tokens = sum(demo_tok[d] for d in demos)
    t_hf = ours_hf = None
    if a.hf:
        hf.score_ids(pairs[:32])
        t = time.perf_counter()
        ours_hf = hf.score_ids(pairs)
        t_hf = time.perf_counter() - t
    reference_score(m32, tok, ctxs[0], tgts[0])
    t = time.perf_counter()
    ref = np.array([reference_score(m32, tok, c, y) for c, y in zip(ctxs, tgts)])
    t_ref = time.perf_counter() - t

    # do the two rank the L candidates of each query the same way? (what labels depend on)
    from scipy.stats import spearmanr  # noqa: PLC0415

    rho = [spearmanr(ours[i : i + a.L], ref[i : i + a.L]).statistic for i in range(0, len(ref), a.L)]
    top5 = [
        len(set(np.argsort(-ours[i : i + a.L])[:5]) & set(np.argsort(-ref[i : i + a.L])[:5])) / 5
        for i in range(0, len(ref), a.L)
    ]
    raw = {
        "machine": machine(),
        "sequences": len(pairs),
        "tokens": n_tok,
        "batch_tokens": a.batch_tokens,
        "ref_seconds": t_ref,
        "ours_seconds": t_ours,
        "ref_tok_s": n_tok / t_ref,
        "ours_tok_s": n_tok / t_ours,
        "speedup": t_ref / t_ours,
        "prefix_seconds": t_pre,
        "prefix_tok_s": n_tok / t_pre,
        "speedup_prefix_vs_batched": t_ours / t_pre,
        "speedup_prefix_vs_reference": t_ref / t_pre,
        "prefix_vs_batched_max_abs_diff": float(np.abs(pre - ours).max()),
        "distinct_demonstrations": len(demo_tok),
        "pairs_per_demonstration": len(pairs) / len(demo_tok),
        "prefix_token_fraction": prefix_tokens / n_tok,
        # the prefix-shared scorer still computes each distinct prefix once: the FLOP-bound ceiling of its speed-up
        "prefix_ceiling": n_tok / (n_tok - prefix_tokens + sum(demo_tok.values())),
        "hf_forward_seconds": t_hf,
        "hf_forward_tok_s": n_tok / t_hf if t_hf else None,
        "speedup_hf_forward": t_ref / t_hf if t_hf else None,
        "fast_vs_hf_max_abs_diff": float(np.abs(ours - ours_hf).max()) if t_hf else None,
        "matmul_tflops": peak,
        "flops_per_token": flops_per_tok,
        "ours_dtype": dname,
        "ours_fraction_of_peak": n_tok / t_ours * flops_per_tok / (peak[dname] * 1e12),
        "ref_fraction_of_fp32_peak": n_tok / t_ref * flops_per_tok / (peak["fp32"] * 1e12),
        "max_abs_diff": float(np.abs(ours - ref).max()),
        "mean_abs_diff": float(np.abs(ours - ref).mean()),
        "spearman_per_query_mean": float(np.nanmean(rho)),
        "top5_overlap_mean": float(np.mean(top5)),
    }
    hf_row = (
        f"| ours, transformers forward: token-budget batches ({a.batch_tokens}), {dname}, answer-only head | "
        f"{t_hf:.1f} | {raw['hf_forward_tok_s']:.0f} | "
        f"{raw['hf_forward_tok_s'] * flops_per_tok / (peak[dname] * 1e12):.2f} of {dname} |\n"
        if t_hf
        else ""
    )
    hf_note = (
        f" ({raw['speedup_hf_forward']:.2f}x with the transformers forward; the two forwards differ by at most "
        f"{raw['fast_vs_hf_max_abs_diff']:.3f} nats per sequence)"
        if t_hf
        else ""
    )
    md = f"""# Scoring throughput (SmolLM2-135M-Instruct, MTOP candidates)

Machine: {describe(raw["machine"])}.
{len(pairs)} sequences ({a.queries} consecutive training examples of the prefix-sharing chunk order over MTOP's whole
pool x L={a.L} BM25-over-outputs candidates), {n_tok} tokens; {raw["distinct_demonstrations"]} distinct demonstrations
({raw["pairs_per_demonstration"]:.2f} sequences each), which hold {100 * raw["prefix_token_fraction"]:.0f}% of the tokens.

| method | seconds | tokens/s | fraction of measured matmul peak |
|---|---|---|---|
| reference: 1 sequence at a time, fp32, full logits | {t_ref:.1f} | {raw["ref_tok_s"]:.0f} | {raw["ref_fraction_of_fp32_peak"]:.2f} of fp32 ({peak["fp32"]:.2f} TFLOP/s) |
{hf_row}| batched: token-budget batches ({a.batch_tokens}), {dname}, answer-only head, lean forward (`epr.lm.fastlm`) | {t_ours:.1f} | {raw["ours_tok_s"]:.0f} | {raw["ours_fraction_of_peak"]:.2f} of {dname} ({peak[dname]:.2f} TFLOP/s) |
| prefix-shared: the same, each demonstration's keys/values computed once (`score_prefixed`) | {t_pre:.1f} | {raw["prefix_tok_s"]:.0f} (sequence tokens) | |

**Batched vs reference: {raw["speedup"]:.2f}x**{hf_note}. **Prefix-shared vs batched:
{raw["speedup_prefix_vs_batched"]:.2f}x** (FLOP-bound ceiling at this sharing: {raw["prefix_ceiling"]:.2f}x), vs reference
{raw["speedup_prefix_vs_reference"]:.2f}x; prefix-shared and batched differ by at most
{raw["prefix_vs_batched_max_abs_diff"]:.4f} nats. Agreement (batched vs reference): mean |diff| {raw["mean_abs_diff"]:.3f} nats
(max {raw["max_abs_diff"]:.2f}), per-query Spearman of the candidate order {raw["spearman_per_query_mean"]:.3f},
top-5 (positive set) overlap {raw["top5_overlap_mean"]:.2f}.
FLOPs/token counted as 2 x non-embedding parameters ({flops_per_tok / 1e6:.0f} MFLOP).
"""
    save("scoring" + (f"-{a.tag}" if a.tag else ""), raw, md)


if __name__ == "__main__":
    main()
