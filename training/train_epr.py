"""Train the EPR dual encoder on the labels of an ``epr`` run (SPEC 2.4).

Launch (reads the run's ``labels`` and ``examples`` stages, writes ``runs/<name>/encoder/``)::

    accelerate launch training/train_epr.py -c configs/mtop.yaml
    accelerate launch --num_processes 2 training/train_epr.py -c configs/mtop.yaml --set train.batch_size=64
    python training/train_epr.py -c configs/demo.yaml --set train.epochs=1        # one process is fine too
    accelerate launch training/train_epr.py -c configs/mtop.yaml --resume          # from the last checkpoint
    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 training/train_epr.py -c ...  # several CPU processes
    (accelerate's own launcher starts a single process on a machine without GPUs)

``train.loss``: ``epr`` (the paper's: each instance gets one sampled positive and one sampled hard negative, and
every other instance's documents, gathered across processes, are negatives too: 2B-1 in all), ``listwise`` (UDR)
or ``distill`` (LLM-R), which learn from ``train.list_size`` scored candidates per instance (epr/loss.py).
``train.similarity``: ``dot`` (EPR) or ``cosine`` with a temperature. The epoch with the best dev metric
(``train.best_by``; epoch 0 is the untrained encoder) is the one saved. ``train.chunk_size > 0`` turns on
gradient caching, so the batch size is bounded by time, not memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from epr.artifacts import read_jsonl, write_manifest
from epr.config import load_config, train_loss_weight, train_temperature
from epr.encoder import DualEncoder
from epr.loss import gather_keep_local_grad, gather_plain, grad_cache_backward, group_loss
from epr.pipeline import stage_fingerprint
from epr.context import Context
from epr.train_data import demo_text, read_labels, recall_mrr, sample_group, sample_pair, split_dev

log = logging.getLogger("train_epr")


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
    ds = [demo_text(task, pool[i]) for g in batch["ids"] for i in g]
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
    loss = loss_fn(unwrapped(unwrapped.tokenize(qs), "query"), unwrapped(unwrapped.tokenize(ds), "prompt"))
    accelerator.backward(loss)
    return loss.detach()


def sum_gradients(model: torch.nn.Module, accelerator) -> None:
    """Sum the gradients over processes. Each process back-propagated the whole batch's loss through its own
    slice of embeddings only, so the sum is the gradient of the whole batch. (The towers run several forward
    passes per step, two towers and GradCache re-forwards, which DDP's hooks do not allow, so forward/backward
    use the unwrapped module and the reduction is done here.)"""
    if accelerator.num_processes == 1:
        return
    import torch.distributed as dist

    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def evaluate(model: DualEncoder, dev, cands: dict, pool, task, k: int) -> dict:
    """Intrinsic dev metric without the LM: recall@k of LM positives among the L candidates, and MRR."""
    if not dev:
        return {}
    q = model.encode([pool[r.qid].input for r in dev], "query")
    ids = [cands[r.qid] for r in dev]
    flat = sorted({i for c in ids for i in c})
    emb = model.encode([demo_text(task, pool[i]) for i in flat], "prompt")
    pos_of = {c: j for j, c in enumerate(flat)}
    cand_emb = [emb[[pos_of[i] for i in c]] for c in ids]
    rec, mrr = recall_mrr(q, cand_emb, ids, [r.pos for r in dev], k)
    return {f"recall@{k}": rec, "mrr": mrr}


def train(ctx: Context, resume: bool = False) -> dict:
    cfg, tc = ctx.cfg, ctx.cfg.train
    out = ctx.stage_dir("encoder")
    accelerator = Accelerator(
        gradient_accumulation_steps=tc.grad_accum, mixed_precision=tc.mixed_precision, project_dir=str(out)
    )
    set_seed(tc.seed)
    pool = ctx.examples("pool")
    labels = read_labels(
        list(read_jsonl(ctx.stage_dir("labels") / "labels.jsonl")),
        len(pool),
        str(ctx.stage_dir("labels") / "labels.jsonl"),
    )
    cands = {r["qid"]: r["ids"] for r in read_jsonl(ctx.stage_dir("candidates") / "candidates.jsonl")}
    train_rows, dev = split_dev(labels, tc.dev_size, tc.seed)
    k = cfg.labels.k_pos

    model = DualEncoder.from_pretrained(
        cfg.models.encoder,
        tie=tc.tie_encoders,
        max_length=tc.max_length,
        cache=cfg.models.cache_dir,
        similarity=tc.similarity,
    )
    per_proc = tc.batch_size
    steps_per_epoch = len(train_rows) // (per_proc * accelerator.num_processes)
    if steps_per_epoch == 0:
        raise ValueError(
            f"{len(train_rows)} training instances cannot fill one batch of {per_proc} x "
            f"{accelerator.num_processes} processes; lower train.batch_size"
        )
    total = steps_per_epoch * tc.epochs // tc.grad_accum
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    sched = get_linear_schedule_with_warmup(opt, int(tc.warmup_ratio * total), max(total, 1))
    model, opt, sched = accelerator.prepare(model, opt, sched)

    history, start_epoch, skip = [], 0, 0
    ckpt_root = out / "checkpoints"
    if resume and ckpt_root.exists() and any(ckpt_root.iterdir()):
        last = max(ckpt_root.iterdir(), key=lambda p: int(p.name.split("_")[1]))
        accelerator.load_state(str(last))
        st = json.loads((last / "progress.json").read_text())
        start_epoch, skip, history = st["epoch"], st["step_in_epoch"], st["history"]
        accelerator.print(f"resumed from {last} (epoch {start_epoch}, step {skip})")
    if not history:
        history.append(
            {
                "epoch": 0,
                "loss": None,
                **evaluate(accelerator.unwrap_model(model), dev, cands, pool, ctx.task, k),
            }
        )
        accelerator.print(f"untrained: {history[-1]}")
        if accelerator.is_main_process:  # epoch 0 is a candidate for the best epoch too
            accelerator.unwrap_model(model).save_pretrained(out / "best_model")

    step = start_epoch * steps_per_epoch + skip
    for epoch in range(start_epoch, tc.epochs):
        model.train()
        dl = accelerator.prepare(get_dataloader(train_rows, per_proc, tc.seed, epoch, tc))
        if skip:
            dl = accelerator.skip_first_batches(dl, skip)
        losses = []
        bar = tqdm(dl, desc=f"epoch {epoch + 1}/{tc.epochs}", disable=not accelerator.is_main_process)
        for i, batch in enumerate(bar, start=skip):
            with accelerator.accumulate(model):
                loss = compute_loss(model, batch, pool, ctx.task, tc, accelerator)
                sum_gradients(accelerator.unwrap_model(model), accelerator)
                opt.step()
                sched.step()
                opt.zero_grad()
            losses.append(accelerator.gather(loss[None]).mean().item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            accelerator.log({"loss": losses[-1]}, step=step)
            step += 1
            if tc.checkpoint_every and step % tc.checkpoint_every == 0:
                _checkpoint(accelerator, ckpt_root, step, epoch, i + 1, history)
        skip = 0
        model.eval()
        row = {
            "epoch": epoch + 1,
            "loss": float(np.mean(losses)) if losses else None,
            **evaluate(accelerator.unwrap_model(model), dev, cands, pool, ctx.task, k),
        }
        history.append(row)
        accelerator.print(f"epoch {epoch + 1}: {row}")
        if accelerator.is_main_process and best_epoch(history, tc.best_by, k) == epoch + 1:
            accelerator.unwrap_model(model).save_pretrained(out / "best_model")
        _checkpoint(accelerator, ckpt_root, step, epoch + 1, 0, history)

    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        best = best_epoch(history, tc.best_by, k)
        if best == history[-1]["epoch"]:
            accelerator.unwrap_model(model).save_pretrained(out / "model")
        else:
            import shutil

            shutil.rmtree(out / "model", ignore_errors=True)
            shutil.copytree(out / "best_model", out / "model")
        accelerator.print(f"kept epoch {best} (train.best_by={tc.best_by})")
        (out / "history.json").write_text(json.dumps(history, indent=2) + "\n")
        _plot(history, out / "training_curve.png", k)
        write_manifest(
            out,
            stage="encoder",
            fp=stage_fingerprint(ctx, "encoder"),
            config=ctx.cfg.section("train"),
            rows={"train_instances": len(train_rows), "dev_instances": len(dev), "steps": step},
            extra={"history": history, "processes": accelerator.num_processes, "best_epoch": best},
        )
    accelerator.end_training()
    return {"history": history}


def best_epoch(history: list[dict], by: str, k: int) -> int:
    """The epoch (0 = untrained) whose dev metric is best (the earliest of equals); the last one for ``last`` or
    without a dev set."""
    key = {"mrr": "mrr", "recall": f"recall@{k}"}.get(by)
    if key is None or key not in history[0]:
        return history[-1]["epoch"]
    return max(history, key=lambda h: (h[key], -h["epoch"]))["epoch"]


def _checkpoint(accelerator, root: Path, step: int, epoch: int, step_in_epoch: int, history) -> None:
    d = root / f"step_{step}"
    accelerator.save_state(str(d))
    if accelerator.is_main_process:
        (d / "progress.json").write_text(
            json.dumps({"epoch": epoch, "step_in_epoch": step_in_epoch, "history": history})
        )


def _plot(history, path: Path, k: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    ax[0].plot(
        [h["epoch"] for h in history if h["loss"] is not None],
        [h["loss"] for h in history if h["loss"] is not None],
        "o-",
    )
    ax[0].set(xlabel="epoch", ylabel="train loss", title="contrastive loss")
    if f"recall@{k}" in history[0]:
        ax[1].plot(ep, [h[f"recall@{k}"] for h in history], "o-", label=f"recall@{k}")
        ax[1].plot(ep, [h["mrr"] for h in history], "s-", label="MRR")
        ax[1].set(xlabel="epoch (0 = untrained)", title="dev: LM positives among BM25 candidates")
        ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", action="append", default=[])
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = Context(load_config(a.config, a.set))
    train(ctx, resume=a.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
