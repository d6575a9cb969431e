"""Training instances for the dual encoder, read from the labels stage, and the intrinsic dev metric.

Per-item randomness comes from (seed, epoch, qid), so the sampled positive/negative of an instance does
not depend on the number of processes or workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from epr.types import Example, InputError

__all__ = ["LabelRow", "read_labels", "split_dev", "sample_pair", "recall_mrr"]


@dataclass(frozen=True)
class LabelRow:
    qid: int
    pos: tuple[int, ...]
    neg: tuple[int, ...]


def read_labels(rows: Sequence[dict], n_pool: int, where: str = "labels.jsonl") -> list[LabelRow]:
    """Validate label rows against the pool: unknown ids, empty positive or negative lists are errors."""
    if not rows:
        raise InputError(f"{where}: no label rows (empty file)")
    out = []
    for i, r in enumerate(rows, start=1):
        pos, neg = tuple(r.get("pos") or ()), tuple(r.get("neg") or ())
        if not pos or not neg:
            raise InputError(
                f"{where}:{i}: query {r.get('qid')} has {len(pos)} positives and {len(neg)} negatives; "
                "each instance needs at least one of both"
            )
        bad = [x for x in (r["qid"], *pos, *neg) if not 0 <= int(x) < n_pool]
        if bad:
            raise InputError(f"{where}:{i}: ids {bad} are not in the pool of {n_pool} examples")
        out.append(LabelRow(int(r["qid"]), pos, neg))
    return out


def split_dev(labels: list[LabelRow], dev_size: int, seed: int) -> tuple[list[LabelRow], list[LabelRow]]:
    if dev_size <= 0:
        return labels, []
    if dev_size >= len(labels):
        raise InputError(f"train.dev_size={dev_size} leaves no training instances out of {len(labels)}")
    dev = set(np.random.default_rng(seed).choice(len(labels), dev_size, replace=False).tolist())
    return [r for i, r in enumerate(labels) if i not in dev], [r for i, r in enumerate(labels) if i in dev]


def sample_pair(row: LabelRow, seed: int, epoch: int) -> tuple[int, int]:
    rng = np.random.default_rng([seed, epoch, row.qid])
    return row.pos[rng.integers(len(row.pos))], row.neg[rng.integers(len(row.neg))]


def recall_mrr(
    q: np.ndarray,
    cand_emb: Sequence[np.ndarray],
    cand_ids: Sequence[Sequence[int]],
    positives: Sequence[Sequence[int]],
    k: int,
) -> tuple[float, float]:
    """Rank each query's candidates by inner product; recall@k of its LM positives and MRR of the first one."""
    rec, rr = [], []
    for qi, emb, ids, pos in zip(q, cand_emb, cand_ids, positives):
        s = emb @ qi
        order = [ids[j] for j in np.lexsort((np.asarray(ids), -s))]
        pos = set(pos)
        rec.append(len(pos & set(order[:k])) / len(pos))
        first = next((r for r, c in enumerate(order, start=1) if c in pos), None)
        rr.append(1.0 / first if first else 0.0)
    return float(np.mean(rec)), float(np.mean(rr))


def demo_text(task, ex: Example) -> str:
    return task.format_demo(ex).strip()
