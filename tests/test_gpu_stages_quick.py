"""``benchmarks/gpu_stages.py``, the benchmark prepared for a GPU machine, runs end to end on the CPU with
``--quick`` (tiny random models): every section, every model shape, positive throughputs, both result files."""

from __future__ import annotations

import json

from benchmarks.gpu_stages import ENCODERS, LMS, main

RATES = {
    "label scoring": ("tok_s", "seq_s", "tflops", "of_peak"),
    "generation": ("new_tok_s", "prompts_s", "tflops", "of_peak"),
    "encoder training": ("steps_s", "tokens_s", "tflops_est", "of_peak"),
}


def test_quick_run_measures_every_section(tmp_path):
    main(["--quick", "--device", "cpu", "--out", str(tmp_path)])
    (js,) = tmp_path.glob("gpu-stages-quick-cpu.json")
    raw = json.loads(js.read_text())
    md = js.with_suffix(".md").read_text()
    rows = raw["rows"]
    assert [r for r in rows if "error" in r or "skipped" in r] == []
    assert raw["peak_tflops"]["bf16"] > 0 and raw["peak_tflops"]["fp32"] > 0 and raw["copy_gbps"] > 0
    assert {(r["stage"], r["model"]) for r in rows} == {
        *((s, m) for s in ("label scoring", "generation") for m in LMS),
        *(("encoder training", m) for m in ENCODERS),
    }
    for r in rows:
        assert all(r[k] > 0 for k in RATES[r["stage"]]), r
        assert f"| {r['stage']} | {r['model']} | {r['setting']} |" in md
    scoring = [r for r in rows if r["stage"] == "label scoring"]
    assert {r["method"] for r in scoring} == {"batched", "prefix-shared"}
    # the prefix-shared scorer computes each distinct prefix once: fewer FLOPs for the same sequences
    by = {(r["model"], r["method"]): r["flops"] for r in scoring}
    assert all(by[m, "prefix-shared"] < by[m, "batched"] for m in LMS)
    # no stop: every prompt gets all its new tokens
    assert all(
        r["new_tokens"] == r["prompts"] * r["max_new_tokens"] for r in rows if r["stage"] == "generation"
    )
    assert {r["dtype"] for r in rows if r["stage"] == "encoder training"} == {"fp32", "bf16"}


def test_profile_traces_each_scoring_setting(tmp_path):
    """``--profile`` (the check prepared for a lent GPU, issue 77) traces every scoring setting and writes its table;
    the plain run (above) traces none."""
    main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--sections", "scoring", "--profile"])
    raw = json.loads(next(tmp_path.glob("gpu-stages-quick-cpu.json")).read_text())
    scoring = [r for r in raw["rows"] if r["stage"] == "label scoring"]
    assert scoring and all("profile" in r for r in scoring)
    for r in scoring:
        pr = r["profile"]
        assert pr["wall_s"] > 0 and 0 < pr["busy_s"] and pr["top"] and pr["launches"] is None  # no CUDA here
        assert pr["top"][0]["own_s"] >= pr["top"][-1]["own_s"]
    md = next(tmp_path.glob("gpu-stages-quick-cpu.md")).read_text()
    assert "**Traced**" in md and md.count("| prefix-shared, batch_tokens") >= 2 * len(LMS)
