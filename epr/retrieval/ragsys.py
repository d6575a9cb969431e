"""RAGSys re-ranking on top of any dense first stage, for the semantic-parsing comparison (SPEC 3.1-3.2).

A retriever name may carry suffixes: ``epr+div`` (MMR diversity, no quality bias) and ``epr+div+bias``
(Algorithm 1: relevance + diversity + the LM quality bias of each demonstration); ``sbert+div+bias`` likewise.
The quality bias b_i = mean token log-prob of demonstration i's output given its input, under the inference LM,
does not depend on the query: the ``rerank`` stage computes it once per pool and inference LM.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from epr.config import parse_retriever_name

__all__ = ["parse_retriever_name", "mean_logprob", "rerank", "rerank_by_name"]

log = logging.getLogger(__name__)


def mean_logprob(scorer, contexts: Sequence[str], targets: Sequence[str]) -> np.ndarray:
    """``(n,) float32`` mean token log-prob of each target after its context: the quality bias b_i (SPEC 3.2)."""
    sums = scorer.score(list(contexts), list(targets))
    n = np.array([max(len(scorer.tok(t, add_special_tokens=False)["input_ids"]), 1) for t in targets])
    return (np.asarray(sums) / n).astype(np.float32)


def rerank(
    query_emb: np.ndarray,
    pool_emb: np.ndarray,
    ids: np.ndarray,
    k: int,
    lambda_d: float,
    lambda_b: float = 1.0,
    quality: np.ndarray | None = None,
) -> np.ndarray:
    """Algorithm 1 over each query's first-stage shortlist.

    query_emb ``(n_queries, d)``, pool_emb ``(n_pool, d)``, ids ``(n_queries, m)`` int64 shortlist (best first),
    quality ``(n_pool,)`` or None. Returns ``(n_queries, min(k, m))`` int64 pool ids in selection order."""
    from ragsys import mmr_select

    out = np.empty((len(ids), min(k, ids.shape[1])), dtype=np.int64)
    for i, row in enumerate(ids):
        q = None if quality is None else quality[row]
        sel = mmr_select(
            query_emb[i], pool_emb[row], q, out.shape[1], lambda_d, lambda_b if q is not None else 1.0
        )
        out[i] = row[sel]
    return out


def rerank_by_name(
    name: str,
    query_emb: np.ndarray,
    pool_emb: np.ndarray,
    ids: np.ndarray,
    k: int,
    lambda_d: float,
    lambda_b: float,
    quality: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """What a retriever name asks of its first stage's shortlist ``ids``: unchanged for a plain name; for ``+div``
    MMR with ``lambda_d``; for ``+bias`` also the quality bias with ``lambda_b`` (``lambda_d`` is 1 without
    ``+div``). Returns the selected ids and their relevance scores (inner products), best first: the one rule the
    ``rerank`` stage and ``epr inspect`` follow."""
    _, div, bias, _ = parse_retriever_name(name)
    if not (div or bias):
        return ids, np.einsum("nkd,nd->nk", pool_emb[ids], query_emb)
    if bias and quality is None:
        raise ValueError(f"{name}: +bias needs the pool's quality bias")
    sel = rerank(query_emb, pool_emb, ids, k, lambda_d if div else 1.0, lambda_b, quality if bias else None)
    return sel, np.einsum("nkd,nd->nk", pool_emb[sel], query_emb)
