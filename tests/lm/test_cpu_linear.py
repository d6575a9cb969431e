"""oneDNN-packed linear layers reproduce nn.Linear and leave model outputs unchanged."""

import pytest
import torch

from epr.lm.cpu_linear import PackedLinear, linear_fn, pack_linears, packing_supported
from epr.lm.fastlm import fast_backbone

needs_packing = pytest.mark.skipif(
    not packing_supported(torch.float32), reason="no oneDNN packing in this build"
)


@needs_packing
@pytest.mark.parametrize("shape", [(7,), (1, 7), (5, 7), (2, 3, 7), (1, 1, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_equals_linear(shape, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(7, 300, bias=bias)  # 300 > 16 * 7: also the one-row packed path
    small = torch.nn.Linear(7, 11, bias=bias)  # the one-row plain path
    x = torch.randn(*shape)
    with torch.inference_mode():
        for m in (lin, small):
            got = PackedLinear.from_linear(m)(x)
            assert got.shape == m(x).shape
            torch.testing.assert_close(got, m(x), rtol=1e-5, atol=1e-5)


def test_modes(tiny_lm):
    model, _ = tiny_lm
    with pytest.raises(ValueError, match="pack_linear"):
        pack_linears(model, "sometimes")
    w = torch.randn(4, 3)
    assert not isinstance(linear_fn(w, "off"), PackedLinear)
    bf = torch.nn.Linear(3, 4).to(torch.bfloat16)
    assert pack_linears(torch.nn.Sequential(bf), "auto") == 0  # auto packs fp32 only


@needs_packing
def test_packed_model_and_lean_forward_match_plain(tiny_lm_dir):
    from epr.lm.models import load_lm

    plain, _ = load_lm(tiny_lm_dir, dtype="fp32", pack="off")
    packed, _ = load_lm(tiny_lm_dir, dtype="fp32", pack="auto")
    n = sum(isinstance(m, PackedLinear) for m in packed.modules())
    assert n > 0 and not any(isinstance(m, PackedLinear) for m in plain.modules())
    ids = torch.randint(0, plain.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, plain(ids).logits, rtol=1e-4, atol=1e-4)
        fast = fast_backbone(packed)
        assert fast is not None and fast.packed
        ref = plain.base_model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(fast(ids), ref, rtol=1e-4, atol=1e-4)
        # greedy generation picks the same tokens
        kw = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(packed.generate(ids, **kw), plain.generate(ids, **kw))
