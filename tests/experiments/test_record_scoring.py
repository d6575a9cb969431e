"""``epr experiment record`` keeps each round's label-scoring time beside the label cost (``scoring_time``): read
from the rounds' own ``scores`` manifests, in round order, a missing one left out rather than guessed."""

from __future__ import annotations

import json

from epr.experiments.record import scoring_time


def _manifest(d, seconds, rate, dtype="bf16"):
    d.mkdir(parents=True)
    m = {"seconds": seconds, "config": {"dtype": dtype, "int8": dtype == "int8"},
         "scoring_speed": {"scored_here": 10, "scoring_seconds": seconds - 1, "sequences_per_s": rate, "machine": "m"}}  # fmt: skip
    (d / "manifest.json").write_text(json.dumps(m))


def test_rounds_in_order_with_their_settings(tmp_path):
    run = tmp_path / "run"
    for i in (1, 2, 10):  # round-10 after round-2: numeric order, not the file names'
        _manifest(run / "rounds" / f"round-{i}" / "scores", 100.0 * i, float(i))
    _manifest(run / "scores", 5.0, 99.0, "int8")
    got = scoring_time(run)
    assert [r["round"] for r in got] == [1, 2, 3, 4]
    assert [r["seconds"] for r in got] == [100.0, 200.0, 1000.0, 5.0]
    assert got[-1]["settings"] == {"dtype": "int8", "int8": True} and got[-1]["sequences_per_s"] == 99.0
    assert got[0]["scoring_seconds"] == 99.0 and got[0]["machine"] == "m"


def test_a_missing_manifest_is_left_out(tmp_path):
    run = tmp_path / "run"
    _manifest(run / "rounds" / "round-1" / "scores", 10.0, 1.0)
    assert [r["round"] for r in scoring_time(run)] == [1]  # the last round's scores/ never ran: not invented
    (run / "rounds" / "round-1" / "scores" / "manifest.json").unlink()
    assert scoring_time(run) == []
