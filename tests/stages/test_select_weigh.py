"""``select.weigh: logprob+em`` (issue 74, item 5): of the retrievers that beat BM25 in gold log-prob, the one with the
highest greedy exact match on the held-out slice is served; the default rule and its key are unchanged."""

from __future__ import annotations

import json

import numpy as np
import pytest

from epr import pipeline
from epr.stages.select import BASELINE, RULE, RULE_EM, choose, read_selection, reselect
from epr.types import InputError

from .test_rounds import make


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.conftest import write_tiny_task

    return write_tiny_task(tmp_path_factory.mktemp("data"))


def test_exact_match_orders_the_retrievers_that_beat_bm25():
    rng = np.random.default_rng(0)
    bm25 = rng.normal(-10, 2, 200)
    lp = {"bm25": bm25, "epr": bm25 + np.abs(rng.normal(1.0, 0.5, 200)),
          "hybrid": bm25 + np.abs(rng.normal(2.0, 0.5, 200)), "sbert": bm25 - 1.0}  # fmt: skip
    em = {"bm25": rng.random(200) < 0.3, "epr": rng.random(200) < 0.6, "hybrid": rng.random(200) < 0.4,
          "sbert": np.ones(200, bool)}  # fmt: skip
    by_lp, by_em = choose(lp, ["epr", "hybrid"], 0.05), choose(lp, ["epr", "hybrid"], 0.05, em)
    assert by_lp["selected"] == "hybrid" and by_lp["rule"] == RULE and "em" not in by_lp["rows"]["epr"]
    assert by_em["selected"] == "epr" and by_em["rule"] == RULE_EM
    assert by_em["rows"]["epr"]["em"] == pytest.approx(100 * em["epr"].mean())
    assert "highest greedy exact match of the 2" in by_em["reason"]
    # exact match never serves a retriever that did not beat BM25 in log-prob (sbert: every example exact)
    assert choose(lp, ["sbert", "hybrid"], 0.05, em)["selected"] == "hybrid"
    assert choose({"bm25": bm25, "sbert": lp["sbert"]}, ["sbert"], 0.05, em)["selected"] == BASELINE
    # equal exact match: log-prob decides, as without it
    same = {**em, "epr": em["hybrid"]}
    assert choose(lp, ["epr", "hybrid"], 0.05, same)["selected"] == "hybrid"


def test_the_default_keeps_its_key_and_logprob_em_rekeys_select(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    base = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "candidates.rounds=1", "select.size=4")
    same = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "candidates.rounds=1", "select.size=4",
                "select.weigh=logprob")  # fmt: skip
    em = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "candidates.rounds=1", "select.size=4",
              "select.weigh=logprob+em")  # fmt: skip
    fp = pipeline.stage_fingerprint
    assert "weigh" not in json.dumps(pipeline.STAGES["select"].keys(base))  # an added option at its default
    assert fp(base, "select") == fp(same, "select") != fp(em, "select")
    assert fp(base, "encoder") == fp(em, "encoder")


def test_a_logprob_em_select_reports_exact_match_off_the_gold_pass(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    sets = ("candidates.rounds=1", "select.size=6", "select.alpha=0.5")
    ctx = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets, "select.weigh=logprob+em")
    pipeline.run(ctx, until="select")
    rep = read_selection(ctx.cfg.run_dir)
    per = [json.loads(x) for x in (ctx.stage_dir("select") / "per_example.jsonl").read_text().splitlines()]
    names = ("bm25", "epr", "hybrid")
    lp = {n: np.array([np.nan if r[n] is None else r[n] for r in per]) for n in names}
    em = {n: np.array([r[f"{n}:em"] for r in per]) for n in names}
    assert {k: rep[k] for k in rep if k not in ("n", "backend")} == choose(lp, ["epr", "hybrid"], 0.5, em)
    again = reselect(
        ctx.stage_dir("select"), ["epr", "hybrid"], "logprob+em"
    )  # read back off the stage's files
    assert {k: again[k] for k in rep if k != "backend"} == {k: rep[k] for k in rep if k != "backend"}
    assert set(np.concatenate(list(em.values()))) <= {0.0, 1.0} and all(
        "em" in r for r in rep["rows"].values()
    )
    # the log-probs are the default rule's, value for value (one forward pass gives both)
    plain = make(tmp_path / "b", tiny, tiny_lm_dir, minilm_dir, *sets)  # its own run root and score cache
    pipeline.run(plain, until="select")
    per0 = [json.loads(x) for x in (plain.stage_dir("select") / "per_example.jsonl").read_text().splitlines()]
    assert [r["idx"] for r in per0] == [r["idx"] for r in per]
    for n in names:
        assert [r[n] for r in per0] == pytest.approx([r[n] for r in per], abs=2e-4)
    assert not any(k.endswith(":em") for k in per0[0])  # negative control: the default reads no exact match


def _stage(d, lp, em, alpha=0.05):
    d.mkdir(parents=True, exist_ok=True)
    n = len(lp[BASELINE])
    rows = [{"idx": j, **{k: (None if np.isnan(v[j]) else float(v[j])) for k, v in lp.items()},
             **({f"{k}:em": float(v[j]) for k, v in em.items()} if em else {})} for j in range(n)]  # fmt: skip
    (d / "per_example.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "report.json").write_text(json.dumps({"alpha": alpha}))
    return d


def test_reselect_is_choose_over_a_subset_of_what_select_scored(tmp_path):
    rng = np.random.default_rng(1)
    bm25 = rng.normal(-10, 2, 120)
    lp = {"bm25": bm25, "epr": bm25 + np.abs(rng.normal(1.0, 0.5, 120)),
          "hybrid": bm25 + np.abs(rng.normal(2.0, 0.5, 120)), "epr+rm": bm25 + np.abs(rng.normal(3.0, 0.5, 120))}  # fmt: skip
    lp["epr"][3] = np.nan  # a prompt that did not fit: NaN survives the file
    em = {k: (rng.random(120) < q).astype(float) for k, q in zip(lp, (0.3, 0.7, 0.4, 0.5))}
    d = _stage(tmp_path / "select", lp, em)
    full = ["epr", "hybrid", "epr+rm"]
    for weigh, e in (("logprob", None), ("logprob+em", em)):
        for subset in (full, ["epr", "hybrid"], ["hybrid"]):
            got = reselect(d, subset, weigh)
            want = choose(
                {k: lp[k] for k in ("bm25", *subset)},
                subset,
                0.05,
                e and {k: e[k] for k in ("bm25", *subset)},
            )
            assert {k: got[k] for k in want} == want and got["n"] == 120 and got["retrievers"] == subset
    assert reselect(d, full, "logprob")["selected"] == "epr+rm"  # the highest log-prob
    assert reselect(d, full, "logprob+em")["selected"] == "epr"  # the highest exact match
    # negative control: leaving the winner out changes the choice
    assert reselect(d, ["hybrid", "epr+rm"], "logprob+em")["selected"] == "epr+rm"
    assert (
        reselect(d, ["hybrid"], "logprob", alpha=1e-300)["selected"] == BASELINE
    )  # alpha given overrides the run's


def test_reselect_names_what_it_lacks(tmp_path):
    lp = {"bm25": np.zeros(4), "epr": np.ones(4)}
    d = _stage(tmp_path / "select", lp, None)
    with pytest.raises(InputError, match="select scored no hybrid"):
        reselect(d, ["epr", "hybrid"])
    with pytest.raises(InputError, match="weigh=logprob\\+em needs"):
        reselect(d, ["epr"], "logprob+em")
    with pytest.raises(InputError, match="no finished select stage"):
        reselect(tmp_path / "none", ["epr"])


def test_epr_experiment_reselect_writes_the_report(tmp_path, capsys):
    from epr.cli.app import main

    rng = np.random.default_rng(2)
    bm25 = rng.normal(-10, 2, 60)
    lp = {
        "bm25": bm25,
        "epr": bm25 + 1.0 + rng.normal(0, 0.1, 60),
        "hybrid": bm25 + 2.0 + rng.normal(0, 0.1, 60),
    }
    _stage(tmp_path / "run" / "select", lp, None)
    out = tmp_path / "choice.json"
    assert (
        main(["experiment", "reselect", str(tmp_path / "run"), "--retrievers", "epr", "--out", str(out)]) == 0
    )
    got = json.loads(out.read_text())
    assert got["selected"] == "epr" and got["retrievers"] == ["epr"] and got["weigh"] == "logprob"
    assert "among epr (logprob, 60 held-out pool examples): epr." in capsys.readouterr().out
