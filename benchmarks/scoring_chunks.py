"""Label scoring by ``scoring.chunk_size``, with the real LM: the same queries scored in chunks of each size.

With prefix sharing the scores stage computes each distinct demonstration of a chunk once, so larger chunks compute
fewer tokens (``benchmarks.scoring_host`` counts them for a whole label set). This times it: ``--queries``
consecutive training examples of a ``--labels``-example MTOP set, taken ``--at`` a position of the stage's chunk
order (by output within nested blocks), scored by ``epr.stages.scores.score_chunk`` with the pipeline's scorer
(SmolLM2-135M, ``models.dtype: auto``, prefix sharing, ``--batch-tokens``) once per chunk size, alternating
``--repeats`` times; each row reports the median time, the LM's padded token positions and the largest score
difference from the first size's scores.

    python -m benchmarks.scoring_chunks [--labels 8000] [--queries 256] [--at 6000] [--chunks 32,256] [--tag zen3-avx2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    import torch

    from benchmarks.common import describe, machine, matmul_tflops, save
    from benchmarks.scoring_host import _label_set, chunk_order
    from epr.lm.identity import default_device, resolve_dtype
    from epr.lm.models import load_lm
    from epr.lm.scoring import LMScorer
    from epr.stages.scores import score_chunk

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", type=int, default=8000)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument(
        "--at", type=int, default=6000, help="position in the stage's chunk order of the first query"
    )
    ap.add_argument("--chunks", default="32,256")
    ap.add_argument("--batch-tokens", type=int, default=2048, help="the CPU's scoring.batch_tokens")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    sizes = [int(x) for x in a.chunks.split(",")]

    task, pool, ranks = _label_set(a.data_dir, a.labels, a.labels, 16)
    sel = chunk_order(pool, ranks)[a.at : a.at + a.queries]
    dtype = resolve_dtype("auto", default_device())
    model, tok = load_lm("smollm2", dtype=dtype)
    scorer = LMScorer(model, tok, batch_tokens=a.batch_tokens, prefix_share=True)
    count = {"tokens": 0}
    bb = scorer.backbone
    pk, fa = bb.prefix_kv, bb.forward_after

    def prefix_kv(pids):
        count["tokens"] += pids.numel()
        return pk(pids)

    def forward_after(ids, start, past, pmask):
        count["tokens"] += ids.numel()
        return fa(ids, start, past, pmask)

    bb.prefix_kv, bb.forward_after = prefix_kv, forward_after
    peak = matmul_tflops(torch.bfloat16 if dtype == "bf16" else torch.float32)
    score_chunk(scorer, task, pool, sel[:2], None)  # warm-up
    times: dict[int, list[float]] = {cs: [] for cs in sizes}
    tokens, scores = {}, {}
    for _ in range(a.repeats):
        for cs in sizes:
            count["tokens"] = 0
            t0 = time.perf_counter()
            rows = []
            for i in range(0, len(sel), cs):
                rows += score_chunk(scorer, task, pool, sel[i : i + cs], None)[0]
            times[cs].append(time.perf_counter() - t0)
            tokens[cs] = count["tokens"]
            scores[cs] = np.array([s for r in rows for s in r["scores"]], dtype=float)
            print(f"chunk {cs}: {times[cs][-1]:.1f} s, {tokens[cs]:,} LM tokens", flush=True)
    n = sum(len(r.ids) for r in sel)
    base = sizes[0]
    res = []
    for cs in sizes:
        t = float(np.median(times[cs]))
        res.append(
            {
                "chunk_size": cs,
                "seconds": round(t, 1),
                "all_seconds": [round(x, 1) for x in times[cs]],
                "sequences_per_s": round(n / t, 2),
                "lm_tokens": tokens[cs],
                "max_abs_diff_vs_first": float(np.nanmax(np.abs(scores[cs] - scores[base]))),
            }
        )
    raw = {
        "machine": machine(),
        "args": vars(a),
        "dtype": dtype,
        "peak_tflops": peak,
        "sequences": n,
        "rows": res,
    }
    lines = [
        f"| chunk_size | seconds | sequences/s | LM tokens | time vs {base} | tokens vs {base} "
        f"| largest score difference from {base} (nats) |"
    ]
    lines.append("|---|---|---|---|---|---|---|")
    r0 = res[0]
    for r in res:
        lines.append(
            f"| {r['chunk_size']} | {r['seconds']} | {r['sequences_per_s']} | {r['lm_tokens']:,} | "
            f"{r['seconds'] / r0['seconds']:.3f} | {r['lm_tokens'] / r0['lm_tokens']:.3f} | "
            f"{r['max_abs_diff_vs_first']:.4f} |"
        )
    md = f"""# Label scoring by chunk size, real LM

Machine: {describe(raw["machine"])}; SmolLM2-135M in {dtype} (`auto`), prefix sharing, batch_tokens
{a.batch_tokens}. MTOP: {a.queries} training examples x L = 16 ({n:,} sequences) at position {a.at} of the scores
stage's chunk order for {a.labels:,} labels, scored in chunks of each size ({a.repeats} run(s) each, alternating;
the median). Measured matmul peak {peak:.2f} TFLOP/s ({dtype}).

{chr(10).join(lines)}

Command: `python -m benchmarks.scoring_chunks --labels {a.labels} --queries {a.queries} --at {a.at} --chunks {a.chunks} --batch-tokens {a.batch_tokens} --repeats {a.repeats}{" --tag " + a.tag if a.tag else ""}`
"""
    save(f"scoring-chunks-{a.tag}" if a.tag else "scoring-chunks", raw, md)


if __name__ == "__main__":
    main()
