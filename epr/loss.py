"""The EPR contrastive loss, cross-process negatives, and gradient caching (GradCache) for large batches.

Layout used throughout: ``docs`` holds, for instance i, its positive at row ``group_size*i`` and its hard
negative(s) right after, so each query sees 1 positive and ``group_size*B - 1`` negatives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = ["contrastive_loss", "gather_keep_local_grad", "grad_cache_backward"]


def contrastive_loss(
    q: torch.Tensor, d: torch.Tensor, group_size: int = 2, temperature: float = 1.0, q_offset: int = 0
) -> torch.Tensor:
    """Mean over queries of ``-log softmax(sim(q_i, d))[positive_i]`` with ``sim`` the inner product.

    q: ``(B, H)`` query embeddings; d: ``(G*B_total, H)`` demonstration embeddings, where the positive of
    query i is row ``group_size * (i + q_offset)`` (``q_offset`` places local queries in gathered docs).
    """
    if d.shape[0] < group_size * (q.shape[0] + q_offset):
        raise ValueError(
            f"{d.shape[0]} docs cannot hold the positives of {q.shape[0]} queries at offset {q_offset}"
        )
    scores = (q @ d.T) / temperature
    target = group_size * (torch.arange(q.shape[0], device=q.device) + q_offset)
    return F.cross_entropy(scores.float(), target)


def gather_keep_local_grad(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All-gather ``t`` across processes; the local slice stays the autograd-connected tensor.

    Returns the concatenation and this process's row offset. Without torch.distributed, returns ``t, 0``.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t, 0
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.detach().contiguous())
    rank = dist.get_rank()
    parts[rank] = t
    return torch.cat(parts), rank * t.shape[0]


class _RandState:
    """Capture and restore the RNG so a recomputed forward sees the same dropout masks."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def restore(self):
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def grad_cache_backward(
    encode_q: Callable[[dict], torch.Tensor],
    encode_d: Callable[[dict], torch.Tensor],
    q_chunks: Sequence[dict],
    d_chunks: Sequence[dict],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    backward: Callable[..., None] = lambda t, g: t.backward(gradient=g),
) -> torch.Tensor:
    """GradCache (Gao et al. 2021): the loss of a large batch with memory bounded by one chunk.

    1. embed every chunk without a graph; 2. compute the loss on the detached embeddings and take its
    gradient with respect to them; 3. re-embed chunk by chunk with a graph (same RNG state) and
    back-propagate the cached embedding gradients. Parameter gradients equal those of the plain loss.
    Returns the (detached) loss.
    """
    states_q, states_d, qs, ds = [], [], [], []
    with torch.no_grad():
        for c in q_chunks:
            states_q.append(_RandState())
            qs.append(encode_q(c))
        for c in d_chunks:
            states_d.append(_RandState())
            ds.append(encode_d(c))
    q = torch.cat(qs).detach().requires_grad_()
    d = torch.cat(ds).detach().requires_grad_()
    loss = loss_fn(q, d)
    loss.backward()
    gq, gd = q.grad.split([x.shape[0] for x in qs]), d.grad.split([x.shape[0] for x in ds])
    for c, st, g in zip(q_chunks, states_q, gq):
        st.restore()
        backward(encode_q(c), g)
    for c, st, g in zip(d_chunks, states_d, gd):
        st.restore()
        backward(encode_d(c), g)
    return loss.detach()
