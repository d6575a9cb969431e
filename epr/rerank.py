"""RAGSys re-ranking on top of any dense first stage, for the semantic-parsing comparison (SPEC 3.1-3.2).

A retriever name may carry suffixes: ``epr+div`` (MMR diversity, no quality bias) and ``epr+div+bias``
(Algorithm 1: relevance + diversity + the LM quality bias of each demonstration); ``sbert+div+bias`` likewise.
The quality bias b_i = mean token log-prob of demonstration i's output given its input, under the inference LM,
does not depend on the query: it is computed once per pool and cached as ``.npy``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from epr.artifacts import load_npy, save_npy

__all__ = ["parse_retriever_name", "pool_quality", "quality_bias", "rerank"]

log = logging.getLogger(__name__)

SUFFIXES = ("+div", "+bias")


def parse_retriever_name(name: str) -> tuple[str, bool, bool]:
    """``"epr+div+bias"`` -> ``("epr", True, True)``. Bias without diversity is written ``+div+bias`` with
    ``ragsys.lambda_d = 1``; a bare ``+bias`` suffix is accepted too."""
    base, div, bias = name, False, False
    while base.endswith(SUFFIXES):
        if base.endswith("+div"):
            base, div = base[:-4], True
        else:
            base, bias = base[:-5], True
    return base, div, bias


def quality_bias(
    scorer, contexts: Sequence[str], targets: Sequence[str], cache: Path | None = None
) -> np.ndarray:
    """``(n,) float32`` mean token log-prob of each target after its context (SPEC 3.2); cached at ``cache``.

    The cache is keyed by a digest of the texts (a sidecar ``.sha256``), so a changed pool, even one of the same
    size, is recomputed rather than served stale."""
    import hashlib

    h = hashlib.sha256()
    for c, t in zip(contexts, targets):
        h.update(c.encode() + b"\0" + t.encode() + b"\1")
    digest = h.hexdigest()
    stamp = None if cache is None else Path(str(cache) + ".sha256")
    if cache is not None and cache.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return load_npy(cache)
    sums = scorer.score(list(contexts), list(targets))
    n = np.array([max(len(scorer.tok(t, add_special_tokens=False)["input_ids"]), 1) for t in targets])
    b = (sums / n).astype(np.float32)
    if cache is not None:
        save_npy(cache, b)
        stamp.write_text(digest + "\n")
    return b


def pool_quality(model, tok, task, pool, cfg, cache_dir: Path) -> np.ndarray:
    """``(len(pool),) float32`` quality bias of every pool demonstration under the inference LM, cached in
    ``cache_dir`` per LM: b_i = mean log p(format_target(y_i) | format_query(x_i))."""
    from epr.scoring import LMScorer

    lm = (cfg.models.inference_lm or cfg.models.lm).replace("/", "_")
    scorer = LMScorer(model, tok, batch_tokens=cfg.scoring.batch_tokens, forward=cfg.scoring.forward)
    log.info("quality bias of %d pool demonstrations with %s", len(pool), lm)
    return quality_bias(
        scorer,
        [task.format_query(e.input) for e in pool],
        [task.format_target(e.output) for e in pool],
        Path(cache_dir) / f"quality_bias.{lm}.npy",
    )


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
