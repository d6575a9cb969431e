"""Eval subsets (seeded, dev / locked), intervals, McNemar and paired rows for comparison tables (pure functions)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "mean_ci",
    "mcnemar_exact",
    "paired_rows",
    "seeded_subset",
    "seeded_groups",
    "eval_part",
    "paired_gain",
    "holm",
    "PAPER",
]

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


def seeded_subset(n: int, limit: int | None, seed: int) -> np.ndarray:
    """Sorted positions of a seeded random subset of ``limit`` of ``n`` items (all of them when ``limit`` is None or
    not smaller than ``n``): the one way every evaluation subset is drawn."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, limit, replace=False))


def seeded_groups(keys: Sequence[str], size: int, seed: int) -> np.ndarray:
    """Sorted positions of whole groups drawn in a seeded order until at least ``size`` rows are taken (the last
    group may overshoot): ``keys[i]`` is row i's group (a dialogue, say), so a group is never cut in two. The one
    way a group-respecting part is drawn (the pool / eval split of a task with groups, the ``groups`` dev cut)."""
    uniq = sorted(set(keys))
    order = np.random.default_rng(seed).permutation(len(uniq))
    counts: dict[str, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    chosen: set[str] = set()
    n = 0
    for j in order:
        if n >= size:
            break
        chosen.add(uniq[j])
        n += counts[uniq[j]]
    return np.array([i for i, k in enumerate(keys) if k in chosen], dtype=np.int64)


def eval_part(
    n: int, limit: int | None, part: str, seed: int, groups: Sequence[str] | None = None
) -> np.ndarray:
    """Positions of the compared part of an eval split of ``n`` rows: ``dev``, the seeded subset of ``limit``
    (all rows when ``limit`` is None), where every choice is made; ``locked``, the rows ``dev`` leaves out,
    evaluated once at the end (``data.eval_part``'s choices, checked when the config loads). With ``groups``
    (row i's group, ``data.eval_cut=groups``) dev is whole groups of at least ``limit`` rows, so no group has rows
    on both sides."""
    if groups is not None and len(groups) != n:
        raise ValueError(f"eval_part: {len(groups)} group keys for {n} rows")
    if groups is None or limit is None or limit >= n:
        dev = seeded_subset(n, limit, seed)
    else:
        dev = seeded_groups(groups, limit, seed)
    if part == "dev":
        return dev
    if limit is None or limit >= n or len(dev) >= n:
        raise ValueError(
            f"data.eval_part=locked needs data.eval_limit below the eval split's {n} rows (the dev subset whose "
            "complement is locked away)"
        )
    return np.setdiff1d(np.arange(n), dev)


def paired_gain(a: np.ndarray, b: np.ndarray) -> dict:
    """Mean gain a - b over the examples both scored (NaN: not scored), its Wilcoxon signed-rank p (a test of
    ranks), the mean's one-sample t-test p and Student 95% CI (what stands behind a *mean* gain), the median gain
    and the fraction of examples where a is higher."""
    from scipy.stats import t as student_t
    from scipy.stats import ttest_1samp, wilcoxon

    d = (a - b)[~(np.isnan(a) | np.isnan(b))]
    if len(d) == 0 or not np.any(d):
        return {
            "gain": 0.0,
            "p": 1.0,
            "p_ttest": 1.0,
            "gain_ci": [0.0, 0.0],
            "median_gain": 0.0,
            "win_rate": 0.0,
        }
    half = (
        float(student_t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
        if len(d) > 1
        else math.inf
    )
    return {
        "gain": float(d.mean()),
        "p": float(wilcoxon(d).pvalue),
        "p_ttest": float(ttest_1samp(d, 0.0).pvalue) if len(d) > 1 else 1.0,
        "gain_ci": [float(d.mean() - half), float(d.mean() + half)],
        "median_gain": float(np.median(d)),
        "win_rate": float(np.mean(d > 0)),
    }


def holm(ps: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values of one family, in the order given."""
    order = np.argsort(ps, kind="stable")
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * float(ps[i])))
        out[i] = running
    return out


def mean_ci(
    x: Sequence[float], n_boot: int = 1000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float, float]:
    """Mean and a percentile-bootstrap (1 - alpha) interval, in the units of ``x``."""
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return float("nan"), float("nan"), float("nan")
    boots = np.random.default_rng(seed).choice(a, size=(n_boot, a.size), replace=True).mean(1)
    return float(a.mean()), float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))


def gap_fraction_ci(
    row: Sequence, base: Sequence, top: Sequence, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05
) -> tuple[float, float, float]:
    """How much of the gap from ``base`` to ``top`` a ``row`` closes, ``(mean(row) - mean(base)) / (mean(top) -
    mean(base))``, over the examples all three scored (None / NaN elsewhere), with a paired percentile-bootstrap
    (1 - alpha) interval: the examples are resampled together, so what the three share cancels as in the paired
    tests. The learning curve's ``oracle_gap_captured`` (base BM25, top LM-Oracle). NaNs when no example is left
    or the gap is zero."""
    m = np.array([[np.nan if v is None else float(v) for v in x] for x in (row, base, top)], dtype=np.float64)
    m = m[:, np.isfinite(m).all(0)]
    nan = (float("nan"),) * 3
    if m.shape[1] == 0 or m[2].mean() == m[1].mean():
        return nan
    point = (m[0].mean() - m[1].mean()) / (m[2].mean() - m[1].mean())
    idx = np.random.default_rng(seed).integers(0, m.shape[1], size=(n_boot, m.shape[1]))
    means = m[:, idx].mean(2)  # (3, n_boot)
    den = means[2] - means[1]
    boots = (means[0] - means[1])[den != 0] / den[den != 0]
    return float(point), float(np.quantile(boots, alpha / 2)), float(np.quantile(boots, 1 - alpha / 2))


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value for paired right/wrong outcomes: under "no difference" the discordant
    examples split like fair coin flips, p = P(|X - n/2| >= |a_only - n/2|), X ~ Binomial(n, 1/2)."""
    n = a_only + b_only
    if n == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def paired_rows(per_query: Sequence[Mapping], names: Sequence[str], key: str = "correct") -> list[dict]:
    """For every pair of retrievers (a, b): examples only a solves, only b solves, both, the McNemar p-value,
    and how many of b's demonstrations also appear in a's prompt (demo overlap)."""
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            ra = [bool(q[a][key]) for q in per_query]
            rb = [bool(q[b][key]) for q in per_query]
            a_only = sum(x and not y for x, y in zip(ra, rb))
            b_only = sum(y and not x for x, y in zip(ra, rb))
            shared = [len(set(q[a]["demos"]) & set(q[b]["demos"])) for q in per_query]
            total_b = sum(len(q[b]["demos"]) for q in per_query)
            rows.append(
                {
                    "a": a,
                    "b": b,
                    "a_only": a_only,
                    "b_only": b_only,
                    "both": sum(x and y for x, y in zip(ra, rb)),
                    "p_mcnemar": mcnemar_exact(a_only, b_only),
                    "demo_overlap": sum(shared) / total_b if total_b else float("nan"),
                }
            )
    return rows
