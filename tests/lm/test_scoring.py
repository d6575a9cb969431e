import numpy as np
import pytest

from epr.lm.scoring import LMScorer, SequenceTooLong, make_batches, reference_score, token_ids

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
    from epr.lm.models import load_lm

    model, tok = load_lm("smollm2", dtype="fp32")
    batched = LMScorer(model, tok, batch_tokens=512).score(CTX, TGT)
    single = [reference_score(model, tok, c, t) for c, t in zip(CTX, TGT)]
    np.testing.assert_allclose(batched, single, rtol=1e-3, atol=1e-2)


def _prefixed_case():
    """Demonstrations shared by several queries (EPR's label scoring), one context not starting with its prefix
    (the split falls back to the first token), and an empty prefix."""
    demos = [
        "turn on the kitchen lights\t[IN:ON [SL:ROOM kitchen ] ]\n",
        "dim the den\t[IN:DIM [SL:ROOM den ] ]\n",
        "",
    ]
    queries = ["dim the porch\t", "check the attic lights\t", "turn off the office\t"]
    prefixes, contexts, targets = [], [], []
    for d in demos:
        for q in queries:
            prefixes.append(d)
            contexts.append(d + q)
            targets.append("[IN:X [SL:ROOM " + q.split()[-1] + " ] ]\n")
    prefixes.append("totally different prefix")
    contexts.append("dim the den\tx")
    targets.append("y\n")
    return prefixes, contexts, targets


@pytest.mark.parametrize("batch_tokens", [24, 4096])
def test_prefix_shared_scores_equal_plain_scores(tiny_lm, batch_tokens):
    model, tok = tiny_lm
    p, c, t = _prefixed_case()
    s = LMScorer(model, tok, batch_tokens=batch_tokens)
    assert s.backbone.__class__.__name__ == "FastLlama"  # the shared path runs, not the fallback
    np.testing.assert_allclose(s.score_prefixed(p, c, t), s.score(c, t), rtol=1e-5, atol=1e-4)


def test_prefix_shared_too_long_is_a_clear_error(tiny_lm):
    model, tok = tiny_lm
    with pytest.raises(SequenceTooLong, match="exceed the model context"):
        LMScorer(model, tok).score_prefixed(["a "], ["a " + "word " * 600], ["x\n"])


@pytest.mark.slow
def test_real_lm_prefix_shared_matches_plain_fp32():
    from epr.lm.models import load_lm

    model, tok = load_lm("smollm2", dtype="fp32")
    p, c, t = _prefixed_case()
    s = LMScorer(model, tok, batch_tokens=512)
    np.testing.assert_allclose(s.score_prefixed(p, c, t), s.score(c, t), rtol=1e-4, atol=2e-3)


def _texts():
    """Label-scoring texts as the scores stage makes them: repeated targets and demonstrations, an empty text,
    special-token text, unicode and a seam that BPE could merge across."""
    p, c, t = _prefixed_case()
    return p + c + t + ["", "<|endoftext|> hi", "caf\u00e9 \u2603\n", "a  b\t\tc"]


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.parametrize("which", ["smollm2", "minilm"])
def test_token_ids_are_the_tokenizers_own(special, which, minilm_dir):
    """The direct fast-tokenizer path (each distinct text once) returns exactly the wrapper's ids: SmolLM2's
    byte-level BPE, and MiniLM's WordPiece (the tiny test LMs' tokenizer), which lower-cases and adds [CLS] / [SEP]
    only with special tokens, so the flag is exercised."""
    from transformers import AutoTokenizer

    from epr.lm.models import load_lm

    tok = (
        load_lm("smollm2", dtype="fp32")[1]
        if which == "smollm2"
        else AutoTokenizer.from_pretrained(minilm_dir)
    )
    assert tok.is_fast
    texts = _texts()
    assert len(set(texts)) < len(texts)  # the dedup is exercised
    want = tok(texts, add_special_tokens=special)["input_ids"]
    assert token_ids(tok, texts, special) == want
    if which == "minilm":
        assert want != tok(texts, add_special_tokens=not special)["input_ids"]
    assert token_ids(tok, [], special) == []


def test_token_ids_follow_the_wrapper_where_the_backend_is_set_up_otherwise():
    """A backend with truncation switched on is asked through the wrapper, which tokenises untruncated, as a plain
    ``tok(texts)`` call does; asked directly it would cut every text at 8 tokens."""
    from epr.lm.models import load_lm

    _, tok = load_lm("smollm2", dtype="fp32")
    texts = ["word " * 50, "word " * 50, "short"]
    tok.backend_tokenizer.enable_truncation(8)
    try:
        got = token_ids(tok, texts, True)  # first: the wrapper switches the backend's truncation off
        assert [len(x) for x in got] == [len(x) for x in tok(texts, add_special_tokens=True)["input_ids"]]
        assert len(got[0]) > 8
    finally:
        tok.backend_tokenizer.no_truncation()


def test_scores_do_not_change_when_texts_repeat(tiny_lm):
    """Shared id lists (equal texts tokenised once) are not changed in place by scoring."""
    model, tok = tiny_lm
    s = LMScorer(model, tok, batch_tokens=64)
    p, c, t = _prefixed_case()
    first = s.score_prefixed(p, c, t)
    np.testing.assert_array_equal(s.score_prefixed(p, c, t), first)
    np.testing.assert_array_equal(s.score(c, t), s.score(c, t))
