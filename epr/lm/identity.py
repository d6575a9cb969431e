"""What names an LM and where and how it runs, without torch: the configured name (``lm_name``), the identity of
its weights (``model_identity``), the device (``default_device``) and the dtype ``models.dtype`` means on this machine
(``resolve_dtype``). The factory (``epr.lm.factory``) builds an ``LMSpec`` from these; loading and keys both use it."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

__all__ = ["DTYPES", "lm_name", "model_identity", "default_device", "resolve_dtype"]

DTYPES = ("auto", "bf16", "fp32")


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


def _nvidia_visible() -> bool:
    return Path("/proc/driver/nvidia/gpus").exists() or Path("/dev/nvidia0").exists()


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``. Without an NVIDIA driver torch is not imported to find out."""
    if "torch" not in sys.modules and not _nvidia_visible():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


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
