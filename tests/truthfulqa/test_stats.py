import numpy as np
import pytest

from epr.truthfulqa import stats as ts


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


def _run_dir(tmp_path, name, bias_shift):
    """A tqa_report folder of one LM: rel+div+bias = rel+div shifted by ``bias_shift`` nats per question."""
    import json

    from epr.artifacts import write_jsonl

    rng = np.random.default_rng(0)
    base = _rows(rng.normal(-2, 1, 60).tolist(), [3] * 60, rng.integers(0, 2, 60).tolist())
    sets = {
        "fix": base,
        "rel+div": base,
        "rel+div+bias": [dict(r, dpo_sum=r["dpo_sum"] + bias_shift) for r in base],
    }
    d = tmp_path / name
    d.mkdir()
    info = {
        "version": "2021-10",
        "lm": name,
        "dtype": "fp32",
        "device": "cpu",
        "machine": "test",
        "seconds": {},
    }
    idx = ts.boot_indices(60)
    variants = {v: {m: list(ts.metric_ci(rs, m, idx)) for m in ts.METRICS} for v, rs in sets.items()}
    (d / "results.json").write_text(json.dumps({"info": info, "variants": variants}))
    write_jsonl(d / "per_question.jsonl", [dict(r, set=v) for v, rs in sets.items() for r in rs])
    return d


def test_findings_across_lms_name_a_bias_that_helps_one_and_hurts_the_other(tmp_path):
    from epr.cli.truthfulqa import findings_main as main

    a, b, c = (
        _run_dir(tmp_path, "lm-a", +0.6),
        _run_dir(tmp_path, "lm-b", -0.6),
        _run_dir(tmp_path, "lm-c", +0.3),
    )
    assert main([str(a), str(b), "--out", str(tmp_path / "f.md")]) == 0
    md = (tmp_path / "f.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| rel+div+bias - rel+div: lm-a"))
    assert (
        "+0.4000 [+0.4000, +0.4000] reproduces (helps one, hurts the other)" in row
    )  # (0.6 - -0.6) / 3 triplets
    main([str(a), str(c), "--out", str(tmp_path / "g.md")])
    row = next(
        ln
        for ln in (tmp_path / "g.md").read_text().splitlines()
        if ln.startswith("| rel+div+bias - rel+div: lm-a")
    )
    assert "differs between the LMs, not in sign" in row
