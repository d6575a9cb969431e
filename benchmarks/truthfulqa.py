"""TruthfulQA evaluation cost: shared-prefix scoring (``LMScorer.score_after``) vs scoring every (context, question,
answer) from scratch, and the prompts of a resumable chunk batched together (``score_prompts``, what the stages run)
vs one prompt at a time, for the ``rel`` prompts and for the learned retriever's label prompts (``tqa_labels``).

(Until 2026-11-23 a second engine, ``epr.prefix_scoring``, also folded answers that are token prefixes of other
answers into one row; the scorer now has one shared-prefix engine, and the committed results under
``benchmarks/results/truthfulqa*`` that report folding come from the earlier engine.)

One variant (``rel``: k = 6 cosine-nearest demonstrations, leave-one-out) on the same seeded questions, both ways in
one run. Prefix sharing runs each question's prompt once and scores all its answers on the prompt's KV cache
(``LMScorer.score_prefixed``); from scratch sends every prompt + answer sequence through the batched scorer
(``LMScorer``: length-sorted token-budget batches, answer-only head), i.e. our best path without sharing.

    python -m benchmarks.truthfulqa [--questions 20] [--label-questions 8] [--data-dir ../shared/data] [--dtype fp32] [--tag NAME]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.common import describe, machine, save
from epr.lm.models import load_encoder, load_lm
from epr.lm.scoring import LMScorer
from epr.truthfulqa.learned import LABEL_CHUNK, candidate_ids, label_targets
from epr.truthfulqa.sets import (
    answer_text,
    answers_of,
    build_sets,
    context_text,
    demo_text,
    load_tqa,
    query_text,
    score_prompts,
    select_context,
)


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    """How far two ways of scoring the same answers are apart, in nats per answer."""
    diff = np.abs(a - b)
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())}


def one_by_one_vs_chunks(scorer, prompts, targets, chunk: int) -> dict:
    """The same prompts scored one at a time (``score_after``) and in chunks of ``chunk`` (``score_prompts``)."""
    t = time.perf_counter()
    alone = np.concatenate([scorer.score_after(p, ts) for p, ts in zip(prompts, targets)])
    t_alone = time.perf_counter() - t
    t = time.perf_counter()
    parts = [
        score_prompts(scorer, prompts[i : i + chunk], targets[i : i + chunk])
        for i in range(0, len(prompts), chunk)
    ]
    t_chunk = time.perf_counter() - t
    together = np.array([x for part in parts for lp in part for x in lp])
    return {
        "prompts": len(prompts),
        "answers": int(sum(len(ts) for ts in targets)),
        "chunk": chunk,
        "seconds_one_by_one": t_alone,
        "seconds_chunks": t_chunk,
        "speedup": t_alone / t_chunk,
        **agreement(alone, together),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=20)
    ap.add_argument("--label-questions", type=int, default=8, help="questions x 16 label prompts")
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
    # what the stages run: a chunk's prompts together (tqa_score: 32 questions; tqa_labels: 64 label prompts)
    rel_chunks = one_by_one_vs_chunks(scorer, prompts, answers, 32)
    lq = subset[: a.label_questions]
    cands = candidate_ids(q_emb, icl_emb, icl_q, [int(q) for q in lq], 16)
    lab_prompts, lab_targets = [], []
    for qi, cs in zip(lq, cands):
        for j in cs:
            lab_prompts.append(demo_text(full.icl[j][1], full.icl[j][2]) + query_text(rows[qi]["question"]))
            lab_targets.append(label_targets(rows[qi])[0])
    label_chunks = one_by_one_vs_chunks(scorer, lab_prompts, lab_targets, LABEL_CHUNK)
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
        **agreement(shared, scratch),
        "full_817_estimate_s": {
            "shared": t_shared * 817 / len(subset),
            "scratch": t_scratch * 817 / len(subset),
            "rel_chunks": rel_chunks["seconds_chunks"] * 817 / len(subset),
            "labels_one_by_one": label_chunks["seconds_one_by_one"] * 817 / len(lq),
            "labels_chunks": label_chunks["seconds_chunks"] * 817 / len(lq),
        },
        "rel_chunks": rel_chunks,
        "label_chunks": label_chunks,
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

**A chunk's prompts together** (`score_prompts`, what `tqa_score` and `tqa_labels` run) vs one prompt at a time
(`score_after`), both with the shared prefix:

| prompts | count | answers | chunk | one at a time (s) | chunks (s) | speedup | max / mean abs diff (nats) | 817 questions, chunks |
|---|---|---|---|---|---|---|---|---|
| `rel` (6 demonstrations + question) | {rel_chunks["prompts"]} | {rel_chunks["answers"]} | {rel_chunks["chunk"]} | {rel_chunks["seconds_one_by_one"]:.1f} | {rel_chunks["seconds_chunks"]:.1f} | **{rel_chunks["speedup"]:.2f}x** | {rel_chunks["max_abs_diff"]:.1e} / {rel_chunks["mean_abs_diff"]:.1e} | {raw["full_817_estimate_s"]["rel_chunks"] / 60:.1f} min |
| `tqa_labels` (one candidate pair + question, {len(lq)} questions x 16) | {label_chunks["prompts"]} | {label_chunks["answers"]} | {label_chunks["chunk"]} | {label_chunks["seconds_one_by_one"]:.1f} | {label_chunks["seconds_chunks"]:.1f} | **{label_chunks["speedup"]:.2f}x** | {label_chunks["max_abs_diff"]:.1e} / {label_chunks["mean_abs_diff"]:.1e} | {raw["full_817_estimate_s"]["labels_chunks"] / 60:.1f} min (one at a time: {raw["full_817_estimate_s"]["labels_one_by_one"] / 60:.1f} min) |
"""
    save("truthfulqa" + (f"-{a.tag}" if a.tag else ""), raw, md)


if __name__ == "__main__":
    main()
