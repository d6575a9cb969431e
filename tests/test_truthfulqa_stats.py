import numpy as np
import pytest

from epr import truthfulqa_stats as ts


def _rows(dpo_sums, dpo_ns, mc1):
    return [
        {"qi": i, "dpo_sum": s, "dpo_n": n, "mc1": m, "paper_mc2": m, "paper_mc3": m}
        for i, (s, n, m) in enumerate(zip(dpo_sums, dpo_ns, mc1))
    ]


def test_dpo_is_a_mean_over_triplets_and_its_interval_resamples_questions():
    a = _rows([-3.0, -1.0, -6.0], [3, 1, 1], [1, 0, 1])
    idx = ts.boot_indices(3, 500, 0)
    v, lo, hi = ts.metric_ci(a, "dpo", idx)
    assert v == pytest.approx(-10.0 / 5)  # over triplets; the mean of per-question means would be -8/3
    assert ts.metric_ci(a, "mc1", idx)[0] == pytest.approx(2 / 3)
    # by hand: each resample's total over its triplets
    s, n = np.array([-3.0, -1.0, -6.0]), np.array([3, 1, 1])
    boots = s[idx].sum(1) / n[idx].sum(1)
    assert (lo, hi) == (pytest.approx(np.quantile(boots, 0.025)), pytest.approx(np.quantile(boots, 0.975)))


def test_paired_difference_equals_difference_of_metrics_and_is_zero_on_itself():
    rng = np.random.default_rng(1)
    a = _rows(rng.normal(-2, 1, 40), rng.integers(1, 9, 40), rng.integers(0, 2, 40))
    b = [dict(r, dpo_sum=r["dpo_sum"] + rng.normal(0.5, 0.2), mc1=1 - r["mc1"]) for r in a]
    idx = ts.boot_indices(40)
    for m in ts.METRICS:
        d = ts.paired_ci(b, a, m, idx)
        assert d[0] == pytest.approx(ts.metric_ci(b, m, idx)[0] - ts.metric_ci(a, m, idx)[0])
        assert d[1] <= d[0] <= d[2]
        assert ts.paired_ci(a, a, m, idx) == (0.0, 0.0, 0.0)
    # a consistent shift of +0.5 nats per question on ~4.5 triplets: separable, and paired tighter than unpaired
    d = ts.paired_ci(b, a, "dpo", idx)
    assert d[1] > 0
    ua, ub = ts.metric_ci(a, "dpo", idx), ts.metric_ci(b, "dpo", idx)
    assert d[2] - d[1] < (ua[2] - ua[1]) + (ub[2] - ub[1])
    with pytest.raises(ValueError, match="same questions"):
        ts.paired_ci(a, a[::-1], "mc1", idx)


def test_verdicts_and_findings():
    assert ts.verdict(0.1, 0.3, +1) == "reproduces" and ts.verdict(-0.3, -0.1, +1) == "reversed"
    assert ts.verdict(-0.1, 0.3, +1) == "not separable" and ts.verdict(0.0, 0.3, +1) == "not separable"
    assert ts.verdict(0.1, 0.3, 0) == "helps" and ts.verdict(-0.3, -0.1, 0) == "hurts"
    base = _rows([-2.0] * 30, [2] * 30, [0] * 30)
    per_q = {"fix": base, "rel": [dict(r, mc1=1, dpo_sum=-1.0) for r in base]}
    f = ts.findings(per_q, ts.boot_indices(30))
    assert [(x["a"], x["b"]) for x in f] == [("rel", "fix")]  # only comparisons whose variants ran
    assert f[0]["verdict"]["mc1"] == "reproduces" and f[0]["diff"]["dpo"][0] == pytest.approx(0.5)
