"""Stage ``encoder``: train the dual encoder on the run's labels (``epr.encoder.train``) in the pipeline's processes.

The stage is run by every process of a launch (``distributed``): ``accelerate launch training/train_epr.py -c
<config>`` (or ``-m epr.cli``) trains it across processes or GPUs and writes the same folder and manifest. A
killed training resumes from its newest complete checkpoint when the stage runs again with the same config.
"""

from __future__ import annotations

from pathlib import Path

from epr.context import Context


def run_encoder(ctx: Context, out: Path, fp: str) -> dict:
    from epr.artifacts import read_jsonl
    from epr.encoder.data import read_labels
    from epr.encoder.train import TrainingData, train

    pool = ctx.examples("pool")
    labels_file = ctx.stage_dir("labels") / "labels.jsonl"
    labels = read_labels(list(read_jsonl(labels_file)), len(pool), str(labels_file))
    cands = {r["qid"]: r["ids"] for r in read_jsonl(ctx.stage_dir("candidates") / "candidates.jsonl")}
    data = TrainingData(pool=pool, task=ctx.task, labels=labels, candidates=cands)
    return train(ctx.cfg, data, out, fp, resume=True, world=ctx.dist.world)
