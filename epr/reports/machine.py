"""The machine a result was measured on, for every result file: CPU, its SIMD/bf16 support, threads, torch."""

from __future__ import annotations

import platform
import time
from pathlib import Path

__all__ = ["machine", "describe", "stamp"]

ZEN = {("25", "17"): "Zen 4", ("25", "1"): "Zen 3", ("23", "49"): "Zen 2", ("23", "1"): "Zen 1"}


def machine() -> dict:
    import torch

    cpu, family, model = "unknown", None, None
    try:
        info = Path("/proc/cpuinfo").read_text()

        def field(name: str):
            return next(
                (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.split(":")[0].strip() == name),
                None,
            )

        cpu = field("model name") or cpu
        family, model = field("cpu family"), field("model")
        amx, avx512bf16, avx512 = "amx_bf16" in info, "avx512_bf16" in info, "avx512f" in info
    except OSError:
        amx = avx512bf16 = avx512 = False
    return {
        "cpu": cpu,
        "cpu_family": family,  # with "model": tells CPU generations apart where the name does not (AMD EPYC)
        "cpu_model": model,
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
    gen = ""
    if m.get("cpu_family") is not None:
        known = ZEN.get((str(m["cpu_family"]), str(m.get("cpu_model")))) if "AMD" in m["cpu"] else None
        gen = f" [{known}]" if known else f" [family {m['cpu_family']} model {m.get('cpu_model')}]"
    return f"{m['cpu']}{gen} ({simd}), {m['threads']} threads{gpu}, torch {m['torch']}, {m['date']}"


def stamp(m: dict) -> str:
    """What names a CPU device for a bf16 arm that may resume in a later session (``scripts/gpu_queue.sh`` HERE
    mode): the CPU's name and generation, its bf16 instructions and torch. Not the date or threads."""
    bf16 = "+".join(k for k in ("amx_bf16", "avx512_bf16") if m.get(k)) or "no-bf16"
    return f"{m['cpu']} (family {m.get('cpu_family')} model {m.get('cpu_model')}, {bf16}), torch {m['torch']}"
