"""Dual-encoder training throughput and peak memory: effective batch 32 vs 256, with and without GradCache; or
(``--precision``) the default recipe's step, fp32 against bf16 autocast (``train.mixed_precision``), each in one
padded batch and in length-sorted sub-batches (``train.length_buckets``), in one run.

Each configuration runs in its own process (peak RSS is per process), on synthetic MTOP-like instances from
the MTOP pool with the packaged MiniLM, for ``--steps`` timed optimizer steps after one warm-up step.

    python -m benchmarks.training [--steps 2] [--data-dir ../shared/data]
    python -m benchmarks.training --precision [--steps 5] [--tag zen4]   # -> results/training-precision-<tag>.md

The recipe's step (configs/mtop.yaml, distill): 32 queries, each with ``list_size`` = 8 scored demonstrations.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from benchmarks.common import describe, machine, save


def one(
    batch: int, chunk: int, steps: int, data_dir: str, precision: str = "no", docs: int = 2, buckets: int = 1,
    task_name: str = "mtop", max_length: int = 64,
) -> dict:  # fmt: skip
    """``docs`` demonstrations per query; ``precision``: no (fp32) | bf16 (autocast, as accelerate runs it);
    ``buckets``: ``train.length_buckets`` (length-sorted sub-batches, without GradCache); ``task_name``'s pool,
    the encoder keeping ``max_length`` tokens."""
    import contextlib

    import numpy as np
    import torch

    from epr.config import DataConfig
    from epr.encoder.model import DualEncoder
    from epr.tasks import get_task

    task = get_task(DataConfig(task=task_name, data_dir=data_dir))
    pool, _ = task.load()
    rng = np.random.default_rng(0)
    model = DualEncoder.from_pretrained("minilm", max_length=max_length)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    autocast = (
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        if precision == "bf16"
        else contextlib.nullcontext
    )
    for step in range(steps + 1):
        idx = rng.choice(len(pool), (1 + docs) * batch, replace=False)
        qs = [pool[i].input for i in idx[:batch]]
        ds = [task.format_demo(pool[i]).strip() for i in idx[batch:]]
        t = time.perf_counter()
        with autocast():
            _step(model, qs, ds, chunk, docs, buckets)
        opt.step()
        opt.zero_grad()
        if step:
            times.append(time.perf_counter() - t)
    ops = count_ops(lambda: _step(model, qs, ds, chunk, docs, buckets), autocast)
    opt.zero_grad()
    return {
        "task": task_name,
        "max_length": max_length,
        "batch": batch,
        "chunk": chunk,
        "precision": precision,
        "docs_per_query": docs,
        "length_buckets": buckets,
        "sec_per_step": float(np.mean(times)),
        "ops_per_step": ops,
        "instances_per_s": batch / float(np.mean(times)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def count_ops(fn, autocast) -> int:
    """The aten operators one call of ``fn`` dispatches, forward and backward (below autograd: each is about one
    kernel launch on a GPU, where a small model's step is bound by launches, not FLOPs). The same on any device."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count(), autocast():
        fn()
    return Count.n


def _step(model, qs, ds, chunk, docs, buckets: int = 1) -> None:
    from epr.encoder.losses import contrastive_loss, grad_cache_backward

    batch = len(qs)
    if chunk:
        grad_cache_backward(
            lambda b: model(b, "query"),
            lambda b: model(b, "prompt"),
            [model.tokenize(qs[i : i + chunk]) for i in range(0, batch, chunk)],
            [model.tokenize(ds[i : i + docs * chunk]) for i in range(0, docs * batch, docs * chunk)],
            contrastive_loss,
        )
    else:
        q, d = model.embed_buckets(qs, "query", buckets), model.embed_buckets(ds, "prompt", buckets)
        contrastive_loss(q, d).backward()


def _run_one(
    b: int, c: int, steps: int, data_dir: str, precision: str = "no", docs: int = 2, buckets: int = 1,
    task_name: str = "mtop", max_length: int = 64,
) -> dict:  # fmt: skip
    spec = f"{b},{c},{precision},{docs},{buckets},{task_name},{max_length}"
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.training", "--one", spec]
        + ["--steps", str(steps), "--data-dir", data_dir],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def precision_table(rows: list[dict], m: dict, steps: int) -> str:
    base = next(r for r in rows if r["precision"] == "no")
    md = [
        f"# Dual-encoder training step, fp32 vs bf16 autocast (MiniLM-L6, {describe(m)})",
        "",
        f"The default recipe's step shape (configs/mtop.yaml): {base['batch']} queries x {base['docs_per_query']} "
        f"demonstrations, no GradCache. Mean of {steps} steps after a warm-up, each configuration in its own process, "
        "one after the other in the same run.",
        "",
        "| train.mixed_precision | train.length_buckets | s / step | instances / s | vs fp32 | peak RSS (MB) | aten ops / step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['precision']} | {r.get('length_buckets', 1)} | {r['sec_per_step']:.2f} | {r['instances_per_s']:.1f} | "
            f"{base['sec_per_step'] / r['sec_per_step']:.2f}x | {r['peak_rss_mb']:.0f} | {r.get('ops_per_step', '')} |"
        )
    return "\n".join(md) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument(
        "--precision", action="store_true", help="fp32 vs bf16 autocast at the recipe's step shape"
    )
    ap.add_argument("--tag", default="", help="suffix of the result files (the machine)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        b, c, precision, docs, buckets, task_name, max_length = a.one.split(",")
        print(json.dumps(one(int(b), int(c), a.steps, a.data_dir, precision, int(docs), int(buckets), task_name,
                             int(max_length))))  # fmt: skip
        return
    if a.precision:
        m = machine()
        shapes = [("no", 1), ("bf16", 1), ("bf16", 4), ("no", 4)]
        rows = [_run_one(32, 0, a.steps, a.data_dir, p, 8, nb) for p, nb in shapes]
        name = "training-precision" + (f"-{a.tag}" if a.tag else "")
        save(name, {"machine": m, "steps": a.steps, "rows": rows}, precision_table(rows, m, a.steps))
        return
    rows = [_run_one(b, c, a.steps, a.data_dir) for b, c in [(32, 0), (32, 16), (256, 0), (256, 16)]]
    base = {r["batch"]: r for r in rows if r["chunk"] == 0}
    md = [
        f"# Dual-encoder training: throughput and peak memory (MiniLM-L6, fp32, {machine()['cpu']}, {machine()['date']})",
        "",
        f"One optimizer step = B queries + B positives + B hard negatives (2B-1 negatives per query). Mean of {a.steps} steps after a warm-up.",
        "",
        "| effective batch B | GradCache chunk | s / step | instances / s | peak RSS (MB) | memory vs plain |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["peak_rss_mb"] / base[r["batch"]]["peak_rss_mb"]
        md.append(
            f"| {r['batch']} | {r['chunk'] or 'off'} | {r['sec_per_step']:.2f} | {r['instances_per_s']:.1f} | {r['peak_rss_mb']:.0f} | {ratio:.2f} |"
        )
    md += [
        "",
        "Peak RSS includes the process baseline (Python, torch, the model, the data), so it understates the saving in activations.",
    ]
    save("training", {"machine": machine(), "rows": rows}, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
