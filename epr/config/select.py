"""The ``select`` section: which trained retriever a run serves, chosen on a held-out slice of its own pool."""

from __future__ import annotations

from dataclasses import dataclass

from epr.config.names import SEED, opt

WEIGHS = ("logprob", "logprob+em")


@dataclass(frozen=True)
class SelectConfig:
    """Which trained retriever serves the run, chosen on a held-out slice of the training pool (never the eval split)."""

    size: int = opt(
        300,
        "pool examples held out (seeded; never labelled, never their own demonstration; at most a fifth of a "
        "wholly labelled pool) the retrievers are compared on; 0: no selection, serve epr",
        ge=0,
    )
    retrievers: tuple[str, ...] = opt(
        ("epr", "hybrid"),
        "the learned retrievers compared with BM25 (the baseline, always compared); +rm: re-ranked by the reward model",
        ("epr", "hybrid", "epr+rm", "hybrid+rm", "bm25+rm"),
    )
    alpha: float = opt(
        0.05, "a learned retriever is served only if it beats BM25 at this Wilcoxon p (two-sided)", gt=0, le=1
    )
    seed: int = opt(0, "seed of the held-out slice", **SEED)
    weigh: str = opt(
        "logprob",
        "among the retrievers that beat BM25, serve the highest mean gold log-prob (logprob), or the highest "
        "greedy exact match read off the same forward pass, then log-prob (logprob+em)",
        WEIGHS,
    )
