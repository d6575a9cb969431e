"""The vocabulary of a config: the names it may choose from (first-stage retrievers with their RAGSys suffixes,
TruthfulQA variants) and :func:`opt`, how every section declares a field.

Plain tuples, one parser and the field helpers, no imports beyond the types: loading a config imports neither numpy
nor ragsys.
"""

from __future__ import annotations

import os
from dataclasses import field
from typing import Any, NamedTuple

from epr.types import ConfigError

__all__ = [
    "opt",
    "PATH_KINDS",
    "range_text",
    "out_of_range",
    "path_problem",
    "section_field",
    "RETRIEVERS",
    "DENSE",
    "LEARNED",
    "RAGSYS_SUFFIXES",
    "REWARD_SUFFIX",
    "is_reranked",
    "base_mode",
    "RetrieverName",
    "parse_retriever_name",
    "TQA_VARIANTS",
    "TQA_LEARNED_VARIANTS",
]

# First-stage retrievers; a dense one (DENSE) may carry the RAGSys suffixes +div / +div+bias (checked at load).
# hybrid: reciprocal-rank fusion of epr (the trained dual encoder) and bm25
RETRIEVERS = ("random", "bm25", "sbert", "epr", "dr-bm25", "bm25-oracle", "lm-oracle", "hybrid")
DENSE = ("sbert", "epr", "dr-bm25")
LEARNED = ("epr", "hybrid")  # the first stages that use the trained dual encoder
RAGSYS_SUFFIXES = ("div", "bias")
REWARD_SUFFIX = "rm"  # +rm: the first stage's top reward.top_k re-scored by the reward model (epr.reward)


def is_reranked(mode: str) -> bool:
    """Whether a served mode (``epr.retrieval.modes``) re-ranks by the reward model: ``hybrid+rm``."""
    return mode.endswith("+" + REWARD_SUFFIX)


def base_mode(mode: str) -> str:
    """The first stage of a served mode: ``hybrid+rm`` -> ``hybrid``; a plain mode is its own."""
    return mode.removesuffix("+" + REWARD_SUFFIX)


class RetrieverName(NamedTuple):
    base: str  # the first stage
    div: bool  # +div: MMR diversity (ragsys.lambda_d)
    bias: bool  # +bias: the LM quality bias (ragsys.lambda_b)
    rm: bool = False  # +rm: re-ranked by the reward model


def parse_retriever_name(name: str) -> RetrieverName:
    """``"epr+div+bias"`` -> ``("epr", True, True, False)``, ``"epr+rm"`` -> ``("epr", False, False, True)``: the one
    reading of a retriever name (config checks, stages, ``epr inspect``, scripts). Bias without diversity is written
    ``+div+bias`` with ``ragsys.lambda_d = 1``; a bare ``+bias`` is accepted too. ``+rm`` (the reward model's
    re-ranking) stands alone. An unknown suffix, or ``+rm`` with RAGSys's, is a ``ConfigError``."""
    base, *suffixes = name.split("+")
    bad = [s for s in suffixes if s not in (*RAGSYS_SUFFIXES, REWARD_SUFFIX)]
    if bad:
        raise ConfigError(
            f"retrieve.retrievers: {name!r}: unknown suffix +{bad[0]} (RAGSys suffixes: +div, +div+bias; the "
            "reward model's re-ranking: +rm)"
        )
    rm = REWARD_SUFFIX in suffixes
    if rm and len(suffixes) > 1:
        raise ConfigError(
            f"retrieve.retrievers: {name!r}: +rm re-ranks a first stage alone (no +div / +bias with it)"
        )
    return RetrieverName(base, "div" in suffixes, "bias" in suffixes, rm)


# TruthfulQA variants: "fix" plus the re-rankers of ragsys.VARIANTS (a test keeps the two equal; no import here, so
# that loading a config imports neither numpy nor ragsys)
TQA_VARIANTS = ("fix", "bias", "rel", "rel+bias", "rel+div", "rel+div+bias")
# the learned relevance (epr.truthfulqa.learned): rel / rel+div on a dual encoder trained on the scoring LM's labels
TQA_LEARNED_VARIANTS = ("epr", "epr+div")


# The kinds of path a field may hold (``opt(..., path=...)``): what each allows, checked at load
PATH_KINDS = {
    "path": "a file or folder path: not empty, no NUL byte or line break",
    "run-name": "a relative path under run_root: a path's rules, and no '.' or '..' part, not absolute",
}


SEED = {"ge": 0, "le": 2**32 - 1}  # what numpy and torch take as a seed
# why a field takes any text (``opt(..., free=...)``): checked where it is used, with the value named
MODEL = "a model name: resolved when loaded (a packaged name, a hub id or a folder; the error names it)"


def opt(
    default: Any,
    help: str,
    choices: tuple | None = None,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    path: str | None = None,
    free: str | None = None,
) -> Any:
    """A config field: ``default``, its one-line ``help`` and what values are valid, checked at load with the key
    named (``epr.config.config_from_dict``): ``choices`` for a finite set (for a tuple field: the values each
    element may take); ``ge`` / ``gt`` / ``le`` the bounds of a number (each element of a tuple; null, where the
    type allows it, is always valid); ``path`` the kind of path (:data:`PATH_KINDS`); or ``free``: why any value
    of the field's type is valid (or where else it is checked). ``tests/test_config_ranges.py`` fails on a number
    or a path without a range, and on any other field (not a bool, not with choices) without one of these."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("config defaults must be immutable (a tuple, not a list)")
    if choices is not None and not all(
        x in choices for x in (default if isinstance(default, tuple) else (default,))
    ):
        raise TypeError(f"default {default!r} is not among its choices {choices}")
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = tuple(choices)
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le)) if v is not None}
    if bounds:
        meta["range"] = bounds
        bad = [x for x in (default if isinstance(default, tuple) else (default,)) if out_of_range(x, bounds)]
        if bad:
            raise TypeError(f"default {default!r} is outside its range {range_text(bounds)}")
    if path is not None:
        if path not in PATH_KINDS:
            raise TypeError(f"path kind {path!r}: one of {', '.join(PATH_KINDS)}")
        meta["path"] = path
    if free is not None:
        meta["free"] = free
    return field(default=default, metadata=meta)


def range_text(bounds: dict[str, float]) -> str:
    """``{"ge": 1}`` -> ``">= 1"``, ``{"ge": 0, "le": 1}`` -> ``"in [0, 1]"``, ``{"gt": 0, "le": 1}`` -> ``"in (0, 1]"``."""

    def num(v: float) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)

    lo = ("[", bounds["ge"]) if "ge" in bounds else ("(", bounds["gt"]) if "gt" in bounds else None
    if lo is not None and "le" in bounds:
        return f"in {lo[0]}{num(lo[1])}, {num(bounds['le'])}]"
    ops = {"ge": ">=", "gt": ">", "le": "<="}
    return " and ".join(f"{ops[k]} {num(v)}" for k, v in bounds.items())


def out_of_range(value: Any, bounds: dict[str, float]) -> bool:
    """Whether the number ``value`` is outside ``bounds`` (written so that NaN is always outside); None is inside."""
    if value is None:
        return False
    ok = {"ge": lambda b: value >= b, "gt": lambda b: value > b, "le": lambda b: value <= b}
    return not all(ok[k](b) for k, b in bounds.items())


def path_problem(value: Any, kind: str) -> str | None:
    """What is wrong with ``value`` as a path of ``kind`` (:data:`PATH_KINDS`), or None; null is always valid."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"expected a path (text), got {type(value).__name__}"
    if not value.strip():
        return "an empty path (write null for none)"
    if any(c in value for c in "\x00\n\r"):
        return "holds a NUL byte or a line break"
    try:
        os.fsencode(value)
    except UnicodeEncodeError as e:
        return f"holds {value[e.start]!r}, which no file name can hold (a lone surrogate)"
    if kind == "run-name":
        parts = value.replace("\\", "/").split("/")
        if value.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return "must be a relative path of names under run_root (no '.' or '..' part, no leading or doubled '/')"
    return None


def section_field(cls: type) -> Any:
    """A section of :class:`ExperimentConfig`; its help is the first line of the section's docstring."""
    return field(default_factory=cls, metadata={"help": (cls.__doc__ or "").strip().splitlines()[0]})
