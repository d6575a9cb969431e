"""Comparing recomputed results with committed ones: numbers within a tolerance, everything else exactly.

``pytest.approx`` is for numbers. Since pytest 9.2 it refuses a string under a relative tolerance (``TypeError:
expected value must support abs(...)``), and comparing text "approximately" never meant anything: a row's
``retriever``, ``loss`` or ``split`` must match exactly. One helper, shared by the results tests, walks nested
dicts and lists and picks the right comparison for each leaf.
"""

from __future__ import annotations

import math
from numbers import Real

import pytest

__all__ = ["assert_same_values", "same_values"]


def _is_number(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def same_values(got: object, want: object, rel: float = 1e-9, abs_: float = 0.0, path: str = "") -> list[str]:
    """Where ``got`` and ``want`` differ: text, bools and ``None`` by ``==``, numbers by ``pytest.approx`` (NaN
    equal to NaN), dicts by key set and value, lists by length and item. Returns the paths that differ."""
    if _is_number(got) and _is_number(want):
        if isinstance(got, float) and isinstance(want, float) and math.isnan(got) and math.isnan(want):
            return []
        return (
            [] if got == pytest.approx(want, rel=rel, abs=abs_) else [f"{path or '.'}: {got!r} != {want!r}"]
        )
    if isinstance(got, dict) and isinstance(want, dict):
        diffs = [f"{path}.{k}: missing on one side" for k in sorted(set(got) ^ set(want), key=str)]
        for k in sorted(set(got) & set(want), key=str):
            diffs += same_values(got[k], want[k], rel, abs_, f"{path}.{k}")
        return diffs
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return [f"{path}: length {len(got)} != {len(want)}"]
        out: list[str] = []
        for i, (g, w) in enumerate(zip(got, want)):
            out += same_values(g, w, rel, abs_, f"{path}[{i}]")
        return out
    return [] if got == want and type(got) is type(want) else [f"{path or '.'}: {got!r} != {want!r}"]


def assert_same_values(
    got: object, want: object, rel: float = 1e-9, abs_: float = 0.0, where: object = ""
) -> None:
    diffs = same_values(got, want, rel, abs_)
    assert not diffs, f"{where}: " + "; ".join(diffs[:10])
