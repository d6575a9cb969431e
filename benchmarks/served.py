"""Scoring through a server vs in-process, on the same MTOP candidate sequences, in one run.

In-process: ``LMScorer`` as the scores stage runs it (prefix-shared, ``models.dtype``: ``auto`` is bf16 on a CPU
with AMX / AVX512-BF16, else fp32), and in fp32. Through a server: ``epr serve`` (llama.cpp, the packaged SmolLM2
GGUF in its own Q4_1 arithmetic) started here on the same cores, scored by ``ServerScorer`` (one completion
request per sequence, ``--concurrency`` in flight). The engines run one at a time (the idle server takes no CPU).
Tokens/s count every token of every sequence. Agreement with the fp32 in-process scores: per-sequence and
per-token differences, and what labels depend on: how each query's L candidates are ranked (Spearman), whether
the best candidate and the top-5 are the same.

    python -m benchmarks.served [--queries 128] [--L 16] [--threads 2] [--concurrency 2] [--tag zen5]

An AVX2-only CPU emulated on a newer one (torch's kernels capped at AVX2; llama.cpp's portable build is AVX2 anyway):

    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 python -m benchmarks.served --dtypes fp32 --tag zen5-avx2
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from benchmarks.common import describe, machine, mtop_sequences, save
from epr.lm.llamacpp_server import launch
from epr.lm.models import load_lm
from epr.lm.scoring import LMScorer
from epr.lm.served import OpenAIServer, ServerScorer


def agreement(a: np.ndarray, b: np.ndarray, n_tgt: np.ndarray, L: int) -> dict:
    from scipy.stats import spearmanr

    d = a - b
    groups = range(0, len(a), L)
    rho = [spearmanr(a[i : i + L], b[i : i + L]).statistic for i in groups]
    return {
        "mean_abs_diff": float(np.abs(d).mean()),
        "p95_abs_diff": float(np.quantile(np.abs(d), 0.95)),
        "max_abs_diff": float(np.abs(d).max()),
        "mean_diff": float(d.mean()),
        "mean_abs_diff_per_token": float(np.abs(d / n_tgt).mean()),
        "spearman_per_query_mean": float(np.nanmean(rho)),
        "top1_same": float(np.mean([np.argmax(a[i : i + L]) == np.argmax(b[i : i + L]) for i in groups])),
        "top5_overlap_mean": float(
            np.mean(
                [
                    len(set(np.argsort(-a[i : i + L])[:5]) & set(np.argsort(-b[i : i + L])[:5])) / 5
                    for i in groups
                ]
            )
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument(
        "--dtypes", default="auto,fp32", help="in-process dtypes to time (auto: what the pipeline picks)"
    )
    ap.add_argument("--tag", default="")
    a = ap.parse_args()

    ctxs, tgts, demos = mtop_sequences(a.data_dir, a.queries, a.L)
    runs: dict[str, dict] = {}
    scores: dict[str, np.ndarray] = {}
    for dtype in a.dtypes.split(","):
        model, tok = load_lm("smollm2", dtype=dtype)
        name = "bf16" if next(model.parameters()).dtype == torch.bfloat16 else "fp32"
        if name in scores:
            continue
        sc = LMScorer(model, tok, batch_tokens=a.batch_tokens, prefix_share=True)
        sc.score_prefixed(demos[:32], ctxs[:32], tgts[:32])  # warm-up
        t = time.perf_counter()
        scores[name] = sc.score_prefixed(demos, ctxs, tgts)
        runs[f"in-process {name}"] = {"seconds": time.perf_counter() - t}
        print(f"in-process {name}: {runs[f'in-process {name}']['seconds']:.1f} s", flush=True)
        pairs = sc.encode(ctxs, tgts)
        del model, sc
    n_tok = sum(len(c) + len(t) for c, t in pairs)
    n_tgt = np.array([len(t) for _, t in pairs], dtype=np.float64)

    with launch("smollm2", threads=a.threads) as url:
        server = OpenAIServer(url, concurrency=a.concurrency)
        sc = ServerScorer(server, "smollm2", tok, 2048)
        sc.score(ctxs[:32], tgts[:32])  # warm-up
        t = time.perf_counter()
        scores["server"] = sc.score_pairs(ctxs, tgts, pairs)
        runs["llama.cpp server (Q4_1)"] = {"seconds": time.perf_counter() - t}
        print(f"server: {runs['llama.cpp server (Q4_1)']['seconds']:.1f} s", flush=True)
        server.close()

    for r in runs.values():
        r["tok_s"] = n_tok / r["seconds"]
    base = runs[f"in-process {'bf16' if 'bf16' in scores else 'fp32'}"]["seconds"]  # what the pipeline runs
    for r in runs.values():
        r["speed_vs_pipeline_default"] = base / r["seconds"]
    ref = "fp32" if "fp32" in scores else next(iter(scores))  # the in-process fp32 scores where timed
    agree = {k: agreement(scores[k], scores[ref], n_tgt, a.L) for k in scores if k != ref}
    isa = {
        k: os.environ[k]
        for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
        if k in os.environ
    }
    raw = {
        "machine": machine(),
        "sequences": len(ctxs),
        "tokens": n_tok,
        "target_tokens": int(n_tgt.sum()),
        "queries": a.queries,
        "L": a.L,
        "threads": a.threads,
        "concurrency": a.concurrency,
        "isa_caps": isa,  # set to emulate a CPU with fewer instructions (e.g. AVX2-only) for torch
        "runs": runs,
        "agreement_reference": f"in-process {ref}",
        "agreement": agree,
    }
    md = [
        f"# Scoring through a server vs in-process ({describe(raw['machine'])})\n",
        f"The same {len(ctxs)} MTOP candidate sequences ({a.queries} queries x L={a.L}, {n_tok} tokens), "
        f"`{' '.join(f'{k}={v}' for k, v in isa.items())}{' ' if isa else ''}python -m benchmarks.served"
        f"{' --dtypes ' + a.dtypes if a.dtypes != 'auto,fp32' else ''}{' --tag ' + a.tag if a.tag else ''}`.\n",
        "| engine | seconds | tokens/s | speed vs the pipeline's default |",
        "|---|---:|---:|---:|",
    ]
    for k, r in runs.items():
        md.append(f"| {k} | {r['seconds']:.1f} | {r['tok_s']:.0f} | {r['speed_vs_pipeline_default']:.2f}x |")
    md += [
        "",
        f"Agreement with the in-process {ref} scores (nats; a score is a sum over the target's tokens):\n",
        "| engine | mean abs | p95 abs | max abs | mean (signed) | per token | Spearman per query | same best | "
        "top-5 overlap |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, g in agree.items():
        md.append(
            f"| {k} | {g['mean_abs_diff']:.3f} | {g['p95_abs_diff']:.3f} | {g['max_abs_diff']:.3f} | "
            f"{g['mean_diff']:+.3f} | {g['mean_abs_diff_per_token']:.4f} | {g['spearman_per_query_mean']:.3f} | "
            f"{g['top1_same']:.2f} | {g['top5_overlap_mean']:.2f} |"
        )
    save(f"served{'-' + a.tag if a.tag else ''}", raw, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
