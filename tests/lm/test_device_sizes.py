"""Batch sizes that depend on the device (``epr.lm.identity.DEVICE_SIZES``, issue 49): a null config value takes the
CPU's size on a CPU and the GPU's on a GPU, an explicit value always wins, and on a CPU every key that names them is
the same as when they were fixed numbers in ``configs/base.yaml`` (2048 tokens) and the config's defaults (64 rows,
256 prompts), so caches and committed runs made before stay valid. (A config that does not inherit base.yaml scored
bf16 at 4096 tokens before; it now gets 2048, and new keys.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from epr import pipeline
from epr.config import load_config
from epr.context import Context
from epr.lm import factory
from epr.lm.identity import DEVICE_SIZES, device_size


def test_null_takes_the_device_size_and_a_set_value_wins():
    for field, (cpu, gpu) in DEVICE_SIZES.items():
        assert device_size(field, None, "cpu") == cpu
        assert device_size(field, None, None) == cpu  # a served LM: no local device
        assert device_size(field, None, "cuda") == gpu == device_size(field, None, "cuda:1")
        assert device_size(field, 7, "cuda") == 7 == device_size(field, 7, "cpu")
        # the GPU's batches are the larger (its training step one batch, not the CPU's length-sorted sub-batches)
        assert (gpu < cpu) if field == "train.length_buckets" else (gpu > cpu)


def _cfg(tmp_path, *extra):
    return load_config([], [f"run_root={tmp_path}", "data.task=demo", "models.dtype=bf16", *extra])


@pytest.fixture
def on(monkeypatch):
    """Pretend the inference and scoring LM run on ``device`` (keys are built without loading a model)."""

    def set_device(device: str):
        monkeypatch.setattr(factory, "default_device", lambda: device)

    return set_device


def test_keys_on_a_cpu_are_those_of_the_old_fixed_sizes(tmp_path, on):
    on("cpu")
    old = ("scoring.batch_tokens=2048", "generate.decode_rows=64", "generate.chunk_size=256")
    assert factory.scoring_key(_cfg(tmp_path)) == factory.scoring_key(_cfg(tmp_path, *old))
    for stage in ("scores", "predict"):
        new = pipeline.stage_fingerprint(Context(_cfg(tmp_path)), stage)
        assert new == pipeline.stage_fingerprint(Context(_cfg(tmp_path, *old)), stage)
        # negative control: another size is another computation
        other = pipeline.stage_fingerprint(
            Context(_cfg(tmp_path, "scoring.batch_tokens=8192", "generate.decode_rows=32")), stage
        )
        assert other != new
    g = factory.generate_settings(_cfg(tmp_path))
    assert (g["decode_rows"], g["chunk_size"]) == (64, 256)


def test_a_gpu_gets_and_keys_its_own_sizes(tmp_path, on):
    on("cuda")
    key = factory.scoring_key(_cfg(tmp_path))
    assert key["device"] == "cuda" and key["batch_tokens"] == DEVICE_SIZES["scoring.batch_tokens"][1]
    g = factory.generate_settings(_cfg(tmp_path))
    assert (g["decode_rows"], g["chunk_size"]) == (
        DEVICE_SIZES["generate.decode_rows"][1],
        DEVICE_SIZES["generate.chunk_size"][1],
    )
    assert g["chunk_size"] >= 4 * g["decode_rows"]  # a chunk keeps the decoder's steps full
    # set on the command line, the value wins on a GPU too, and keys as set
    g = factory.generate_settings(_cfg(tmp_path, "generate.decode_rows=16", "generate.chunk_size=64"))
    assert (g["decode_rows"], g["chunk_size"]) == (16, 64)
    assert factory.scoring_key(_cfg(tmp_path, "scoring.batch_tokens=2048"))["batch_tokens"] == 2048


def test_the_scorer_and_the_generator_run_with_the_resolved_sizes(tmp_path, tiny_lm_dir):
    """What is built runs with the sizes its key names (the tiny LM on this CPU)."""
    cfg = _cfg(tmp_path, f"models.lm={tiny_lm_dir}", "models.dtype=fp32")
    gen, scorer = factory.inference_lm(cfg, "\n")
    assert scorer.batch_tokens == DEVICE_SIZES["scoring.batch_tokens"][0]
    assert gen.lean.max_rows == DEVICE_SIZES["generate.decode_rows"][0]
    cfg = _cfg(tmp_path, f"models.lm={tiny_lm_dir}", "models.dtype=fp32", "generate.decode_rows=5")
    assert factory.inference_lm(cfg, "\n")[0].lean.max_rows == 5
    assert (
        factory.scorer_for(_cfg(tmp_path, "scoring.batch_tokens=99"), gen.model, gen.tok).batch_tokens == 99
    )


def test_shipped_configs_leave_the_sizes_to_the_device(tmp_path, on):
    """Every shipped config inherits null sizes, so a GPU gets its own; on a CPU they resolve to what base.yaml set
    before (2048 tokens), the key every cached score of the shipped configs was made under."""
    on("cpu")
    cfg = load_config(
        [str(Path(__file__).resolve().parents[2] / "configs/mtop.yaml")],
        [f"run_root={tmp_path}", "models.dtype=bf16"],
    )
    assert cfg.scoring.batch_tokens is None and cfg.generate.decode_rows is None
    assert factory.scoring_key(cfg)["batch_tokens"] == 2048
    on("cuda")
    assert factory.scoring_key(cfg)["batch_tokens"] == 16384


def test_gpu_memory_reads_the_allocator_on_cuda_only(monkeypatch):
    """The scores manifest's note on the CUDA allocator (peak held and used, retries after a failed allocation):
    nothing off CUDA; on CUDA the allocator's own counters, in GB."""
    import torch

    assert factory.gpu_memory("cpu") == {} and factory.gpu_memory("mps") == {}
    gb = 1024**3
    stats = {
        "reserved_bytes.all.peak": 139 * gb,
        "allocated_bytes.all.peak": 12 * gb + gb // 2,
        "num_alloc_retries": 57,
    }
    seen = []
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda d: seen.append(d) or stats)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": 143 * gb})
    )
    got = factory.gpu_memory("cuda:1")
    assert got == {"max_reserved_gb": 139.0, "max_allocated_gb": 12.5, "total_gb": 143.0, "alloc_retries": 57}
    assert seen == ["cuda:1"]


def test_bf16_asked_for_on_a_cpu_without_bf16_instructions_is_named_once(monkeypatch, caplog):
    """An AVX2-only CPU emulates bf16 matrix work: asking for bf16 there is allowed (its scores are bf16's, under
    bf16's key) but said once per process where a model is loaded to compute (``pick_dtype``); building a key
    (``resolve_dtype``) says nothing, auto picks fp32 there, and a bf16 CPU and CUDA say nothing."""
    import logging

    import torch

    from epr.lm import identity
    from epr.lm.models import pick_dtype

    monkeypatch.setattr(identity, "_WARNED", set())
    monkeypatch.setattr(identity, "_cpu_has_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="epr.lm.identity"):
        assert identity.resolve_dtype("bf16") == "bf16" and not caplog.records  # a key: no warning
        assert pick_dtype("auto") == torch.float32 and not caplog.records
        assert pick_dtype("bf16", "cuda:0") == torch.bfloat16 and not caplog.records
        assert pick_dtype("bf16") == torch.bfloat16 == pick_dtype("bf16", "cpu")
        assert len(caplog.records) == 1 and "AVX512-BF16" in caplog.records[0].getMessage()
        caplog.clear()
        monkeypatch.setattr(identity, "_cpu_has_bf16", lambda: True)
        monkeypatch.setattr(identity, "_WARNED", set())
        assert pick_dtype("bf16") == torch.bfloat16 == pick_dtype("auto")
        assert not caplog.records
