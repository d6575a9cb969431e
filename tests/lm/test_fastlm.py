"""The lean Llama forward (epr.lm.fastlm) against the transformers forward it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epr.lm.fastlm import fast_backbone
from epr.lm.scoring import LMScorer


def _llama(**kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = dict(
        vocab_size=101,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=1000.0,
    )
    cfg.update(kw)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


@pytest.mark.parametrize("kv_heads", [6, 2, 1])
def test_fast_forward_equals_transformers(kv_heads):
    model = _llama(num_key_value_heads=kv_heads)
    fast = fast_backbone(model)
    assert fast is not None
    ids = torch.randint(0, 101, (3, 17))
    with torch.inference_mode():
        ref = model.base_model(input_ids=ids).last_hidden_state
        got = fast(ids)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_fast_forward_bf16_close_to_transformers():
    model = _llama().to(torch.bfloat16)
    ids = torch.randint(0, 101, (2, 11))
    with torch.inference_mode():
        ref = model.base_model(input_ids=ids).last_hidden_state.float()
        got = fast_backbone(model)(ids).float()
    assert (got - ref).abs().mean() / ref.abs().mean() < 0.02


def test_unsupported_models_fall_back():
    assert fast_backbone(_llama(mlp_bias=True)) is None
    assert fast_backbone(_llama(hidden_act="gelu")) is None
    assert fast_backbone(object()) is None


def test_scorer_fast_and_hf_forward_agree(tiny_lm):
    model, tok = tiny_lm
    ctx = ["turn on the lights", "a", "dim the garage lights please now"]
    tgt = [" [IN:ON ]", " b c", " [IN:DIM [SL:ROOM garage ] ]"]
    fast = LMScorer(model, tok, forward="fast")
    assert fast.backbone.__class__.__name__ == "FastLlama"
    hf = LMScorer(model, tok, forward="hf")
    np.testing.assert_allclose(fast.score(ctx, tgt), hf.score(ctx, tgt), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="forward"):
        LMScorer(model, tok, forward="turbo")
