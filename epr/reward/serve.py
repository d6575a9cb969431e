"""The reward model as a served re-ranker: a ``+rm`` mode of :class:`epr.api.PromptRetriever` (``epr+rm``,
``hybrid+rm``, ``bm25+rm``) re-scores its first stage's top ``top_k`` with the trained cross-encoder, as the
pipeline's ``rerank`` stage does (:func:`epr.stages.rerank.reward_rerank`): the first stage ranks ``k``, the first
``top_k`` of them are ordered by the reward model's score of (query, demonstration), best first.

The model loads on first use, so a retriever that serves a plain mode never reads it; a shipped retriever holds it
in ``reward/`` (the saved :class:`~epr.reward.model.CrossEncoder` folder) with its ``top_k`` in ``retriever.json``."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from epr.reward.model import META, CrossEncoder, rerank

__all__ = ["Reranker"]


class Reranker:
    """A trained reward model (a saved folder, or the model itself) and how many first-stage candidates it
    re-scores per query."""

    def __init__(self, model: str | Path | CrossEncoder, top_k: int = 32):
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ValueError(
                f"top_k={top_k!r}: the reward model re-scores the first stage's top_k, an int >= 1"
            )
        if not isinstance(model, CrossEncoder) and not (Path(model) / META).is_file():
            raise FileNotFoundError(
                f"{model}: not a trained reward model (no {META}); train one with `epr stage reward` "
                "(or `epr run` with a +rm retriever)"
            )
        self._model = model if isinstance(model, CrossEncoder) else None
        self.path = None if self._model is not None else Path(model)
        self.top_k = int(top_k)

    @property
    def model(self) -> CrossEncoder:
        if self._model is None:
            self._model = CrossEncoder.from_pretrained(str(self.path))
        return self._model

    def __call__(self, query: str, ids: Sequence[int], pool: Sequence, task) -> tuple[np.ndarray, np.ndarray]:
        """The first ``top_k`` of ``ids`` (a first stage's ranking over ``pool``, best first) re-ordered by the
        reward model's score of (query, demonstration as the model reads it), best first, and those scores."""
        m, ids = self.model, [int(i) for i in ids[: self.top_k]]
        sel, sc = rerank(m, query, ids, [m.demo(task, pool[i]) for i in ids])
        return np.asarray(sel, dtype=np.int64), np.asarray(sc, dtype=np.float64)

    def save(self, dest: Path) -> None:
        """The model's folder as it was trained (copied), or the in-memory model saved."""
        if self.path is not None:
            shutil.copytree(self.path, dest)
        else:
            self.model.save(dest)
