"""int8 linear layers (issue 77, first part): per-channel weights and per-row activations, the integer product exact,
the result within a stated tolerance of fp32, and a CPU without int8 instructions refused with its reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from epr.lm import int8_linear as il
from epr.lm.int8_linear import FusedInt8Linear, Int8Linear, fused_supported, int8_supported, quantize_rows

needs_int8 = pytest.mark.skipif(int8_supported() is not None, reason=str(int8_supported()))


def test_rows_are_quantised_within_half_a_step():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 33, generator=g) * torch.logspace(-3, 2, 7).view(-1, 1)
    x[3] = 0
    q, s = quantize_rows(x)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127 and s[3].item() == 1.0
    assert torch.all((q.float() * s - x).abs() <= s / 2 + 1e-6)


@needs_int8
def test_the_integer_product_is_exact_and_the_output_close_to_fp32():
    g = torch.Generator().manual_seed(1)
    # on the int8 grid already (every row's max is 127): quantisation is the identity, the product exact
    w = torch.randint(-126, 127, (48, 64), generator=g).float()
    w[:, 0] = 127
    x = torch.randint(-126, 127, (9, 64), generator=g).float()
    x[:, 1] = -127
    assert torch.equal(Int8Linear(w)(x), x @ w.T)
    # SmolLM2-135M's MLP shape, Gaussian weights and inputs: within 2% of fp32 (relative to the output's norm; bf16
    # rounding alone is ~0.3%)
    w = torch.randn(1536, 576, generator=g) * 0.02
    x = torch.randn(2, 37, 576, generator=g)
    ref, got = F.linear(x, w), Int8Linear(w)(x)
    assert got.shape == ref.shape and float((got - ref).norm() / ref.norm()) < 0.02
    assert Int8Linear(w)(x.bfloat16()).dtype == torch.bfloat16
    # negative control: one scale for the whole weight, with one loud output channel, is much worse
    w[0] *= 200
    per_tensor = torch.round(w / (w.abs().max() / 127)) * (w.abs().max() / 127)
    ref = F.linear(x, w)
    rest = slice(1, None)
    err_channel = float((Int8Linear(w)(x) - ref)[..., rest].norm() / ref[..., rest].norm())
    err_tensor = float((F.linear(x, per_tensor) - ref)[..., rest].norm() / ref[..., rest].norm())
    assert err_channel < 0.02 < 0.5 < err_tensor


@pytest.mark.skipif(fused_supported() is not None, reason=str(fused_supported()))
def test_the_fused_onednn_layer_is_exact_on_the_grid_and_close_to_fp32():
    g = torch.Generator().manual_seed(2)
    w = torch.randint(-126, 127, (40, 64), generator=g).float()
    w[:, 3] = -127
    x = torch.randint(-126, 128, (6, 64), generator=g).float()
    x[0, :2] = torch.tensor(
        [-127.0, 128.0]
    )  # one uint8 step per unit: the input's quantisation is the identity
    assert torch.equal(FusedInt8Linear(w)(x), x @ w.T)
    w = torch.randn(1536, 576, generator=g) * 0.02
    x = torch.randn(3, 29, 576, generator=g).bfloat16()
    ref, got = F.linear(x.float(), w), FusedInt8Linear(w)(x)
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    assert float((got.float() - ref).norm() / ref.norm()) < 0.02
    # negative control: the same product without the weights' scales is another number
    layer = FusedInt8Linear(w)
    layer.wscale = torch.ones_like(layer.wscale)
    assert float((layer(x).float() - ref).norm() / ref.norm()) > 1


def test_a_cpu_without_int8_instructions_is_refused_with_its_reason(monkeypatch):
    monkeypatch.setattr(il, "cpu_int8_flags", lambda: ())
    il.int8_supported.cache_clear()
    il.fused_supported.cache_clear()
    try:
        assert "no int8 dot-product instruction" in il.int8_supported()
        assert "no int8 dot-product instruction" in il.fused_supported()
    finally:
        il.int8_supported.cache_clear()
        il.fused_supported.cache_clear()
