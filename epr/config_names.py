"""The names a config may choose from: first-stage retrievers with their RAGSys suffixes, and TruthfulQA variants.

Plain tuples and one parser, no imports beyond the types: loading a config imports neither numpy nor ragsys.
"""

from __future__ import annotations

from typing import NamedTuple

from epr.types import ConfigError

__all__ = [
    "RETRIEVERS",
    "DENSE",
    "RAGSYS_SUFFIXES",
    "RetrieverName",
    "parse_retriever_name",
    "TQA_VARIANTS",
    "TQA_LEARNED_VARIANTS",
]

# First-stage retrievers; a dense one (DENSE) may carry the RAGSys suffixes +div / +div+bias (checked at load).
RETRIEVERS = ("random", "bm25", "sbert", "epr", "dr-bm25", "bm25-oracle", "lm-oracle")
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
