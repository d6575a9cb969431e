"""Stage ``encoder``: train the dual encoder on the run's labels (``epr.encoder.train``) in the pipeline's processes;
with ``train.teacher: reward``, on the ``teacher`` stage's rows (the reward model's scores), judged on the labels.

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
    if ctx.cfg.train.teacher == "reward":  # learn the reward model's scores; the dev metric stays the LM's
        from epr.stages.teacher import teacher_file

        f = teacher_file(ctx.stage_dir("teacher"))
        taught = read_labels(list(read_jsonl(f)), len(pool), str(f))
        data = TrainingData(pool=pool, task=ctx.task, labels=taught, candidates=cands, dev_labels=labels)
    init = warm_start_dir(ctx)
    result = train(ctx.cfg, data, out, fp, resume=True, world=ctx.dist.world, init=init)
    if init is not None:
        result.setdefault("extra", {})["warm_start"] = str(init)
    return result


def warm_start_dir(ctx: Context) -> Path | None:
    """The trained encoder this round starts from: with ``train.init: previous``, the encoder of the round that
    mined its candidates (this run's round r, or ``candidates.mine_run``); ``None`` for round 1 or ``init: base``."""
    rnd = ctx.this_round
    if ctx.cfg.train.init != "previous" or not rnd.remined or rnd.mine_dir is None:
        return None
    return Path(rnd.mine_dir) / "encoder" / "model"
