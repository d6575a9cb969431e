"""The default recipe end to end, stage by stage, on this machine.

    python -m benchmarks.recipe                                   # epr run -c configs/mtop.yaml, empty run root
    python -m benchmarks.recipe --set models.dtype=fp32 --import-scores results/mtop-curve/labels-smollm2-fp32.json.gz
    python -m benchmarks.recipe --from-run runs/mtop -c configs/mtop.yaml   # the table of a run already made

Runs ``epr run`` (every round, ``select``, the comparison) in a subprocess from an empty run root (``--run-root``,
default ``runs-bench``), then reads every stage's manifest, the earlier rounds' included: its wall time and its work
(sequences scored, sequences the score cache served, training steps, prompts). The machine's limits are measured in
the same process (matmul peak in fp32 and bf16, read bandwidth), and the subprocess's peak RSS is reported. Writes
``benchmarks/results/recipe-<name>.json`` (raw) and ``.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import describe, machine, matmul_tflops, save
from benchmarks.generate import memory_gbps

BAR_S = 45 * 60  # issue 49: the default MTOP recipe end to end in 45 minutes on 2 cores


def stage_rows(run_dir: Path) -> list[dict]:
    """One row per finished stage of the run (earlier rounds first, the locked part's comparing stages last), from
    the manifests: name, seconds, work."""
    rows = []
    rounds = sorted((run_dir / "rounds").glob("round-*"), key=lambda p: int(p.name.split("-")[1]))
    parts = [*[(f"{r.name}/", r) for r in rounds], ("", run_dir)]
    if (run_dir / "locked").is_dir():  # the comparing stages of a data.eval_part=locked run
        parts.append(("locked/", run_dir / "locked"))
    for prefix, d in parts:
        for man in sorted(d.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime):
            m = json.loads(man.read_text())
            if m.get("stage") == "rounds" or "seconds" not in m:
                continue  # the rounds stage's time is its rounds' stages, listed above
            work = dict(m.get("rows", {}))
            speed = m.get("scoring_speed")
            if speed:
                work["scored_here"] = speed.get("scored_here")
            rows.append({"stage": prefix + m["stage"], "seconds": m["seconds"], "work": work})
    return rows


def table(rows: list[dict], info: dict) -> str:
    total = sum(r["seconds"] for r in rows)
    lines = [
        f"# The default recipe, stage by stage ({info['command']})",
        "",
        f"Machine: {info['machine']}. Measured in the same run: matmul peak {info['peak_fp32']:.2f} TFLOP/s fp32, "
        f"{info['peak_bf16']:.2f} bf16; read bandwidth {info['bandwidth_gbps']:.1f} GB/s. Peak RSS "
        f"{info['peak_rss_mb']:.0f} MB.",
        "",
        "| stage | seconds | share | work |",
        "|---|---|---|---|",
    ]
    for r in rows:
        work = ", ".join(f"{k} {v}" for k, v in r["work"].items())
        lines.append(
            f"| {r['stage']} | {r['seconds']:.0f} | {r['seconds'] / max(total, 1e-9):.0%} | {work} |"
        )
    verdict = "within" if total <= BAR_S else "over"
    lines += [
        "",
        f"Stages' total: {total / 60:.1f} min ({verdict} the 45-minute bar); wall time of the command: "
        f"{info['wall_s'] / 60:.1f} min (model loading and start-up between stages included).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/mtop.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--run-root", default="runs-bench", help="an empty run root (nothing cached)")
    ap.add_argument("--import-scores", action="append", default=[], help="epr cache import FILE first")
    ap.add_argument("--from-run", help="only read this finished run folder's manifests (no run)")
    ap.add_argument("--name", default=None, help="result file name (default: the config's name)")
    a = ap.parse_args()
    sets = [*a.set]
    epr = [sys.executable, "-m", "epr.cli"]
    t0 = time.time()
    if a.from_run:
        run_dir = Path(a.from_run)
        command = f"epr run -c {a.config} " + " ".join(f"--set {s}" for s in sets)
    else:
        root = Path(a.run_root)
        if root.exists() and any(root.iterdir()):
            sys.exit(f"{root}: not empty; the benchmark starts from an empty run root (--run-root)")
        sets.append(f"run_root={root}")
        cfg = ["-c", a.config, *[x for s in sets for x in ("--set", s)]]
        for f in a.import_scores:
            subprocess.run([*epr, "cache", "import", *cfg, f], check=True)
        command = " ".join(["epr", "run", *cfg])
        subprocess.run([*epr, "run", *cfg], check=True)
        from epr.config import load_config

        run_dir = load_config([a.config], sets).run_dir
    wall = time.time() - t0
    import torch

    info = {
        "command": command,
        "machine": describe(machine()),
        "peak_fp32": matmul_tflops(torch.float32),
        "peak_bf16": matmul_tflops(torch.bfloat16),
        "bandwidth_gbps": memory_gbps(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "wall_s": wall if not a.from_run else sum(r["seconds"] for r in stage_rows(run_dir)),
        "from_run": bool(a.from_run),
    }
    rows = stage_rows(run_dir)
    save(f"recipe-{a.name or run_dir.name}", {"info": info, "stages": rows}, table(rows, info))


if __name__ == "__main__":
    main()
