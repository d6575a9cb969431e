"""Training losses of the dual encoder, cross-process negatives, and gradient caching (GradCache).

Layout used throughout: ``docs`` holds ``group_size`` rows per instance, instance i's at rows
``group_size*i .. group_size*(i+1)-1``. For the EPR loss these are its sampled positive then hard negative(s);
for the listwise and distillation losses, ``group_size`` of its scored candidates (best first, with the LM scores
as ``teacher``). Every query also sees every other instance's rows as in-batch negatives.

Losses (``train.loss``), all functions of the similarity matrix ``sim = q @ d.T / temperature``:

- ``epr``: ``-log softmax(sim_i)[positive_i]`` (Rubin et al. 2022).
- ``listwise``: UDR's ranking loss (Li et al., ACL 2023) over an instance's candidates, ordered by the LM score:
  ``sum_{a,b} max(0, 1/r_a - 1/r_b) * log(1 + exp(sim_b - sim_a))`` (r: rank, 1 = best), plus ``weight`` times
  the in-batch contrastive loss with the best candidate as positive.
- ``distill``: LLM-R's distillation (Wang et al., EACL 2024): ``KL(softmax(teacher / tau_t) || softmax(sim_i over
  the instance's candidates))``, plus ``weight`` times the in-batch contrastive loss.

In-batch negatives that are the same pool example as the query's positive are masked (not false negatives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "contrastive_loss",
    "inbatch_contrastive",
    "listwise_loss",
    "distill_loss",
    "group_kl",
    "group_loss",
    "gather_keep_local_grad",
    "gather_plain",
    "grad_cache_backward",
]


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


def inbatch_contrastive(
    sim: torch.Tensor, pos_col: torch.Tensor, doc_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean over rows of ``-log softmax(sim_i)[pos_col_i]``; columns holding the same pool id as row i's positive
    (``doc_ids``) other than ``pos_col_i`` itself are left out of the softmax."""
    sim = sim.float()
    if doc_ids is not None:
        dup = doc_ids[None, :] == doc_ids[pos_col][:, None]
        dup[torch.arange(sim.shape[0], device=sim.device), pos_col] = False
        sim = sim.masked_fill(dup, float("-inf"))
    return F.cross_entropy(sim, pos_col)


def _own_block(sim: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(B, group_size)``: each row's similarities to its own instance's rows."""
    B = sim.shape[0]
    cols = group_size * torch.arange(B, device=sim.device)[:, None] + torch.arange(
        group_size, device=sim.device
    )
    return sim.gather(1, cols)


def listwise_loss(
    sim: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor,
    group_size: int,
    weight: float = 1.0,
    doc_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """UDR's listwise ranking loss over each instance's ``group_size`` candidates (rows ordered best first by the
    ``teacher`` score; ``valid`` masks padding), averaged over instances, + ``weight`` x in-batch contrastive.

    sim: ``(B, group_size*B)``; teacher, valid: ``(B, group_size)``.
    """
    own = _own_block(sim, group_size).float()
    t = teacher.float().masked_fill(~valid, float("-inf"))
    # rank 1 = best by teacher (ties: earlier row first)
    order = torch.argsort(-t, dim=1, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(1, group_size + 1, device=sim.device).expand_as(order))
    inv = 1.0 / rank.float()
    w = (inv[:, :, None] - inv[:, None, :]).clamp(min=0)  # w[a, b] > 0 where a ranks above b
    w = w * (valid[:, :, None] & valid[:, None, :])
    pair = F.softplus(own[:, None, :] - own[:, :, None])  # log(1 + exp(sim_b - sim_a))
    rank_loss = (w * pair).sum((1, 2)).mean()
    if weight == 0:
        return rank_loss
    best = group_size * torch.arange(sim.shape[0], device=sim.device) + order[:, 0]
    return rank_loss + weight * inbatch_contrastive(sim, best, doc_ids)


def group_kl(
    student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, teacher_temperature: float = 1.0
) -> torch.Tensor:
    """Mean over rows of ``KL(softmax(teacher / teacher_temperature) || softmax(student))`` over each row's valid
    entries (all ``(B, G)``; ``valid`` masks padding): the distillation of an LM's distribution over a query's
    candidates into a retriever's scores (the dual encoder's, the reward model's)."""
    neg_inf = float("-inf")
    log_p_t = torch.log_softmax((teacher.float() / teacher_temperature).masked_fill(~valid, neg_inf), dim=1)
    log_p_s = torch.log_softmax(student.float().masked_fill(~valid, neg_inf), dim=1)
    p_t = log_p_t.exp()
    return torch.where(valid, p_t * (log_p_t - log_p_s), torch.zeros_like(p_t)).sum(1).mean()


def distill_loss(
    sim: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor,
    group_size: int,
    teacher_temperature: float = 1.0,
    weight: float = 0.2,
    doc_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """LLM-R's distillation: mean over instances of ``KL(p_teacher || p_retriever)`` over the instance's valid
    candidates, ``p_teacher = softmax(teacher / teacher_temperature)``, ``p_retriever = softmax(sim)``, +
    ``weight`` x in-batch contrastive with the teacher's best candidate as positive."""
    kl = group_kl(_own_block(sim, group_size), teacher, valid, teacher_temperature)
    if weight == 0:
        return kl
    best_in_group = teacher.float().masked_fill(~valid, float("-inf")).argmax(1)
    best = group_size * torch.arange(sim.shape[0], device=sim.device) + best_in_group
    return kl + weight * inbatch_contrastive(sim, best, doc_ids)


def group_loss(
    kind: str,
    q: torch.Tensor,
    d: torch.Tensor,
    group_size: int,
    temperature: float = 1.0,
    teacher: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
    doc_ids: torch.Tensor | None = None,
    weight: float = 1.0,
    teacher_temperature: float = 1.0,
) -> torch.Tensor:
    """The loss ``kind`` (epr | listwise | distill) of queries ``q (B, H)`` against docs ``d (group_size*B, H)``."""
    if d.shape[0] != group_size * q.shape[0]:
        raise ValueError(f"{d.shape[0]} docs for {q.shape[0]} queries x group_size {group_size}")
    sim = (q @ d.T) / temperature
    if kind == "epr":  # the paper's loss as published: no masking of duplicate in-batch negatives
        return inbatch_contrastive(sim, group_size * torch.arange(q.shape[0], device=q.device))
    if teacher is None:
        raise ValueError(f"loss {kind!r} needs the candidates' teacher scores")
    if valid is None:
        valid = torch.ones_like(teacher, dtype=torch.bool)
    if kind == "listwise":
        return listwise_loss(sim, teacher, valid, group_size, weight, doc_ids)
    if kind == "distill":
        return distill_loss(sim, teacher, valid, group_size, teacher_temperature, weight, doc_ids)
    raise ValueError(f"unknown loss {kind!r} (epr | listwise | distill)")


def gather_plain(t: torch.Tensor) -> torch.Tensor:
    """All-gather a tensor that needs no gradient (ids, teacher scores, masks); ``t`` itself without
    torch.distributed."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    home = t.device
    # NCCL gathers GPU tensors only; the ids and teacher scores live on the CPU
    if dist.get_backend() == "nccl" and home.type != "cuda":
        t = t.to(torch.device("cuda", torch.cuda.current_device()))
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts).to(home)


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
