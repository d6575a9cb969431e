"""The config's checks across fields, run by ``load_config`` after each field was read and range-checked."""

from __future__ import annotations

import logging

from epr.config.sections import DENSE, RETRIEVERS, ExperimentConfig, parse_retriever_name
from epr.types import ConfigError

__all__ = ["validate", "MANY_ROUNDS"]

log = logging.getLogger(__name__)

MANY_ROUNDS = 4  # UDR and LLM-R iterate 2-3 times; each round scores its labels anew


def validate(cfg: ExperimentConfig) -> None:
    """What spans fields (each field's own range is declared with it and checked as it is read): refused with the
    keys named; a very large candidates.rounds warned about."""
    if cfg.candidates.rounds > MANY_ROUNDS:
        log.warning(
            "config candidates.rounds=%d: each round mines, scores its labels with the LM and trains anew (the "
            "default recipe's two rounds take most of its time; UDR and LLM-R iterate 2-3 times): about %dx the "
            "labels of one round",
            cfg.candidates.rounds,
            cfg.candidates.rounds,
        )
    # each field's own range is declared with it (opt(..., ge=...)) and checked by config_from_dict; these span fields
    checks = [
        (
            cfg.labels.k_pos + cfg.labels.k_neg <= cfg.candidates.L,
            f"labels.k_pos + labels.k_neg ({cfg.labels.k_pos}+{cfg.labels.k_neg}) must be <= candidates.L ({cfg.candidates.L})",
        ),
        (
            cfg.candidates.mine_run is None or cfg.candidates.miner in ("retriever", "mixed"),
            "candidates.mine_run names the run whose trained encoder mines round 1: set it with "
            f"candidates.miner=retriever or mixed; got miner={cfg.candidates.miner}, mine_run={cfg.candidates.mine_run}",
        ),
        (
            cfg.candidates.miner == "bm25"
            or cfg.candidates.mine_run is not None
            or cfg.candidates.rounds >= 2,
            f"candidates.miner={cfg.candidates.miner} with candidates.rounds=1 needs candidates.mine_run (the run "
            "whose trained encoder mines); or set candidates.rounds >= 2 to re-mine with this run's own round 1",
        ),
        (
            cfg.labels.source == "lm" or (cfg.candidates.miner == "bm25" and cfg.candidates.rounds == 1),
            "labels.source=bm25 ranks candidates by their BM25 scores: it needs candidates.miner=bm25 and "
            f"candidates.rounds=1 (re-mined candidates carry the encoder's scores); got "
            f"miner={cfg.candidates.miner}, rounds={cfg.candidates.rounds}",
        ),
    ]
    for name in cfg.retrieve.retrievers:
        try:
            base, div, bias, rm = parse_retriever_name(name)
        except ConfigError as e:  # its own message (an unknown suffix, +rm with RAGSys's)
            raise ConfigError(f"config: {str(e)}") from None
        suffixes = div or bias
        checks.append(
            (
                base in RETRIEVERS,
                f"retrieve.retrievers: unknown retriever {name!r}; known: {', '.join(RETRIEVERS)}, "
                "with +div / +div+bias (RAGSys) after a dense one",
            )
        )
        checks.append(
            (
                not suffixes or base in DENSE,
                f"retrieve.retrievers: {name!r}: RAGSys re-ranking (+div, +bias) "
                f"needs a dense first stage ({', '.join(DENSE)})",
            )
        )
        checks.append(
            (
                not rm
                or (base not in ("random", "bm25-oracle", "lm-oracle") and cfg.data.task != "truthfulqa"),
                f"retrieve.retrievers: {name!r}: the reward model re-ranks a first stage that ranks (bm25, sbert, "
                "epr, hybrid, dr-bm25) on an EPR task",
            )
        )
    checks.append(
        (
            cfg.train.max_length != 1,
            "train.max_length: 1 keeps only the encoder's [CLS] token; use 0 (from the data) or at least 2",
        )
    )
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"config: {msg}")
