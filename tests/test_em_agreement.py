"""epr experiment em-agreement and the exact-match method guards of epr.reports.curve, on hand-made rows."""

from __future__ import annotations

import gzip
import importlib
import json

import pytest

from epr.reports.curve import attach_em, paired_p, pooled


def _row(correct, method=None):
    r = {"idx": list(range(len(correct))), "correct": correct, "prediction": [None] * len(correct)}
    return r if method is None else {**r, "method": method}


def test_agreement_counts_and_refusals():
    ea = importlib.import_module("epr.experiments.em_agreement")
    got = ea.agreement(
        _row([True, True, False, False, True]), _row([True, False, False, True, True], "greedy")
    )
    assert got == {
        "n": 5,
        "em_generate": 60.0,
        "em_greedy": 60.0,
        "generate_only": 1,
        "greedy_only": 1,
        "agreement": 0.6,
    }
    with pytest.raises(ValueError, match="generated and a greedy"):
        ea.agreement(_row([True]), _row([True]))
    other = {**_row([True, False], "greedy"), "idx": [0, 2]}
    with pytest.raises(ValueError, match="different examples"):
        ea.agreement(_row([True, False]), other)


def test_paired_tests_and_pooling_refuse_mixed_methods_and_rows_record_theirs():
    gen, greedy = _row([True, False, True]), _row([True, True, False], "greedy")
    with pytest.raises(ValueError, match="across exact-match methods"):
        paired_p(greedy, gen)
    with pytest.raises(ValueError, match="different methods"):
        pooled([gen, greedy])
    assert pooled([greedy, greedy])["method"] == "greedy" and "method" not in pooled([gen, gen])
    rows = [{"retriever": "bm25", "loss": None, "seeds": 1}, {"retriever": "epr", "loss": None, "seeds": 1}]
    attach_em(rows, {"bm25": _row([False] * 3, "greedy"), "epr": greedy})
    assert rows[1]["em_method"] == "greedy" and rows[1]["em"] == pytest.approx(200 / 3)
    assert rows[1]["p_vs_bm25"] == pytest.approx(0.5)


def test_the_script_prints_one_line_per_shared_row(tmp_path, capsys):
    for d, method in (("gen", None), ("greedy", "greedy")):
        (tmp_path / d).mkdir()
        for name, c in (
            ("bm25", [False, True, False, False]),
            ("epr@2000-distill", [True, True, True, False]),
        ):
            data = _row(c, method)
            (tmp_path / d / f"em-{name}.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    from epr.cli.tools import em_agreement_main

    assert em_agreement_main([str(tmp_path / "gen"), str(tmp_path / "greedy")]) == 0
    out = capsys.readouterr().out
    assert "| epr@2000-distill | 4 | 75.0 | 75.0 | 0 | 0 | 100.00% | 0.5 / 0.5 |" in out
