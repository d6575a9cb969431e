"""Dual-encoder training throughput and peak memory: effective batch 32 vs 256, with and without GradCache.

Each configuration runs in its own process (peak RSS is per process), on synthetic MTOP-like instances from
the MTOP pool with the packaged MiniLM, for ``--steps`` timed optimizer steps after one warm-up step.

    python -m benchmarks.training [--steps 2] [--data-dir ../shared/data]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from benchmarks.common import machine, save


def one(batch: int, chunk: int, steps: int, data_dir: str) -> dict:
    import numpy as np
    import torch

    from epr.config import DataConfig
    from epr.encoder.losses import contrastive_loss, grad_cache_backward
    from epr.encoder.model import DualEncoder
    from epr.tasks import get_task

    task = get_task(DataConfig(task="mtop", data_dir=data_dir))
    pool, _ = task.load()
    rng = np.random.default_rng(0)
    model = DualEncoder.from_pretrained("minilm")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    times = []
    for step in range(steps + 1):
        idx = rng.choice(len(pool), 3 * batch, replace=False)
        qs = [pool[i].input for i in idx[:batch]]
        ds = [task.format_demo(pool[i]).strip() for i in idx[batch:]]
        t = time.perf_counter()
        if chunk:
            grad_cache_backward(
                lambda b: model(b, "query"),
                lambda b: model(b, "prompt"),
                [model.tokenize(qs[i : i + chunk]) for i in range(0, batch, chunk)],
                [model.tokenize(ds[i : i + 2 * chunk]) for i in range(0, 2 * batch, 2 * chunk)],
                contrastive_loss,
            )
        else:
            contrastive_loss(
                model(model.tokenize(qs), "query"), model(model.tokenize(ds), "prompt")
            ).backward()
        opt.step()
        opt.zero_grad()
        if step:
            times.append(time.perf_counter() - t)
    return {
        "batch": batch,
        "chunk": chunk,
        "sec_per_step": float(np.mean(times)),
        "instances_per_s": batch / float(np.mean(times)),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        b, c = map(int, a.one.split(","))
        print(json.dumps(one(b, c, a.steps, a.data_dir)))
        return
    rows = []
    for b, c in [(32, 0), (32, 16), (256, 0), (256, 16)]:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.training",
                "--one",
                f"{b},{c}",
                "--steps",
                str(a.steps),
                "--data-dir",
                a.data_dir,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
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
