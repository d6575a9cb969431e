"""Stage ``reward``: train the reward model (``epr.reward``) on this run's labels, every scored candidate of each
labelled example, in the pipeline's processes (``distributed``: ``accelerate launch -m epr.cli stage reward`` trains
it across processes). Resumes a killed training from its newest complete checkpoint. It runs when asked for
(``epr stage reward``) or when a re-ranking retriever needs it; the default recipe does not train it yet."""

from __future__ import annotations

from pathlib import Path

from epr.context import Context


def run_reward(ctx: Context, out: Path, fp: str) -> dict:
    from epr.artifacts import read_jsonl
    from epr.encoder.data import read_labels
    from epr.encoder.train import TrainingData
    from epr.reward.train import train_reward

    pool = ctx.examples("pool")
    labels_file = ctx.stage_dir("labels") / "labels.jsonl"
    labels = read_labels(list(read_jsonl(labels_file)), len(pool), str(labels_file))
    data = TrainingData(pool=pool, task=ctx.task, labels=labels, candidates={})
    return train_reward(ctx.cfg.reward, data, out, fp, resume=True, cache=ctx.cfg.models.cache_dir)


def reward_dir(ctx: Context) -> Path:
    """The trained reward model a re-ranking retriever serves."""
    return ctx.stage_dir("reward") / "model"
