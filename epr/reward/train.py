"""Training the reward model on the labels (issue 74; LLM-R's reward model, Wang et al. 2023): for each labelled
example, ``reward.list_size`` of its LM-scored candidates (the best and a seeded sample, as the dual encoder's
listwise losses take them: ``epr.encoder.data.sample_group``) are read with the query by the cross-encoder, and the
loss is ``KL(softmax(LM scores / reward.teacher_temperature) || softmax(reward scores))`` over them
(``epr.encoder.losses.group_kl``). No LM is called: the labels' scores are the whole teacher.

Every process of an ``accelerate launch`` trains its share of each batch (DistributedDataParallel averages the
gradients); checkpoints are the encoder's (``epr.encoder.checkpoints``): guarded by the stage fingerprint, resumed
after a kill with the same batches, RNG states and schedule. Each epoch's dev metrics (on ``reward.dev_size`` held-out
examples, all their candidates): the listwise KL and how often the reward model's top candidate is the LM's."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from epr.artifacts import atomic_write_text
from epr.encoder.checkpoints import Checkpoints
from epr.encoder.data import LabelRow, sample_group, split_dev
from epr.encoder.losses import group_kl
from epr.encoder.train import TrainingData, make_accelerator, off_global_rng
from epr.reward.model import CrossEncoder

__all__ = ["train_reward", "dev_metrics", "group_scores", "merge_rounds"]

log = logging.getLogger(__name__)

WARMUP = 0.1  # of the optimizer steps


def merge_rounds(rounds: list[list[LabelRow]]) -> list[LabelRow]:
    """Every round's label rows as one row per labelled example: the union of its scored candidates (a pair scored
    in two rounds has one score: the same LM scored the same sequence), best first (ties: lower id), with the last
    round's positives and negatives. Examples in the order they first appear."""
    merged: dict[int, dict[int, float]] = {}
    last: dict[int, LabelRow] = {}
    for rows in rounds:
        for r in rows:
            merged.setdefault(r.qid, {}).update(zip(r.cands, r.cand_scores))
            last[r.qid] = r
    out = []
    for qid, cands in merged.items():
        order = sorted(cands.items(), key=lambda t: (-t[1], t[0]))
        out.append(
            LabelRow(
                qid, last[qid].pos, last[qid].neg, tuple(i for i, _ in order), tuple(s for _, s in order)
            )
        )
    return out


def group_scores(model, rows: list[LabelRow], groups: list[tuple], pool, task) -> torch.Tensor:
    """The reward model's ``(B, G)`` scores of each row's group of candidates (``sample_group``'s ids)."""
    m = model.module if hasattr(model, "module") else model
    qs = [pool[r.qid].input for r, g in zip(rows, groups) for _ in g[0]]
    ds = [m.demo(task, pool[i]) for g in groups for i in g[0]]
    return model(m.tokenize(qs, ds)).view(len(rows), -1)


@torch.no_grad()
def dev_metrics(model: CrossEncoder, dev: list[LabelRow], pool, task, teacher_temperature: float) -> dict:
    """On held-out labelled examples, every scored candidate: the mean listwise KL (the training loss) and the share
    of examples whose reward-model top candidate is the LM's top (their ties: the LM's first)."""
    if not dev:
        return {}
    was = model.training
    model.eval()
    kls, top = [], []
    for r in dev:
        s = torch.tensor(
            model.score([pool[r.qid].input] * len(r.cands), [model.demo(task, pool[i]) for i in r.cands])
        )
        t = torch.tensor(r.cand_scores, dtype=torch.float32)
        kls.append(
            float(group_kl(s[None], t[None], torch.ones(1, len(t), dtype=torch.bool), teacher_temperature))
        )
        top.append(int(torch.argmax(s)) == int(torch.argmax(t)))
    model.train(was)
    return {"dev_kl": float(np.mean(kls)), "dev_top1": float(np.mean(top)), "dev_examples": len(dev)}


def _loader(rows: list[LabelRow], batch_size: int, seed: int, epoch: int) -> DataLoader:
    """The labelled examples in a seeded per-epoch order (drawn here, not by the loader: a resumed epoch then draws
    nothing from the RNG states a checkpoint restores)."""
    order = np.random.default_rng([seed, epoch]).permutation(len(rows))
    return DataLoader(
        [rows[i] for i in order], batch_size=batch_size, shuffle=False, drop_last=True, collate_fn=list
    )


def train_reward(
    rc, data: TrainingData, out: Path, fp: str, resume: bool = True, cache: str | None = None
) -> dict:
    """Train into ``out`` (``out/model``: the saved cross-encoder; every process calls it); returns the manifest's
    ``rows`` and ``extra``. ``rc``: the ``reward`` config section; ``fp`` owns the checkpoints."""
    out = Path(out)
    acc = make_accelerator(out)
    set_seed(rc.seed)
    pool, task = data.pool, data.task
    if any(not r.cands for r in data.labels):
        raise ValueError(
            "the reward model learns from every scored candidate: rerun the labels stage (old labels)"
        )
    train_rows, dev = split_dev(data.labels, rc.dev_size, rc.seed, "reward.dev_size")
    model = CrossEncoder.from_pretrained(rc.backbone, rc.max_length, cache, rc.seed)
    steps_per_epoch = len(train_rows) // (rc.batch_size * acc.num_processes)
    if steps_per_epoch == 0:
        raise ValueError(f"{len(train_rows)} labelled examples cannot fill one batch of {rc.batch_size} x "
                         f"{acc.num_processes} processes; lower reward.batch_size")  # fmt: skip
    total = max(steps_per_epoch * rc.epochs, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=rc.lr)
    sched = get_linear_schedule_with_warmup(opt, int(WARMUP * total), total)
    model, opt = acc.prepare(model, opt)
    acc.register_for_checkpointing(sched)
    plain = acc.unwrap_model(model)
    ckpts = Checkpoints(out / "checkpoints", fp, acc)
    ckpts.claim(fresh=not resume)
    history, losses, start_epoch, skip = [], [], 0, 0
    if (last := ckpts.latest()) is not None:  # weights, optimizer, schedule, RNG states
        acc.load_state(str(last.path))
        p = last.progress
        start_epoch, skip, history, losses = p["epoch"], p["step_in_epoch"], p["history"], p["epoch_losses"]
    if not history:
        history.append(
            {"epoch": 0, "loss": None, **dev_metrics(plain, dev, pool, task, rc.teacher_temperature)}
        )
    step = start = start_epoch * steps_per_epoch + skip
    for epoch in range(start_epoch, rc.epochs):
        model.train()
        dl = acc.prepare(_loader(train_rows, rc.batch_size, rc.seed, epoch))
        if skip:
            dl = acc.skip_first_batches(dl, skip)
        bar = tqdm(off_global_rng(dl), desc=f"reward model, epoch {epoch + 1}/{rc.epochs}", total=steps_per_epoch, initial=skip,
                   disable=not acc.is_main_process)  # fmt: skip
        for i, rows in enumerate(bar, start=skip):
            groups = [sample_group(r, rc.list_size, rc.seed, epoch) for r in rows]
            teacher = torch.tensor([g[1] for g in groups], dtype=torch.float32, device=acc.device)
            valid = torch.tensor([g[2] for g in groups], dtype=torch.bool, device=acc.device)
            loss = group_kl(
                group_scores(model, rows, groups, pool, task), teacher, valid, rc.teacher_temperature
            )
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(acc.gather(loss.detach()[None]).mean().item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            step += 1
            if rc.checkpoint_every and step % rc.checkpoint_every == 0 and i + 1 < steps_per_epoch:
                ckpts.save(step, _progress(epoch, i + 1, steps_per_epoch, history, losses))
        bar.close()
        skip = 0
        row = {"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else None,
               **dev_metrics(plain, dev, pool, task, rc.teacher_temperature)}  # fmt: skip
        history.append(row)
        losses = []
        acc.print(f"reward model, epoch {epoch + 1}: {row}")
        ckpts.save(step, _progress(epoch + 1, 0, steps_per_epoch, history, losses))
    acc.wait_for_everyone()
    cut, n_pairs = _pairs_cut(plain, rc.max_length, train_rows, pool, task)
    if acc.is_main_process:
        plain.save(out / "model")
        atomic_write_text(out / "history.json", json.dumps(history, indent=2) + "\n")
        ckpts.remove()
    acc.wait_for_everyone()
    return {
        "rows": {"train_examples": len(train_rows), "dev_examples": len(dev), "pairs": n_pairs, "steps": step},
        "extra": {"history": history, "processes": acc.num_processes, "resumed_from_step": start,
                  "steps_run": step - start, "pairs_cut": cut},
    }  # fmt: skip


def _pairs_cut(model: CrossEncoder, max_length: int, rows: list[LabelRow], pool, task) -> tuple[int, int]:
    """How many of the [query; demonstration] pairs the training read were cut at ``max_length`` (warned), of all."""
    qs = [pool[r.qid].input for r in rows for _ in r.cands]
    cut = model.cut(qs, [model.demo(task, pool[i]) for r in rows for i in r.cands])
    if cut:
        log.warning("reward.max_length=%d cuts %d of the %d [query; demonstration] pairs it trains on (%.0f%%)",
                    max_length, cut, len(qs), 100 * cut / len(qs))  # fmt: skip
    return cut, len(qs)


def _progress(epoch: int, step_in_epoch: int, steps_per_epoch: int, history: list, losses: list) -> dict:
    where = {"epoch": epoch, "step_in_epoch": step_in_epoch, "steps_per_epoch": steps_per_epoch}
    return {**where, "history": history, "epoch_losses": losses}
