"""Linear layers with weights pre-packed once for oneDNN, for LM inference on CPU.

``F.linear`` on CPU calls MKL's sgemm, which re-reads the weight in its plain layout on every call. For the shapes
of LM inference that is slow where it matters most: decoding (a handful of rows per step) runs at 4-25 GFLOP/s on a
2-core AVX2 EPYC, and an LM head with a large vocabulary at ~10. oneDNN's inner-product kernel with the weight
reordered once into its blocked layout runs the same products at 40-70 GFLOP/s from 8 rows up, and is not slower for
large batches (``python -m benchmarks.forward`` and ``benchmarks.generate`` time both on the machine at hand).

``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise`` are the ops PyTorch's own CPU compiler
(Inductor's weight freezing) emits for this; they are not public API, so every use is guarded: the pair is probed
once on a small product and compared with ``F.linear``; if either op is missing, raises, or disagrees, nothing is
packed and the plain layers are used (logged once).

Inference only: packed layers have no gradient path. :class:`PackedLinear` keeps a reference to the original
weight (``.weight``), so code that reads it (tied embeddings, the lean forward's fused copies) still works; the
packed copy costs one more copy of each linear weight in memory.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

__all__ = ["PackedLinear", "linear_fn", "pack_linears", "packing_supported"]

log = logging.getLogger(__name__)


@functools.cache
def packing_supported(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN weight packing exists here and reproduces ``F.linear`` on a probe (cached per dtype)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w = torch.randn(48, 40, generator=g).to(dtype)
        b = torch.randn(48, generator=g).to(dtype)
        x = torch.randn(3, 5, 40, generator=g).to(dtype)
        with torch.inference_mode():
            packed = torch.ops.mkldnn._reorder_linear_weight(w)
            got = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, 40), packed, b, "none", [], "").view(
                3, 5, 48
            )
            ref = F.linear(x, w, b)
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        ok = bool(torch.allclose(got.float(), ref.float(), rtol=tol, atol=tol))
        if not ok:
            log.info("oneDNN packed linear disagrees with F.linear for %s: not used", dtype)
        return ok
    except Exception as e:  # noqa: BLE001 - a missing private op or a build without oneDNN: fall back quietly
        log.info("oneDNN packed linear unavailable for %s (%s): using F.linear", dtype, type(e).__name__)
        return False


class PackedLinear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` reordered once for oneDNN; any leading dims, inference only."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight  # the original (shared, not copied): tied weights and readers keep working
        self.bias = bias
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear) -> PackedLinear:
        return cls(lin.weight, lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        b = None if self.bias is None else self.bias.detach()
        if x.numel() == self.in_features and self.out_features < 16 * self.in_features:
            # one row (batch-1 decoding): MKL's plain gemv beat the packed kernel there (benchmarks.generate)
            return F.linear(x, self.weight.detach(), b)
        y = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, self.in_features), self.packed, b, "none", [], ""
        )
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def _wanted(mode: str, device: torch.device, dtype: torch.dtype) -> bool:
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"models.pack_linear must be auto, on or off, not {mode!r}")
    if mode == "off" or device.type != "cpu":
        return False
    # auto: fp32 only, where it was measured faster; bf16 (AMX) kernels take the plain layout at full speed already
    if mode == "auto" and dtype != torch.float32:
        return False
    return packing_supported(dtype)


def linear_fn(weight: torch.Tensor, mode: str = "auto") -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable ``x -> x @ weight.T``: packed for oneDNN when ``mode`` allows it here, else ``F.linear``."""
    if _wanted(mode, weight.device, weight.dtype):
        return PackedLinear(weight)
    return functools.partial(F.linear, weight=weight)


def pack_linears(model: torch.nn.Module, mode: str = "auto") -> int:
    """Replace every ``nn.Linear`` of an inference model with a :class:`PackedLinear`; returns how many."""
    params = next(model.parameters(), None)
    if params is None or not _wanted(mode, params.device, params.dtype):
        return 0
    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == params.dtype:
                setattr(parent, name, PackedLinear.from_linear(child))
                n += 1
    if n:
        log.info("packed %d linear layers for oneDNN (models.pack_linear=%s)", n, mode)
    return n
