"""The learned retriever on TruthfulQA: EPR's LM labels and dual encoder as RAGSys's relevance (issue 22, item 5).

Two stages join the TruthfulQA graph when a learned variant (``epr``, ``epr+div``) is in ``truthfulqa.variants``:

- ``tqa_labels``: every evaluated question's ``truthfulqa.label_candidates`` D_ICL pairs most relevant to it under the
  frozen encoder (``models.encoder``, the relevance of ``rel``; leave-one-out: never its own question's pairs), each
  scored by the scoring LM as the gain it gives the question's correct answers over its incorrect ones,
  ``mean_a log p(a | demo, q) - mean_ā log p(ā | demo, q)`` (summed token log-probs, the DPO metric's terms: the
  empty-context terms are the same for every candidate of a question and drop out of its ranking). Positives and
  hard negatives come from ``epr.encoder.data.select_labels`` as on the EPR datasets; the log-probs live in
  resumable chunks keyed by the LM (a killed run resumes, another LM or dtype rescores).
- ``tqa_encoders``: ``truthfulqa.folds`` seeded folds of the questions; fold f's dual encoder (the ``train`` section,
  ``epr.encoder.train.train``) learns only from the labels of the other folds, so no question's own labels train the
  retriever that serves it. A killed run resumes inside the fold it was training and skips the folds it finished.

``tqa_contexts`` then selects each question's demonstrations with its fold's towers: ``epr`` runs ``rel`` and
``epr+div`` runs ``rel+div`` (MMR with lambda_d) on the learned query and demonstration embeddings in place of the
frozen question embeddings. Pure math here; the stage graph is ``epr.truthfulqa.stage``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from epr.artifacts import atomic_write_text, read_jsonl, write_jsonl
from epr.truthfulqa import sets as tqa
from epr.types import Example

__all__ = [
    "LEARNED",
    "needs_learned",
    "check_plan",
    "candidate_ids",
    "label_targets",
    "gain",
    "assign_folds",
    "training_pool",
    "labels_keys",
    "encoders_keys",
    "run_labels",
    "run_encoders",
    "fold_embeddings",
]

log = logging.getLogger(__name__)

# a learned variant -> the RAGSys re-ranker it runs, with the learned embeddings as relevance
LEARNED = {"epr": "rel", "epr+div": "rel+div"}
LABEL_CHUNK = 64  # candidate prompts per resumable chunk of label log-probs
SCORE_RULE = "mean-correct-minus-mean-incorrect/v1"  # the label score; a new rule is a new key


def needs_learned(cfg) -> bool:
    return any(v in LEARNED for v in cfg.truthfulqa.variants)


def check_plan(cfg, n_questions: int) -> None:
    """Settings that would fail only after the labels are paid for, named before any LM runs: a candidate list
    with no room for a negative, more folds than questions, a fold whose training labels cannot hold out
    ``train.dev_size`` and still fill a batch."""
    from epr.types import InputError

    t, tc, lc = cfg.truthfulqa, cfg.train, cfg.labels
    if t.label_candidates <= lc.k_pos:
        raise InputError(
            f"truthfulqa.label_candidates={t.label_candidates} leaves no hard negative after labels.k_pos={lc.k_pos}"
        )
    if t.folds > n_questions:
        raise InputError(f"truthfulqa.folds={t.folds}: only {n_questions} questions to split")
    smallest = n_questions - -(-n_questions // t.folds)  # the labels that train the fold of the largest size
    if smallest - tc.dev_size < tc.batch_size:
        raise InputError(
            f"{n_questions} questions in {t.folds} folds: a fold trains on {smallest} labels, which cannot hold "
            f"out train.dev_size={tc.dev_size} and fill a batch of train.batch_size={tc.batch_size}; "
            "use more questions (truthfulqa.limit), fewer folds or smaller dev_size / batch_size"
        )


# ---- pure functions -------------------------------------------------------------------------------------------------


def candidate_ids(
    q_emb: np.ndarray, icl_emb: np.ndarray, icl_q: np.ndarray, questions: Sequence[int], L: int
) -> list[list[int]]:
    """Per question (rows of ``q_emb`` by question index), the ``L`` D_ICL pairs with the largest inner product,
    best first (ties: the lower index), never a pair of the question itself (leave-one-out)."""
    out = []
    for qi in questions:
        keep = np.nonzero(icl_q != qi)[0]
        s = icl_emb[keep] @ q_emb[qi]
        out.append(keep[np.lexsort((keep, -s))[:L]].tolist())
    return out


def label_targets(row: dict) -> tuple[list[str], int]:
    """The answers a candidate is judged by, as scored after the question: the distinct correct answers, then the
    distinct incorrect ones (an answer listed on both sides counts as correct); and how many are correct."""
    correct = list(dict.fromkeys(row["correct_answers"]))
    incorrect = [a for a in dict.fromkeys(row["incorrect_answers"]) if a not in set(correct)]
    if not correct or not incorrect:
        raise ValueError(f"question {row['question']!r}: a label needs correct and incorrect answers")
    return [tqa.answer_text(a) for a in (*correct, *incorrect)], len(correct)


def gain(lp: Sequence[float], n_correct: int) -> float:
    """A candidate's label: the mean log-prob of the correct answers minus that of the incorrect ones (``lp``:
    correct first, as ``label_targets`` orders them)."""
    lp = np.asarray(lp, dtype=np.float64)
    return float(lp[:n_correct].mean() - lp[n_correct:].mean())


def assign_folds(questions: Sequence[int], folds: int, seed: int) -> dict[int, int]:
    """A seeded partition of ``questions`` into ``folds`` folds of near-equal size: question -> fold."""
    if not 2 <= folds <= len(questions):
        raise ValueError(f"truthfulqa.folds={folds}: needs 2 <= folds <= {len(questions)} questions")
    perm = np.random.default_rng([seed, 20260]).permutation(len(questions))
    return {int(questions[p]): i % folds for i, p in enumerate(perm)}


class DemoFormat:
    """How a D_ICL pair reads to the prompt tower: the evaluation's own demonstration format."""

    @staticmethod
    def format_demo(ex: Example) -> str:
        return tqa.demo_text(ex.input, ex.output)


def training_pool(data: tqa.TQA) -> list[Example]:
    """The examples the labels index: the D_ICL pairs (ids 0..n_icl-1), then one query per question (id n_icl + qi;
    its ``input`` is the question, which is all the query tower reads)."""
    pairs = [Example(j, q, a) for j, (_, q, a) in enumerate(data.icl)]
    n = len(pairs)
    return pairs + [Example(n + qi, r["question"], "") for qi, r in enumerate(data.rows)]


# ---- stage keys -----------------------------------------------------------------------------------------------------


def labels_keys(ctx) -> dict:
    from epr.lm.factory import model_identity
    from epr.truthfulqa.common import data_key, lp_key

    cfg, t = ctx.cfg, ctx.cfg.truthfulqa
    return {
        "data": data_key(cfg),
        "limit": t.limit,
        "seed": cfg.seed,
        "first_stage": model_identity(cfg.models.encoder),
        "L": t.label_candidates,
        "lm": lp_key(cfg),
        "rule": SCORE_RULE,
        "k": [cfg.labels.k_pos, cfg.labels.k_neg],
        "prompt": tqa.demo_text("q", "a") + tqa.query_text("q") + tqa.answer_text("a"),
    }


def encoders_keys(ctx) -> dict:
    import dataclasses

    from epr.lm.factory import model_identity
    from epr.lm.identity import default_device, device_size

    cfg = ctx.cfg
    train = dataclasses.asdict(
        cfg.train
    )  # as written, but the length buckets as they act (4 on a CPU, as before)
    train["length_buckets"] = device_size("train.length_buckets", cfg.train.length_buckets, default_device())
    # the EPR rounds' teacher option: these encoders learn TruthfulQA's own labels, never it
    train.pop("teacher")
    return {
        "train": train,
        "encoder": model_identity(cfg.models.encoder),
        "folds": cfg.truthfulqa.folds,
        "seed": cfg.seed,
        "k_pos": cfg.labels.k_pos,  # the dev metric's recall@k
        "demo": DemoFormat.format_demo(Example(0, "q", "a")),
    }


# ---- tqa_labels -----------------------------------------------------------------------------------------------------


def _frozen_embeddings(cfg, rows: list[dict], data: tqa.TQA) -> tuple[np.ndarray, np.ndarray]:
    """The frozen relevance of ``rel``: normalised embeddings of every question and of every D_ICL pair's question."""
    from epr.lm.factory import default_device
    from epr.lm.models import load_encoder

    st = load_encoder(cfg.models.encoder, cfg.models.cache_dir, device=default_device())
    q_emb = st.encode([r["question"] for r in rows], batch_size=128, normalize_embeddings=True)
    icl_emb = st.encode([q for _, q, _ in data.icl], batch_size=128, normalize_embeddings=True)
    return np.asarray(q_emb), np.asarray(icl_emb)


def run_labels(ctx, out: Path, fp: str) -> dict:
    from epr.cache import ChunkStore
    from epr.encoder.data import select_labels
    from epr.reports.stats import seeded_subset
    from epr.truthfulqa.common import LazyScorer, cache_dir, lp_key

    cfg, t = ctx.cfg, ctx.cfg.truthfulqa
    rows = tqa.load_tqa(cfg.data.data_dir, t.version)
    data = tqa.build_sets(rows)
    subset = seeded_subset(len(rows), t.limit, cfg.seed).tolist()
    check_plan(cfg, len(subset))
    q_emb, icl_emb = _frozen_embeddings(cfg, rows, data)
    icl_q = np.array([qi for qi, _, _ in data.icl])
    cands = candidate_ids(q_emb, icl_emb, icl_q, subset, t.label_candidates)
    targets = {qi: label_targets(rows[qi]) for qi in subset}
    items = [
        {"prompt": tqa.demo_text(data.icl[j][1], data.icl[j][2]) + tqa.query_text(rows[qi]["question"]),
         "targets": targets[qi][0]}
        for qi, cs in zip(subset, cands) for j in cs
    ]  # fmt: skip
    key = lp_key(cfg)
    scorer, fresh = LazyScorer(ctx), [0]

    def compute(part: list[dict]) -> list[list[float]]:
        fresh[0] += len(part)
        return tqa.score_prompts(scorer(), [it["prompt"] for it in part], [it["targets"] for it in part])

    t0 = time.time()
    lps = ChunkStore(cache_dir(cfg, "label-logprobs", key), key).map(
        items, LABEL_CHUNK, compute, desc="tqa_labels", unit="prompt"
    )
    seconds = time.time() - t0
    n_icl, lab_rows, at = len(data.icl), [], 0
    for qi, cs in zip(subset, cands):
        scores = [gain(lp, targets[qi][1]) for lp in lps[at : at + len(cs)]]
        at += len(cs)
        sel = select_labels(cs, scores, cfg.labels.k_pos, cfg.labels.k_neg)
        lab_rows.append({"qi": qi, "qid": n_icl + qi, "question": rows[qi]["question"], **sel})
    write_jsonl(out / "labels.jsonl", lab_rows)
    spread = [r["cand_scores"][0] - r["cand_scores"][-1] for r in lab_rows]
    targets_scored = sum(len(targets[qi][0]) for qi, cs in zip(subset, cands) for _ in cs)
    return {
        "rows": {"questions": len(lab_rows), "candidates": len(items), "prompts_scored_now": fresh[0]},
        "extra": {
            "first_stage": cfg.models.encoder,
            "median_best_minus_worst_nats": float(np.median(spread)),
            # item 6 of issue 22: the label cost on this machine (0 when every chunk came from the cache)
            "prompts_per_s": fresh[0] / seconds if fresh[0] and seconds > 0 else None,
            "answers_scored": targets_scored,
        },
    }


# ---- tqa_encoders ---------------------------------------------------------------------------------------------------


def run_encoders(ctx, out: Path, fp: str) -> dict:
    from epr.encoder.data import read_labels
    from epr.encoder.train import TrainingData, train

    cfg, t = ctx.cfg, ctx.cfg.truthfulqa
    rows = tqa.load_tqa(cfg.data.data_dir, t.version)
    data = tqa.build_sets(rows)
    pool = training_pool(data)
    lab_file = ctx.stage_dir("tqa_labels") / "labels.jsonl"
    lab_rows = list(read_jsonl(lab_file))
    labels = read_labels(lab_rows, len(pool), str(lab_file))
    qis = [int(r["qi"]) for r in lab_rows]
    folds = assign_folds(qis, t.folds, cfg.seed)
    cands = {lab.qid: list(lab.cands) for lab in labels}
    per_fold = []
    for f in range(t.folds):
        fold_dir = out / f"fold-{f}"
        done = fold_dir / "done.json"  # a finished fold of this fingerprint is not trained again after a kill
        if done.is_file() and (fold_dir / "model").is_dir():
            prev = json.loads(done.read_text(encoding="utf-8"))
            if prev.get("fp") == fp:
                per_fold.append(prev["summary"])
                continue
        train_labels = [lab for lab, qi in zip(labels, qis) if folds[qi] != f]
        log.info(
            "tqa_encoders: fold %d/%d: %d labelled questions train it", f + 1, t.folds, len(train_labels)
        )
        res = train(
            cfg,
            TrainingData(pool=pool, task=DemoFormat(), labels=train_labels, candidates=cands),
            fold_dir,
            fp,
            resume=True,
            world=ctx.dist.world,
        )
        summary = {"fold": f, "serves": sum(v == f for v in folds.values()), **res["rows"],
                   "best_epoch": res["extra"]["best_epoch"]}  # fmt: skip
        per_fold.append(summary)
        if ctx.dist.is_main:
            atomic_write_text(done, json.dumps({"fp": fp, "summary": summary}) + "\n")
    if ctx.dist.is_main:
        for f in range(t.folds):  # the stage is finished: a forced rerun trains every fold again
            (out / f"fold-{f}" / "done.json").unlink(missing_ok=True)
        atomic_write_text(out / "folds.json", json.dumps({str(q): f for q, f in folds.items()}) + "\n")
    return {"rows": {"folds": t.folds, "questions": len(qis)}, "extra": {"per_fold": per_fold}}


def fold_embeddings(ctx, data: tqa.TQA, subset: Sequence[int]) -> tuple[dict[int, int], np.ndarray, list]:
    """Each evaluated question's fold, its query embedding under that fold's query tower (rows by question index)
    and, per fold, every D_ICL pair's embedding under that fold's prompt tower."""
    from epr.encoder.model import DualEncoder

    enc_dir = ctx.stage_dir("tqa_encoders")
    folds = {int(q): f for q, f in json.loads((enc_dir / "folds.json").read_text()).items()}
    missing = [qi for qi in subset if qi not in folds]
    if missing:
        raise ValueError(
            f"{enc_dir}/folds.json: questions {missing[:5]} have no fold (labels of another subset?)"
        )
    demos = [DemoFormat.format_demo(Example(j, q, a)).strip() for j, (_, q, a) in enumerate(data.icl)]
    q_emb, icl_by_fold = None, []
    for f in range(ctx.cfg.truthfulqa.folds):
        model = DualEncoder.from_pretrained(str(enc_dir / f"fold-{f}" / "model"))
        icl_by_fold.append(model.encode(demos, "prompt"))
        mine = [qi for qi in subset if folds[qi] == f]
        if mine:
            e = model.encode([data.rows[qi]["question"] for qi in mine], "query")
            if q_emb is None:
                q_emb = np.zeros((len(data.rows), e.shape[1]), dtype=np.float32)
            q_emb[mine] = e
    return folds, q_emb, icl_by_fold
