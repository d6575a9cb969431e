"""Training instances for the dual encoder, read from the labels stage, and the intrinsic dev metric.

Per-item randomness comes from (seed, epoch, qid), so the sampled positive/negative of an instance does
not depend on the number of processes or workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from epr.types import Example, InputError

__all__ = [
    "LabelRow",
    "select_labels",
    "read_labels",
    "split_dev",
    "sample_pair",
    "sample_group",
    "recall_mrr",
]


@dataclass(frozen=True)
class LabelRow:
    qid: int
    pos: tuple[int, ...]
    neg: tuple[int, ...]
    cands: tuple[int, ...] = ()  # every scored candidate, best first
    cand_scores: tuple[float, ...] = ()


def select_labels(ids: Sequence[int], scores: Sequence[float | None], k_pos: int, k_neg: int) -> dict:
    """Positives: the ``k_pos`` best by (score desc, id asc); negatives: the ``k_neg`` worst of the same order,
    never overlapping the positives. Candidates with a ``None`` score are left out. ``cands`` / ``cand_scores``:
    every scored candidate in that order (what the listwise and distillation losses learn from)."""
    scored = [(s, i) for i, s in zip(ids, scores) if s is not None]
    order = sorted(scored, key=lambda t: (-t[0], t[1]))
    pos = order[:k_pos]
    neg = order[max(len(pos), len(order) - k_neg) :]
    return {
        "pos": [i for _, i in pos],
        "neg": [i for _, i in neg],
        "pos_scores": [s for s, _ in pos],
        "neg_scores": [s for s, _ in neg],
        "cands": [i for _, i in order],
        "cand_scores": [s for s, _ in order],
    }


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
        cands, cs = tuple(r.get("cands") or ()), tuple(r.get("cand_scores") or ())
        if len(cands) != len(cs):
            raise InputError(f"{where}:{i}: {len(cands)} candidates but {len(cs)} candidate scores")
        if any(s is None for s in cs):
            raise InputError(f"{where}:{i}: a candidate score is null (unscored candidates are left out)")
        bad = [x for x in (r["qid"], *pos, *neg, *cands) if not 0 <= int(x) < n_pool]
        if bad:
            raise InputError(f"{where}:{i}: ids {bad} are not in the pool of {n_pool} examples")
        out.append(LabelRow(int(r["qid"]), pos, neg, cands, tuple(float(s) for s in cs)))
    return out


def split_dev(
    labels: list[LabelRow], dev_size: int, seed: int, setting: str = "train.dev_size"
) -> tuple[list[LabelRow], list[LabelRow]]:
    """``dev_size`` seeded labelled examples held out; ``setting`` names the option in the error (the encoder's
    ``train.dev_size``, the reward model's ``reward.dev_size``)."""
    if dev_size <= 0:
        return labels, []
    if dev_size >= len(labels):
        raise InputError(
            f"{setting}={dev_size} leaves no training instances out of {len(labels)} labelled examples: lower "
            f"{setting} (0: no dev metrics) or label more examples"
        )
    dev = set(np.random.default_rng(seed).choice(len(labels), dev_size, replace=False).tolist())
    return [r for i, r in enumerate(labels) if i not in dev], [r for i, r in enumerate(labels) if i in dev]


def sample_pair(row: LabelRow, seed: int, epoch: int) -> tuple[int, int]:
    rng = np.random.default_rng([seed, epoch, row.qid])
    return row.pos[rng.integers(len(row.pos))], row.neg[rng.integers(len(row.neg))]


def sample_group(
    row: LabelRow, size: int, seed: int, epoch: int
) -> tuple[list[int], list[float], list[bool]]:
    """``size`` of the instance's scored candidates for the listwise / distillation losses: the best one and a
    seeded sample of the others (all of them when there are at most ``size``), best first by score; padded
    (repeating the best, ``valid`` False) when the instance has fewer. Seeded by (seed, epoch, qid)."""
    if not row.cands:
        raise InputError(
            f"query {row.qid}: its label row has no scored candidate list (labels written by an older version: "
            "rerun the labels stage)"
        )
    n = len(row.cands)
    rest = np.arange(1, n)
    if n > size:
        rest = np.sort(np.random.default_rng([seed, epoch, row.qid]).choice(rest, size - 1, replace=False))
    pick = [0, *rest.tolist()]
    ids = [row.cands[j] for j in pick]
    scores = [row.cand_scores[j] for j in pick]
    valid = [True] * len(pick)
    while len(ids) < size:
        ids.append(row.cands[0])
        scores.append(row.cand_scores[0])
        valid.append(False)
    return ids, scores, valid


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


DEMO_FIELDS = ("input_output", "input")


def demo_text(task, ex: Example, fields: str = "input_output") -> str:
    """A demonstration as the prompt tower reads it: the task's demonstration format (input and output, SPEC 2.4:
    E_P encodes x_e and y_e together), or with ``fields="input"`` the input alone (as SBERT reads the pool)."""
    if fields == "input":
        return ex.input.strip()
    if fields != "input_output":
        raise ValueError(f"demo fields must be one of {', '.join(DEMO_FIELDS)}, not {fields!r}")
    return task.format_demo(ex).strip()


def token_lengths(tok, texts: Sequence[str]) -> list[int]:
    """Each text's token count under ``tok`` with the special tokens, uncut."""
    return [len(x) for x in tok(list(texts), add_special_tokens=True, truncation=False)["input_ids"]]


def length_from_data(lengths: Sequence[int], cap: int, multiple: int = 8) -> int:
    """The encoder length that cuts none of ``lengths`` (token counts with the special tokens): the longest, rounded
    up to a multiple of ``multiple``, at most ``cap`` (the encoder's own limit) and at least ``multiple``."""
    longest = max((int(n) for n in lengths), default=0)
    return max(multiple, min(int(cap), -(-longest // multiple) * multiple))


def truncation(lengths: Sequence[int], max_length: int) -> dict:
    """How much of a set of texts an encoder that keeps ``max_length`` tokens cuts: the share of texts longer
    than it and the length quantiles (``lengths``: each text's token count with the special tokens)."""
    a = np.asarray(lengths, dtype=np.int64)
    if a.size == 0:
        return {"texts": 0, "max_length": max_length, "truncated": 0, "share": 0.0}
    q50, q90, q99 = (int(np.ceil(np.percentile(a, p))) for p in (50, 90, 99))
    cut = int((a > max_length).sum())
    return {
        "texts": int(a.size),
        "max_length": max_length,
        "truncated": cut,
        "share": cut / a.size,
        "tokens_p50": q50,
        "tokens_p90": q90,
        "tokens_p99": q99,
    }
