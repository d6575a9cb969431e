"""Typed, frozen configuration: one dataclass per stage (:mod:`epr.config.sections`, each field declared once with
its default, help and choices), filled from YAML plus ``--set a.b=v`` overrides and checked (:mod:`epr.config.loading`:
unknown keys and values outside a field's choices are ``ConfigError``s naming the key), printed back as commented
YAML by :func:`dump_config` (:mod:`epr.config.dump`, ``epr config``)."""

from epr.config.dump import dump_config
from epr.config.loading import (
    config_from_dict,
    load_config,
    train_loss_weight,
    train_temperature,
)
from epr.config.sections import (
    DENSE,
    RETRIEVERS,
    CandidatesConfig,
    DataConfig,
    ExperimentConfig,
    GenerateConfig,
    LabelsConfig,
    ModelsConfig,
    PromptConfig,
    RagsysConfig,
    RetrieveConfig,
    ScoringConfig,
    SelectConfig,
    ServerConfig,
    TrainConfig,
    TruthfulQAConfig,
    parse_retriever_name,
)
from epr.types import ConfigError

__all__ = [
    "ExperimentConfig",
    "DataConfig",
    "ModelsConfig",
    "CandidatesConfig",
    "ScoringConfig",
    "LabelsConfig",
    "TrainConfig",
    "RetrieveConfig",
    "SelectConfig",
    "GenerateConfig",
    "PromptConfig",
    "RagsysConfig",
    "TruthfulQAConfig",
    "ServerConfig",
    "load_config",
    "config_from_dict",
    "dump_config",
    "train_temperature",
    "train_loss_weight",
    "RETRIEVERS",
    "DENSE",
    "parse_retriever_name",
    "ConfigError",
]
