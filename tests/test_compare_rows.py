"""epr experiment compare-rows: two committed rows paired on the same examples agree with the curve's own paired tests
(value for value, on committed files), and rows of different examples are refused."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCKED = ROOT / "results" / "mtop-curve-locked"


@pytest.fixture(scope="module")
def cr():
    return importlib.import_module("epr.experiments.compare_rows")


def test_dense_and_em_comparisons_match_the_committed_curve(cr):
    rows = {
        (r["retriever"], r["seed"], r["seeds"]): r
        for r in json.loads((LOCKED / "curve.json").read_text())["rows"]
    }
    want = rows[("epr", 1, 1)]
    d = cr.compare(cr.load(LOCKED / "rows/bm25.json"), cr.load(LOCKED / "rows/epr@2000-distill-s1.json"))
    assert d["n"] == want["n"] and d["left_out"] == 0
    assert d["gain"] == pytest.approx(want["logprob_gain_vs_bm25"])
    assert d["p_wilcoxon"] == pytest.approx(want["logprob_p_vs_bm25"])
    assert d["median_gain"] == pytest.approx(want["logprob_median_gain_vs_bm25"])
    assert d["gain_ci"][0] < d["gain"] < d["gain_ci"][1]
    e = cr.compare(
        cr.load(LOCKED / "rows/em-bm25.json.gz"), cr.load(LOCKED / "rows/em-epr@2000-distill-s1.json.gz")
    )
    assert e["em_b"] == pytest.approx(want["em"]) and e["em_a"] == pytest.approx(
        rows[("bm25", None, 1)]["em"]
    )
    assert e["p_mcnemar"] == pytest.approx(want["p_vs_bm25"])
    # order matters for the sign, not for the test
    r = cr.compare(cr.load(LOCKED / "rows/epr@2000-distill-s1.json"), cr.load(LOCKED / "rows/bm25.json"))
    assert r["gain"] == pytest.approx(-d["gain"]) and r["p_wilcoxon"] == pytest.approx(d["p_wilcoxon"])


def test_rows_of_different_examples_are_refused(cr):
    a = {"per_query_logprob": [-1.0, -2.0, None]}
    with pytest.raises(ValueError, match="not the same examples"):
        cr.compare(a, {"per_query_logprob": [-1.0, -2.0]})
    held = cr.compare(a, {"per_query_logprob": [-0.5, -1.0, -3.0]})
    assert held["n"] == 2 and held["left_out"] == 1 and held["gain"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="same examples in the same order"):
        cr.compare({"idx": [0, 1], "correct": [1, 0]}, {"idx": [1, 0], "correct": [1, 0]})
    with pytest.raises(ValueError, match="not two dense rows"):
        cr.compare(a, {"idx": [0], "correct": [True]})


def test_seeds_pooled_per_example_match_the_committed_pooled_row(cr):
    """Three seeds joined by commas are the curve's pooled row: its gain, Wilcoxon p, EM and sign-test p."""
    want = next(
        r
        for r in json.loads((LOCKED / "curve.json").read_text())["rows"]
        if r["retriever"] == "epr" and r["seeds"] == 3
    )
    seeds = ["epr@2000-distill.json", "epr@2000-distill-s1.json", "epr@2000-distill-s2.json"]
    dense = cr.load_side(",".join(str(LOCKED / "rows" / f) for f in seeds))
    d = cr.compare(cr.load(LOCKED / "rows/bm25.json"), dense)
    assert (d["seeds_a"], d["seeds_b"]) == (1, 3)
    assert d["gain"] == pytest.approx(want["logprob_gain_vs_bm25"])
    assert d["p_wilcoxon"] == pytest.approx(want["logprob_p_vs_bm25"])
    em = cr.load_side(",".join(str(LOCKED / "rows" / f"em-{f[:-5]}.json.gz") for f in seeds))
    e = cr.compare(cr.load(LOCKED / "rows/em-bm25.json.gz"), em)
    assert e["em_b"] == pytest.approx(want["em"]) and e["p_mcnemar"] == pytest.approx(want["p_vs_bm25"])
    # a pooled side is not the examples x seeds concatenation: each example counts once
    assert e["n"] == want["n"] == 1235


def test_pooling_refuses_seeds_of_different_examples(cr):
    assert cr.pool([{"per_query_logprob": [-1.0, None]}, {"per_query_logprob": [-3.0, None]}]) == {
        "per_query_logprob": [-2.0, None],
        "seeds": 2,
    }
    with pytest.raises(ValueError, match="not the same examples"):
        cr.pool([{"per_query_logprob": [-1.0]}, {"per_query_logprob": [-1.0, -2.0]}])
    with pytest.raises(ValueError, match="same examples in the same order"):
        cr.pool([{"idx": [0, 1], "correct": [1, 0]}, {"idx": [1, 0], "correct": [1, 0]}])
    with pytest.raises(ValueError, match="different kinds"):
        cr.pool([{"idx": [0], "correct": [1]}, {"per_query_logprob": [-1.0]}])


def test_a_runs_selection_slice_pairs_as_a_dense_row(cr, tmp_path):
    """``<run>/select/per_example.jsonl:<retriever>`` (the committed copy here) gives the select report's own gain
    and p; slices of other examples are refused."""
    folder = ROOT / "results" / "mtop-default-recipe"
    want = json.loads((folder / "select-report.json").read_text())["rows"]["hybrid"]
    sl = folder / "rows" / "select-per_example.jsonl.gz"
    d = cr.compare(cr.load_side(f"{sl}:bm25"), cr.load_side(f"{sl}:hybrid"))
    assert d["gain"] == pytest.approx(want["gain"]) and d["p_wilcoxon"] == pytest.approx(want["p"])
    other = tmp_path / "per_example.jsonl"
    other.write_text("".join(json.dumps({"idx": i + 10**6, "bm25": -1.0}) + "\n" for i in range(d["n"])))
    with pytest.raises(ValueError, match="same examples"):
        cr.compare(cr.load_side(f"{sl}:bm25"), cr.load_side(f"{other}:bm25"))
    with pytest.raises(ValueError, match="no 'sbert' column"):
        cr.load_side(f"{sl}:sbert")


def test_the_command_prints_what_the_function_computes(capsys):
    """``epr experiment compare-rows A B`` (epr/cli/tools.py) on two committed rows: its line carries the numbers of
    ``compare``, and ``--json`` prints them whole; the script path older folders recorded reruns as this command."""
    import json

    from epr.cli import main
    from epr.experiments import compare_rows

    a, b = str(LOCKED / "rows" / "em-bm25.json.gz"), str(LOCKED / "rows" / "em-epr@2000-distill.json.gz")
    want = compare_rows.compare(compare_rows.load_side(a), compare_rows.load_side(b), a, b)
    assert main(["experiment", "compare-rows", a, b]) == 0
    line = capsys.readouterr().out
    assert f"A {want['em_a']:.1f}, B {want['em_b']:.1f}" in line and f"p = {want['p_mcnemar']:.2g}" in line
    assert main(["experiment", "compare-rows", a, b, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(want))
    other = compare_rows.compare(compare_rows.load_side(b), compare_rows.load_side(a), b, a)
    assert json.loads(json.dumps(other)) != json.loads(json.dumps(want))  # negative control: the sides matter
