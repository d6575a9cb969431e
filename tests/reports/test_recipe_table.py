"""benchmarks.recipe reads a run's stage table from its manifests: earlier rounds first, the rounds stage itself
left out (its time is its rounds' stages), every stage's seconds and work."""

import json

from benchmarks.recipe import stage_rows, table


def _man(d, stage, seconds, rows=None, **extra):
    d.mkdir(parents=True, exist_ok=True)
    (d / "manifest.json").write_text(
        json.dumps({"stage": stage, "seconds": seconds, "rows": rows or {}, **extra})
    )


def test_stage_rows_lists_each_round_then_the_run(tmp_path):
    run = tmp_path / "mtop"
    r1 = run / "rounds" / "round-1"
    _man(r1 / "scores", "scores", 600.0, {"sequences": 32000}, scoring_speed={"scored_here": 32000})
    _man(r1 / "encoder", "encoder", 1000.0)
    _man(run / "rounds", "rounds", 1600.0)
    _man(run / "scores", "scores", 400.0, {"sequences": 32000}, scoring_speed={"scored_here": 24794})
    _man(run / "select", "select", 60.0, {"held_out": 300})
    (run / "predict").mkdir()  # unfinished: no manifest, not listed
    rows = stage_rows(run)
    names = [r["stage"] for r in rows]
    assert set(names) == {"round-1/scores", "round-1/encoder", "scores", "select"}
    assert names.index("round-1/encoder") < names.index("scores")
    by = {r["stage"]: r for r in rows}
    assert by["scores"]["work"] == {"sequences": 32000, "scored_here": 24794}
    info = {"command": "epr run", "machine": "m", "peak_fp32": 1.0, "peak_bf16": 2.0, "bandwidth_gbps": 30.0}
    md = table(rows, {**info, "peak_rss_mb": 900.0, "wall_s": 2100.0})
    assert "| round-1/encoder | 1000 |" in md and "34.3 min (within the 45-minute bar)" in md
