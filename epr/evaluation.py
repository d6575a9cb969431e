"""Scores and intervals for comparison tables (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["mean_ci", "PAPER"]

# SPEC 2.8: GPT-Neo 2.7B, dev sets (EM; LF-EM for BREAK)
PAPER = {
    "break": {
        "random": 1.7,
        "sbert": 21.6,
        "bm25": 26.0,
        "dr-bm25": 23.6,
        "epr": 31.9,
        "bm25-oracle": 32.3,
        "lm-oracle": 43.1,
    },
    "mtop": {
        "random": 7.3,
        "sbert": 48.7,
        "bm25": 52.9,
        "dr-bm25": 50.2,
        "epr": 64.2,
        "bm25-oracle": 58.9,
        "lm-oracle": 71.6,
    },
    "smcalflow": {
        "random": 8.9,
        "sbert": 43.6,
        "bm25": 46.1,
        "dr-bm25": 43.1,
        "epr": 54.3,
        "bm25-oracle": 47.3,
        "lm-oracle": 73.7,
    },
}


def mean_ci(
    x: Sequence[float], n_boot: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float, float]:
    """Mean and a percentile-bootstrap (1 - alpha) interval, in the units of ``x``."""
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return float("nan"), float("nan"), float("nan")
    boots = np.random.default_rng(seed).choice(a, size=(n_boot, a.size), replace=True).mean(1)
    return float(a.mean()), float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))
