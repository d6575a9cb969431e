"""Records and interfaces shared by every stage. A leaf module: imports nothing from the package."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Example",
    "Ranking",
    "Hits",
    "Retriever",
    "UserError",
    "InputError",
    "ConfigError",
    "UpstreamError",
]


class UserError(Exception):
    """A failure the user can fix (a file, a setting, a missing step). The message names the file / key / URL,
    what was expected and what to do; the CLI prints it as one paragraph with exit code 2, never a stack."""


class InputError(UserError, ValueError):
    """Bad user input (file, row, field). The message names where and what."""


class ConfigError(InputError):
    """A bad configuration: a YAML file that does not parse, an override that is not ``key=value``, a wrong type."""


class UpstreamError(UserError, RuntimeError):
    """A stage was asked to run before the stages it reads from (or a command before the run it reads)."""


@dataclass(frozen=True)
class Example:
    """One row of a split. ``idx`` (its position in the split) is the only identity used downstream."""

    idx: int
    input: str
    output: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {"idx": self.idx, "input": self.input, "output": self.output, "meta": self.meta}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Example:
        return cls(int(row["idx"]), row["input"], row["output"], row.get("meta") or {})


@dataclass(frozen=True)
class Ranking:
    """A query's candidates, best first. ``ids`` index the pool; ``scores`` align with ``ids``."""

    qid: int
    ids: list[int]
    scores: list[float]

    def to_json(self) -> dict[str, Any]:
        return {"qid": self.qid, "ids": self.ids, "scores": self.scores}

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> Ranking:
        return cls(int(row["qid"]), [int(i) for i in row["ids"]], [float(s) for s in row["scores"]])


@dataclass(frozen=True)
class Hits:
    """What a retriever returns for a batch of queries: ``ids`` ``(n_queries, k) int64`` pool ids, best first, and
    ``scores`` ``(n_queries, k) float64``, the retriever's own score of each (higher is better; random: 0)."""

    ids: np.ndarray
    scores: np.ndarray

    def __post_init__(self) -> None:
        if self.ids.shape != self.scores.shape:
            raise ValueError(f"Hits: ids {self.ids.shape} and scores {self.scores.shape} differ in shape")

    def rows(self, queries: Sequence[Example]) -> list[dict[str, Any]]:
        """One JSON row per query: ``{idx, ids, scores}``."""
        return [
            {"idx": q.idx, "ids": [int(i) for i in ids], "scores": [round(float(s), 6) for s in sc]}
            for q, ids, sc in zip(queries, self.ids, self.scores)
        ]


@runtime_checkable
class Retriever(Protocol):
    """Every retriever (random, BM25, dense, trained, oracle) answers the same call.

    ``retrieve`` returns :class:`Hits` for ``k`` pool ids per query, best first. ``exclude[i]`` (optional) is a
    pool id that query ``i`` must never get back (the query itself when queries come from the pool), or -1.
    """

    name: str
    is_oracle: bool

    def retrieve(self, queries: Sequence[Example], k: int, exclude: np.ndarray | None = None) -> Hits: ...
