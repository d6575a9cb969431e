"""Stage ``teacher`` (``train.teacher: reward``; issue 74, item 3): LLM-R's distillation target. Each labelled
example's ``reward.teach_k`` candidates, mined as this round mines its candidates (BM25 in round 1, the earlier
round's encoder after; ``epr.stages.candidates.mine_round``), together with every candidate the LM scored for it,
are scored by the reward model (the ``reward`` stage): no LM call. The rows are written in the labels' own format
(``teacher.jsonl``: positives and negatives by the reward model's order, ``cands`` / ``cand_scores`` every scored
candidate, best first), so the dual encoder learns from the reward model's distribution over four times the LM's
candidates where it would learn from the LM's own.

The encoder's dev metric still reads the LM's labels (``TrainingData.dev_labels``): which epoch is kept is judged by
the LM, never by the teacher it imitates."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from epr.context import Context

__all__ = ["run_teacher", "teacher_rows", "teacher_file"]

log = logging.getLogger(__name__)

BATCH = 64  # pairs per reward-model forward pass


def teacher_rows(labels, mined, score, k_pos: int, k_neg: int) -> list[dict]:
    """One label row per row of ``labels`` (``LabelRow``s, in their order): its candidates are ``mined[qid]`` (ids,
    best first) and then the LM-scored candidates not among them, each scored by ``score(qid, ids) -> scores``;
    ordered, and positives / negatives chosen, as the labels stage chooses them (``select_labels``)."""
    from epr.encoder.data import select_labels

    out = []
    for r in labels:
        ids = list(dict.fromkeys([*mined.get(r.qid, ()), *r.cands]))  # mined first, then the LM's; no repeats
        ids = [i for i in ids if i != r.qid]
        s = [float(x) for x in score(r.qid, ids)]
        out.append({"qid": int(r.qid), **select_labels(ids, s, k_pos, k_neg)})
    return out


def run_teacher(ctx: Context, out: Path, fp: str) -> dict:
    from epr.artifacts import read_jsonl, write_jsonl
    from epr.encoder.data import read_labels
    from epr.reward.model import CrossEncoder
    from epr.stages.candidates import mine_round
    from epr.stages.reward import reward_dir

    cfg, pool = ctx.cfg, ctx.examples("pool")
    f = ctx.stage_dir("labels") / "labels.jsonl"
    labels = read_labels(list(read_jsonl(f)), len(pool), str(f))
    qids = np.array([r.qid for r in labels], dtype=np.int64)
    rankings, rnd, how = mine_round(ctx, qids, cfg.reward.teach_k)
    mined = {r.qid: list(r.ids) for r in rankings}
    model = CrossEncoder.from_pretrained(str(reward_dir(ctx)))
    bar = tqdm(total=len(labels), desc="teacher (reward model scores)", unit="query")

    def score(qid: int, ids: list[int]) -> np.ndarray:
        s = model.score([pool[qid].input] * len(ids), [model.demo(ctx.task, pool[i]) for i in ids], BATCH)
        bar.update(1)
        return s

    rows = teacher_rows(labels, mined, score, cfg.labels.k_pos, cfg.labels.k_neg)
    bar.close()
    n = write_jsonl(teacher_file(out), rows)
    sizes = [len(r["cands"]) for r in rows]
    agree = float(np.mean([t["cands"][0] == r.cands[0] for t, r in zip(rows, labels)]))
    log.info(
        "teacher (round %d): %d labelled examples x %.1f candidates (%s, top %d, and the LM's) scored by the "
        "reward model; its best is the LM's best on %.0f%%",
        rnd,
        n,
        float(np.mean(sizes)),
        how,
        cfg.reward.teach_k,
        100 * agree,
    )
    extra = {"round": rnd, "teach_k": cfg.reward.teach_k, "mean_candidates": round(float(np.mean(sizes)), 2)}
    return {"rows": {"queries": n}, "extra": {**extra, "top_is_lm_top": round(agree, 4)}}


def teacher_file(stage_dir: Path) -> Path:
    return Path(stage_dir) / "teacher.jsonl"
