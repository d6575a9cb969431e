import numpy as np
import pytest

from epr.scoring import LMScorer, SequenceTooLong, make_batches, reference_score

CTX = [
    "turn on the kitchen lights\t[IN:ON [SL:ROOM kitchen ] ]\n",
    "dim the den\t",
    "",
    "a much longer context " * 5,
]
TGT = ["[IN:ON [SL:ROOM garage ] ]\n", "[IN:DIM [SL:ROOM den ] ]\n", "hello\n", "x\n"]


def test_batches_respect_budget():
    lengths = [5, 17, 3, 9, 30, 12, 1]
    batches = make_batches(lengths, 32)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 32


def test_batched_equals_one_at_a_time(tiny_lm):
    model, tok = tiny_lm
    batched = LMScorer(model, tok, batch_tokens=4096).score(CTX, TGT)
    single = [reference_score(model, tok, c, t) for c, t in zip(CTX, TGT)]
    np.testing.assert_allclose(batched, single, rtol=1e-4, atol=1e-4)


def test_batch_composition_does_not_change_scores(tiny_lm):
    model, tok = tiny_lm
    a = LMScorer(model, tok, batch_tokens=16).score(CTX * 3, TGT * 3)
    b = LMScorer(model, tok, batch_tokens=100_000).score(CTX * 3, TGT * 3)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    assert np.all(a < 0)


def test_too_long_sequence_is_a_clear_error(tiny_lm):
    model, tok = tiny_lm
    with pytest.raises(SequenceTooLong, match="exceed the model context of 512"):
        LMScorer(model, tok).score(["word " * 600], ["x\n"])


def test_empty_target_is_an_error(tiny_lm):
    model, tok = tiny_lm
    with pytest.raises(ValueError, match="has no tokens"):
        LMScorer(model, tok).score(["a"], [""])


@pytest.mark.slow
def test_real_lm_batched_matches_reference_fp32():
    from epr.models import load_lm

    model, tok = load_lm("smollm2", dtype="fp32")
    batched = LMScorer(model, tok, batch_tokens=512).score(CTX, TGT)
    single = [reference_score(model, tok, c, t) for c, t in zip(CTX, TGT)]
    np.testing.assert_allclose(batched, single, rtol=1e-3, atol=1e-2)
