"""The results tests' comparison helper: text exact, numbers approximate (with negative controls)."""

from __future__ import annotations

import math

import pytest

from tests.values import assert_same_values, same_values


def test_text_keys_compare_exactly_and_numbers_approximately():
    row = {"retriever": "hybrid", "loss": "distill", "split": "locked", "em": 26.2, "seeds": 3, "p": None}
    near = {**row, "em": 26.2 * (1 + 1e-12)}
    assert same_values(near, row) == []
    assert same_values({**row, "loss": "epr"}, row) == [".loss: 'epr' != 'distill'"]
    assert same_values({**row, "em": 26.3}, row) == [".em: 26.3 != 26.2"]
    assert same_values({**row, "p": 0.0}, row)  # None is not a number near 0
    assert same_values({**row, "seeds": True}, {**row, "seeds": 1})  # a bool is not the count 1


def test_nested_values_lists_and_nan():
    want = {"gap": {"gold_logprob": [0.28, 0.19, 0.35], "em": math.nan}, "names": ["a", "b"]}
    assert (
        same_values({"gap": {"gold_logprob": [0.28, 0.19, 0.35], "em": math.nan}, "names": ["a", "b"]}, want)
        == []
    )
    assert same_values({"gap": {"gold_logprob": [0.28, 0.19], "em": math.nan}, "names": ["a", "b"]}, want)
    assert same_values({"gap": {"gold_logprob": [0.28, 0.19, 0.35]}, "names": ["a", "b"]}, want)
    with pytest.raises(AssertionError, match="names"):
        assert_same_values({**want, "names": ["a", "c"]}, want, where="row")
