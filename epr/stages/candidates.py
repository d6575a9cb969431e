"""Stage ``candidates``: for each labelled training example, L candidates from the pool by BM25.

The default view searches the *outputs* (query y, corpus all y_j), as EPR does. The example itself is
excluded by id. Which training examples get labelled: all, or the first ``num_queries`` of a seeded permutation
(nested: a larger set contains the smaller ones).
"""

from __future__ import annotations

import logging

import numpy as np

from epr.artifacts import write_jsonl
from epr.context import Context
from epr.retrieval.bm25 import BM25Index
from epr.types import Example, Ranking

log = logging.getLogger(__name__)


def view_text(ex: Example, view: str) -> str:
    if view == "output":
        return ex.output
    if view == "input":
        return ex.input
    return f"{ex.input} {ex.output}"


def query_ids(n_pool: int, num_queries: int | None, seed: int) -> np.ndarray:
    """The first ``num_queries`` of a seeded permutation of the pool, in that order.

    Nested: a larger label set contains every smaller one of the same seed (so it reuses their scores), and the
    order is the scoring order, so the first chunks of a long scoring run form the smaller sets."""
    if num_queries is None or num_queries >= n_pool:
        return np.arange(n_pool)
    return np.random.default_rng(seed).permutation(n_pool)[:num_queries]


def mine(
    pool: list[Example], qids: np.ndarray, L: int, view: str, backend: str, progress: bool = True
) -> list[Ranking]:
    index = BM25Index([view_text(e, view) for e in pool], backend)
    ids, scores = index.search([view_text(pool[q], view) for q in qids], L, exclude=qids, progress=progress)
    return [
        Ranking(int(q), i.tolist(), [round(float(s), 5) for s in sc]) for q, i, sc in zip(qids, ids, scores)
    ]


def run_candidates(ctx: Context, out, fp: str) -> dict:
    c = ctx.cfg.candidates
    pool = ctx.examples("pool")
    qids = query_ids(len(pool), c.num_queries, c.query_seed)
    rankings = mine(pool, qids, c.L, c.view, c.backend)
    n = write_jsonl(out / "candidates.jsonl", rankings)
    log.info("candidates: %d queries x L=%d (%s over %s)", n, c.L, c.backend, c.view)
    return {"rows": {"queries": n}}
