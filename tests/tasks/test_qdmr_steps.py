"""QDMR steps (epr.tasks.qdmr_steps): splitting, each operator identified, properties and typed arguments."""

from __future__ import annotations

import pytest

from epr.tasks.qdmr_steps import Step, identify, indicator_words, operator_of, parse_steps


def test_parse_steps_strips_return_and_spaces_commas():
    assert parse_steps("return dogs ;return #1 ,  #2 ;") == ["dogs", "#1 , #2"]


@pytest.mark.parametrize(
    "step, op",
    [
        ("flights", "select"),
        ("#1 from denver", "filter"),
        ("color of #2", "project"),
        ("number of #1", "aggregate"),
        ("the number of #1 for each #2", "group"),
        ("#1 where #2 is highest", "superlative"),
        ("#1 where #2 is at least 3", "comparative"),
        ("#1 , #2", "union"),
        ("rivers in both #1 and #2", "intersection"),
        ("#1 besides #2", "discard"),
        ("#1 sorted by #2", "sort"),
        ("if #1 is red", "boolean"),
        ("the difference of #1 and #2", "arithmetic"),
        ("which is higher of #1 , #2", "comparison"),
    ],
)
def test_each_operator_is_identified(step, op):
    assert operator_of(step) == op


def test_properties_and_arguments():
    s = identify("#1 where #2 is lowest")
    assert (s.operator, s.properties) == ("superlative", ("min",))
    assert sorted(s.refs) == [("attribute", 2), ("sub", 1)]
    a = identify("the number of #3")
    assert (a.operator, a.properties, a.refs) == ("aggregate", ("count",), [("arg", 3)])


def test_indicator_words_are_the_operator_and_property_words():
    words = indicator_words(identify("the number of #1 for each #2"))
    assert {"for", "each", "number", "of"} <= words and "count" in words
    assert indicator_words(Step("select")) == set()
