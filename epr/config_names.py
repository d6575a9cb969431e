"""The vocabulary of a config: the names it may choose from (first-stage retrievers with their RAGSys suffixes,
TruthfulQA variants) and :func:`opt`, how every section declares a field.

Plain tuples, one parser and the field helpers, no imports beyond the types: loading a config imports neither numpy
nor ragsys.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, NamedTuple

from epr.types import ConfigError

__all__ = [
    "opt",
    "section_field",
    "RETRIEVERS",
    "DENSE",
    "RAGSYS_SUFFIXES",
    "RetrieverName",
    "parse_retriever_name",
    "TQA_VARIANTS",
    "TQA_LEARNED_VARIANTS",
]

# First-stage retrievers; a dense one (DENSE) may carry the RAGSys suffixes +div / +div+bias (checked at load).
# hybrid: reciprocal-rank fusion of epr (the trained dual encoder) and bm25
RETRIEVERS = ("random", "bm25", "sbert", "epr", "dr-bm25", "bm25-oracle", "lm-oracle", "hybrid")
DENSE = ("sbert", "epr", "dr-bm25")
RAGSYS_SUFFIXES = ("div", "bias")


class RetrieverName(NamedTuple):
    base: str  # the first stage
    div: bool  # +div: MMR diversity (ragsys.lambda_d)
    bias: bool  # +bias: the LM quality bias (ragsys.lambda_b)


def parse_retriever_name(name: str) -> RetrieverName:
    """``"epr+div+bias"`` -> ``("epr", True, True)``: the one reading of a retriever name (config checks, stages,
    ``epr inspect``, scripts). Bias without diversity is written ``+div+bias`` with ``ragsys.lambda_d = 1``; a bare
    ``+bias`` is accepted too. An unknown suffix is a ``ConfigError``."""
    base, *suffixes = name.split("+")
    bad = [s for s in suffixes if s not in RAGSYS_SUFFIXES]
    if bad:
        raise ConfigError(
            f"retrieve.retrievers: {name!r}: unknown suffix +{bad[0]} (RAGSys suffixes: +div, +div+bias)"
        )
    return RetrieverName(base, "div" in suffixes, "bias" in suffixes)


# TruthfulQA variants: "fix" plus the re-rankers of ragsys.VARIANTS (a test keeps the two equal; no import here, so
# that loading a config imports neither numpy nor ragsys)
TQA_VARIANTS = ("fix", "bias", "rel", "rel+bias", "rel+div", "rel+div+bias")
# the learned relevance (epr.truthfulqa.learned): rel / rel+div on a dual encoder trained on the scoring LM's labels
TQA_LEARNED_VARIANTS = ("epr", "epr+div")


def opt(default: Any, help: str, choices: tuple | None = None) -> Any:
    """A config field: ``default``, its one-line ``help`` and, for a finite set of valid values, ``choices`` (for
    a tuple field: the values each element may take). The loader rejects a value outside ``choices``."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("config defaults must be immutable (a tuple, not a list)")
    if choices is not None and not all(
        x in choices for x in (default if isinstance(default, tuple) else (default,))
    ):
        raise TypeError(f"default {default!r} is not among its choices {choices}")
    meta = {"help": help} if choices is None else {"help": help, "choices": tuple(choices)}
    return field(default=default, metadata=meta)


def section_field(cls: type) -> Any:
    """A section of :class:`ExperimentConfig`; its help is the first line of the section's docstring."""
    return field(default_factory=cls, metadata={"help": (cls.__doc__ or "").strip().splitlines()[0]})
