"""Score many targets after one shared prefix: the prefix runs once, its KV cache serves every target.

A target whose tokens begin another target's tokens (TruthfulQA scores every answer with and without its final
period: " X" and " X.") is read off the longer one's row: the causal LM gives the same token log-probs, so each
distinct token sequence that no other target extends runs once. On TruthfulQA this halves the scored rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from epr.scoring import LMScorer

__all__ = ["score_shared_prefix", "fold_prefixes"]


def fold_prefixes(seqs: Sequence[Sequence[int]]) -> list[int]:
    """For each sequence, the index of a sequence it is a prefix of (itself included) that no other sequence
    extends: the rows that must run. Equal sequences share one row."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    rows: list[int] = []
    owner = [0] * len(seqs)
    for i in order:
        s = list(seqs[i])
        for r in rows:
            if list(seqs[r][: len(s)]) == s:
                owner[i] = r
                break
        else:
            rows.append(i)
            owner[i] = i
    return owner


@torch.inference_mode()
def score_shared_prefix(
    scorer: LMScorer, prefix: str, targets: Sequence[str], fold: bool = True
) -> np.ndarray:
    """``(n,) float64`` summed log-probs of each target after ``prefix``; equals ``scorer.score([prefix]*n, targets)``.
    ``fold=False`` runs every target as its own row (the baseline of ``benchmarks.truthfulqa``)."""
    model, tok = scorer.model, scorer.tok
    p = tok(prefix, add_special_tokens=True)["input_ids"] or [scorer._start]
    t_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in targets]
    if any(not t for t in t_ids):
        raise ValueError("a target has no tokens")
    if len(p) + max(map(len, t_ids)) > scorer.max_length:
        raise ValueError(
            f"prefix of {len(p)} tokens plus the longest target exceed the context of {scorer.max_length}"
        )
    owner = fold_prefixes(t_ids) if fold else list(range(len(t_ids)))
    run = sorted(set(owner))  # the rows that run, by target index
    row_of = {t: i for i, t in enumerate(run)}
    dev = scorer.device
    base = model.base_model
    cache = None
    if len(p) > 1:
        cache = base(input_ids=torch.tensor([p[:-1]], device=dev), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(run))
    T = max(len(t_ids[t]) for t in run)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(run), T + 1), pad, dtype=torch.long)
    for i, t in enumerate(
        run
    ):  # row i: last prefix token, then the target, right-padded (causal: no mask needed)
        ids[i, : len(t_ids[t]) + 1] = torch.tensor([p[-1], *t_ids[t]])
    hidden = base(input_ids=ids.to(dev), past_key_values=cache, use_cache=False).last_hidden_state
    rows = torch.cat([torch.full((len(t_ids[t]),), i) for i, t in enumerate(run)])
    cols = torch.cat([torch.arange(len(t_ids[t])) for t in run])
    labels = torch.cat([torch.tensor(t_ids[t]) for t in run]).to(dev)
    logits = model.get_output_embeddings()(hidden[rows.to(dev), cols.to(dev)]).float()
    lp = torch.log_softmax(logits, -1).gather(1, labels[:, None])[:, 0].double().cpu().numpy()
    # per-row cumulative sums: target j's score is its owner row's sum over its own length
    starts = np.concatenate([[0], np.cumsum([len(t_ids[t]) for t in run])[:-1]])
    csum = np.cumsum(lp)
    out = np.empty(len(targets), dtype=np.float64)
    for j, t in enumerate(t_ids):
        s = starts[row_of[owner[j]]]
        out[j] = csum[s + len(t) - 1] - (csum[s - 1] if s > 0 else 0.0)
    return out
