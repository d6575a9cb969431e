"""int8 linear layers for label scoring on CPUs with int8 dot-product instructions (issue 77).

The labels need the *ranking* of a query's candidates, not the last digit of a log-probability, and CPUs with
AVX512-VNNI (Zen 4, Zen 5, Ice Lake on) or AMX-INT8 (Sapphire Rapids on) multiply int8 at up to twice their bf16
rate. :class:`Int8Linear` keeps a weight quantised once per output channel (symmetric, scale = max |w| / 127) and
quantises each input row on the fly (per row, the same rule), multiplies in int8 with int32 accumulation
(``torch._int_mm``, exact) and rescales in fp32: ``y = (x_q W_q^T) * s_x * s_w``.

``torch._int_mm`` is not public API, so :func:`int8_supported` probes it once against an integer reference; where it
is missing or wrong, or the CPU has no int8 dot-product instruction (it would run, emulated, slower than bf16),
nothing is quantised and the caller says why. Inference only.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

__all__ = ["Int8Linear", "int8_supported", "cpu_int8_flags", "quantize_rows"]

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
