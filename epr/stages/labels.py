"""Stage ``labels``: top-k positives and bottom-k hard negatives per training example, ties broken by id, and
every scored candidate with its score (best first) for the losses that use them all.

``labels.source = lm`` ranks candidates by the LM score (EPR); ``bm25`` by the BM25 score (DR-BM25).
"""

from __future__ import annotations

import logging
from pathlib import Path

from epr.artifacts import read_jsonl, write_jsonl
from epr.context import Context
from epr.encoder.data import select_labels  # the pure rule, shared with the TruthfulQA labels

__all__ = ["run_labels", "select_labels"]

log = logging.getLogger(__name__)


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
