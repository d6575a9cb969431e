"""What names an LM and where and how it runs, without torch: the configured name (``lm_name``), the identity of
its weights (``model_identity``), the device (``default_device``) and the dtype ``models.dtype`` means on this machine
(``resolve_dtype``). The factory (``epr.lm.factory``) builds an ``LMSpec`` from these; loading and keys both use it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from epr.config.per_device import visible_device

__all__ = [
    "DTYPES",
    "DEVICE_SIZES",
    "lm_name",
    "model_identity",
    "default_device",
    "resolve_dtype",
    "warn_if_emulated",
    "device_size",
]

DTYPES = ("auto", "bf16", "fp32")

# Batch sizes whose best value depends on the device, used where the config leaves them null: (CPU, GPU). The GPU's
# from the H200 sweep (benchmarks/results/gpu-stages-nvidia-h200-sweep.md and gpu-stages-nvidia-h200.md): the scorer
# at 16,384 padded tokens 2.2x its rate at 4,096 (SmolLM2-135M's shape, prefix-shared; past 16,384 batched scoring
# got slower and prefix-shared 10% faster at 262,144, which ran out of memory with Llama-3.2-1B's vocabulary), the lean decoder at 256 rows 4.5x its rate at 64 (256 on
# a 1B model with 1,100-token prompts is ~9 GB of KV cache: kept at 256, not the sweep's faster 1,024, for smaller
# GPUs); generation chunks of 4x the rows, so a chunk keeps its steps full. The CPU's are the sizes every shipped
# config ran with before (configs/base.yaml's 2048 tokens, fastest on the 2-core AMX machine:
# benchmarks/results/scoring.md; 64 rows in chunks of 256: benchmarks/results/generate-*.md), so their CPU keys
# stay. A config that does not inherit base.yaml scored bf16 at the old dataclass default, 4096: it now gets 2048 and
# new keys (its bf16 scores are computed again; fp32 keys do not name the batch).
# Training's length buckets: 4 on a CPU (1.39x one padded batch's rate on Zen 4: fewer padded FLOPs,
# benchmarks/results/training-precision-zen4.md), 1 on a GPU, where a step of 4 buckets dispatches 7,910 operators
# against one batch's 2,210 (training-precision-zen4-ops.md) and the H200 trained at 4.7-6.8 steps/s with 4 against
# 27 for one padded batch of the same shape (docs/benchmarks.md): launches, not FLOPs, set a GPU's step there.
DEVICE_SIZES = {
    "scoring.batch_tokens": (2048, 16384),
    "generate.decode_rows": (64, 256),
    "generate.chunk_size": (256, 1024),
    "train.length_buckets": (4, 1),
}


def lm_name(models, inference: bool = False) -> str:
    """The scoring LM's name, or the inference LM's (``models.inference_lm``, defaulting to the scoring LM)."""
    return (models.inference_lm or models.lm) if inference else models.lm


def model_identity(name: str) -> dict:
    """What names a model's weights: the name, and for a local folder also a digest of the full content of its
    files (``files``), so a folder whose weights were replaced, even in place, is another model to every cache.
    Each file is hashed once and remembered by path, size and modification time (``cache.cached_digest``)."""
    from epr.cache import cached_digest

    p = Path(name)
    if not p.is_dir():
        return {"lm": name}
    h = hashlib.sha256()
    for f in sorted(x for x in p.iterdir() if x.is_file()):
        h.update(f.name.encode() + b"\0" + str(cached_digest(f, full=True)).encode() + b"\n")
    return {"lm": name, "files": h.hexdigest()[:16]}


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu`` (the ground layer's :func:`epr.config.per_device.visible_device`,
    which config loading uses too)."""
    return visible_device()


def device_size(field: str, value: int | None, device: str | None) -> int:
    """``value``, or where it is null the size :data:`DEVICE_SIZES` gives ``field`` on ``device`` (a GPU: ``cuda``,
    ``cuda:N``; anything else, a served LM's None included, takes the CPU's)."""
    if value is not None:
        return value
    cpu, gpu = DEVICE_SIZES[field]
    return gpu if str(device or "cpu").startswith("cuda") else cpu


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


_WARNED: set[str] = set()


def warn_if_emulated(dtype: str, device: str = "cpu") -> None:
    """Say once per process, where a model is loaded to compute, that bf16 on a CPU without AMX or AVX512-BF16 is
    emulated (tens of times slower than the fp32 that ``auto`` picks there). Building a key says nothing."""
    msg = (
        "models.dtype: bf16 on a CPU without AMX or AVX512-BF16 (an AVX2-only CPU emulates bf16 matrix work: tens "
        "of times slower than fp32, which models.dtype: auto would choose here); its scores are bf16's, stored "
        "under bf16's key"
    )
    if dtype == "bf16" and not str(device).startswith("cuda") and not _cpu_has_bf16() and msg not in _WARNED:
        _WARNED.add(msg)
        import logging

        logging.getLogger(__name__).warning(msg)


def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    """``models.dtype`` on this machine: ``bf16`` where the hardware runs it fast (CUDA with bf16, a CPU with
    AMX / AVX512-BF16) under ``auto``, else ``fp32``; ``bf16`` / ``fp32`` as given."""
    if dtype not in DTYPES:
        from epr.types import ConfigError

        raise ConfigError(f"models.dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    if str(device).startswith("cuda"):
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if _cpu_has_bf16() else "fp32"
