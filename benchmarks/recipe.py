"""The default recipe end to end, stage by stage, on this machine.

    python -m benchmarks.recipe                                   # epr run -c configs/mtop.yaml, empty run root
    python -m benchmarks.recipe --set models.dtype=fp32 --import-scores results/mtop-curve/labels-smollm2-fp32.json.gz
    python -m benchmarks.recipe --from-run runs/mtop -c configs/mtop.yaml   # the table of a run already made
    python -m benchmarks.recipe --redraw benchmarks/results/recipe-mtop-default-recipe-zen4.json  # table only
    python -m benchmarks.recipe --from-run RUN -c configs/mtop.yaml --set ... \
        --ran-on benchmarks/results/gpu-stages-nvidia-h200.json   # a run made on a lent GPU, read here

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

from benchmarks.common import RESULTS, describe, machine, matmul_tflops, save
from benchmarks.generate import memory_gbps

BAR_S = 45 * 60  # issue 49: the default MTOP recipe end to end in 45 minutes on 2 cores
# GPU runs of benchmarks.gpu_stages whose rates estimate the recipe there (benchmarks.recipe_work.gpu_estimate)
GPU_RESULTS = ("gpu-stages-nvidia-h200.json",)


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
                # where the scoring loop's time went (pairs prepared, the LM's calls, the store), when logged
                work |= {f"{k}_s": v for k, v in (speed.get("seconds_by_part") or {}).items()}
            rows.append(
                {
                    "stage": prefix + m["stage"],
                    "seconds": m["seconds"],
                    "work": work,
                    "dir": str(man.parent),
                    "manifest": m,
                }
            )
    return rows


def table(rows: list[dict], info: dict) -> str:
    total = sum(r["seconds"] for r in rows)
    lines = [
        f"# The default recipe, stage by stage ({info['command']})",
        "",
        f"Machine: {info['machine']}. "
        + ("The GPU's" if info.get("ran_on") else "Measured in the same run:")
        + f" matmul peak {info['peak_fp32']:.2f} TFLOP/s fp32, "
        f"{info['peak_bf16']:.2f} bf16; read bandwidth {info['bandwidth_gbps']:.1f} GB/s. Peak RSS "
        + (
            f"{info['peak_rss_mb']:.0f} MB."
            if info["peak_rss_mb"]
            else "not measured (read from a finished run)."
        ),
        "",
        "| stage | seconds | share | work | tokens | dtype | TFLOP | fraction of the matmul peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        work = ", ".join(f"{k} {v}" for k, v in r["work"].items())
        flops = f"{r['flops'] / 1e12:.1f}" if "flops" in r else ""
        frac = f"{r['fraction']:.2f}" if r.get("fraction") is not None else ""
        lines.append(
            f"| {r['stage']} | {r['seconds']:.0f} | {r['seconds'] / max(total, 1e-9):.0%} | {work} | "
            f"{r.get('tokens', '')} | {r.get('dtype', '')} | {flops} | {frac} |"
        )
    verdict = "within" if total <= BAR_S else "over"
    floor = sum(r["flops"] / (info[f"peak_{r['dtype']}"] * 1e12) for r in rows if r.get("flops"))
    counted = sum(r["seconds"] for r in rows if r.get("flops"))
    lines += [
        "",
        f"The counted stages take {counted / 60:.1f} min; at 100% of the matmul peak their FLOPs would take "
        f"{floor / 60:.1f} min (a floor: decoding is bound by memory, not FLOPs).",
        "",
        "Work is counted from the run's artifacts (`benchmarks/recipe_work.py`): label scoring counts the sequences no "
        "earlier round scored, at 2 x the LM's non-embedding parameters per token (dense-equivalent: prefix sharing "
        "computes each demonstration once, so its real FLOPs are fewer); training 6 x the encoder's per token; predict "
        "the prompt + gold tokens prefilled and the tokens generated (decoding is bound by reading the weights, not by "
        "FLOPs: its bound is `benchmarks.generate`'s).",
        "",
        f"Stages' total: {total / 60:.1f} min ({verdict} the 45-minute bar); "
        + (
            "wall time of the command not measured (read from a finished run)."
            if info.get("from_run")
            else f"wall time of the command: {info['wall_s'] / 60:.1f} min (model loading and start-up between "
            "stages included)."
        ),
        "",
    ]
    if info.get("estimates"):
        lines += [
            "**Estimated, not measured**: the same stages on other machines, each stage's time here times its kind's "
            "time there over time here, read off committed benchmarks of both machines (`benchmarks/recipe_work.py`, "
            "`ESTIMATES`: LM prefill from the scoring benchmark, or the matmul peak where that is all there is; "
            "generation from the lean decoder's; training as LM prefill).",
            "",
            "| machine | label scoring + select | generation | training | stages' total |",
            "|---|---|---|---|---|",
        ]
        for name, e in info["estimates"].items():
            f = e["factors"]
            lines.append(
                f"| {name} | x{f['lm']:.2f} | x{f['predict']:.2f} | x{f['encoder']:.2f} | "
                f"{e['total_s'] / 60:.0f} min |"
            )
        lines.append("")
    for g in info.get("gpu_estimates", []):
        if info.get("ran_on"):
            lines += [
                f"**Measured against estimated**: on the GPU the stages took {total / 60:.1f} min; the estimate "
                f"below, from the benchmark of its kind of GPU, says {g['total_s'] / 60:.1f} min. Its 'here' is the "
                "GPU run itself (the stages off the LM path keep their measured time).",
                "",
            ]
        lines += [
            f"**Estimated, not measured: on one {g['device_name']}**, the counted work at the rates "
            f"`benchmarks.gpu_stages` measured there (random-init models of the same shapes; GPU sizes: "
            f"`scoring.batch_tokens` {g['sizes']['scoring.batch_tokens']}, `generate.decode_rows` "
            f"{g['sizes']['generate.decode_rows']}), stages off the GPU's LM path at their time "
            f"here (`benchmarks/recipe_work.py`, `gpu_estimate`): **{g['total_s'] / 60:.1f} min** in all, of which "
            f"the LM and training stages {g['lm_and_training_s']:.0f} s (model loading not counted).",
            "",
            "| stage | here (s) | there (s) | how |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['stage']} | {r['seconds_here']:.0f} | {r['seconds']:.1f} | {r['how']} |"
            for r in g["stages"]
            if r["seconds_here"] >= 1
        ]
        lines.append("")
    return "\n".join(lines)


def add_estimates(rows: list[dict], info: dict) -> None:
    """Other CPUs' estimates (only from a Zen 4 run: their factors are over a Zen 4's benchmarks) and the GPUs'."""
    from benchmarks.recipe_work import estimate, gpu_estimate

    encoder = info.get("encoder", "all-MiniLM-L6-v2")
    if info.get(
        "ran_on"
    ):  # a GPU's run: the estimate from that GPU's benchmark, beside what the run measured
        gpu = json.loads((RESULTS / info["ran_on"]).read_text())  # a committed benchmarks.gpu_stages result
        info["gpu_estimates"] = [gpu_estimate(rows, gpu, encoder)]
        return
    if "Zen 4" in info["machine"]:
        info["estimates"] = estimate(rows, RESULTS)
    info["gpu_estimates"] = [
        gpu_estimate(rows, json.loads((RESULTS / f).read_text()), encoder)
        for f in GPU_RESULTS
        if (RESULTS / f).exists()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default="configs/mtop.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--run-root", default="runs-bench", help="an empty run root (nothing cached)")
    ap.add_argument("--import-scores", action="append", default=[], help="epr cache import FILE first")
    ap.add_argument("--from-run", help="only read this finished run folder's manifests (no run)")
    ap.add_argument("--name", default=None, help="result file name (default: the config's name)")
    ap.add_argument(
        "--raw", help="with --from-run: the raw JSON of the benchmark that made the run (its wall time, RSS)"
    )
    ap.add_argument(
        "--ran-on",
        help="with --from-run: the run was made on another machine, a GPU's; this benchmarks.gpu_stages JSON of that "
        "kind of machine describes it and gives its peaks, and its estimate is set beside the measured stages",
    )
    ap.add_argument("--redraw", help="a raw JSON of this benchmark: its table again, estimates anew (no run)")
    a = ap.parse_args()
    if a.ran_on:  # a committed benchmark of the GPU the run was made on: the table names it, redraws read it
        if not a.from_run:
            ap.error("--ran-on needs --from-run (a run made on that GPU, read here)")
        if Path(a.ran_on).resolve().parent != RESULTS.resolve() or not Path(a.ran_on).is_file():
            ap.error(
                f"--ran-on {a.ran_on}: give a benchmarks.gpu_stages result under {RESULTS} (commit it there)"
            )
        a.ran_on = Path(a.ran_on).name
    if a.redraw:
        raw = json.loads(Path(a.redraw).read_text())
        add_estimates(raw["stages"], raw["info"])
        return save(Path(a.redraw).stem, raw, table(raw["stages"], raw["info"]), Path(a.redraw).parent)
    sets = [*a.set]
    epr = [sys.executable, "-m", "epr.cli"]
    t0 = time.time()
    from epr.config import load_config

    if a.from_run:
        run_dir = Path(a.from_run)
        sets.append(f"run_root={run_dir.parent}")
        if load_config([a.config], sets).run_dir.resolve() != run_dir.resolve():
            sys.exit(
                f"{run_dir}: not the run folder of {a.config} with these --set values (its name differs)"
            )
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
        run_dir = load_config([a.config], sets).run_dir
    wall = time.time() - t0
    import torch

    cfg = load_config([a.config], sets)
    rows = stage_rows(run_dir)
    info = {
        "command": command,
        "machine": describe(machine()),
        "peak_fp32": max(matmul_tflops(torch.float32) for _ in range(3)),
        "peak_bf16": max(matmul_tflops(torch.bfloat16) for _ in range(3)),
        "bandwidth_gbps": memory_gbps(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "wall_s": wall,
        "from_run": bool(a.from_run),
        # the training rate a GPU estimate reads (benchmarks.gpu_stages measured these two shapes)
        "encoder": "all-mpnet-base-v2" if "mpnet" in cfg.models.encoder else "all-MiniLM-L6-v2",
    }
    if a.from_run and a.ran_on:  # made on a lent GPU: that machine's figures, not this one's
        gpu = json.loads((RESULTS / a.ran_on).read_text())
        logged = [r["manifest"]["scoring_speed"]["machine"] for r in rows
                  if (r["manifest"].get("scoring_speed") or {}).get("machine")]  # fmt: skip
        info.update(
            machine=f"{logged[0] if logged else gpu['device_name']} (lent; the run was read here from its folder; "
            f"the peaks are {a.ran_on}'s, {describe(gpu['machine'])})",
            peak_fp32=gpu["peak_tflops"]["fp32"],
            peak_bf16=gpu["peak_tflops"]["bf16"],
            bandwidth_gbps=gpu["copy_gbps"],
            peak_rss_mb=None,
            ran_on=a.ran_on,
        )
    if a.from_run and a.raw:
        first = json.loads(Path(a.raw).read_text())["info"]
        info.update(
            command=first["command"], wall_s=first["wall_s"], peak_rss_mb=first["peak_rss_mb"], from_run=False
        )
    from benchmarks.recipe_work import run_work

    if a.from_run and not a.raw:  # no command was timed here: the stages' own total
        info["wall_s"] = sum(r["seconds"] for r in rows)
    run_work(cfg, rows, {"fp32": info["peak_fp32"], "bf16": info["peak_bf16"]})
    add_estimates(rows, info)
    save(f"recipe-{a.name or run_dir.name}", {"info": info, "stages": rows}, table(rows, info))


if __name__ == "__main__":
    main()
