"""SmoothQuant (Xiao et al., ICML 2023) for the lean forward's int8 projections (issue 77).

Per-tensor int8 inputs (oneDNN's fused layer, :class:`epr.lm.int8_linear.FusedInt8Linear`) lose SmolLM2's labels to
a few activation channels whose magnitude is far above the rest (benchmarks.int8_labels: Spearman 0.842). SmoothQuant
moves that range into the weights, where it is quantised per output channel: for a projection ``y = x W^T`` and a
positive ``s`` per input channel, ``y = (x / s) (W * s)^T`` exactly, and ``x / s`` is folded into what produced ``x``,
so the forward computes nothing more. ``s_j = max|x_j|^alpha / max|W_:j|^(1 - alpha)`` from the inputs' channel
maxima on calibration sequences (:func:`calibrate`).

Where ``x / s`` folds, in a FastLlama layer ``(ln1, qkv, o, ln2, gate_up, down)`` (:func:`smoothed`):
q/k/v's and gate/up's inputs are RMS-normed, so ``1 / s`` multiplies the norm's weight; down's input is
``silu(gate) * up``, so ``1 / s`` multiplies up's output rows. The output projection's input (attention's) has no
such place under grouped key/value heads; it is left unsmoothed. Inference only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

__all__ = ["SMOOTHABLE", "calibrate", "smoothing", "smoothed", "weight_of"]

QKV, OUT, GATE_UP, DOWN = 1, 2, 4, 5  # a FastLlama layer's projections
SMOOTHABLE = (QKV, GATE_UP, DOWN)


def weight_of(lin) -> torch.Tensor:
    """The weight ``(out, in)`` of a FastLlama projection (a ``PackedLinear``, ``F.linear`` partial or int8 layer's
    source)."""
    if isinstance(lin, functools.partial):
        return lin.keywords["weight"]
    return lin.weight


class _Recorder:
    """A projection that records its input's max |value| per channel, then calls through."""

    def __init__(self, lin, into: dict, key: int) -> None:
        self.lin, self.into, self.key = lin, into, key

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        prev = self.into.get(self.key)
        self.into[self.key] = m if prev is None else torch.maximum(prev, m)
        return self.lin(x)


def calibrate(layers: list, run: Callable[[], object]) -> list[dict[int, torch.Tensor]]:
    """Per layer, the max |input| per channel of each smoothable projection over ``run()`` (forward passes of the
    model that owns ``layers``, a FastLlama's list, swapped in place and restored)."""
    stats: list[dict[int, torch.Tensor]] = [{} for _ in layers]
    orig = list(layers)
    try:
        for li, layer in enumerate(orig):
            parts = list(layer)
            for i in SMOOTHABLE:
                parts[i] = _Recorder(parts[i], stats[li], i)
            layers[li] = tuple(parts)
        run()
    finally:
        layers[:] = orig
    return stats


def smoothing(act_max: torch.Tensor, w: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant's ``s`` per input channel of ``w (out, in)``: ``act_max^alpha / max|w_:j|^(1 - alpha)``, 1 where
    either is zero."""
    a, b = act_max.float(), w.float().abs().amax(dim=0)
    s = a.pow(alpha) / b.pow(1 - alpha)
    return torch.where((a > 0) & (b > 0), s, torch.ones_like(s)).clamp_(min=1e-5)


def smoothed(
    layers: Sequence[tuple],
    stats: Sequence[dict[int, torch.Tensor]],
    make: Callable[[torch.Tensor], object],
    which: Sequence[int] = SMOOTHABLE,
    alpha: float = 0.5,
    plain: Callable[[torch.Tensor], object] | None = None,
) -> list[tuple]:
    """FastLlama ``layers`` with the projections ``which`` (of :data:`SMOOTHABLE`) smoothed and built by ``make``
    (an int8 layer from an fp32 weight), ``1 / s`` folded as the module says; a projection not in ``which`` keeps its
    callable unless smoothing another changed its weight (up's rows, for down), then it is rebuilt by ``plain``
    (default: ``F.linear`` in its weight's dtype)."""
    plain = plain or (lambda w: functools.partial(torch.nn.functional.linear, weight=w))
    out = []
    for layer, st in zip(layers, stats, strict=True):
        ln1, qkv, o, ln2, gu, down = layer
        w = {QKV: weight_of(qkv).float(), GATE_UP: weight_of(gu).float(), DOWN: weight_of(down).float()}
        dtype = {k: weight_of(p).dtype for k, p in ((QKV, qkv), (GATE_UP, gu), (DOWN, down))}
        norms = {QKV: ln1, GATE_UP: ln2}
        new_norm = dict(norms)
        for i in which:
            s = smoothing(st[i], w[i], alpha)
            w[i] = w[i] * s
            if i in norms:
                new_norm[i] = (norms[i].float() / s).to(norms[i].dtype)
            else:  # down's input is silu(gate) * up: up's rows (the second half of gate/up) carry 1 / s
                half = w[GATE_UP].shape[0] // 2
                w[GATE_UP] = torch.cat([w[GATE_UP][:half], w[GATE_UP][half:] / s[:, None]])
        parts = {QKV: qkv, GATE_UP: gu, DOWN: down}
        touched = set(which) | ({GATE_UP} if DOWN in which else set())
        for i in touched:
            parts[i] = make(w[i]) if i in which else plain(w[i].to(dtype[i]))
        out.append((new_norm[QKV], parts[QKV], o, new_norm[GATE_UP], parts[GATE_UP], parts[DOWN]))
    return out
