"""Score many targets after one shared prefix: the prefix runs once, its KV cache serves every target."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from epr.scoring import LMScorer

__all__ = ["score_shared_prefix"]


@torch.inference_mode()
def score_shared_prefix(scorer: LMScorer, prefix: str, targets: Sequence[str]) -> np.ndarray:
    """``(n,) float64`` summed log-probs of each target after ``prefix``; equals ``scorer.score([prefix]*n, targets)``."""
    model, tok = scorer.model, scorer.tok
    p = tok(prefix, add_special_tokens=True)["input_ids"] or [scorer._start]
    t_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in targets]
    if any(not t for t in t_ids):
        raise ValueError("a target has no tokens")
    if len(p) + max(map(len, t_ids)) > scorer.max_length:
        raise ValueError(
            f"prefix of {len(p)} tokens plus the longest target exceed the context of {scorer.max_length}"
        )
    dev = scorer.device
    base = model.base_model
    cache = None
    if len(p) > 1:
        cache = base(input_ids=torch.tensor([p[:-1]], device=dev), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(targets))
    T = max(map(len, t_ids))
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(targets), T + 1), pad, dtype=torch.long)
    for i, t in enumerate(
        t_ids
    ):  # row i: last prefix token, then the target, right-padded (causal: no mask needed)
        ids[i, : len(t) + 1] = torch.tensor([p[-1], *t])
    hidden = base(input_ids=ids.to(dev), past_key_values=cache, use_cache=False).last_hidden_state
    rows = torch.cat([torch.full((len(t),), i) for i, t in enumerate(t_ids)])
    cols = torch.cat([torch.arange(len(t)) for t in t_ids])
    labels = torch.cat([torch.tensor(t) for t in t_ids]).to(dev)
    logits = model.get_output_embeddings()(hidden[rows.to(dev), cols.to(dev)]).float()
    lp = torch.log_softmax(logits, -1).gather(1, labels[:, None])[:, 0].double()
    out = torch.zeros(len(targets), dtype=torch.float64, device=dev).index_add_(0, rows.to(dev), lp)
    return out.cpu().numpy()
