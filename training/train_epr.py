"""Train the EPR dual encoder: the ``encoder`` stage of a run, for ``accelerate launch`` / ``torchrun``.

The training itself is ``epr.encoder.train``; this script runs the stage through the pipeline
(``epr.pipeline.run(..., until="encoder")``), so it writes the same ``runs/<name>/encoder/`` folder and manifest as
``epr run``. Stale stages before it run first, in every process: with ``candidates.rounds`` > 1 (the default: 2)
that is each earlier round (its candidates, LM scores, labels and encoder, under ``runs/<name>/rounds/``) and then
the last round's candidates, scores and labels (``epr run -c <config> --until labels`` first does the same)::

    accelerate launch training/train_epr.py -c configs/mtop.yaml
    accelerate launch --num_processes 2 training/train_epr.py -c configs/mtop.yaml --set train.batch_size=64
    python training/train_epr.py -c configs/demo.yaml --set train.epochs=1        # one process is fine too
    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 training/train_epr.py -c ...  # several CPU processes
    (accelerate's own launcher starts a single process on a machine without GPUs)

A killed training continues from its newest complete checkpoint of the same config (``--resume``, the default,
is accepted for old command lines; ``--fresh`` deletes the checkpoints and starts over). A fresh stage is
skipped unless ``--force`` (or ``--fresh``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--resume", action="store_true", help="the default (kept for old command lines)")
    ap.add_argument(
        "--fresh", action="store_true", help="delete the stage's checkpoints and train from scratch"
    )
    ap.add_argument("--force", action="store_true", help="train even when the stage is fresh")
    a = ap.parse_args(argv)
    if a.resume and a.fresh:
        ap.error("--resume and --fresh contradict each other")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("accelerate.accelerator", "accelerate.checkpointing"):  # a line per file of each checkpoint
        logging.getLogger(name).setLevel(logging.WARNING)

    from epr import pipeline
    from epr.config import load_config
    from epr.context import Context, Dist
    from epr.run_lock import run_lock

    ctx = Context(load_config(a.config, a.set), Dist.from_env())
    lock = run_lock(ctx.cfg.run_dir, "this run", dist=ctx.dist)  # one writer per run, until the process ends
    lock.__enter__()
    if a.fresh:
        if ctx.dist.is_main:
            shutil.rmtree(ctx.stage_dir("encoder") / "checkpoints", ignore_errors=True)
        ctx.dist.barrier()
    ran = pipeline.run(ctx, until="encoder", force=("encoder",) if a.force or a.fresh else ())
    if "encoder" not in ran and ctx.dist.is_main:
        print(f"{ctx.stage_dir('encoder')} is fresh: nothing to do (--force retrains)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
