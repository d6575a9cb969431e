"""benchmarks.int8_floor's projection: each stage kind divided by its own rate, the rest untouched."""

import json

import pytest

from benchmarks import int8_floor

STAGES = [
    {"stage": "round-1/scores", "seconds": 600.0},
    {"stage": "scores", "seconds": 600.0},
    {"stage": "predict", "seconds": 300.0},
    {"stage": "encoder", "seconds": 120.0},
    {"stage": "round-1/encoder", "seconds": 60.0},
]


def test_project_divides_only_its_stage_kinds():
    base = int8_floor.project(STAGES, 1.0)
    assert base == pytest.approx(
        {"scoring_min": 20.0, "generation_min": 5.0, "rest_min": 3.0, "total_min": 28.0}
    )
    p = int8_floor.project(STAGES, 2.0, 1.5)
    assert p["scoring_min"] == pytest.approx(10.0) and p["generation_min"] == pytest.approx(300 / 1.5 / 60)
    assert p["rest_min"] == base["rest_min"]  # negative control: training is not sped up by int8 labels
    assert p["total_min"] == pytest.approx(10.0 + 300 / 1.5 / 60 + 3.0)


def test_main_writes_the_prefill_bound_between_the_kept_variant_and_the_peak(tmp_path, monkeypatch):
    recipe, q = tmp_path / "recipe.json", tmp_path / "q.json"
    recipe.write_text(json.dumps({"stages": STAGES}))
    agree = {"spearman_mean": 0.98, "positives_same": 0.95}
    q.write_text(json.dumps({"base": "bf16", "machine": {}, "seconds": {"bf16": 12.5, "scoring.int8 x": 10.0},
                             "agreement": {"scoring.int8 x": agree}}))  # fmt: skip
    saved = {}
    monkeypatch.setattr(int8_floor, "save", lambda name, raw, md: saved.update(raw=raw, md=md))
    monkeypatch.setattr(int8_floor, "describe", lambda m: "test machine")
    monkeypatch.setattr(int8_floor, "machine_slug", lambda m: "test")
    rows = int8_floor.main(["--recipe", str(recipe), "--int8", str(q), "--bar", "20"])["rows"]
    names = [r["variant"] for r in rows]
    assert names[1] == "scoring.int8 x" and rows[1]["x"] == pytest.approx(1.25)
    prefill = rows[2]
    assert prefill["variant"].startswith("bound: that, and all of generation")
    assert prefill["gen_x"] == pytest.approx(1.25) and prefill["generation_min"] == pytest.approx(4.0)
    assert rows[-2]["x"] == 2.0 and rows[-2]["generation_min"] == pytest.approx(5.0)
    assert "item 3" in saved["md"] and "1.25x" in saved["md"]
