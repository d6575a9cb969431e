"""int8 linear layers for label scoring on CPUs with int8 dot-product instructions (issue 77).

The labels need the *ranking* of a query's candidates, not the last digit of a log-probability, and CPUs with
AVX512-VNNI (Zen 4, Zen 5, Ice Lake on) or AMX-INT8 (Sapphire Rapids on) multiply int8 at up to twice their bf16
rate. :class:`Int8Linear` keeps a weight quantised once per output channel (symmetric, scale = max |w| / 127) and
quantises each input row on the fly (per row, the same rule), multiplies in int8 with int32 accumulation
(``torch._int_mm``, exact) and rescales in fp32: ``y = (x_q W_q^T) * s_x * s_w``.

``torch._int_mm`` is not public API, so :func:`int8_supported` probes it once against an integer reference; where it
is missing or wrong, or the CPU has no int8 dot-product instruction (it would run, emulated, slower than bf16),
nothing is quantised and the caller says why. Inference only.

Measured on two Zen 4 cores (``python -m benchmarks.int8_linear``): the int8 product alone runs ~2x bf16, but the
eager rescale of :class:`Int8Linear`'s int32 output (one pass over every output element, bandwidth-bound) costs
more than it saves. :class:`FusedInt8Linear` uses oneDNN's int8 inner product with the dequantisation fused
(``torch.ops.onednn.qlinear_pointwise``, the op PyTorch's x86 int8 compiler path emits): per-channel int8 weights,
the input quantised per tensor (uint8 with a zero point), the output written in bf16 / fp32 directly.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

__all__ = [
    "Int8Linear",
    "FusedInt8Linear",
    "int8_supported",
    "fused_supported",
    "cpu_int8_flags",
    "quantize_rows",
]

log = logging.getLogger(__name__)

INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_int8_flags() -> tuple[str, ...]:
    """The int8 dot-product instructions this CPU reports (``/proc/cpuinfo``; empty where unreadable)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return ()
    return tuple(f for f in INT8_FLAGS if f in flags)


@functools.cache
def int8_supported() -> str | None:
    """``None`` where int8 linears run here natively and exactly; else why not (for the caller's message)."""
    flags = cpu_int8_flags()
    if not flags:
        return "this CPU reports no int8 dot-product instruction (AVX512-VNNI, AVX-VNNI or AMX-INT8)"
    try:
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (5, 40), generator=g, dtype=torch.int8)
        b = torch.randint(-127, 128, (40, 24), generator=g, dtype=torch.int8)
        if not torch.equal(torch._int_mm(a, b), a.int() @ b.int()):
            return "torch._int_mm disagrees with an integer product on a probe"
    except Exception as e:  # noqa: BLE001 - a build without the private op
        return f"torch._int_mm is unavailable ({type(e).__name__}: {e})"
    return None


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row of a 2-d tensor: ``(q, scale)`` with ``x ~= q * scale`` (``scale``: ``(rows, 1)``
    fp32; an all-zero row gets scale 1)."""
    x = x.float()
    s = x.abs().amax(dim=1, keepdim=True) / 127.0
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round(x / s).clamp_(-127, 127).to(torch.int8), s


class Int8Linear(torch.nn.Module):
    """``y = x W^T`` with ``W`` quantised once per output channel and ``x`` per row; the output in ``x``'s dtype."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        with torch.no_grad():
            q, s = quantize_rows(weight.detach())
        self.qweight_t = q.t().contiguous()  # (in, out): torch._int_mm's right operand
        self.wscale = s.view(1, -1)  # (1, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        q, s = quantize_rows(x.reshape(-1, self.in_features))
        y = torch._int_mm(q, self.qweight_t).float().mul_(s).mul_(self.wscale)
        return y.to(x.dtype).view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, int8 (per channel / per row)"
        )


def quantize_tensor_u8(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """Asymmetric uint8 over the whole tensor: ``(q, scale, zero_point)`` with ``x ~= (q - zero_point) * scale``."""
    lo, hi = torch.aminmax(x)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)  # zero exactly representable
    scale = (hi - lo) / 255.0 or 1.0
    zp = int(round(-lo / scale))
    return torch.round(x / scale).add_(zp).clamp_(0, 255).to(torch.uint8), scale, zp


@functools.cache
def fused_supported() -> str | None:
    """``None`` where oneDNN's fused int8 inner product runs here and is exact on a probe; else why not."""
    why = int8_supported()
    if why is not None:
        return why
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randint(-126, 127, (24, 40), generator=g).float()
        w[:, 0] = 127
        x = torch.randint(-126, 128, (5, 40), generator=g).float()
        x[0, :2] = torch.tensor([-127.0, 128.0])
        if not torch.equal(FusedInt8Linear(w)(x), x @ w.T):
            return "oneDNN's int8 inner product disagrees with an exact product on a probe"
    except Exception as e:  # noqa: BLE001 - a build without the op
        return f"oneDNN's int8 inner product is unavailable ({type(e).__name__}: {e})"
    return None


class FusedInt8Linear(torch.nn.Module):
    """``y = x W^T``: ``W`` int8 per output channel, ``x`` uint8 per tensor, oneDNN's product with the rescale fused;
    the output in ``x``'s dtype (bf16 or fp32)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        with torch.no_grad():
            q, s = quantize_rows(weight.detach())
        self.packed = torch.ops.onednn.qlinear_prepack(q, None)
        self.wscale = s.view(-1)
        self.wzp = torch.zeros(self.out_features, dtype=torch.int64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = x.dtype if x.dtype in (torch.bfloat16, torch.float32) else torch.float32
        q, s, zp = quantize_tensor_u8(x.reshape(-1, self.in_features))
        y = torch.ops.onednn.qlinear_pointwise(
            q, s, zp, self.packed, self.wscale, self.wzp, None, 1.0, 0, out, "none", [], ""
        )
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, int8 oneDNN (fused rescale)"
        )
