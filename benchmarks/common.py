"""Shared benchmark helpers: machine description and result files (JSON raw + Markdown table)."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        flags = Path("/proc/cpuinfo").read_text()
        amx, avx512bf16, avx512 = "amx_bf16" in flags, "avx512_bf16" in flags, "avx512f" in flags
    except OSError:
        amx = avx512bf16 = avx512 = False
    return {
        "cpu": cpu,
        "amx_bf16": amx,
        "avx512_bf16": avx512bf16,
        "avx512f": avx512,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def matmul_tflops(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


def describe(m: dict) -> str:
    """One line for a results file: CPU, its bf16 support, threads, torch."""
    simd = (
        "AMX"
        if m.get("amx_bf16")
        else "AVX512-BF16"
        if m.get("avx512_bf16")
        else "AVX512"
        if m.get("avx512f")
        else "AVX2"
    )
    return f"{m['cpu']} ({simd}), {m['threads']} threads, torch {m['torch']}, {m['date']}"


def save(name: str, raw: dict, markdown: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(raw, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)
