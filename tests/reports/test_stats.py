"""Paired comparison of retrievers: exact McNemar p-values (checked against scipy) and the per-pair counts."""

from __future__ import annotations

import numpy as np
import pytest

from epr.reports.stats import gap_fraction_ci, mcnemar_exact, paired_rows


@pytest.mark.parametrize("a_only, b_only", [(0, 0), (3, 0), (20, 18), (5, 15), (1, 9), (40, 12), (0, 7)])
def test_mcnemar_matches_scipy_binomtest(a_only, b_only):
    stats = pytest.importorskip("scipy.stats")
    n = a_only + b_only
    ref = 1.0 if n == 0 else stats.binomtest(min(a_only, b_only), n, 0.5).pvalue
    assert mcnemar_exact(a_only, b_only) == pytest.approx(ref, rel=1e-9)
    assert mcnemar_exact(a_only, b_only) == mcnemar_exact(b_only, a_only)


def test_paired_rows_counts_by_hand():
    q = [
        {"x": {"correct": True, "demos": [1, 2]}, "y": {"correct": False, "demos": [2, 3]}},
        {"x": {"correct": True, "demos": [4]}, "y": {"correct": True, "demos": [4]}},
        {"x": {"correct": False, "demos": [5]}, "y": {"correct": True, "demos": [6]}},
        {"x": {"correct": False, "demos": [7]}, "y": {"correct": False, "demos": [7]}},
    ]
    (r,) = paired_rows(q, ["x", "y"])
    assert (r["a"], r["b"], r["a_only"], r["b_only"], r["both"]) == ("x", "y", 1, 1, 1)
    assert r["p_mcnemar"] == 1.0
    assert r["demo_overlap"] == pytest.approx(3 / 5)  # y's demos 2, 4, 7 of 2, 3, 4, 6, 7 are in x's prompts


def test_gap_fraction_ci_by_hand_and_paired():
    rng = np.random.default_rng(0)
    n = 400
    shared = rng.normal(-20, 8, n)  # what every retriever shares per example (the example's difficulty)
    base = shared + rng.normal(0, 1, n)
    top = shared + 6 + rng.normal(0, 1, n)
    row = shared + 1.5 + rng.normal(0, 1, n)
    point, lo, hi = gap_fraction_ci(row, base, top)
    assert point == pytest.approx((row.mean() - base.mean()) / (top.mean() - base.mean()))
    assert lo < point < hi and 0.15 < lo and hi < 0.35  # ~0.25, and paired: the shared spread of 8 cancels
    # unpaired resampling would not cancel it: the same data with examples shuffled between rows is far wider
    _, lo_u, hi_u = gap_fraction_ci(rng.permutation(row), base, rng.permutation(top))
    assert hi_u - lo_u > 3 * (hi - lo)
    # the ends of the scale, and the examples one row did not score left out of all three
    assert gap_fraction_ci(base, base, top)[0] == 0.0
    assert gap_fraction_ci(top, base, top)[0] == pytest.approx(1.0)
    holes = list(row[:-2]) + [None, float("nan")]
    assert gap_fraction_ci(holes, base, top)[0] == pytest.approx(
        (row[:-2].mean() - base[:-2].mean()) / (top[:-2].mean() - base[:-2].mean())
    )
    assert all(np.isnan(gap_fraction_ci(row, base, base)))  # no gap: no fraction
