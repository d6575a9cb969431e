"""benchmarks.recipe reads a run's stage table from its manifests: earlier rounds first, the rounds stage itself
left out (its time is its rounds' stages), every stage's seconds and work."""

import json

import pytest

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


def _ws_tok(texts, add_special_tokens=True):
    """A whitespace tokenizer (one id per word, plus one special token when asked)."""
    return {"input_ids": [[0] * (len(t.split()) + int(add_special_tokens)) for t in texts]}


def test_predict_work_counts_prefill_gold_and_generated_tokens(tmp_path):
    from benchmarks.recipe_work import predict_work
    from epr.types import Example

    class Task:
        def format_target(self, y):
            return y

    prompts, pred = tmp_path / "prompts", tmp_path / "predict"
    prompts.mkdir(), pred.mkdir()
    (prompts / "bm25.jsonl").write_text(
        json.dumps({"idx": 3, "n_tokens": 10}) + "\n" + json.dumps({"idx": 5, "n_tokens": 20}) + "\n"
    )
    (pred / "bm25.jsonl").write_text(
        json.dumps({"idx": 3, "prediction": "a b"}) + "\n" + json.dumps({"idx": 5, "prediction": ""}) + "\n"
    )
    (prompts / "sbert.jsonl").write_text(
        json.dumps({"idx": 3, "n_tokens": 7}) + "\n"
    )  # not predicted: left out
    ev = {3: Example(3, "x", "g h i"), 5: Example(5, "x", "j")}
    w = predict_work(pred, prompts, Task(), _ws_tok, ev)
    # prefill: prompts 10 + 20, gold 3 + 1; generated: (2 + 1) + (0 + 1) with the stop token
    assert w == {"rows": 2, "prefill_tokens": 34, "generated_tokens": 4, "tokens": 38}


def test_estimates_read_time_and_rate_ratios(tmp_path):
    from benchmarks.recipe_work import estimate, factors

    (tmp_path / "here.json").write_text(
        json.dumps({"tok_s": 100.0, "runs": {"lean": {"seconds": 50.0, "n": 100}}})
    )
    (tmp_path / "there.json").write_text(
        json.dumps({"tok_s": 200.0, "runs": {"lean": {"seconds": 90.0, "n": 300}}})
    )
    src = {
        "lm": ("there.json", "tok_s", "here.json", "tok_s", "rate"),
        "predict": ("there.json", "runs.lean.seconds", "here.json", "runs.lean.seconds", "time"),
    }
    f = factors(tmp_path, src)
    assert f["lm"] == 0.5  # twice the rate there: half the time
    assert abs(f["predict"] - 0.6) < 1e-12  # 0.3 s a prompt there vs 0.5 here
    import benchmarks.recipe_work as rw

    old = rw.ESTIMATES
    rw.ESTIMATES = {"m": src}
    try:
        rows = [{"stage": "round-1/scores", "seconds": 100.0}, {"stage": "predict", "seconds": 10.0}]
        rows.append({"stage": "labels", "seconds": 1.0})  # no kind: keeps its time
        assert abs(estimate(rows, tmp_path)["m"]["total_s"] - (50.0 + 6.0 + 1.0)) < 1e-9
    finally:
        rw.ESTIMATES = old


def test_fraction_of_peak():
    from benchmarks.recipe_work import fraction

    assert fraction(2e12, 10.0, 0.4) == 0.5
    assert fraction(1.0, 0.0, 0.4) is None


def test_every_estimate_reads_committed_benchmarks():
    """The estimates' sources are files and fields of benchmarks/results (a renamed file or field fails here)."""
    from benchmarks.common import RESULTS
    from benchmarks.recipe_work import ESTIMATES, factors

    for name, src in ESTIMATES.items():
        f = factors(RESULTS, src)
        assert set(f) == {"lm", "predict", "encoder"} and all(0.1 < v < 10 for v in f.values()), name


def _gpu(**over) -> dict:
    lm, enc = "SmolLM2-135M", "all-MiniLM-L6-v2"
    rows = [
        {"stage": "label scoring", "model": lm, "method": "prefix-shared", "batch_tokens": 16384, "seconds": 1,
         "tok_s": 1000.0},
        {"stage": "label scoring", "model": lm, "method": "batched", "batch_tokens": 16384, "seconds": 1,
         "tok_s": 500.0},
        {"stage": "label scoring", "model": lm, "method": "batched", "batch_tokens": 4096, "seconds": 1,
         "tok_s": 1.0},  # another size: not the GPU default, not read
        {"stage": "generation", "model": lm, "decode_rows": 256, "seconds": 1, "new_tok_s": 10.0},
        {"stage": "encoder training", "model": enc, "dtype": "bf16", "doc_len": 64, "seconds": 1,
         "tokens_s": 200.0},
    ]  # fmt: skip
    return {"device_name": "GPU X", "rows": rows, **over}


def test_gpu_estimate_divides_each_stage_s_work_by_its_gpu_rate():
    from benchmarks.recipe_work import gpu_estimate

    rows = [
        {"stage": "round-1/scores", "seconds": 400.0, "tokens": 2000, "work": {}},
        {"stage": "round-1/encoder", "seconds": 50.0, "tokens": 400, "work": {}},
        {"stage": "retrieve", "seconds": 30.0, "work": {}},  # not on the LM path: its time here
        {"stage": "predict", "seconds": 99.0, "work": {"prefill_tokens": 1000, "generated_tokens": 30}},
        {
            "stage": "select",
            "seconds": 8.0,
            "work": {},
        },  # the scorer's rate here 2000 / 400 = 5 tok/s, there 1000
    ]
    e = gpu_estimate(rows, _gpu())
    got = {r["stage"]: r["seconds"] for r in e["stages"]}
    assert got == {"round-1/scores": 2.0, "round-1/encoder": 2.0, "retrieve": 30.0, "predict": 2.0 + 3.0,
                   "select": 8.0 * 5 / 1000}  # fmt: skip
    assert e["total_s"] == sum(got.values()) and e["lm_and_training_s"] == e["total_s"] - 30.0
    bad = _gpu()
    bad["rows"] = [r for r in bad["rows"] if r["stage"] != "generation"]
    with pytest.raises(ValueError, match="0 measured rows"):  # a missing measurement is named, not guessed
        gpu_estimate(rows, bad)


def test_gpu_estimate_reads_the_committed_gpu_run():
    """Every committed GPU run the recipe table reads has the rows the estimate needs, at the GPU sizes."""
    from benchmarks.common import RESULTS
    from benchmarks.recipe import GPU_RESULTS
    from benchmarks.recipe_work import gpu_estimate

    recipe = json.loads((RESULTS / "recipe-mtop-default-recipe-zen4.json").read_text())
    for f in GPU_RESULTS:
        e = gpu_estimate(recipe["stages"], json.loads((RESULTS / f).read_text()))
        assert 0 < e["lm_and_training_s"] < e["total_s"] < sum(r["seconds"] for r in recipe["stages"])


def test_a_gpu_run_read_here_redraws_to_its_committed_table(monkeypatch):
    """The 8,000-label recipe run on a lent H200, read here with ``--ran-on`` that GPU's benchmark: its committed
    table is what its raw JSON redraws to (the GPU's description and peaks, the measured total against the estimate
    from the same benchmark), and its stages' total is the run's measured 6.4 minutes."""
    import benchmarks.recipe as recipe
    from benchmarks.common import RESULTS
    from benchmarks.recipe import add_estimates

    monkeypatch.setattr(recipe, "GPU_RESULTS", ())  # the estimate comes from the run's own GPU benchmark
    raw = json.loads((RESULTS / "recipe-mtop-8000-locked-s42-h200.json").read_text())
    assert raw["info"]["ran_on"] == "gpu-stages-nvidia-h200.json" and raw["info"]["from_run"]
    info = {k: v for k, v in raw["info"].items() if k not in ("estimates", "gpu_estimates")}
    add_estimates(raw["stages"], info)
    assert "estimates" not in info and len(info["gpu_estimates"]) == 1  # no CPU's estimate for a GPU's run
    md = table(raw["stages"], info)
    assert md == (RESULTS / "recipe-mtop-8000-locked-s42-h200.md").read_text()
    assert (
        "GPU NVIDIA H200, torch 2.11.0+cu130, 2026-11-28 06:25 (lent" in md
        and "The GPU's matmul peak 51.15 TFLOP/s fp32, 663.48 bf16" in md
    )
    assert "on the GPU the stages took 6.4 min" in md and "wall time of the command not measured" in md
    assert sum(r["seconds"] for r in raw["stages"]) == pytest.approx(6.4 * 60, abs=3)


def test_ran_on_takes_a_committed_gpu_benchmark_and_a_finished_run():
    """``--ran-on`` describes a run made on a GPU: without ``--from-run`` (a fresh run would measure this machine)
    or with a file outside benchmarks/results (a redraw could not find it) it is refused before any work."""
    import subprocess
    import sys

    from benchmarks.common import RESULTS

    def call(*args):
        return subprocess.run(
            [sys.executable, "-m", "benchmarks.recipe", *args], capture_output=True, text=True
        )

    gpu = str(RESULTS / "gpu-stages-nvidia-h200.json")
    r = call("--ran-on", gpu)
    assert r.returncode == 2 and "--ran-on needs --from-run" in r.stderr
    r = call("--from-run", "runs/x", "--ran-on", "elsewhere/gpu-stages-nvidia-h200.json")
    assert r.returncode == 2 and "give a benchmarks.gpu_stages result under" in r.stderr


def test_the_gpu_estimate_trains_at_the_runs_encoders_rate():
    """A run whose encoder is all-mpnet-base-v2 is estimated at mpnet's training rate, not MiniLM's."""
    from benchmarks.common import RESULTS
    from benchmarks.recipe_work import gpu_estimate

    raw = json.loads((RESULTS / "recipe-mtop-8000-locked-s42-h200.json").read_text())
    gpu = json.loads((RESULTS / "gpu-stages-nvidia-h200.json").read_text())
    s = {
        enc: {r["stage"]: r["seconds"] for r in gpu_estimate(raw["stages"], gpu, enc)["stages"]}
        for enc in ("all-MiniLM-L6-v2", "all-mpnet-base-v2")
    }
    assert s["all-mpnet-base-v2"]["round-1/encoder"] > 2 * s["all-MiniLM-L6-v2"]["round-1/encoder"]
    assert s["all-mpnet-base-v2"]["round-1/scores"] == s["all-MiniLM-L6-v2"]["round-1/scores"]
