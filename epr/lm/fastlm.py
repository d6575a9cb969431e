"""A lean inference forward for Llama-architecture LMs (SmolLM2 and kin), used by the scorer and the
lean decoder.

The Hugging Face forward is written for every use (training, caches, masks, tensor parallelism); for scoring we need
one thing: the final hidden states of right-padded sequences under a causal mask. On a 2-core CPU most of the HF
forward's time is not the matrix products but the element-wise passes around them (RMSNorm's fp32 round trip,
``rotate_half``'s ``cat`` and ``neg``, separate q/k/v and gate/up projections, dtype copies). This module computes the
same function with fewer passes over memory:

- q, k, v come from one fused projection, gate and up from another (the weights are concatenated once);
- RMSNorm reads the bf16 activations once for the fp32 norm and writes the normalised bf16 result in one pass;
- rotary embedding is ``x * cos + roll(x) * sin_signed`` (one ``roll``, one ``addcmul``), on q and k together;
- attention is PyTorch's fused ``scaled_dot_product_attention`` with ``is_causal`` and grouped key/value heads;
- where the model's linears were packed for oneDNN (``epr.lm.cpu_linear``, fp32 on CPU), the fused weights are too.

Numerics follow the HF code (RMSNorm in fp32, cos/sin from the model's own rotary module, so every rope variant the
model supports is honoured); results agree to float rounding (tested against ``transformers``). Models this does
not cover (other architectures, biases, tensor-parallel checkpoints) make :func:`fast_backbone` return ``None`` and
the scorer falls back to the HF forward.
"""

from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F

from epr.lm.cpu_linear import PackedLinear, linear_fn

__all__ = ["FastLlama", "fast_backbone"]

log = logging.getLogger(__name__)


def _rms_norm(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: ``w * (h_fp32 * rsqrt(mean(h_fp32^2) + eps)).to(h.dtype)`` in three passes."""
    n = h.shape[-1]
    norm = torch.linalg.vector_norm(h, 2, dim=-1, keepdim=True, dtype=torch.float32)
    scale = torch.rsqrt(norm.square_().div_(n).add_(eps))
    out = torch.empty_like(h)
    torch.mul(h, scale, out=out)  # computed in fp32, rounded once to h.dtype, as HF does
    return out.mul_(w)


class FastLlama(torch.nn.Module):
    """Final hidden states of a Llama-style decoder, ``forward(ids: (B, T) long) -> (B, T, H)``.

    Holds references to (not copies of) the embedding and norm weights and one concatenated copy of the projection
    weights per layer, in ``nn.Linear`` layout (out, in): oneDNN's bf16 (AMX) kernels take that layout; a
    transposed copy multiplied with ``@`` fell off the fast path and ran ~10x slower on this CPU.
    """

    def __init__(self, model) -> None:
        super().__init__()
        cfg = model.config
        base = model.base_model
        self.H = cfg.num_attention_heads
        self.Hkv = cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.I = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.final_w = base.norm.weight
        self.scale = base.layers[0].self_attn.scaling
        # the fused projections are packed for oneDNN when the model's own linears were (epr.lm.cpu_linear)
        packed = isinstance(base.layers[0].self_attn.q_proj, PackedLinear)
        self.packed = packed

        def lin(w: torch.Tensor):
            return linear_fn(w, "on" if packed else "off")

        self.layers = []
        with torch.no_grad():
            for layer in base.layers:
                at, mlp = layer.self_attn, layer.mlp
                self.layers.append(
                    (
                        layer.input_layernorm.weight,
                        lin(torch.cat([at.q_proj.weight, at.k_proj.weight, at.v_proj.weight])),
                        lin(at.o_proj.weight),
                        layer.post_attention_layernorm.weight,
                        lin(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                        lin(mlp.down_proj.weight),
                    )
                )

    def _rope(self, pos: torch.Tensor, like: torch.Tensor):
        """cos and signed sin for positions ``pos (B, T)`` (or ``(1, T)``), shaped ``(B, T, 1, D)``."""
        cos, sin = self.rotary(like, pos)
        half = self.D // 2
        # rotate_half(x) * sin == roll(x, D/2) * [-sin_lo, sin_hi]
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
        return cos[:, :, None, :], sin[:, :, None, :]

    def stack(self, ids, pos, attend=None, final_norm=True):
        """The decoder stack over ``ids (B, T)`` at positions ``pos (B, T)`` (or ``(1, T)``). ``attend(layer, q, k,
        v) -> o`` (heads-first ``(B, heads, T, D)``) is the attention; by default causal among the new tokens. A
        prefix's or a KV cache's keys and values come in through ``attend`` (:meth:`forward_after`,
        :mod:`epr.lm.decode`). Returns the hidden states ``(B, T, H)``, final-normed when ``final_norm``."""
        B, T = ids.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        x = self.embed(ids)
        cos, sin = self._rope(pos, x)
        half = D // 2
        h = x.reshape(B * T, -1)
        nq, nk = H * D, Hkv * D
        attend = attend or self.causal
        for li, (ln1, wqkv, wo, ln2, wgu, wd) in enumerate(self.layers):
            a = _rms_norm(h, ln1, self.eps)
            qkv = wqkv(a)
            qk = qkv[:, : nq + nk].view(B, T, H + Hkv, D)
            qk = torch.addcmul(qk * cos, qk.roll(half, dims=-1), sin)
            q = qk[:, :, :H].transpose(1, 2)
            k = qk[:, :, H:].transpose(1, 2)
            v = qkv[:, nq + nk :].view(B, T, Hkv, D).transpose(1, 2)
            o = attend(li, q, k, v)
            h = h + wo(o.transpose(1, 2).reshape(B * T, nq))
            a = _rms_norm(h, ln2, self.eps)
            gu = wgu(a)
            h = h + wd(F.silu(gu[:, : self.I]) * gu[:, self.I :])
        h = h.view(B, T, -1)
        return _rms_norm(h, self.final_w, self.eps) if final_norm else h

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return _rms_norm(h, self.final_w, self.eps)

    def causal(self, li: int, q, k, v, mask=None) -> torch.Tensor:
        """Attention of ``q`` over ``k, v`` (grouped key/value heads): causal, or under a boolean ``mask``."""
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale, enable_gqa=self.Hkv != self.H
        )

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        return self.stack(ids, torch.arange(T, device=ids.device)[None])

    @torch.inference_mode()
    def prefix_kv(self, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer keys/values ``(G, Hkv, P, D)`` of right-padded prefixes ``ids (G, P)`` (pads never matter:
        the prefix tokens before them do not attend to them, and the suffixes mask them out)."""
        T = ids.shape[1]
        kvs = []

        def keep(li, q, k, v):
            kvs.append((k, v))
            return self.causal(li, q, k, v)

        self.stack(ids, torch.arange(T, device=ids.device)[None], keep, final_norm=False)
        return kvs

    @torch.inference_mode()
    def forward_after(
        self, ids: torch.Tensor, start: torch.Tensor, past: list, past_mask: torch.Tensor
    ) -> torch.Tensor:
        """Hidden states of right-padded suffixes ``ids (B, S)`` that continue prefixes of lengths ``start (B,)``,
        given the prefixes' per-layer keys/values ``(B, Hkv, P, D)`` and their validity ``past_mask (B, P)``."""
        B, T = ids.shape
        pos = start[:, None] + torch.arange(T, device=ids.device)[None]
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        mask = torch.cat([past_mask[:, None, :].expand(B, T, -1), causal.expand(B, T, T)], dim=2)[:, None]

        def after(li, q, k, v):
            pk, pv = past[li]
            return self.causal(li, q, torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2), mask)

        return self.stack(ids, pos, after)


_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fast_backbone(model) -> FastLlama | None:
    """A :class:`FastLlama` for a model it reproduces exactly, else ``None`` (callers use the HF forward). Built
    once per model (its fused weights are copies): the scorer and the decoder of one model share it."""
    if model in _BUILT:  # (False for objects that cannot be weakly referenced)
        return _BUILT[model]
    fast = _fast_backbone(model)
    try:
        _BUILT[model] = fast
    except TypeError:  # not weak-referenceable: built again next time
        pass
    return fast


def _fast_backbone(model) -> FastLlama | None:
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "llama":
        return None
    reasons = []
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        reasons.append("biases")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        reasons.append(f"activation {cfg.hidden_act}")
    if getattr(cfg, "pretraining_tp", 1) != 1:
        reasons.append("pretraining_tp")
    base = getattr(model, "base_model", None)
    if base is None or not hasattr(base, "rotary_emb") or not hasattr(base, "layers"):
        reasons.append("unexpected module layout")
    if reasons:
        log.info("fast forward not used (%s); using the transformers forward", ", ".join(reasons))
        return None
    return FastLlama(model)
