"""Shared benchmark helpers: machine description and result files (JSON raw + Markdown table)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from epr.reports.machine import describe, machine  # noqa: F401  (re-exported for the benchmarks)

RESULTS = Path(__file__).resolve().parent / "results"


def matmul_tflops(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e12


def machine_slug(m: dict) -> str:
    """A result file's machine part: the AMD generation where known (``zen4``), else the CPU name, slugged."""
    import re

    from epr.reports.machine import ZEN

    gen = ZEN.get((str(m.get("cpu_family")), str(m.get("cpu_model")))) if "AMD" in m["cpu"] else None
    return (
        re.sub(r"[^a-z0-9]+", "", gen.lower())
        if gen
        else re.sub(r"[^a-z0-9]+", "-", m["cpu"].lower()).strip("-")
    )


def save(name: str, raw: dict, markdown: str, out: Path | None = None) -> None:
    """``<out>/<name>.json`` (raw) and ``.md``; ``out`` defaults to ``benchmarks/results``."""
    out = RESULTS if out is None else Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(raw, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)
    print(markdown)


def mtop_sequences(data_dir: str, queries: int, L: int, seed: int = 0):
    """One chunk of the scores stage labelling MTOP's whole pool with prefix sharing on: BM25 over outputs proposes
    ``L`` candidates per pool example, queries in the stage's chunk order (by output), a seeded run of ``queries``
    consecutive ones. Returns (contexts, targets, demonstrations), ``queries * L`` of each."""
    import numpy as np

    from epr.config import DataConfig
    from epr.stages.candidates import mine
    from epr.tasks import get_task

    task = get_task(DataConfig(task="mtop", data_dir=data_dir))
    pool, _ = task.load()
    ranks = mine(pool, np.arange(len(pool)), L, "output", "bm25s", progress=False)
    ranks.sort(key=lambda r: (pool[r.qid].output, r.qid))
    start = int(np.random.default_rng(seed).integers(0, len(ranks) - queries))
    ranks = ranks[start : start + queries]
    ctxs = [task.format_demo(pool[c]) + task.format_query(pool[r.qid].input) for r in ranks for c in r.ids]
    tgts = [task.format_target(pool[r.qid].output) for r in ranks for _ in r.ids]
    demos = [task.format_demo(pool[c]) for r in ranks for c in r.ids]
    return ctxs, tgts, demos
