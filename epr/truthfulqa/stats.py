"""TruthfulQA statistics over questions (pure): bootstrap intervals, paired differences and the paper's findings.

Every interval resamples *questions* (the unit the data is drawn in), with one seeded set of resamples shared by
all statistics, so a paired difference is computed on the same resampled questions for both variants. DPO is a mean
over triplets (a ratio of per-question sums to per-question triplet counts), every other metric a mean over
questions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "METRICS",
    "FINDINGS",
    "boot_indices",
    "ratio_ci",
    "metric_ci",
    "paired_ci",
    "interaction_ci",
    "verdict",
    "findings",
]

METRICS = ("dpo", "mc1", "paper_mc2", "paper_mc3")
SHORT = {"dpo": "DPO", "mc1": "MC1", "paper_mc2": "paper-MC2", "paper_mc3": "paper-MC3"}

# The paper's three findings (SPEC 3.6), each as comparisons (a - b) and the direction the paper reports.
# The third is about two LMs: per LM the sign of the bias's effect, and whether it differs between the LMs.
FINDINGS = (
    ("relevance beats the fixed primer", (("rel", "fix"),), +1),
    ("diversity adds on top of relevance", (("rel+div", "rel"), ("rel+div+bias", "rel+bias")), +1),
    ("the quality bias helps one LM and hurts the other",
     (("rel+div+bias", "rel+div"), ("rel+bias", "rel"), ("bias", "fix")), 0),
    # not the paper's: the learned relevance (epr.truthfulqa.learned) against the frozen encoder it starts from
    ("the learned retriever beats the frozen relevance", (("epr", "rel"), ("epr+div", "rel+div")), +1),
)  # fmt: skip


def fmt_ci(v: Sequence[float], digits: int = 3, signed: bool = False) -> str:
    """``value [low, high]`` of a ``(value, low, high)`` triple; ``signed``: with a sign, for differences."""
    f = f"{'+' if signed else ''}.{digits}f"
    return f"{v[0]:{f}} [{v[1]:{f}}, {v[2]:{f}}]"


def boot_indices(n: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """``(n_boot, n)`` resampled question positions, the same for every statistic of one report."""
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def ratio_ci(
    num: Sequence[float], den: Sequence[float] | None, idx: np.ndarray, alpha: float = 0.05
) -> tuple[float, float, float]:
    """``sum(num) / sum(den)`` (``den`` None: a mean) and its percentile-bootstrap interval over ``idx``."""
    a = np.asarray(num, dtype=np.float64)
    d = np.ones_like(a) if den is None else np.asarray(den, dtype=np.float64)
    if a.size == 0 or d.sum() == 0:
        return float("nan"), float("nan"), float("nan")
    boots = a[idx].sum(1) / np.maximum(d[idx].sum(1), 1e-12)
    return (
        float(a.sum() / d.sum()),
        float(np.quantile(boots, alpha / 2)),
        float(np.quantile(boots, 1 - alpha / 2)),
    )


def metric_ci(rows: Sequence[dict], metric: str, idx: np.ndarray) -> tuple[float, float, float]:
    """One variant's metric over its per-question rows (``question_row``), with its interval."""
    if metric == "dpo":
        return ratio_ci([r["dpo_sum"] for r in rows], [r["dpo_n"] for r in rows], idx)
    if metric == "dpo_q":  # each question's sum over its triplets, averaged over questions
        return ratio_ci([r["dpo_sum"] for r in rows], None, idx)
    return ratio_ci([r[metric] for r in rows], None, idx)


def paired_ci(
    a: Sequence[dict], b: Sequence[dict], metric: str, idx: np.ndarray
) -> tuple[float, float, float]:
    """``metric(a) - metric(b)`` on the same questions (rows in the same order), with its paired interval."""
    if [r["qi"] for r in a] != [r["qi"] for r in b]:
        raise ValueError("paired rows must be the same questions in the same order")
    if metric == "dpo":
        return ratio_ci([x["dpo_sum"] - y["dpo_sum"] for x, y in zip(a, b)], [x["dpo_n"] for x in a], idx)
    return ratio_ci([x[metric] - y[metric] for x, y in zip(a, b)], None, idx)


def verdict(lo: float, hi: float, sign: int) -> str:
    """``reproduces`` / ``reversed`` when the interval excludes 0 (in / against the expected ``sign``),
    else ``not separable``; with ``sign`` 0 (no expected direction): ``helps`` / ``hurts`` / ``not separable``."""
    if lo > 0:
        return "helps" if sign == 0 else ("reproduces" if sign > 0 else "reversed")
    if hi < 0:
        return "hurts" if sign == 0 else ("reproduces" if sign < 0 else "reversed")
    return "not separable"


def findings(per_q: dict[str, list[dict]], idx: np.ndarray, metrics: Sequence[str] = METRICS) -> list[dict]:
    """Every comparison of ``FINDINGS`` whose two variants were run: the paired difference per metric and the
    verdict at 95%."""
    out = []
    for title, pairs, sign in FINDINGS:
        for a, b in pairs:
            if a not in per_q or b not in per_q:
                continue
            diffs = {m: paired_ci(per_q[a], per_q[b], m, idx) for m in metrics}
            out.append(
                {"finding": title, "a": a, "b": b, "sign": sign,
                 "diff": {m: list(v) for m, v in diffs.items()},
                 "verdict": {m: verdict(v[1], v[2], sign) for m, v in diffs.items()}}
            )  # fmt: skip
    return out


def interaction_ci(
    lm1: tuple[Sequence[dict], Sequence[dict]],
    lm2: tuple[Sequence[dict], Sequence[dict]],
    metric: str,
    idx: np.ndarray,
) -> tuple[float, float, float]:
    """How much more ``a - b`` gains under one LM than under another, ``(a1 - b1) - (a2 - b2)``, paired by question
    (both LMs scored the same questions): whether an effect differs between LMs, with its interval."""
    (a1, b1), (a2, b2) = lm1, lm2
    if not [r["qi"] for r in a1] == [r["qi"] for r in b1] == [r["qi"] for r in a2] == [r["qi"] for r in b2]:
        raise ValueError("interaction rows must be the same questions in the same order")
    key = "dpo_sum" if metric == "dpo" else metric
    num = [w[key] - x[key] - (y[key] - z[key]) for w, x, y, z in zip(a1, b1, a2, b2)]
    return ratio_ci(num, [r["dpo_n"] for r in a1] if metric == "dpo" else None, idx)
