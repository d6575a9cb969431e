"""SmoothQuant for the lean forward (issue 77): smoothing is an identity of the forward before quantisation, and with
an activation outlier it brings per-tensor int8 back near fp32."""

from __future__ import annotations

import functools

import pytest
import torch

from epr.lm.fastlm import fast_backbone
from epr.lm.int8_linear import FusedInt8Linear, fused_supported
from epr.lm.smooth_quant import SMOOTHABLE, calibrate, smoothed, smoothing, weight_of

from .test_fastlm import _llama


def _fast(outlier: float = 1.0):
    """A small FastLlama in fp32; ``outlier`` > 1 makes channel 3 of every normed input that much larger, with the
    projections reading it scaled down to match (the model's output unchanged: the outlier lives in activations)."""
    fast = fast_backbone(_llama())
    if outlier != 1.0:
        for li, (ln1, qkv, o, ln2, gu, down) in enumerate(fast.layers):
            ln1, ln2 = ln1.clone(), ln2.clone()
            ln1[3] *= outlier
            ln2[3] *= outlier
            wq, wg = weight_of(qkv).clone(), weight_of(gu).clone()
            wq[:, 3] /= outlier
            wg[:, 3] /= outlier
            lin = functools.partial(torch.nn.functional.linear)
            fast.layers[li] = (
                ln1,
                functools.partial(lin, weight=wq),
                o,
                ln2,
                functools.partial(lin, weight=wg),
                down,
            )
    return fast


def _out(fast, ids):
    with torch.inference_mode():
        return fast(ids)


def test_smoothing_is_an_identity_of_the_forward_before_quantisation():
    fast, ids = _fast(), torch.randint(0, 101, (3, 17))
    ref = _out(fast, ids)
    stats = calibrate(fast.layers, lambda: _out(fast, torch.randint(0, 101, (4, 19))))
    assert all(set(st) == set(SMOOTHABLE) for st in stats) and stats[0][1].shape == (48,)
    assert _out(fast, ids).equal(ref)  # calibration restores the layers
    orig = list(fast.layers)
    identity = lambda w: functools.partial(torch.nn.functional.linear, weight=w)  # noqa: E731
    fast.layers[:] = smoothed(orig, stats, identity)
    torch.testing.assert_close(_out(fast, ids), ref, rtol=1e-4, atol=1e-4)
    # negative control: the weights smoothed without folding 1 / s into the norms change the forward
    fast.layers[:] = [
        (orig[i][0], *s[1:3], orig[i][3], *s[4:]) for i, s in enumerate(smoothed(orig, stats, identity))
    ]
    assert (_out(fast, ids) - ref).abs().max() > 1e-2


def test_the_smoothing_factor_balances_the_two_ranges():
    act, w = torch.tensor([4.0, 0.0, 1.0]), torch.tensor([[1.0, 2.0, 0.25], [-0.5, 1.0, 0.0]])
    s = smoothing(act, w, alpha=0.5)
    # channel 0: sqrt(4) / sqrt(1) = 2; channel 1 has no activation (s = 1); channel 2: sqrt(1) / sqrt(0.25) = 2
    assert torch.allclose(s, torch.tensor([2.0, 1.0, 2.0]))
    assert torch.allclose((act / s)[[0, 2]], (w.abs().amax(0) * s)[[0, 2]])  # alpha 0.5: the two maxima meet


@pytest.mark.skipif(fused_supported() is not None, reason=str(fused_supported()))
def test_with_an_activation_outlier_smoothing_brings_per_tensor_int8_back_near_fp32():
    fast, ids = _fast(outlier=60.0), torch.randint(0, 101, (3, 17))
    ref = _out(fast, ids)
    stats = calibrate(fast.layers, lambda: _out(fast, torch.randint(0, 101, (4, 19))))
    orig = list(fast.layers)

    def err(layers):
        fast.layers[:] = layers
        return float((_out(fast, ids) - ref).abs().mean() / ref.abs().mean())

    plain = [(ln1, FusedInt8Linear(weight_of(q).float()), o, ln2, FusedInt8Linear(weight_of(g).float()), d)
             for ln1, q, o, ln2, g, d in orig]  # fmt: skip
    sq = smoothed(orig, stats, FusedInt8Linear, which=(1, 4))
    e_plain, e_sq = err(plain), err(sq)
    assert e_sq < 0.05 and e_sq < e_plain / 2, (
        e_sq,
        e_plain,
    )  # the unsmoothed layers are the negative control
