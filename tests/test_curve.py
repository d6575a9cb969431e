"""The learning curve's result rows (epr.reports.curve, used by epr experiment curve): seeds pooled, exact match
paired on the pooled predictions, the split and the fraction of the oracle gap in curve.json (synthetic rows: no
model)."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from epr.experiments.curve import curve_args

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def curve():
    from epr.reports import curve

    return curve


def _row(name, loss, labels, lp, seed=None):
    return {
        "name": name,
        "retriever": name.split("@")[0],
        "loss": loss,
        "labels": labels,
        "seed": seed,
        "seeds": 1,
        "split": "locked",
        "n": len(lp),
        "gold_logprob": float(np.mean(lp)),
        "gold_logprob_ci": [float(np.mean(lp)) - 0.1, float(np.mean(lp)) + 0.1],
        "dpo": -0.5,
        "per_query_logprob": list(lp),
    }


def test_pooled_rows_em_tests_gap_and_row_shape(curve, tmp_path):
    rng = np.random.default_rng(0)
    n = 40
    bm25 = rng.normal(-10, 1, n)
    oracle = bm25 + 2.0
    seeds = [42, 1, 2]
    seed_lp = [bm25 + 0.5 + rng.normal(0, 0.1, n) for _ in seeds]
    rows = [
        _row("bm25", None, None, bm25),
        _row("lm-oracle", None, None, oracle),
        _row("sbert", None, None, bm25 - 1),
    ]
    rows += [_row(curve.seeded("epr@100-distill", s), "distill", 100, lp, s) for s, lp in zip(seeds, seed_lp)]
    curve.add_pooled(rows, 100, "distill", seeds)
    pooled_row = rows[-1]
    assert pooled_row["name"] == "epr@100-distill-pooled" and pooled_row["seeds"] == 3
    assert pooled_row["gold_logprob"] == pytest.approx(np.mean([np.mean(x) for x in seed_lp]))
    np.testing.assert_allclose(pooled_row["per_query_logprob"], np.mean(seed_lp, axis=0))
    # a missing seed: no pooled row
    assert curve.add_pooled(rows[:4], 100, "distill", seeds) is None and len(rows) == 7
    # another learned retriever's seeds of the same point pool on their own, never mixed with epr's
    hyb = [bm25 + 1.0 + rng.normal(0, 0.1, n) for _ in seeds]
    rows += [_row(curve.seeded("hybrid@100-distill", s), "distill", 100, lp, s) for s, lp in zip(seeds, hyb)]
    curve.add_pooled(rows, 100, "distill", seeds, "hybrid")
    assert rows[-1]["name"] == "hybrid@100-distill-pooled" and rows[-1]["retriever"] == "hybrid"
    np.testing.assert_allclose(rows[-1]["per_query_logprob"], np.mean(hyb, axis=0))
    del rows[-4:]

    idx = list(range(n))
    ref = {"idx": idx, "correct": [i % 4 == 0 for i in idx], "prediction": ["x"] * n}
    em = {"bm25": ref, "sbert": ref, "lm-oracle": {**ref, "correct": [True] * n}}
    for s in seeds:  # every seed right where BM25 is, and on 10 more examples
        em[curve.seeded("epr@100-distill", s)] = {**ref, "correct": [i % 4 == 0 or i < 10 for i in idx]}
    em["epr@100-distill-pooled"] = curve.pooled([em[curve.seeded("epr@100-distill", s)] for s in seeds])
    curve.attach_em(rows, em)
    single, pooled_em = rows[3], rows[-1]
    assert single["em"] == pooled_em["em"] == pytest.approx(100 * 17 / 40)
    # one pair per example, not per example x seed: identical seeds carry no more evidence than one seed
    assert single["p_vs_bm25"] == pytest.approx(curve.mcnemar_exact(7, 0))
    assert pooled_em["p_vs_bm25"] == pytest.approx(single["p_vs_bm25"])
    # seeds that disagree: an example counts for EPR only where the seeds' mean beats the reference
    mixed = [{**ref, "correct": [i % 4 == 0 or i < m for i in idx]} for m in (10, 2, 2)]
    p_mixed = curve.paired_p(curve.pooled(mixed), ref, 3)
    assert p_mixed == pytest.approx(curve.mcnemar_exact(7, 0))  # 7 examples with mean > 0 = BM25's 0
    assert curve.paired_p(curve.pooled(mixed), {**ref, "correct": [True] * n}, 3) == pytest.approx(
        curve.mcnemar_exact(0, 29)  # all 3 seeds right on 11 examples (i % 4 == 0, and i = 1)
    )
    assert pooled_em["em_n"] == n and pooled_em["em_sd"] == 0.0  # n counts examples, not examples x seeds

    speed = {"machine": "test box", "scored_here": 3200, "scoring_seconds": 640.0, "sequences_per_s": 5.0}
    a = argparse.Namespace(
        split="locked",
        name="mtop-curve",
        lms="scoring LM smollm2 (fp32)",
        labels_info={"sequences": 32000, "speed": speed},
    )
    curve.write_curve(tmp_path, rows, **curve_args(a, 0.0))
    written = json.loads((tmp_path / "curve.json").read_text())
    assert written["info"]["labels"]["speed"]["sequences_per_s"] == 5.0
    assert (
        "Labels: 32000 scored sequences; the last scoring process scored 3200 at 5.0 sequences/s (test box)."
        in (tmp_path / "curve.md").read_text()
    )
    out = written["rows"]
    by = {(r["retriever"], r["seeds"], r["seed"]): r for r in out}
    p = by[("epr", 3, None)]
    for k in (
        "retriever",
        "loss",
        "labels",
        "n",
        "em",
        "p_vs_bm25",
        "p_vs_sbert",
        "gold_logprob",
        "split",
        "seeds",
    ):
        assert k in p
    assert p["split"] == "locked"
    assert p["n"] == n  # examples, as in the single-seed rows
    # (row - BM25) / (LM-Oracle - BM25), per metric
    assert p["oracle_gap_captured"]["gold_logprob"] == pytest.approx(
        (p["gold_logprob"] - np.mean(bm25)) / (np.mean(oracle) - np.mean(bm25))
    )
    assert p["oracle_gap_captured"]["em"] == pytest.approx((100 * 17 / 40 - 25.0) / (100.0 - 25.0))
    assert by[("bm25", 1, None)]["oracle_gap_captured"]["gold_logprob"] == 0.0
    lo, hi = p["oracle_gap_captured_ci"]["gold_logprob"]  # its paired bootstrap interval, in curve.md too
    assert lo < p["oracle_gap_captured"]["gold_logprob"] < hi
    assert by[("bm25", 1, None)]["oracle_gap_captured_ci"]["gold_logprob"] is None
    assert f"({lo:.2f} to {hi:.2f})" in (tmp_path / "curve.md").read_text()
    # the typical example, beside the heavy-tailed mean: median paired gain and win rate over BM25
    d = np.mean(seed_lp, axis=0) - bm25
    assert p["logprob_median_gain_vs_bm25"] == pytest.approx(np.median(d))
    assert p["logprob_win_rate_vs_bm25"] == pytest.approx(np.mean(d > 0))
    assert p["logprob_gain_vs_bm25"] == pytest.approx(np.mean(d))
    md = (tmp_path / "curve.md").read_text()
    assert "| seeds |" in md and (tmp_path / "curve.png").exists()
    assert (
        all(f"| 1 (seed {s}) |" in md for s in seeds) and "| distill | 100 | 3 |" in md
    )  # seed rows told apart

    curve.save_em(tmp_path / "rows", "bm25", ref)
    with gzip.open(tmp_path / "rows" / "em-bm25.json.gz", "rt") as f:
        assert json.load(f) == ref


def test_a_learned_row_that_kept_epoch_0_says_it_is_the_untrained_encoder(curve, tmp_path):
    """train.best_by keeps epoch 0 when no epoch beats the untrained encoder on the dev labels: the row is then not a
    learned row, and curve.json / curve.md say so (single seeds and pooled rows)."""
    lp = np.linspace(-12, -8, 10)
    rows = [_row("bm25", None, None, lp), _row("sbert", None, None, lp - 1)]
    for s, best in ((42, 0), (1, 2)):
        rows.append(
            {**_row(curve.seeded("epr@100-distill", s), "distill", 100, lp + 0.1, s), "best_epoch": best}
        )
    curve.add_pooled(rows, 100, "distill", [42, 1])
    a = argparse.Namespace(split="dev", name="x-curve", lms="LMs")
    curve.write_curve(tmp_path, rows, **curve_args(a, 0.0))
    out = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert [r["best_epoch"] for r in out] == [None, None, 0, 2, [0, 2]]
    md = (tmp_path / "curve.md").read_text()
    assert "| 1 (seed 42); kept epoch 0 (untrained) |" in md and "| 1 (seed 1) |" in md
    assert "| 2; 1 of 2 seeds kept epoch 0 (untrained) |" in md


def test_seeded_names_keep_the_committed_runs(curve):
    assert curve.seeded("mtop-curve/2000-distill", curve.BASE_SEED) == "mtop-curve/2000-distill"
    assert curve.seeded("mtop-curve/2000-distill", 7) == "mtop-curve/2000-distill-s7"


@pytest.mark.skipif(
    not (ROOT.parent / "shared" / "data").exists(), reason="needs ../shared/data (the real data sets)"
)
@pytest.mark.parametrize("dataset", ["mtop", "smcalflow", "break"])
def test_each_dataset_curve_config_has_a_dev_and_a_locked_part_of_1000(dataset):
    """The curve's recipe on every EPR dataset: >= 2,000 labelled pool examples x L >= 16, and >= 1,000 evaluation
    examples in the dev part and in the once-only locked part, disjoint (real data: the files in ../shared/data)."""
    from epr.config import load_config
    from epr.context import Context
    from epr.stages.retrieve import eval_examples

    path = ROOT / "configs" / f"{dataset}_curve.yaml"
    parts = {}
    for part in ("dev", "locked"):
        sets = [f"data.data_dir={ROOT.parent / 'shared' / 'data'}", f"data.eval_part={part}"]
        if part == "locked":
            sets.append("retrieve.eval_limit=null")  # as epr experiment curve --split locked sets it
        cfg = load_config([str(path)], sets)
        assert (
            cfg.name == f"{dataset}-curve" and cfg.candidates.num_queries >= 2000 and cfg.candidates.L >= 16
        )
        ctx = Context(cfg)
        pool, ev = ctx.task.load()
        ctx.examples = lambda which, p=pool, e=ev: {"pool": p, "eval": e}[which]  # no run folder needed
        parts[part] = {e.idx for e in eval_examples(ctx)}
        assert len(pool) >= 2000
    assert len(parts["dev"]) >= 1000 and len(parts["locked"]) >= 1000, {k: len(v) for k, v in parts.items()}
    assert not parts["dev"] & parts["locked"]


def test_extra_exact_match_metrics_get_their_own_paired_tests(curve, tmp_path):
    """BREAK reports LF-EM beside NEM: each extra metric gets its rate and McNemar tests, pooled like EM."""
    n, seeds = 30, [42, 1]
    idx = list(range(n))
    ref = {
        "idx": idx,
        "correct": [False] * n,
        "prediction": ["x"] * n,
        "metrics": {"lf_em": [i < 5 for i in idx]},
    }
    rows = [_row("bm25", None, None, np.zeros(n)), _row("sbert", None, None, np.zeros(n))]
    rows += [_row(curve.seeded("epr@100-distill", s), "distill", 100, np.zeros(n), s) for s in seeds]
    curve.add_pooled(rows, 100, "distill", seeds)
    em = {"bm25": ref, "sbert": {**ref, "metrics": {"lf_em": [False] * n}}}
    for s in seeds:  # LF-EM right on 15 examples (BM25's 5 and 10 more); NEM as BM25's
        em[curve.seeded("epr@100-distill", s)] = {**ref, "metrics": {"lf_em": [i < 15 for i in idx]}}
    em["epr@100-distill-pooled"] = curve.pooled([em[curve.seeded("epr@100-distill", s)] for s in seeds])
    assert len(em["epr@100-distill-pooled"]["metrics"]["lf_em"]) == 2 * n
    curve.attach_em(rows, em)
    single, pooled_em = rows[2], rows[-1]
    assert single["lf_em"] == pooled_em["lf_em"] == pytest.approx(50.0)
    assert single["lf_em_p_vs_bm25"] == pytest.approx(curve.mcnemar_exact(10, 0))
    assert pooled_em["lf_em_p_vs_sbert"] == pytest.approx(curve.mcnemar_exact(15, 0))
    assert single["p_vs_bm25"] == pytest.approx(1.0)  # NEM: no discordant pair
    assert rows[0]["lf_em_p_vs_bm25"] is None  # a reference is not tested against itself

    a = argparse.Namespace(split="dev", name="break-curve", lms="scoring LM smollm2 (fp32)")
    curve.write_curve(tmp_path, rows, **curve_args(a, 0.0))
    out = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert out[-1]["lf_em"] == pytest.approx(50.0) and "lf_em_p_vs_sbert" in out[-1]
    md = (tmp_path / "curve.md").read_text()
    assert "| lf_em | lf_em p vs BM25 | lf_em p vs SBERT |" in md and "(lf_em) with the same tests" in md
    header, rule = [line for line in md.splitlines() if line.startswith("|")][:2]
    assert header.count("|") == rule.count("|")


def test_rows_from_dir_pools_each_learned_retrievers_exact_match_on_its_own(curve, tmp_path):
    """``--learned epr,hybrid`` writes exact-match rows for both; redrawn from ``rows/``, each retriever's seeds pool
    into its own row (never epr's seeds with hybrid's), with its own paired tests."""
    from epr.reports.curve_rows import rows_from_dir

    rows_dir = tmp_path / "rows"
    rows_dir.mkdir()
    n, seeds = 40, [42, 1, 2]
    idx = list(range(n))
    bm25 = np.full(n, -10.0)
    (rows_dir / "bm25.json").write_text(json.dumps(_row("bm25", None, None, bm25)))
    curve.save_em(
        rows_dir, "bm25", {"idx": idx, "correct": [i % 4 == 0 for i in idx], "prediction": ["x"] * n}
    )
    right = {"epr": 10, "hybrid": 20}  # examples below which each retriever is right (besides BM25's)
    for r, m in right.items():
        for s in seeds:
            name = curve.seeded(f"{r}@100-distill", s)
            (rows_dir / f"{name}.json").write_text(json.dumps(_row(name, "distill", 100, bm25 + 1, s)))
            e = {"idx": idx, "correct": [i % 4 == 0 or i < m for i in idx], "prediction": ["x"] * n}
            curve.save_em(rows_dir, name, e)
    rows, em = rows_from_dir(rows_dir, "locked")
    curve.attach_em(rows, em)
    by = {r["name"]: r for r in rows}
    assert by["epr@100-distill-pooled"]["em"] == pytest.approx(100 * 17 / 40)
    assert by["hybrid@100-distill-pooled"]["em"] == pytest.approx(100 * 25 / 40)
    assert by["hybrid@100-distill-pooled"]["p_vs_bm25"] == pytest.approx(curve.mcnemar_exact(15, 0))
    assert len(em["hybrid@100-distill-pooled"]["correct"]) == 3 * n


def test_a_rows_label_cost_goes_to_curve_json_and_pools_per_seed(curve, tmp_path):
    """Issue 48: each learned row carries the LM-scored sequences of its labels (every round); a pooled row lists
    each seed's (a re-mined round follows its seed's encoder); rows made before the count keep their old shape."""
    rng = np.random.default_rng(1)
    bm25 = rng.normal(-10, 1, 20)
    rows = [_row("bm25", None, None, bm25)]
    seeds = [42, 1]
    for s, cost in zip(seeds, (56_000, 55_500)):
        rows.append(
            {
                **_row(curve.seeded("epr@2000-distill", s), "distill", 2000, bm25 + 1, s),
                "scored_sequences": cost,
            }
        )
    rows.append(_row("epr@1000-distill", "distill", 1000, bm25, 42))  # an old row: no count
    curve.add_pooled(rows, 2000, "distill", seeds)
    a = argparse.Namespace(split="dev", name="c", lms="x", labels_info={"sequences": 1, "speed": None})
    curve.write_curve(tmp_path, rows, **curve_args(a, 0.0))
    out = json.loads((tmp_path / "curve.json").read_text())["rows"]
    got = {(r["retriever"], r["labels"], r["seeds"], r.get("seed")): r.get("scored_sequences") for r in out}
    assert got[("epr", 2000, 1, 42)] == 56_000 and got[("epr", 2000, 1, 1)] == 55_500
    assert got[("epr", 2000, 2, None)] == [56_000, 55_500]
    assert got[("epr", 1000, 1, 42)] is None and got[("bm25", None, 1, None)] is None
