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
        amx = "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        amx = False
    return {
        "cpu": cpu,
        "amx_bf16": amx,
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


def save(name: str, raw: dict, markdown: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(raw, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)
