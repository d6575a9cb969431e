"""Train the EPR dual encoder on the labels of a run: the ``encoder`` stage (SPEC 2.4).

:func:`train` is what the stage runs, in the pipeline's process(es); ``training/train_epr.py`` runs the same
stage under ``accelerate launch`` / ``torchrun``. It takes what it learns from as arguments (``TrainingData``:
the pool, the task, the labels, each query's candidates; the stage reads them from the run) and writes ``model/`` (the kept epoch), ``best_model/``, ``history.json`` and
``training_curve.png``.

``train.loss``: ``epr`` (the paper's: each instance gets one sampled positive and one sampled hard negative,
and every other instance's documents, gathered across processes, are negatives too: 2B-1 in all),
``listwise`` (UDR) or ``distill`` (LLM-R), which learn from ``train.list_size`` scored candidates per
instance (epr/encoder/losses.py). ``train.similarity``: ``dot`` (EPR) or ``cosine`` with a temperature. The epoch with
the best dev metric (``train.best_by``; epoch 0 is the untrained encoder) is the one kept.
``train.chunk_size > 0`` turns on gradient caching, so the batch size is bounded by time, not memory.

Resuming: a checkpoint is written at every epoch end and every ``train.checkpoint_every`` steps
(epr/encoder/checkpoints.py), under the stage fingerprint. A restarted stage with the same config continues
from the newest complete one, mid-epoch included, and ends with the weights and history of an uninterrupted
run: the documents an instance sees are seeded by (seed, epoch, qid), the checkpoint holds the RNG states
(dropout), and data loading is kept off the global RNG (a new DataLoader iterator draws a seed from it).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from epr.artifacts import atomic_write_text
from epr.config import train_loss_weight, train_temperature
from epr.encoder.checkpoints import Checkpoints, save_model
from epr.encoder.data import length_from_data, sample_group, sample_pair, split_dev, token_lengths, truncation
from epr.encoder.dev_metric import best_epoch, evaluate, plot_history
from epr.encoder.losses import gather_keep_local_grad, gather_plain, grad_cache_backward, group_loss
from epr.encoder.model import DualEncoder
from epr.encoder.settings import effective_train

__all__ = [
    "TrainingData",
    "train",
    "get_dataloader",
    "make_batch",
    "compute_loss",
    "sum_gradients",
    "make_accelerator",
    "off_global_rng",
]

log = logging.getLogger(__name__)


def get_dataloader(rows, batch_size: int, seed: int, epoch: int, tc) -> DataLoader:
    """Instances in a seeded per-epoch order; the collate samples each instance's documents from (seed, epoch,
    qid), so what an instance sees does not depend on the number of processes."""
    order = np.random.default_rng([seed, epoch]).permutation(len(rows))
    return DataLoader(
        [rows[i] for i in order],
        batch_size=batch_size,
        shuffle=False,
        drop_last=True,
        collate_fn=lambda b: make_batch(b, tc, seed, epoch),
    )


def make_batch(rows, tc, seed: int, epoch: int) -> dict:
    """The documents of a batch: ``group`` rows per instance (EPR: a sampled positive and hard negative;
    listwise / distill: ``list_size`` scored candidates, best first, with their LM scores as ``teacher``)."""
    if tc.loss == "epr":
        ids = [list(sample_pair(r, seed, epoch)) for r in rows]
        return {"qids": [r.qid for r in rows], "ids": ids, "group": 2}
    groups = [sample_group(r, tc.list_size, seed, epoch) for r in rows]
    return {
        "qids": [r.qid for r in rows],
        "ids": [g[0] for g in groups],
        "teacher": torch.tensor([g[1] for g in groups], dtype=torch.float32),
        "valid": torch.tensor([g[2] for g in groups], dtype=torch.bool),
        "group": tc.list_size,
    }


def compute_loss(model: DualEncoder, batch: dict, pool, task, tc, accelerator) -> torch.Tensor:
    """Forward + backward for one batch; returns the detached loss of the whole (all-process) batch.

    Every process embeds its own instances, gathers all queries and documents, and computes the loss of the
    whole batch, in which only its own slice carries gradient; summing the processes' gradients
    (:func:`sum_gradients`) then gives exactly the one-process gradient of the whole batch (tested)."""
    unwrapped = accelerator.unwrap_model(model)
    qs = [pool[q].input for q in batch["qids"]]
    ds = [unwrapped.demo(task, pool[i]) for g in batch["ids"] for i in g]
    G = batch["group"]
    doc_ids = torch.tensor([i for g in batch["ids"] for i in g])
    teacher, valid = batch.get("teacher"), batch.get("valid")
    extra = (gather_plain(doc_ids),)
    if teacher is not None:
        extra += (gather_plain(teacher), gather_plain(valid))
    temp, weight = train_temperature(tc), train_loss_weight(tc)

    def loss_fn(q, d):
        q_all, _ = gather_keep_local_grad(q)
        d_all, _ = gather_keep_local_grad(d)
        dev = q_all.device
        ids_all = extra[0].to(dev)
        t_all, v_all = (extra[1].to(dev), extra[2].to(dev)) if teacher is not None else (None, None)
        return group_loss(
            tc.loss,
            q_all,
            d_all,
            G,
            temperature=temp,
            teacher=t_all,
            valid=v_all,
            doc_ids=ids_all,
            weight=weight,
            teacher_temperature=tc.teacher_temperature,
        )

    if tc.chunk_size and tc.chunk_size < len(qs):
        cs = tc.chunk_size
        q_chunks = [unwrapped.tokenize(qs[i : i + cs]) for i in range(0, len(qs), cs)]
        d_chunks = [unwrapped.tokenize(ds[i : i + G * cs]) for i in range(0, len(ds), G * cs)]
        return grad_cache_backward(
            lambda b: unwrapped(b, "query"),
            lambda b: unwrapped(b, "prompt"),
            q_chunks,
            d_chunks,
            loss_fn,
            backward=lambda t, g: accelerator.backward(t, gradient=g),
        )
    # resolved by effective_train; a caller's raw config gets the training device's size
    nb = tc.length_buckets
    if nb is None:
        from epr.lm.identity import device_size

        nb = device_size("train.length_buckets", None, accelerator.device.type)
    loss = loss_fn(unwrapped.embed_buckets(qs, "query", nb), unwrapped.embed_buckets(ds, "prompt", nb))
    accelerator.backward(loss)
    return loss.detach()


def sum_gradients(model: torch.nn.Module, accelerator) -> None:
    """Sum the gradients over processes. Each process back-propagated the whole batch's loss through its own
    slice of embeddings only, so the sum is the gradient of the whole batch. (The towers run several forward
    passes per step, two towers and GradCache re-forwards, which DDP's hooks do not allow, so forward/backward
    use the unwrapped module and the reduction is done here, once per optimizer step.)"""
    if accelerator.num_processes == 1:
        return
    import torch.distributed as dist

    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


@dataclass(frozen=True)
class TrainingData:
    """What a training learns from: the pool the labels index, the task (how a demonstration reads), the labels
    (``read_labels`` rows) and each query's candidate ids (for the dev metric). ``dev_labels``: where the labels
    are a teacher's (``train.teacher: reward``), the LM's rows the dev metric reads instead, row for row."""

    pool: list
    task: Any
    labels: list
    candidates: dict[int, list[int]]
    dev_labels: list | None = None


def train(
    cfg, data: TrainingData, out: Path, fp: str, resume: bool = True, world: int = 1, init: Path | None = None
) -> dict:
    """Train into ``out`` (every process calls it); returns the manifest's ``rows`` and ``extra``.

    ``fp``: the fingerprint that owns the checkpoints (a checkpoint of another fingerprint is never resumed).
    ``resume=False`` deletes them first. ``world``: the number of processes the caller expects. ``init``: a saved
    dual encoder to start from (a warm start, ``train.init: previous``; its own similarity and max length hold),
    else ``models.encoder``."""
    warm = init is not None
    tc, out = effective_train(cfg.train, warm), Path(out)
    accelerator = make_accelerator(out, tc.grad_accum, tc.mixed_precision)
    procs = {"accelerate": accelerator.num_processes, "caller": world}
    if torch.distributed.is_initialized():
        procs["torch.distributed"] = torch.distributed.get_world_size()
    # e.g. a stage run by one process of a launch, or a process layout read without accelerate's CPU flag
    if len(set(procs.values())) > 1:
        raise RuntimeError(f"the training's process counts disagree: {procs}")
    set_seed(tc.seed)
    pool, task, cands = data.pool, data.task, data.candidates
    train_rows, dev = split_dev(data.labels, tc.dev_size, tc.seed)
    if data.dev_labels is not None:  # the same held-out examples, judged by the LM's labels
        lm = {r.qid: r for r in data.dev_labels}
        dev = [lm[r.qid] for r in dev]
    k = cfg.labels.k_pos

    model = DualEncoder.from_pretrained(
        str(init) if init is not None else cfg.models.encoder,
        tie=tc.tie_encoders,
        max_length=tc.max_length,
        cache=cfg.models.cache_dir,
        similarity=tc.similarity,
        demo_fields=tc.demo_fields,
    )
    if tc.max_length == 0:  # from the data: the longest query or demonstration training reads, uncut
        model.max_length = data_length(model, task, pool, data.labels)
    cut = demo_truncation(model, task, pool, train_rows)
    if cut["share"] > TRUNCATION_WARN:
        log.warning(
            "train.max_length=%d cuts %d of the %d demonstrations the encoder trains on (%.0f%%; 90%% fit in %d "
            "tokens, 99%% in %d): the prompt encoder never sees their ends; raise train.max_length to see them "
            "(and set train.chunk_size, GradCache, to bound memory)",
            tc.max_length,
            cut["truncated"],
            cut["texts"],
            100 * cut["share"],
            cut["tokens_p90"],
            cut["tokens_p99"],
        )
    per_proc, n_proc = tc.batch_size, accelerator.num_processes
    steps_per_epoch = len(train_rows) // (per_proc * n_proc)
    if steps_per_epoch == 0:
        raise ValueError(
            f"{len(train_rows)} training instances cannot fill one batch of {per_proc} x "
            f"{n_proc} processes; lower train.batch_size"
        )
    total = steps_per_epoch * tc.epochs // tc.grad_accum
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    # not handed to accelerate, which would step it once per process per step: stepped once per optimizer step
    sched = get_linear_schedule_with_warmup(opt, int(tc.warmup_ratio * total), max(total, 1))
    model, opt = accelerator.prepare(model, opt)
    accelerator.register_for_checkpointing(sched)

    ckpts = Checkpoints(out / "checkpoints", fp, accelerator)
    ckpts.claim(fresh=not resume)
    history, losses, start_epoch, skip = [], [], 0, 0
    if (last := ckpts.latest()) is not None:
        accelerator.load_state(str(last.path))  # weights, optimizer, schedule, RNG states, accumulation step
        p = last.progress
        start_epoch, skip, history, losses = p["epoch"], p["step_in_epoch"], p["history"], p["epoch_losses"]
        accelerator.print(f"resumed from {last.path} (epoch {start_epoch + 1}, step {skip} of the epoch)")
    if not history:
        history.append(
            {"epoch": 0, "loss": None, **evaluate(_unwrap(accelerator, model), dev, cands, pool, task, k)}
        )
        start = "warm start (the earlier round's encoder)" if warm else "untrained"
        accelerator.print(f"{start}: {history[-1]}")
        if accelerator.is_main_process and not warm:  # epoch 0 is a candidate (not the warm start's)
            save_model(_unwrap(accelerator, model), out / "best_model")

    def progress(epoch: int, step_in_epoch: int) -> dict:
        where = {"epoch": epoch, "step_in_epoch": step_in_epoch, "steps_per_epoch": steps_per_epoch}
        return {**where, "history": history, "epoch_losses": losses}

    start_step = step = start_epoch * steps_per_epoch + skip
    for epoch in range(start_epoch, tc.epochs):
        model.train()
        dl = accelerator.prepare(get_dataloader(train_rows, per_proc, tc.seed, epoch, tc))
        if skip:
            dl = accelerator.skip_first_batches(dl, skip)
        bar = tqdm(
            off_global_rng(dl),
            desc=f"epoch {epoch + 1}/{tc.epochs}",
            total=steps_per_epoch,
            initial=skip,
            disable=not accelerator.is_main_process,
        )
        for i, batch in enumerate(bar, start=skip):
            with accelerator.accumulate(model):
                with accelerator.autocast():  # bf16 where train.mixed_precision says so (a no-op otherwise)
                    loss = compute_loss(model, batch, pool, task, tc, accelerator)
                if accelerator.sync_gradients:  # accumulated gradients are summed once, not per micro-batch
                    sum_gradients(_unwrap(accelerator, model), accelerator)
                opt.step()
                if accelerator.sync_gradients:
                    sched.step()
                opt.zero_grad()
            losses.append(accelerator.gather(loss[None]).mean().item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            step += 1
            mid_epoch = i + 1 < steps_per_epoch and accelerator.sync_gradients  # no half-accumulated gradient
            if tc.checkpoint_every and step % tc.checkpoint_every == 0 and mid_epoch:
                ckpts.save(step, progress(epoch, i + 1))
        bar.close()
        skip = 0
        model.eval()
        row = {
            "epoch": epoch + 1,
            "loss": float(np.mean(losses)) if losses else None,
            **evaluate(_unwrap(accelerator, model), dev, cands, pool, task, k),
        }
        history.append(row)
        losses = []
        accelerator.print(f"epoch {epoch + 1}: {row}")
        if accelerator.is_main_process and best_epoch(history, tc.best_by, k, warm) == epoch + 1:
            save_model(_unwrap(accelerator, model), out / "best_model")
        ckpts.save(step, progress(epoch + 1, 0))

    accelerator.wait_for_everyone()
    best = best_epoch(history, tc.best_by, k, warm)
    if best == 0:
        log.warning(
            "kept epoch 0, the untrained %s: it beat every trained epoch on the %d dev instances (train.best_by=%s)",
            cfg.models.encoder,
            len(dev),
            tc.best_by,
        )
    if accelerator.is_main_process:
        if best == history[-1]["epoch"]:
            save_model(_unwrap(accelerator, model), out / "model")
        else:
            save_model(out / "best_model", out / "model")
        accelerator.print(f"kept epoch {best} (train.best_by={tc.best_by})")
        atomic_write_text(out / "history.json", json.dumps(history, indent=2) + "\n")
        plot_history(history, out / "training_curve.png", k)
        ckpts.remove()
    accelerator.wait_for_everyone()  # (no end_training: it ends the process group the pipeline goes on with)
    return {
        "rows": {"train_instances": len(train_rows), "dev_instances": len(dev), "steps": step},
        "extra": {
            "history": history,
            "processes": n_proc,
            "best_epoch": best,
            "resumed_from_step": start_step,
            "steps_run": step - start_step,
            "demo_truncation": cut,
        },
    }


TRUNCATION_WARN = 0.05  # the share of cut demonstrations above which training warns


def demo_truncation(model: DualEncoder, task, pool, rows) -> dict:
    """``truncation`` of the demonstrations the training rows draw on (positives, negatives, scored candidates), as
    the prompt encoder tokenizes them."""
    ids = sorted({i for r in rows for i in (*r.pos, *r.neg, *r.cands)})
    return truncation(token_lengths(model.tok, [model.demo(task, pool[i]) for i in ids]), model.max_length)


def data_length(model: DualEncoder, task, pool, rows) -> int:
    """``train.max_length: 0``: the encoder length that cuts none of the queries and demonstrations of ``rows``
    (:func:`epr.encoder.data.length_from_data`), at most the encoder's position limit; logged."""
    ids = sorted({i for r in rows for i in (*r.pos, *r.neg, *r.cands)})
    texts = [model.demo(task, pool[i]) for i in ids] + [pool[r.qid].input for r in rows]
    lengths = token_lengths(model.tok, texts)
    cap = min(getattr(model.q_model.config, "max_position_embeddings", 512), model.tok.model_max_length)
    n = length_from_data(lengths, cap)
    log.info("train.max_length from the data: %d tokens (the longest of %d queries and demonstrations: %d; the "
             "encoder's limit: %d)", n, len(texts), max(lengths, default=0), cap)  # fmt: skip
    return n


def make_accelerator(out: Path, grad_accum: int = 1, mixed_precision: str = "no") -> Accelerator:
    """An Accelerator for a training that checkpoints under ``out`` (the dual encoder's, the reward model's)."""
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state.get("_mixed_precision", mixed_precision) != mixed_precision:
        # an earlier training in this process (the learning curve, tests) used another precision; the process
        # layout (PartialState) stays
        AcceleratorState._reset_state()
    return Accelerator(
        gradient_accumulation_steps=grad_accum, mixed_precision=mixed_precision, project_dir=str(out)
    )


def off_global_rng(batches):
    """Iterate ``batches`` without touching the global RNG (torch's: a DataLoader iterator draws its base seed
    from it when it starts). Otherwise a resumed epoch, which starts a new iterator after the checkpoint's RNG
    state is restored, would draw dropout masks other than the uninterrupted run's."""
    it = iter(batches)
    while True:
        with torch.random.fork_rng(devices=[]):
            try:
                batch = next(it)
            except StopIteration:
                return
        yield batch


def _unwrap(accelerator, model) -> DualEncoder:
    return accelerator.unwrap_model(model)
