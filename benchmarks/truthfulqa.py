"""TruthfulQA evaluation cost: shared-prefix scoring (``LMScorer.score_after``) vs scoring every (context, question,
answer) from scratch.

(Until 2026-11-23 a second engine, ``epr.prefix_scoring``, also folded answers that are token prefixes of other
answers into one row; the scorer now has one shared-prefix engine, and the committed results under
``benchmarks/results/truthfulqa*`` that report folding come from the earlier engine.)

One variant (``rel``: k = 6 cosine-nearest demonstrations, leave-one-out) on the same seeded questions, both ways in
one run. Prefix sharing runs each question's prompt once and scores all its answers on the prompt's KV cache
(``LMScorer.score_prefixed``); from scratch sends every prompt + answer sequence through the batched scorer
(``LMScorer``: length-sorted token-budget batches, answer-only head), i.e. our best path without sharing.

    python -m benchmarks.truthfulqa [--questions 20] [--data-dir ../shared/data] [--dtype fp32] [--tag NAME]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.common import describe, machine, save
from epr.lm.models import load_encoder, load_lm
from epr.lm.scoring import LMScorer
from epr.truthfulqa.sets import (
    answer_text,
    answers_of,
    build_sets,
    context_text,
    load_tqa,
    query_text,
    select_context,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--dtype", default="fp32", help="fp32 (the TruthfulQA config's default) | bf16 | auto")
    ap.add_argument("--tag", default="", help="suffix of the result files (one per machine)")
    a = ap.parse_args()

    rows = load_tqa(a.data_dir)
    full = build_sets(rows)
    st = load_encoder("minilm")
    q_emb = st.encode([r["question"] for r in rows], batch_size=128, normalize_embeddings=True)
    icl_emb = st.encode([q for _, q, _ in full.icl], batch_size=128, normalize_embeddings=True)
    icl_q = np.array([qi for qi, _, _ in full.icl])
    zeros = np.zeros(len(full.icl), dtype=np.float32)  # "rel" ignores the quality bias
    subset = np.sort(np.random.default_rng(0).choice(len(rows), a.questions, replace=False))
    prompts, answers = [], []
    for qi in subset:
        sel = select_context("rel", int(qi), q_emb[qi], icl_emb, icl_q, zeros, 6, 1.0, 1.0)
        prompts.append(context_text(full.icl, sel) + query_text(rows[qi]["question"]))
        answers.append([answer_text(x) for x in answers_of(rows[qi])])

    model, tok = load_lm("smollm2", dtype=a.dtype)
    scorer = LMScorer(model, tok, batch_tokens=a.batch_tokens)
    scorer.score_after(prompts[0], answers[0])  # warm-up
    scorer.score([prompts[0]] * 4, answers[0][:4])

    t = time.perf_counter()
    shared = np.concatenate([scorer.score_after(p, ans) for p, ans in zip(prompts, answers)])
    t_shared = time.perf_counter() - t
    flat_ctx = [p for p, ans in zip(prompts, answers) for _ in ans]
    flat_tgt = [x for ans in answers for x in ans]
    t = time.perf_counter()
    scratch = scorer.score(flat_ctx, flat_tgt)
    t_scratch = time.perf_counter() - t

    n_prompt = sum(len(tok(p)["input_ids"]) for p in prompts)
    n_ans = sum(len(tok(x, add_special_tokens=False)["input_ids"]) for x in flat_tgt)
    n_scratch = sum(len(tok(c)["input_ids"]) for c in flat_ctx) + n_ans
    diff = np.abs(shared - scratch)
    raw = {
        "machine": machine(),
        "questions": int(len(subset)),
        "answers": len(flat_tgt),
        "prompt_tokens": n_prompt,
        "answer_tokens": n_ans,
        "tokens_forwarded_shared": n_prompt + n_ans + len(flat_tgt),
        "tokens_forwarded_scratch": n_scratch,
        "seconds_shared": t_shared,
        "seconds_scratch": t_scratch,
        "speedup": t_scratch / t_shared,
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "full_817_estimate_s": {
            "shared": t_shared * 817 / len(subset),
            "scratch": t_scratch * 817 / len(subset),
        },
    }
    md = f"""# TruthfulQA evaluation: shared prefix vs from scratch (one variant, `rel`, k = 6)

Machine: {describe(raw["machine"])}.
SmolLM2-135M-Instruct ({next(model.parameters()).dtype}), {len(subset)} seeded questions (seed 0) of 817, {len(flat_tgt)} answers scored
(every MC1/MC2 choice and every reference answer, once each), 6 demonstrations per prompt.

| way | tokens through the LM | seconds | questions / s | 817 questions (extrapolated) |
|---|---|---|---|---|
| from scratch (batched scorer, every prompt + answer) | {n_scratch} | {t_scratch:.1f} | {len(subset) / t_scratch:.2f} | {t_scratch * 817 / len(subset) / 60:.1f} min |
| shared prefix (`LMScorer.score_after`: the prompt once, every answer after its keys and values) | {raw["tokens_forwarded_shared"]} | {t_shared:.1f} | {len(subset) / t_shared:.2f} | {t_shared * 817 / len(subset) / 60:.1f} min |

**Shared prefix vs from scratch: {raw["speedup"]:.2f}x.** The two agree to {raw["max_abs_diff"]:.1e} nats at most per answer (mean
{raw["mean_abs_diff"]:.1e}: float rounding differs between the two batch shapes).
A whole variant needs this once per question; the empty-context scores (for DPO) once in all.
"""
    save("truthfulqa" + (f"-{a.tag}" if a.tag else ""), raw, md)


if __name__ == "__main__":
    main()
