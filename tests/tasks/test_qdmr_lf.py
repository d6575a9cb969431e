"""LF-EM for BREAK (epr.tasks.qdmr_lf): hand-made cases, bad input, and the operators the Break dataset ships.

Operator identification on its own (epr.tasks.qdmr_steps): tests/tasks/test_qdmr_steps.py."""

from __future__ import annotations

import ast
import csv
from collections import Counter

import pytest

from epr.tasks.qdmr_lf import UnparsableQDMR, lf_key, lf_match
from epr.tasks.qdmr_steps import operator_of, parse_steps
from tests.conftest import SHARED_DATA


@pytest.mark.parametrize(
    "a, b",
    [
        # filter chains collapse: steps split differently, same logical form
        (
            "return flights ;return #1 from denver ;return #2 to boston",
            "return flights from denver to boston",
        ),
        # function words, case, spacing and plural forms do not matter
        ("return the Rivers ;return number of #1", "return rivers ;return the number of  #1"),
        # union arguments in either order
        ("return dogs ;return cats ;return #1 , #2", "return cats ;return dogs ;return #1 , #2"),
    ],
)
def test_equivalent_qdmrs_match(a, b):
    assert lf_match(a, b)
    assert lf_key(a) == lf_key(b)


@pytest.mark.parametrize(
    "a, b",
    [
        ("return cubes ;return #1 that are red ;return number of #2", "return red cubes ;return sum of #1"),
        (
            "return players ;return goals of #1 ;return #1 where #2 is highest",
            "return players ;return goals of #1 ;return #1 where #2 is lowest",
        ),
        ("return dogs ;return #1 that are black", "return dogs ;return #1 that are white"),
        ("return rivers ;return number of #1", "return rivers ;return #1 , #1"),
    ],
)
def test_different_qdmrs_do_not_match(a, b):
    assert not lf_match(a, b)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        ";;",
        "return #1 of dogs",
        "return dogs ;return #3 of cats",
        "return dogs ;return #2 that bark",
        "return #0",
    ],
)
def test_bad_predictions_score_zero_and_raise_clearly(bad):
    gold = "return dogs ;return #1 that bark"
    assert lf_match(bad, gold) is False
    with pytest.raises((UnparsableQDMR, ValueError)):
        lf_key(bad)


def test_self_match_on_gold_style_text():
    q = "return flights ;return #1 from  denver ;return #2 to philadelphia ;return #3 if  available"
    assert lf_match(q, q)


LF_DEV = SHARED_DATA / "break" / "original" / "logical-forms" / "dev.csv"


@pytest.mark.slow
@pytest.mark.skipif(not LF_DEV.exists(), reason="../shared/data/break not present")
def test_operators_agree_with_the_break_dataset():
    """The dataset ships each step's operator from the Break authors' identifier: we agree on >= 99% of steps.

    Known, intended differences come from the later rule set the LF-EM matcher uses (Hasson & Berant 2021):
    ``#2 where #3 is the lowest`` is a superlative there, ``#1 that are not metallic`` a discard."""
    steps = agree = 0
    diff: Counter = Counter()
    with open(LF_DEV, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        gold = ast.literal_eval(r["operators"])
        texts = parse_steps(r["decomposition"])
        if len(texts) != len(gold):
            continue
        for t, g in zip(texts, gold):
            try:
                mine = operator_of(t)
            except UnparsableQDMR:
                mine = None
            steps += 1
            agree += mine == g
            if mine != g:
                diff[(g, mine)] += 1
    assert steps > 35_000
    assert agree / steps >= 0.99, diff.most_common(5)
    # every gold decomposition gets a logical form, and matches itself
    unparsable = sum(1 for r in rows if not lf_match(r["decomposition"], r["decomposition"]))
    assert unparsable / len(rows) < 0.005


def test_break_task_reports_lf_em_and_the_table_shows_it(tmp_path):
    from types import SimpleNamespace

    from epr.reports.tables import comparison_table, write_comparison
    from epr.tasks.semparse import Break

    gold = "return flights ;return #1 from denver ;return #2 to boston"
    task = Break.__new__(Break)
    assert task.metrics("return flights from denver to boston", gold) == {"lf_em": True}
    assert task.is_correct("return flights from denver to boston", gold) is False  # NEM is stricter
    row = {
        "em": 0.0, "ci_low": 0.0, "ci_high": 0.0, "oracle": False, "mean_demos": 2.0, "mean_prompt_tokens": 50.0,
        "prompt_status": {"ok": 1, "no_demo_fits": 0, "query_too_long": 0}, "paper": 26.0,
        "lf_em": {"value": 100.0, "ci_low": 100.0, "ci_high": 100.0},
    }  # fmt: skip
    cfg = SimpleNamespace(
        models=SimpleNamespace(inference_lm=None, lm="smollm2"),
        retrieve=SimpleNamespace(prompt_budget=256, answer_reserve=64, max_demos=4),
    )
    task.name = "break"
    write_comparison(tmp_path, comparison_table(task, {"bm25": row}, 1, cfg))
    md = (tmp_path / "results.md").read_text()
    assert (
        "| retriever | EM (ours) | 95% CI | LF-EM (ours) | 95% CI | gold log-prob (nats) | paper LF-EM |"
        in md
    )  # no row has a DPO: no column for it
    assert "| bm25 | 0.0 | 0.0-0.0 | 100.0 | 100.0-100.0 |  | 26.0 |" in md
    header = (tmp_path / "results.csv").read_text().splitlines()[0]
    assert header.startswith("retriever,em,ci_low,ci_high,lf_em,lf_em_ci_low,lf_em_ci_high,paper")


def test_a_saturated_dpo_is_left_out_with_the_reason(tmp_path):
    """DPO against the empty context saturates near 0 when demonstrations help a lot (the demo set's rows are all
    about -1e-9, unreadable as -2.13e-09 (-4e-09 to -1.1e-10)): the column is left out and the notes say why; where a
    row's DPO is readable the column is there in 3 decimals (issue 78); gold log-prob keeps 2 decimals."""
    from types import SimpleNamespace

    from epr.reports.tables import comparison_table, write_comparison
    from epr.tasks.semparse import Break

    task = Break.__new__(Break)
    task.name = "break"
    row = {
        "em": 50.0, "ci_low": 10.0, "ci_high": 90.0, "oracle": False, "mean_demos": 2.0, "mean_prompt_tokens": 50.0,
        "prompt_status": {"ok": 1, "no_demo_fits": 0, "query_too_long": 0}, "paper": None,
        "lf_em": {"value": 50.0, "ci_low": 10.0, "ci_high": 90.0},
        "gold_logprob": {"value": -0.8234, "ci_low": -1.04, "ci_high": -0.63},
        "dpo": {"value": -2.13e-9, "ci_low": -4.0e-9, "ci_high": -1.1e-10},
    }  # fmt: skip
    cfg = SimpleNamespace(
        models=SimpleNamespace(inference_lm=None, lm="smollm2"),
        retrieve=SimpleNamespace(prompt_budget=256, answer_reserve=64, max_demos=4),
    )
    write_comparison(tmp_path, comparison_table(task, {"epr": row}, 1, cfg))
    md = (tmp_path / "results.md").read_text()
    assert "| -0.82 (-1.04 to -0.63) | 50.0-" not in md and "| -0.82 (-1.04 to -0.63) |" in md
    assert "DPO vs empty context" not in md and "DPO (mean log sigmoid" in md and "is left out" in md
    readable = {**row, "dpo": {"value": -0.0213, "ci_low": -0.04, "ci_high": -0.011}}  # the negative control
    write_comparison(tmp_path, comparison_table(task, {"epr": row, "bm25": readable}, 1, cfg))
    md2 = (tmp_path / "results.md").read_text()
    assert (
        "DPO vs empty context" in md2 and "| -0.021 (-0.040 to -0.011) |" in md2 and "is left out" not in md2
    )
    # no row has a paper number (a task of one's own, or a retriever the paper did not run): no paper column, and
    # no note naming the paper's LM
    header = next(line for line in md.splitlines() if line.startswith("| retriever |"))
    assert "paper" not in header and "GPT-Neo" not in md
