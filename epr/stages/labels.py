"""Stage ``labels``: top-k positives and bottom-k hard negatives per training example, ties broken by id, and
every scored candidate with its score (best first) for the losses that use them all.

``labels.source = lm`` ranks candidates by the LM score (EPR); ``bm25`` by the BM25 score (DR-BM25).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from epr.artifacts import read_jsonl, write_jsonl
from epr.context import Context

log = logging.getLogger(__name__)


def select_labels(ids: Sequence[int], scores: Sequence[float | None], k_pos: int, k_neg: int) -> dict:
    """Positives: the ``k_pos`` best by (score desc, id asc); negatives: the ``k_neg`` worst of the same order,
    never overlapping the positives. Candidates with a ``None`` score are left out. ``cands`` / ``cand_scores``:
    every scored candidate in that order (what the listwise and distillation losses learn from)."""
    scored = [(s, i) for i, s in zip(ids, scores) if s is not None]
    order = sorted(scored, key=lambda t: (-t[0], t[1]))
    pos = order[:k_pos]
    neg = order[max(len(pos), len(order) - k_neg) :]
    return {
        "pos": [i for _, i in pos],
        "neg": [i for _, i in neg],
        "pos_scores": [s for s, _ in pos],
        "neg_scores": [s for s, _ in neg],
        "cands": [i for _, i in order],
        "cand_scores": [s for s, _ in order],
    }


def run_labels(ctx: Context, out: Path, fp: str) -> dict:
    lc = ctx.cfg.labels
    src = ("scores", "scores.jsonl") if lc.source == "lm" else ("candidates", "candidates.jsonl")
    rows = []
    for r in read_jsonl(ctx.stage_dir(src[0]) / src[1], required=("qid", "ids", "scores")):
        lab = select_labels(r["ids"], r["scores"], lc.k_pos, lc.k_neg)
        if not lab["pos"] or not lab["neg"]:
            log.warning("labels: query %d has no scored candidates; left out", r["qid"])
            continue
        rows.append({"qid": r["qid"], **lab})
    n = write_jsonl(out / "labels.jsonl", rows)
    log.info(
        "labels: %d queries, %d positives and %d negatives each (source: %s)",
        n,
        lc.k_pos,
        lc.k_neg,
        lc.source,
    )
    return {"rows": {"queries": n}}
