"""The TruthfulQA sections of the configuration: RAGSys re-ranking (``ragsys``) and the TruthfulQA stages
(``truthfulqa``)."""

from __future__ import annotations

from dataclasses import dataclass

from epr.config.names import TQA_LEARNED_VARIANTS, TQA_VARIANTS, opt
from epr.types import ConfigError


@dataclass(frozen=True)
class RagsysConfig:
    """RAGSys re-ranking (Algorithm 1: relevance, MMR diversity, LM quality bias) of +div / +div+bias retrievers."""

    k: int = opt(6, "TruthfulQA: demonstrations per question (elsewhere retrieve.max_demos)", ge=1)
    lambda_d: float = opt(0.75, "weight of relevance against diversity (1: no diversity)", ge=0.0, le=1.0)
    lambda_b: float = opt(0.95, "weight of relevance against the quality bias (1: no bias)", ge=0.0, le=1.0)


@dataclass(frozen=True)
class TruthfulQAConfig:
    """The TruthfulQA stages (epr/truthfulqa/stage.py); k, lambda_d and lambda_b come from ``ragsys``, the LM from
    ``models.lm`` / ``models.dtype``, the relevance encoder from ``models.encoder``, the files from ``data.data_dir``."""

    version: str = opt(
        "2021-10", "2021-10 (SPEC 3.4) | v0 (the copy HF / lm-evaluation-harness use)", ("2021-10", "v0")
    )
    variants: tuple[str, ...] = opt(
        TQA_VARIANTS,
        "the compared variants (distinct); epr / epr+div: rel / rel+div with the learned retriever (k-fold)",
        TQA_VARIANTS + TQA_LEARNED_VARIANTS,
    )
    limit: int | None = opt(
        None,
        "a seeded subset (seed: the top-level seed) of the 817 questions; the pool stays whole; null: all",
        ge=1,
    )
    sweep: tuple[float, ...] = opt(
        (), "lambda_d values of the calibration sweep (rel+div+bias); empty: none", ge=0.0, le=1.0
    )
    chunk_size: int = opt(32, "questions per resumable chunk of scores", ge=1)
    label_candidates: int = opt(
        16, "learned variants: D_ICL pairs per question scored by the LM (the frozen relevance's top L)", ge=2
    )
    folds: int = opt(
        5,
        "learned variants: question folds; fold f's retriever trains on the labels of the other folds",
        ge=2,
    )

    def __post_init__(self):
        if not self.variants or len(set(self.variants)) != len(self.variants):
            raise ConfigError(f"config truthfulqa.variants: {list(self.variants)}: expected distinct names")
        try:
            sweep = tuple(float(x) for x in self.sweep)
        except (TypeError, ValueError):
            raise ConfigError(
                f"config truthfulqa.sweep: {self.sweep!r}: expected numbers in [0, 1]"
            ) from None
        object.__setattr__(self, "sweep", sweep)  # the elements' range: opt(..., ge=0, le=1), checked at load
