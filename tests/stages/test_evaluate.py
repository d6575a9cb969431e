"""The evaluate stage joins upstream rows by ``idx``, never by position."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from epr.stages.evaluate import by_idx
from epr.types import UpstreamError


def write(path, idxs):
    path.write_text("".join(json.dumps({"idx": i, "v": 10 * i}) + "\n" for i in idxs))
    return path


def test_rows_come_back_in_the_compared_order_whatever_the_file_order(tmp_path):
    ev = [SimpleNamespace(idx=i) for i in (7, 3, 5)]
    rows = by_idx(write(tmp_path / "p.jsonl", [5, 7, 3]), ev)
    assert [r["idx"] for r in rows] == [7, 3, 5] and [r["v"] for r in rows] == [70, 30, 50]


@pytest.mark.parametrize(
    "idxs,what",
    [([7, 3], "missing idx \\[5\\]"), ([7, 3, 5, 9], "unexpected idx \\[9\\]"), ([7, 3, 5, 3], "twice")],
)
def test_a_file_that_does_not_hold_the_compared_examples_is_named(tmp_path, idxs, what):
    ev = [SimpleNamespace(idx=i) for i in (7, 3, 5)]
    f = write(tmp_path / "preds.jsonl", idxs)
    with pytest.raises(UpstreamError, match=f"preds.jsonl.*{what}"):
        by_idx(f, ev)
