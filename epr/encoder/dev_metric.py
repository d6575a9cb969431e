"""The training's dev metric, the choice of the epoch to keep, and the per-epoch training-curve plot
(``training_curve.png``)."""

from __future__ import annotations

from pathlib import Path

from epr.encoder.data import recall_mrr
from epr.encoder.model import DualEncoder

__all__ = ["evaluate", "best_epoch", "plot_history"]


def evaluate(model: DualEncoder, dev, cands: dict, pool, task, k: int) -> dict:
    """Intrinsic dev metric without the LM: recall@k of LM positives among the L candidates, and MRR."""
    if not dev:
        return {}
    q = model.encode([pool[r.qid].input for r in dev], "query")
    ids = [cands[r.qid] for r in dev]
    flat = sorted({i for c in ids for i in c})
    emb = model.encode([model.demo(task, pool[i]) for i in flat], "prompt")
    pos_of = {c: j for j, c in enumerate(flat)}
    cand_emb = [emb[[pos_of[i] for i in c]] for c in ids]
    rec, mrr = recall_mrr(q, cand_emb, ids, [r.pos for r in dev], k)
    return {f"recall@{k}": rec, "mrr": mrr}


def best_epoch(history: list[dict], by: str, k: int, trained_only: bool = False) -> int:
    """The epoch (0 = untrained) whose dev metric is best (the earliest of equals); the last one for
    ``last`` or without a dev set. ``trained_only`` (a warm-started round, whose epoch 0 is the previous round's
    encoder): epoch 0 is not a candidate once an epoch has trained, so a round never hands on its starting encoder
    unchanged because a few dev queries ranked it higher."""
    key = {"mrr": "mrr", "recall": f"recall@{k}"}.get(by)
    if key is None or key not in history[0]:
        return history[-1]["epoch"]
    pick = [h for h in history if h["epoch"] > 0] if trained_only and len(history) > 1 else history
    return max(pick, key=lambda h: (h[key], -h["epoch"]))["epoch"]


def plot_history(history: list[dict], path: Path, k: int) -> None:
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
