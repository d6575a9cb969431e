"""The lean decoder's key/value cache (:class:`KVCache`: per-layer keys and values, which slots each row may read,
rows moved and the cache grown for continuous batching) and the attention of a few new queries over it
(:func:`cached_attention`)."""

from __future__ import annotations

import torch

from epr.lm.fastlm import FastLlama

__all__ = ["KVCache", "cached_attention"]


def cached_attention(q, k, v, mask, scale: float) -> torch.Tensor:
    """Attention of a few new queries ``q (B, H, T, D)`` over cached ``k, v (B, Hkv, S, D)`` where ``mask (B, 1, T
    or 1, S)`` is True; query head ``h`` reads key head ``h // (H / Hkv)`` (``repeat_kv``'s grouping). Two batched
    products and an fp32 softmax: for one query per row this is ~10x faster on CPU than
    ``scaled_dot_product_attention`` with a mask, and equal to it to float rounding."""
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    s = torch.matmul(q.reshape(B, Hkv, G * T, D), k.transpose(-1, -2)).float()
    s.mul_(scale)
    m = mask.reshape(B, 1, -1, mask.shape[-1])
    if m.shape[2] != 1:  # (B, 1, T, S): every query head of a group has the same T rows
        m = m.expand(B, 1, T, -1).repeat(1, 1, G, 1)
    s.masked_fill_(~m, float("-inf"))
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return torch.matmul(p, v).reshape(B, H, T, D)


class KVCache:
    """Per-layer keys and values ``(B, Hkv, S, D)`` and which slots each row may attend to ``(B, S)``."""

    def __init__(self, n_layers: int, B: int, Hkv: int, S: int, D: int, dtype, device):
        # zeros, not empty: a masked slot's weight is 0, but 0 x (NaN in uninitialised memory) is NaN
        self.k = [torch.zeros(B, Hkv, S, D, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(B, Hkv, S, D, dtype=dtype, device=device) for _ in range(n_layers)]
        self.valid = torch.zeros(B, S, dtype=torch.bool, device=device)

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    def attend(
        self, fast: FastLlama, lo: int, hi: int, mask: torch.Tensor | None, r0: int = 0, r1=None, span=None
    ):
        """Attention that writes the new keys/values of rows ``r0:r1`` into slots ``lo:hi`` and lets those rows
        attend over slots ``:span`` (default ``:hi``) under ``mask`` (``None``: a prefill from slot 0, causal among
        the new tokens)."""
        end = hi if span is None else span

        def fn(li, q, k, v):
            self.k[li][r0:r1, :, lo:hi] = k
            self.v[li][r0:r1, :, lo:hi] = v
            if mask is None:
                return fast.causal(li, q, k, v)
            return cached_attention(
                q, self.k[li][r0:r1, :, :end], self.v[li][r0:r1, :, :end], mask, fast.scale
            )

        return fn

    def attend_step(self, fast: FastLlama, slots: torch.Tensor, mask: torch.Tensor, span: int):
        """One decoding step of rows ``0:n`` (``n = len(slots)``): row ``r``'s new key/value goes into its own slot
        ``slots[r]``, and the rows attend over slots ``:span`` under ``mask (n, 1, 1, span)``. ``span`` = the whole
        cache is contiguous in memory; a shorter slice is strided, and the batched products copy it on every
        layer and step (bf16: twice the attention's time). Slots past a row's filled ones are masked and hold
        zeros or finite keys of earlier rows or gold tokens, so their weight is exactly 0."""
        n = len(slots)
        rows = torch.arange(n, device=slots.device)

        def fn(li, q, k, v):
            self.k[li][rows, :, slots] = k[:, :, 0]
            self.v[li][rows, :, slots] = v[:, :, 0]
            return cached_attention(q, self.k[li][:n, :, :span], self.v[li][:n, :, :span], mask, fast.scale)

        return fn

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy rows ``src`` into rows ``dst`` (every slot): how finished rows' places are refilled."""
        if not src:
            return
        s = torch.tensor(src, dtype=torch.long, device=self.valid.device)
        d = torch.tensor(dst, dtype=torch.long, device=self.valid.device)
        for t in self.k + self.v:
            t.index_copy_(0, d, t.index_select(0, s))
        self.valid.index_copy_(0, d, self.valid.index_select(0, s))

    def grown(self, B: int, S: int, n: int) -> KVCache:
        """A cache of ``B`` rows and ``S >= self.slots`` slots holding this one's first ``n`` rows."""
        k0 = self.k[0]
        new = KVCache(len(self.k), B, k0.shape[1], S, k0.shape[3], k0.dtype, k0.device)
        for a, b in zip(new.k + new.v, self.k + self.v):
            a[:n, :, : self.slots] = b[:n]
        new.valid[:n, : self.slots] = self.valid[:n]
        return new
