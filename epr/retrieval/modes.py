"""What a served retriever ranks by (``epr.api.PromptRetriever.mode``), as the pipeline's retrievers of the same
names rank (:mod:`epr.retrieval.retrievers`):

- ``epr``: the trained dual encoder's ranking (inner product over the faiss index);
- ``bm25``: BM25 over the pool's *inputs* (:class:`~epr.retrieval.retrievers.BM25Retriever`);
- ``hybrid``: the two fused by reciprocal rank (:func:`~epr.retrieval.retrievers.rrf_fuse`), each contributing
  its top ``k`` and the fused top ``k`` kept, as :class:`~epr.retrieval.retrievers.FusionRetriever` does.

Scores are each mode's own: inner products (``epr``), BM25 scores (``bm25``), fused ``sum 1 / (60 + rank)``
(``hybrid``). Every ranking breaks ties deterministically (faiss's exact search, BM25 by id, RRF by first rank).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from epr.retrieval.retrievers import BM25Retriever, rrf_fuse
from epr.types import Example

__all__ = ["MODES", "BM25_BACKENDS", "check_mode", "LazyBM25", "rank"]

MODES = ("epr", "hybrid", "bm25")
BM25_BACKENDS = ("bm25s", "rank_bm25")

Ranking = tuple[np.ndarray, np.ndarray]  # (k,) int64 pool ids and (k,) float64 scores, best first


def check_mode(mode: str, backend: str) -> None:
    """A ValueError naming the value and what is allowed, for an unknown mode or BM25 backend."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
    if backend not in BM25_BACKENDS:
        raise ValueError(f"bm25_backend={backend!r}: choose one of {', '.join(BM25_BACKENDS)}")


class LazyBM25:
    """BM25 over a pool's inputs, built on first use and again once the pool has changed size (an added
    demonstration), so a retriever that never ranks by BM25 never builds it."""

    def __init__(self, backend: str = "bm25s"):
        self.backend = backend
        self._bm25: BM25Retriever | None = None
        self._n = -1

    def reset(self) -> None:
        self._bm25, self._n = None, -1

    def __call__(self, pool: Sequence[Example]) -> BM25Retriever:
        if self._bm25 is None or self._n != len(pool):
            self._bm25, self._n = BM25Retriever(pool, "input", self.backend), len(pool)
        return self._bm25


def rank(
    mode: str,
    query: str,
    k: int,
    dense: Callable[[int], Ranking],
    bm25: Callable[[], BM25Retriever],
) -> Ranking:
    """The ``k`` best pool ids for ``query`` and their scores under ``mode``. ``dense(n)``: the dense top ``n``
    (ids and inner products, faiss's ``-1`` padding dropped); ``bm25()``: the BM25 retriever over the pool's
    inputs. Each is called only when the mode needs it."""
    if mode == "epr":
        ids, sc = dense(k)
        return np.asarray(ids, dtype=np.int64), np.asarray(sc, dtype=np.float64)
    hits = bm25().retrieve([Example(-1, query, "", {})], k)
    b_ids, b_sc = hits.ids[0], hits.scores[0]
    if mode == "bm25":
        return b_ids, b_sc
    if mode != "hybrid":
        raise ValueError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
    d_ids, _ = dense(k)
    return rrf_fuse([d_ids, b_ids], min(len(d_ids), len(b_ids)))  # FusionRetriever's k: the shorter part's
