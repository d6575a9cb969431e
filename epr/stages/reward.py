"""Stage ``reward``: train the reward model (``epr.reward``) on this run's labels, every scored candidate of each
labelled example in every round (``epr.reward.train.merge_rounds``: no new LM scoring), in the pipeline's processes (``distributed``: ``accelerate launch -m epr.cli stage reward`` trains
it across processes). Resumes a killed training from its newest complete checkpoint. It runs when asked for
(``epr stage reward``) or when a re-ranking retriever needs it; the default recipe does not train it yet."""

from __future__ import annotations

from pathlib import Path

from epr.context import Context


def run_reward(ctx: Context, out: Path, fp: str) -> dict:
    from epr.artifacts import read_jsonl
    from epr.encoder.data import read_labels
    from epr.encoder.train import TrainingData
    from epr.reward.train import merge_rounds, train_reward

    pool = ctx.examples("pool")
    rounds = []
    for r in ctx.rounds():  # each round's labels are upstream of this run's (its rounds stage ran them)
        f = r.stage_dir("labels") / "labels.jsonl"
        rounds.append(read_labels(list(read_jsonl(f)), len(pool), str(f)))
    data = TrainingData(pool=pool, task=ctx.task, labels=merge_rounds(rounds), candidates={})
    result = train_reward(ctx.cfg.reward, data, out, fp, resume=True, cache=ctx.cfg.models.cache_dir)
    result.setdefault("extra", {})["rounds"] = len(rounds)
    return result


def reward_dir(ctx: Context) -> Path:
    """The trained reward model a re-ranking retriever serves."""
    return ctx.stage_dir("reward") / "model"
