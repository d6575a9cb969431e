"""What a served retriever ranks by (``epr.api.PromptRetriever.mode``), as the pipeline's retrievers of the same
names rank (:mod:`epr.retrieval.retrievers`):

- ``epr``: the trained dual encoder's ranking (inner product over the faiss index);
- ``bm25``: BM25 over the pool's *inputs* (:class:`~epr.retrieval.retrievers.BM25Retriever`);
- ``hybrid``: the two fused by reciprocal rank (:func:`~epr.retrieval.retrievers.rrf_fuse`), each contributing
  its top ``k`` and the fused top ``k`` kept, as :class:`~epr.retrieval.retrievers.FusionRetriever` does;
- ``epr+rm``, ``hybrid+rm``, ``bm25+rm``: that first stage's top ``reward.top_k`` re-ordered by the trained reward
  model (:class:`epr.reward.serve.Reranker`), as the pipeline's ``rerank`` stage orders the ``+rm`` retrievers.

Scores are each mode's own: inner products (``epr``), BM25 scores (``bm25``), fused ``sum 1 / (60 + rank)``
(``hybrid``), the reward model's (``+rm``). Every ranking breaks ties deterministically (faiss's exact search, BM25 by id, RRF by first rank).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from epr.cache import read_manifest
from epr.config.names import base_mode, is_reranked
from epr.retrieval.retrievers import BM25Retriever, rrf_fuse
from epr.types import Example, UpstreamError

__all__ = [
    "MODES",
    "BM25_BACKENDS",
    "check_mode",
    "LazyBM25",
    "rank",
    "served_mode",
    "run_reranker",
    "warn_changed_data",
    "run_prompt",
]

log = logging.getLogger(__name__)

PLAIN_MODES = ("epr", "hybrid", "bm25")
MODES = (*PLAIN_MODES, *(f"{m}+rm" for m in PLAIN_MODES))
BM25_BACKENDS = ("bm25s", "rank_bm25")

Ranking = tuple[np.ndarray, np.ndarray]  # (k,) int64 pool ids and (k,) float64 scores, best first


def check_mode(mode: str, backend: str, has_reward: bool | None = None) -> None:
    """A ValueError naming the value and what is allowed, for an unknown mode or BM25 backend, or (``has_reward``
    False) a ``+rm`` mode without a reward model."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: choose one of {', '.join(MODES)}")
    if has_reward is False and is_reranked(mode):
        raise ValueError(
            f"mode={mode!r}: re-ranks by a trained reward model, and this retriever has none (a run trains it in "
            "its reward stage, `epr stage reward`; an exported retriever holds it only when exported serving a "
            f"+rm mode); serve {base_mode(mode)!r} instead, or pass reward=Reranker(folder)"
        )
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
    rerank: Callable[[str, np.ndarray], Ranking] | None = None,
    depth: int = 0,
) -> Ranking:
    """The ``k`` best pool ids for ``query`` and their scores under ``mode``. ``dense(n)``: the dense top ``n``
    (ids and inner products, faiss's ``-1`` padding dropped); ``bm25()``: the BM25 retriever over the pool's
    inputs; ``rerank(query, ids)``: the reward model's order of a first stage's ranking (``+rm`` modes: at most
    its ``top_k`` ids come back), applied to the first stage's ``max(k, depth)`` best (``depth``: the run's
    ``retrieve.k``, so that a smaller ``k`` is the top of the same list). Each is called only when needed."""
    if is_reranked(mode):
        if rerank is None:
            raise ValueError(f"mode={mode!r}: re-ranks by a reward model, and this retriever has none")
        ids, sc = rerank(query, rank(base_mode(mode), query, max(k, depth), dense, bm25)[0])
        return ids[:k], sc[:k]
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


def served_mode(run: Path, mode: str | None, enc_fp: str) -> tuple[str, str, dict | None]:
    """(the mode to serve, its BM25 backend, the select stage's report or None): ``mode`` where given, else what
    the run's finished ``select`` stage chose, else ``epr``. A select folder without its manifest is unfinished
    and ignored, as every stage's is."""
    report, man, f = None, read_manifest(run / "select"), run / "select" / "report.json"
    try:
        if man is not None:
            report = json.loads(f.read_text(encoding="utf-8"))
            check_mode(report["selected"], report.get("backend") or "bm25s")
    except (OSError, ValueError, KeyError, TypeError) as e:
        if mode is None:
            raise UpstreamError(
                f"{f}: not a readable select report ({type(e).__name__}: {e}); rerun the select stage "
                "(`epr run` with the run's -c/--set), or pass mode= to choose the retriever yourself"
            ) from None
        log.warning("%s: unreadable (%s); serving mode=%r as asked", f, e, mode)
        report = None
    if report is not None and man.get("upstream", {}).get("encoder") not in (None, enc_fp):
        log.warning("%s: the select stage compared an earlier encoder of this run; rerun it to compare the "
                    "current one (`epr run` with the run's -c/--set)", run)  # fmt: skip
    if man is None and mode is None and (run / "select").is_dir():
        log.warning("%s: its select stage did not finish (stopped mid-run), so its choice is unknown: serving 'epr' "
                    "until it does (`epr run` with the run's -c/--set finishes it), or pass mode=", run)  # fmt: skip
    cand = (read_manifest(run / "candidates") or {}).get("config", {}).get("candidates", {})
    backend = (report or {}).get("backend") or cand.get("backend") or "bm25s"
    chose = report and f"the run's select stage chose {report['selected']!r}: {report.get('reason')}"
    if mode is not None:
        why = f"asked for with mode={mode!r}" + (f"; {chose}" if chose else "")
    else:
        mode, why = (report["selected"], chose) if report else ("epr", "the run has no finished select stage")
    check_mode(mode, backend)
    log.info("%s: serving the %r retriever (%s)", run, mode, why)
    return mode, backend, report


def run_reranker(run: Path):
    """The run's trained reward model as a :class:`~epr.reward.serve.Reranker` (loaded on first use), with the
    ``top_k`` its ``select`` (else ``rerank``) stage re-ranked with; ``None`` where it has no finished reward stage."""
    from epr.config.reward import RewardConfig
    from epr.reward.serve import Reranker

    if read_manifest(run / "reward") is None or not (run / "reward" / "model").is_dir():
        return None
    keys = [(read_manifest(run / st) or {}).get("config", {}) for st in ("select", "rerank")]
    top_k = next((k["reward_top_k"] for k in keys if "reward_top_k" in k), RewardConfig().top_k)
    return Reranker(run / "reward" / "model", top_k)


def warn_changed_data(run: Path, ex_man: dict) -> None:
    """Warn when a data file the run's pool was read from has changed since (its digest is in the examples stage's
    key): the run serves the pool it loaded then, and `epr run` would rebuild it. Files no longer where they were
    (a moved run, relative paths from another folder) are not checked."""
    from epr.cache import cached_digest

    changed = [
        f
        for f, d in (ex_man["config"].get("files") or {}).items()
        if d is not None and cached_digest(f) not in (None, d)
    ]
    if changed:
        log.warning(
            "%s: the data file(s) %s changed since this run read them; serving the pool as it was then "
            "(rerun `epr run` with the run's config to rebuild the pool and the retriever on the new data)",
            run,
            ", ".join(changed),
        )


def run_prompt(run: Path) -> dict | None:
    """The prompt format a run rendered its prompts in: the ``prompt`` entry of its ``prompts`` (else ``select``)
    stage's key (:meth:`epr.prompt.PromptFormat.spec`); ``None`` for the task's own format."""
    for stage in ("prompts", "select"):
        man = read_manifest(run / stage)
        if man is not None:
            keys = man["config"]
            return keys.get("prompt") or keys.get("prompts", {}).get("prompt")
    return None
