"""Paired comparison of retrievers: exact McNemar p-values (checked against scipy) and the per-pair counts."""

from __future__ import annotations

import pytest

from epr.reports.stats import mcnemar_exact, paired_rows


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
