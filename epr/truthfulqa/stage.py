"""The TruthfulQA stages (SPEC 3.3-3.6): ``tqa_contexts`` -> ``tqa_score`` -> ``tqa_report``.

- ``tqa_contexts``: the questions of ``truthfulqa.version`` (a seeded subset of ``truthfulqa.limit``), the relevance
  embeddings (``models.encoder``), the quality bias of every D_ICL pair under ``models.lm`` and, for every variant and
  every sweep value of lambda_d, the demonstrations each question gets (``contexts.json``).
- ``tqa_score``: every question's answers scored with no context (for DPO) and after each context (``<set>.lp.jsonl``).
- ``tqa_report`` (``epr.truthfulqa.report``): the metrics with bootstrap intervals, paired differences against
  Fix and Rel, the paper's findings, the sweep table and the plots.

Log-probs and quality biases live in resumable :class:`~epr.cache.ChunkStore` chunks under
``<run_root>/.cache/truthfulqa/``, keyed by the data version and the LM's identity, resolved dtype and device, with the
exact prompts and answers as each chunk's inputs: another version, LM or dtype recomputes, a changed sweep reuses
every set already scored, and a killed run resumes from its last finished chunk. Pure math: ``epr.truthfulqa.sets``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from epr.artifacts import atomic_write_text, write_jsonl
from epr.cache import ChunkStore
from epr.truthfulqa import learned
from epr.truthfulqa import report as _report
from epr.truthfulqa import sets as tqa
from epr.truthfulqa.common import LazyScorer, cache_dir, data_key, lp_key

__all__ = [
    "STAGE_SPECS",
    "contexts_keys",
    "score_keys",
    "run_contexts",
    "run_score",
]

QUALITY_CHUNK = 256  # D_ICL pairs per resumable chunk of quality bias


# ---- keys: what each stage's output depends on (besides its upstream) ---------------------------------------------


def _needs_bias(cfg) -> bool:
    t = cfg.truthfulqa
    return bool(t.sweep) or any("bias" in v for v in t.variants)


def quality_key(cfg) -> dict:
    """The quality bias's LM: identity, resolved dtype, device, and the batch layout where it matters (bf16)."""
    from epr.lm.factory import scoring_key

    fmt = tqa.query_text("q") + tqa.answer_text("a")
    return {"what": "tqa-quality-bias", "version": cfg.truthfulqa.version, "format": fmt, **scoring_key(cfg)}


def contexts_keys(ctx) -> dict:
    from epr.lm.factory import model_identity

    cfg, t, rc = ctx.cfg, ctx.cfg.truthfulqa, ctx.cfg.ragsys
    keys = {
        "data": data_key(cfg),
        "limit": t.limit,
        "seed": cfg.seed,
        "variants": list(t.variants),
        "sweep": list(t.sweep),
        "ragsys": {"k": rc.k, "lambda_d": rc.lambda_d, "lambda_b": rc.lambda_b},
        "encoder": model_identity(cfg.models.encoder),
    }
    if _needs_bias(cfg):
        keys["quality"] = quality_key(cfg)
    return keys


def score_keys(ctx) -> dict:
    return {
        "lm": lp_key(ctx.cfg),
        "prompt": tqa.demo_text("q", "a") + tqa.query_text("q") + tqa.answer_text("a"),
    }


# ---- tqa_contexts ---------------------------------------------------------------------------------------------------


def icl_quality(ctx, data: tqa.TQA, scorer: LazyScorer) -> np.ndarray:
    """``(len(D_ICL),) float32`` quality bias (SPEC 3.2) in resumable chunks keyed by the LM."""
    key = quality_key(ctx.cfg)
    store = ChunkStore(cache_dir(ctx.cfg, "quality", key), key)
    items = [[q, a] for _, q, a in data.icl]
    vals = store.map(
        items, QUALITY_CHUNK, lambda part: tqa.quality_bias(scorer(), part).tolist(), "quality bias"
    )
    return np.asarray(vals, dtype=np.float32)


def context_sets(cfg) -> list[dict]:
    """Every demonstration set to score: the variants, then ``sweep-<lambda_d>`` (rel+div+bias at that lambda_d)."""
    from ragsys import VARIANTS

    ld = cfg.ragsys.lambda_d
    out = []
    for v in cfg.truthfulqa.variants:
        base = learned.LEARNED.get(v, v)  # a learned variant runs its re-ranker on the learned embeddings
        eff = None if v == "fix" else VARIANTS[base][0] if VARIANTS[base][0] is not None else ld
        out.append({"name": v, "kind": "variant", "variant": v, "lambda_d": eff})
    for x in cfg.truthfulqa.sweep:
        out.append({"name": f"sweep-{x:g}", "kind": "sweep", "variant": "rel+div+bias", "lambda_d": x})
    return out


def run_contexts(ctx, out: Path, fp: str) -> dict:
    from epr.lm.factory import default_device
    from epr.lm.models import load_encoder
    from epr.reports.stats import seeded_subset

    cfg, rc = ctx.cfg, ctx.cfg.ragsys
    rows = tqa.load_tqa(cfg.data.data_dir, cfg.truthfulqa.version)
    data = tqa.build_sets(rows)
    subset = seeded_subset(len(rows), cfg.truthfulqa.limit, cfg.seed).tolist()
    sets = context_sets(cfg)
    bias = np.zeros(len(data.icl), dtype=np.float32)
    if _needs_bias(cfg):
        bias = icl_quality(ctx, data, LazyScorer(ctx))
        np.save(out / "quality_bias.npy", bias)
    if any(s["variant"] != "fix" for s in sets):
        st = load_encoder(cfg.models.encoder, cfg.models.cache_dir, device=default_device())
        q_emb = st.encode([r["question"] for r in rows], batch_size=128, normalize_embeddings=True)
        icl_emb = st.encode([q for _, q, _ in data.icl], batch_size=128, normalize_embeddings=True)
        icl_q = np.array([qi for qi, _, _ in data.icl])
    if learned.needs_learned(cfg):  # each question's fold's towers (epr.truthfulqa.learned)
        fold_of, q_learned, icl_learned = learned.fold_embeddings(ctx, data, subset)
    for s in sets:
        if s["variant"] == "fix":
            s["demos"], s["mean_pairwise_cosine"] = None, None
            continue
        if s["variant"] in learned.LEARNED:
            s["demos"] = [
                tqa.select_context(learned.LEARNED[s["variant"]], qi, q_learned[qi], icl_learned[fold_of[qi]],
                                   icl_q, bias, rc.k, s["lambda_d"], rc.lambda_b)
                for qi in subset
            ]  # fmt: skip
        else:
            s["demos"] = [
                tqa.select_context(
                    s["variant"], qi, q_emb[qi], icl_emb, icl_q, bias, rc.k, s["lambda_d"], rc.lambda_b
                )
                for qi in subset
            ]
        # in the frozen encoder's space for every variant, learned ones too: one yardstick for the column
        s["mean_pairwise_cosine"] = tqa.mean_pairwise_cosine(icl_emb, s["demos"])
    meta = {
        "version": cfg.truthfulqa.version,
        "questions_total": len(rows),
        "subset": subset,
        "icl_pairs": len(data.icl),
        "dpo_triplets": len(data.dpo),
        "sets": sets,
    }
    atomic_write_text(out / "contexts.json", json.dumps(meta) + "\n")
    return {"rows": {"questions": len(subset), "sets": len(sets), "icl_pairs": len(data.icl)}}


# ---- tqa_score ------------------------------------------------------------------------------------------------------


def run_score(ctx, out: Path, fp: str) -> dict:
    from tqdm.auto import tqdm

    cfg = ctx.cfg
    meta = json.loads((ctx.stage_dir("tqa_contexts") / "contexts.json").read_text(encoding="utf-8"))
    rows = tqa.load_tqa(cfg.data.data_dir, cfg.truthfulqa.version)
    data = tqa.build_sets(rows)
    subset = meta["subset"]
    key = lp_key(cfg)
    base = cache_dir(cfg, "logprobs", key)
    scorer = LazyScorer(ctx)
    fresh = [0]

    def compute(part: list[dict]) -> list[list[float]]:
        fresh[0] += len(part)
        return tqa.score_prompts(scorer(), [it["prompt"] for it in part], [it["targets"] for it in part])

    for f in out.glob("*.lp.jsonl"):  # sets of an earlier configuration
        f.unlink()
    answers = {qi: tqa.answers_of(rows[qi]) for qi in subset}
    queries = {qi: tqa.query_text(rows[qi]["question"]) for qi in subset}
    targets = {qi: [tqa.answer_text(a) for a in answers[qi]] for qi in subset}
    todo = [("empty", [""] * len(subset))]
    for s in meta["sets"]:
        demos = s["demos"] or [None] * len(subset)
        todo.append((s["name"], [tqa.context_text(data.icl, d) for d in demos]))
    # a set whose prompts equal an earlier one's (sweep-0.75 is rel+div+bias) reuses its scores
    work, digest_of = {}, {}
    for name, contexts in todo:
        items = [{"prompt": c + queries[qi], "targets": targets[qi]} for qi, c in zip(subset, contexts)]
        digest_of[name] = ChunkStore.digest(items)
        work.setdefault(digest_of[name], (name, items))
    done: dict[str, list] = {}
    bar = tqdm(total=sum(len(items) for _, items in work.values()), desc="tqa_score", unit="q")
    for digest, (name, items) in work.items():
        bar.set_postfix_str(name)
        done[digest] = ChunkStore(base / name, key).map(items, cfg.truthfulqa.chunk_size, compute, bar=bar)
    bar.close()
    for name, _ in todo:
        rows_out = [
            {"qi": qi, "lp": dict(zip(answers[qi], lp))} for qi, lp in zip(subset, done[digest_of[name]])
        ]
        write_jsonl(out / f"{name}.lp.jsonl", rows_out)
    return {
        "rows": {"questions": len(subset), "sets": len(todo), "distinct_sets": len(done),
                 "prompts_scored_now": fresh[0]},
        "extra": {"loaded_lm": scorer.scorer is not None},
    }  # fmt: skip


def _contexts_deps(ctx) -> tuple[str, ...]:
    """The learned variants' towers; none for the six RAGSys variants (their runs' fingerprints stay as they were)."""
    return ("tqa_encoders",) if learned.needs_learned(ctx.cfg) else ()


# name, deps (a tuple, or a function of the context), keys, fn[, distributed]: the entries of ``epr.pipeline.STAGES``
STAGE_SPECS = (
    ("tqa_labels", (), learned.labels_keys, learned.run_labels),
    # every process of a launch trains (distributed)
    ("tqa_encoders", ("tqa_labels",), learned.encoders_keys, learned.run_encoders, True),
    ("tqa_contexts", _contexts_deps, contexts_keys, run_contexts),
    ("tqa_score", ("tqa_contexts",), score_keys, run_score),
    ("tqa_report", ("tqa_contexts", "tqa_score"), _report.report_keys, _report.run_report),
)
