"""BM25 top-k with one tokenisation and two interchangeable backends.

Both backends compute Okapi BM25 (k1=1.5, b=0.75) with Robertson idf clipped at 0:
``rank_bm25.BM25Okapi(epsilon=0)`` (the reference) and ``bm25s`` with ``method="robertson"`` (the fast one,
sparse precomputed scores). Ties are broken by pool id, so both return the same order for the same scores.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import numpy as np
from tqdm.auto import tqdm

__all__ = ["tokenize", "BM25Index", "K1", "B"]

log = logging.getLogger(__name__)
K1, B = 1.5, 0.75
_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens. Brackets and punctuation carry no signal in logical forms; identifiers such as
    ``IN:GET_WEATHER`` become ``in``, ``get_weather``."""
    return _TOKEN.findall(text.lower())


def _topk_with_ties(scores: np.ndarray, k: int, exclude: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids of one score row, ordered by (-score, id), never returning ``exclude``."""
    if exclude >= 0:
        scores = scores.copy()
        scores[exclude] = -np.inf
    n = scores.shape[0]
    k_eff = min(k, n - (1 if exclude >= 0 else 0))
    if k_eff < n:
        # a partition may cut through a tie group: take every id whose score reaches the k-th value
        kth = np.partition(scores, n - k_eff)[n - k_eff]
        cand = np.nonzero(scores >= kth)[0]
    else:
        cand = np.arange(n)
    order = np.lexsort((cand, -scores[cand]))[:k_eff]
    ids = cand[order]
    return ids.astype(np.int64), scores[ids].astype(np.float32)


def _import_bm25s():
    """``bm25s``, imported without its side effects. Where jax is installed, bm25s runs one ``jax.lax.top_k`` at
    import, which starts jax's default backend: on a GPU jax then takes 75% of its memory at once (on a lent H200,
    112 of 140 GB in one run's process, and the runs beside it failed). epr uses bm25s's scores only, never its
    jax top-k, so unless the application has imported jax itself, bm25s is imported as if jax were absent (it falls
    back to numpy) and jax is importable again afterwards. And bm25s forces DEBUG on its logger at import: its
    records follow the application's level instead."""
    import sys

    hide = "jax" not in sys.modules
    if hide:
        sys.modules["jax"] = None  # `import jax.lax` raises ImportError
    try:
        import bm25s
    finally:
        if hide and "jax" in sys.modules and sys.modules["jax"] is None:
            del sys.modules["jax"]
    if logging.getLogger("bm25s").level == logging.DEBUG:
        logging.getLogger("bm25s").setLevel(logging.NOTSET)
    return bm25s


class BM25Index:
    """BM25 over a corpus of texts. ``search`` returns ``(n_queries, k) int64`` ids and ``float32`` scores,
    best first, ties broken by id; ``exclude[i]`` is an id that query ``i`` must not get back (or -1)."""

    def __init__(self, corpus: Sequence[str], backend: str = "bm25s"):
        if not corpus:
            raise ValueError("BM25Index: empty corpus")
        self.backend = backend
        self.n = len(corpus)
        toks = [tokenize(t) for t in corpus]
        if backend == "rank_bm25":
            from rank_bm25 import BM25Okapi

            self._bm = BM25Okapi(toks, k1=K1, b=B, epsilon=0.0)
        elif backend == "bm25s":
            bm25s = _import_bm25s()
            self._bm = bm25s.BM25(method="robertson", k1=K1, b=B)
            self._bm.index(toks, show_progress=False)
            self._vocab = self._bm.vocab_dict
        else:
            raise ValueError(f"BM25 backend {backend!r}: choose bm25s or rank_bm25")

    def scores(self, query: str) -> np.ndarray:
        """``(n_docs,) float32`` scores of one query against every document."""
        q = tokenize(query)
        if self.backend == "rank_bm25":
            return np.asarray(self._bm.get_scores(q), dtype=np.float32)
        ids = [self._vocab[t] for t in q if t in self._vocab]
        if not ids:
            return np.zeros(self.n, dtype=np.float32)
        # bm25s leaves out the constant (k1 + 1) numerator factor that rank-bm25 (and Robertson) include
        return np.asarray(self._bm.get_scores(ids), dtype=np.float32) * np.float32(K1 + 1)

    def search(
        self, queries: Sequence[str], k: int, exclude: np.ndarray | None = None, progress: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        if exclude is None:
            exclude = np.full(len(queries), -1, dtype=np.int64)
        k_eff = min(k, self.n - int((exclude >= 0).any()))
        ids = np.empty((len(queries), k_eff), dtype=np.int64)
        sc = np.empty((len(queries), k_eff), dtype=np.float32)
        it = tqdm(queries, desc=f"bm25 ({self.backend})", disable=not progress, unit="q")
        for i, q in enumerate(it):
            ids[i], sc[i] = _topk_with_ties(self.scores(q), k_eff, int(exclude[i]))
        return ids, sc
