"""The reward model's section (``reward``): a cross-encoder that reads a query and a demonstration together, trained
on the LM's scores of every labelled candidate (``epr.reward``), that re-ranks a first stage's top K."""

from __future__ import annotations

from dataclasses import dataclass

from epr.config.names import MODEL, SEED, opt


@dataclass(frozen=True)
class RewardConfig:
    """The reward model (epr/reward/): its backbone, training on the labels, and its re-ranking depth."""

    backbone: str = opt(
        "minilm", "the cross-encoder's pretrained encoder (minilm, mpnet, a hub id or a folder)", free=MODEL
    )
    max_length: int = opt(
        160, "tokens of a [query; demonstration] pair (longer pairs are cut, counted)", ge=16
    )
    epochs: int = opt(2, "passes over the labelled examples (0: the untrained reward model)", ge=0)
    batch_size: int = opt(8, "labelled examples per optimizer step (per process)", ge=1)
    list_size: int = opt(
        8, "of each example's scored candidates per step (the best and a seeded sample)", ge=2
    )
    lr: float = opt(3e-5, "AdamW learning rate (linear decay after a 10% warm-up)", gt=0)
    teacher_temperature: float = opt(1.0, "the LM scores' temperature in the listwise KL target", gt=0)
    dev_size: int = opt(100, "labelled examples held out for the per-epoch dev metrics (0: none)", ge=0)
    seed: int = opt(42, "seed of the sampling, the dev split and the head's initialisation", **SEED)
    checkpoint_every: int = opt(
        200, "optimizer steps between resumable checkpoints (0: per epoch only)", ge=0
    )
    top_k: int = opt(32, "a re-ranking retriever's first-stage candidates re-scored per query", ge=1)
    teach_k: int = opt(
        64,
        "train.teacher: reward: candidates per labelled example, mined as the round mines, it scores",
        ge=2,
    )
