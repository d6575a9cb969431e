"""The machine a result was measured on, for every result file: CPU, its SIMD/bf16 support, threads, torch."""

from __future__ import annotations

import platform
import time
from pathlib import Path

__all__ = ["machine", "describe"]


def machine() -> dict:
    import torch

    cpu = "unknown"
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), cpu
        )
        amx, avx512bf16, avx512 = "amx_bf16" in info, "avx512_bf16" in info, "avx512f" in info
    except OSError:
        amx = avx512bf16 = avx512 = False
    return {
        "cpu": cpu,
        "amx_bf16": amx,
        "avx512_bf16": avx512bf16,
        "avx512f": avx512,
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def describe(m: dict) -> str:
    """One line for a results file: CPU, its bf16 support, threads, GPU if any, torch."""
    simd = next(
        (
            n
            for k, n in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX512"))
            if m.get(k)
        ),
        "AVX2",
    )
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return f"{m['cpu']} ({simd}), {m['threads']} threads{gpu}, torch {m['torch']}, {m['date']}"
