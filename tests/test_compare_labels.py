"""epr experiment compare-labels: two label sets of the same training examples compared on hand-made rows, and a
malformed row named by file and line."""

from __future__ import annotations

import importlib
import json

import pytest


@pytest.fixture(scope="module")
def cl():
    return importlib.import_module("epr.experiments.compare_labels")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_best_and_median_scores_and_shared_candidates(cl, tmp_path):
    a = _write(tmp_path / "a.jsonl", [
        {"qid": 1, "cands": [1, 2, 3, 4], "cand_scores": [-1.0, -2.0, -3.0, -10.0]},
        {"qid": 2, "cands": [5, 6, 7, 8], "cand_scores": [-4.0, -5.0, -6.0, -7.0]},
        {"qid": 3, "cands": [9, 10, 11, 12], "cand_scores": [-1.0, -1.0, -1.0, -1.0]},
    ])  # fmt: skip
    b = _write(tmp_path / "b.jsonl", [
        {"qid": 1, "cands": [1, 2, 20, 21], "cand_scores": [-1.0, -2.0, -30.0, -40.0]},
        {"qid": 2, "cands": [5, 30, 31, 32], "cand_scores": [-2.0, -3.0, -8.0, -9.0]},
        {"qid": 4, "cands": [1, 2, 3, 4], "cand_scores": [0.0, 0.0, 0.0, 0.0]},
    ])  # fmt: skip
    c = cl.compare(cl.load(a), cl.load(b))
    assert (c["examples"], c["only_a"], c["only_b"]) == (2, 1, 1)
    assert c["candidates_shared"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert (c["best_a"], c["best_b"]) == (pytest.approx(-2.5), pytest.approx(-1.5))
    assert (c["best_b_higher"], c["best_b_lower"]) == (0.5, 0.0)  # qid 1 tied, qid 2 higher
    assert (c["median_a"], c["median_b"]) == (
        pytest.approx((-2.5 - 5.5) / 2),
        pytest.approx((-16.0 - 5.5) / 2),
    )


def test_how_alike_two_lms_rank_the_same_candidates(cl):
    same = [1, 2, 3, 4, 5]
    a = {
        1: {"cands": same, "cand_scores": [-1.0, -2.0, -3.0, -4.0, -5.0]},
        2: {"cands": same, "cand_scores": [-1.0, -2.0, -3.0, -4.0, -5.0]},
        3: {"cands": [1, 2, 9, 10, 11], "cand_scores": [-1.0, -2.0, -3.0, -4.0, -5.0]},  # 2 shared: left out
    }
    b = {
        1: {
            "cands": same[::-1],
            "cand_scores": [-5.0, -4.0, -3.0, -2.0, -1.0],
        },  # the same order, listed reversed
        2: {"cands": same, "cand_scores": [-5.0, -4.0, -3.0, -2.0, -1.0]},  # the reverse order
        3: {"cands": [1, 2, 20, 21, 22], "cand_scores": [-1.0, -2.0, -3.0, -4.0, -5.0]},
    }
    c = cl.compare(a, b, k=2)
    assert c["rank_agreement"] == pytest.approx(0.0) and c["rank_agreement_examples"] == 2  # (1 + -1) / 2
    assert c["top_k_shared"] == pytest.approx(0.5) and c["top_k"] == 2  # qid 1: both, qid 2: none
    assert c["top_k_identical"] == pytest.approx(0.5)  # qid 1's top 2 is B's, qid 2's is not
    # the scores' own distance over every shared candidate (qid 1: 0 x 5, qid 2: 4 2 0 2 4, qid 3: 0 x 2)
    assert (c["score_abs_diff_mean"], c["score_abs_diff_max"]) == (pytest.approx(12 / 12), 4.0)
    # ranks, not values: a monotone but non-linear pair agrees fully (Pearson would not)
    mono = {1: {"cands": same, "cand_scores": [-1.0, -2.0, -3.0, -4.0, -100.0]}}
    assert cl.agreement(a, mono, [1], 2)["rank_agreement"] == pytest.approx(1.0)
    # ties in A broken by candidate id, not by B's listing order: A ties 1..5, B lists 5 first
    tied = {1: {"cands": same, "cand_scores": [-1.0] * 5}}
    b5 = {1: {"cands": [5, 4, 3, 2, 1], "cand_scores": [-1.0, -2.0, -3.0, -4.0, -5.0]}}
    assert cl.agreement(tied, b5, [1], 2)["top_k_shared"] == 0.0  # A's top 2 = {1, 2}; B's = {5, 4}


def test_the_summary_prints_when_no_example_shares_more_than_k(cl, tmp_path, capsys):
    rows = [{"qid": 1, "cands": [1, 2, 3], "cand_scores": [-1.0, -2.0, -3.0]}]
    a = _write(tmp_path / "a.jsonl", rows)
    from epr.cli.tools import compare_labels_main

    assert compare_labels_main([str(a), str(a), "--k", "3"]) == 0
    assert "Spearman 1.000" in capsys.readouterr().out


def test_a_row_without_a_score_per_candidate_is_named(cl, tmp_path):
    good = {"qid": 1, "cands": [1, 2], "cand_scores": [-1.0, -2.0]}
    _write(tmp_path / "labels.jsonl", [good, {"qid": 2, "cands": [1, 2], "cand_scores": [-1.0]}])
    with pytest.raises(ValueError, match=r"labels.jsonl:2: cand_scores"):
        cl.load(tmp_path)  # the folder holding labels.jsonl
    assert cl.load(_write(tmp_path / "ok.jsonl", [good]))[1] == good
    with pytest.raises(ValueError, match="share no training example"):
        cl.compare({1: good}, {2: good})


def test_the_positives_and_negatives_training_reads(cl, capsys, tmp_path):
    """``kept``: on the examples whose candidates are the same set in both, the share whose positives and hard
    negatives (the rows' own ``pos`` / ``neg``, as the labels stage chose them) are the same sets."""
    from epr.encoder.data import select_labels

    ids = [10, 11, 12, 13, 14, 15]
    a = {q: {"qid": q, **select_labels(ids, [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0], 2, 2)} for q in (1, 2, 3)}
    b = {
        1: {
            "qid": 1,
            **select_labels(ids[::-1], [-6.0, -5.0, -4.0, -3.0, -2.0, -1.0], 2, 2),
        },  # the same labels
        2: {
            "qid": 2,
            **select_labels(ids, [-2.0, -1.0, -3.0, -4.0, -6.0, -5.0], 2, 2),
        },  # order within sets moved
        3: {
            "qid": 3,
            **select_labels(ids, [-3.0, -2.0, -1.0, -4.0, -5.0, -6.0], 2, 2),
        },  # 12 into the positives
    }
    k = cl.kept(a, b, [1, 2, 3])
    assert k == {"same_candidates_examples": 3, "positives_identical": pytest.approx(2 / 3),
                 "negatives_identical": 1.0}  # fmt: skip
    b[3]["neg"] = [13, 14]  # negative control: a changed negative set counts
    assert cl.kept(a, b, [1, 2, 3])["negatives_identical"] == pytest.approx(2 / 3)
    b[2] = {
        "qid": 2,
        **select_labels([10, 11, 12, 13, 14, 99], [-1.0] * 6, 2, 2),
    }  # other candidates: left out
    assert cl.kept(a, b, [1, 2, 3])["same_candidates_examples"] == 2
    assert (
        cl.kept({1: {"cands": [1], "cand_scores": [0.0]}}, {1: {"cands": [2], "cand_scores": [0.0]}}, [1])
        == {}
    )
    from epr.cli.tools import compare_labels_main

    pa = _write(tmp_path / "a.jsonl", list(a.values()))
    assert compare_labels_main([str(pa), str(pa)]) == 0
    assert "the same positives on 100.0%, the same hard negatives on 100.0%" in capsys.readouterr().out
