"""The lean greedy decoder (epr.lm.decode) against transformers' greedy generate, value for value."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epr.lm.decode import LeanDecoder, StopTable, length_batches
from epr.lm.generate import Generator
from epr.lm.kv_cache import cached_attention


@pytest.fixture(scope="module")
def smol_tok():
    from transformers import AutoTokenizer

    from epr.lm.models import resolve_lm

    tok = AutoTokenizer.from_pretrained(resolve_lm("smollm2"))
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


@pytest.fixture(scope="module")
def tiny_smol(smol_tok):
    """A random 3-layer Llama with SmolLM2's byte-level tokenizer (newlines and multi-token stops are real)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(smol_tok),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=smol_tok.eos_token_id,
        bos_token_id=smol_tok.bos_token_id,
        pad_token_id=smol_tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = smol_tok.eos_token_id
    return model, smol_tok


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = "turn on the lights in kitchen set alarm for 7 am play music by queen what is weather".split()
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 40))
        out.append(" ".join(rng.choice(words, k)) + ("\n" if rng.random() < 0.3 else ":"))
    return out


def _both(model, tok, prompts, stop, max_new=24, **kw):
    hf = Generator(model, tok, max_new, 5, stop, engine="hf").generate(prompts)
    lean = Generator(model, tok, max_new, stop=stop, engine="lean", **kw)
    return hf, lean.generate(prompts), lean


def test_lean_equals_hf_greedy_with_mixed_lengths_slices_and_dropped_rows(tiny_smol):
    model, tok = tiny_smol
    prompts = _prompts(60)
    # 3 rows decoded together, prefill slices of 40 padded tokens: many groups, slices, dropped rows
    hf, lean, g = _both(model, tok, prompts, "\n", decode_rows=3, prefill_tokens=40)
    assert g.engine == "lean"
    assert lean == hf
    assert g.lean.stats["prompts"] == 60 and g.lean.stats["decode_steps"] > 0
    # the same with one large group
    _, lean_big, _ = _both(model, tok, prompts, "\n", decode_rows=64, prefill_tokens=100000)
    assert lean_big == hf


def test_continuous_batching_refills_rows_grows_the_cache_and_equals_hf(tiny_smol, monkeypatch):
    """Prompts of widely different lengths through a pool of 8 rows: groups join while others decode (finished
    rows' places refilled), the cache grows when longer groups arrive, every step runs more rows than dropping
    finished rows would leave, and the strings are transformers' (fp32) value for value. Negative control: a
    move that forgets to copy the keys (rows left with another row's cache) changes the outputs."""
    import epr.lm.kv_cache as kvc

    model, tok = tiny_smol
    rng = np.random.default_rng(7)
    words = "turn on the lights in kitchen set alarm for 7 am play music by queen".split()
    prompts = [" ".join(rng.choice(words, int(k))) + ":" for k in rng.integers(1, 120, 48)]
    calls = {"grown": 0, "moved": 0}
    grown, move = kvc.KVCache.grown, kvc.KVCache.move

    def spy_grown(self, *a):
        calls["grown"] += 1
        return grown(self, *a)

    def spy_move(self, src, dst):
        calls["moved"] += len(src)
        return move(self, src, dst)

    monkeypatch.setattr(kvc.KVCache, "grown", spy_grown)
    monkeypatch.setattr(kvc.KVCache, "move", spy_move)
    hf, lean, g = _both(model, tok, prompts, "\n", max_new=20, decode_rows=8, prefill_tokens=300)
    assert lean == hf
    st = g.lean.stats
    assert calls["grown"] >= 1 and calls["moved"] > 0
    assert st["decode_rows"] / st["decode_steps"] > 4  # refilled: most steps run on a nearly full pool

    def forgetful(self, src, dst):  # the bookkeeping moves, the keys and values do not
        if src:
            s_, d_ = torch.tensor(src), torch.tensor(dst)
            self.valid.index_copy_(0, d_, self.valid.index_select(0, s_))

    monkeypatch.setattr(kvc.KVCache, "move", forgetful)
    broken = Generator(model, tok, 20, stop="\n", engine="lean", decode_rows=8, prefill_tokens=300)
    assert broken.generate(prompts) != hf


def test_lean_equals_hf_on_the_tiny_bert_tokenizer_model(tiny_lm):
    model, tok = tiny_lm  # a wordpiece vocabulary without a newline: both generate max_new_tokens and cut
    prompts = ["turn on the lights", "a", "dim the garage lights please now", "set an alarm"]
    hf, lean, _ = _both(model, tok, prompts, "\n", max_new=10)
    assert lean == hf


def _free_run(model, tok, prompt, n):
    """HF greedy ids without any stop (the reference sequence the stops are cut from)."""
    enc = tok(prompt, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return out[0, enc["input_ids"].shape[1] :].tolist()


def test_stop_at_step_zero_never_and_split_across_tokens(tiny_smol):
    model, tok = tiny_smol
    prompt = "play music by queen"
    ids = _free_run(model, tok, prompt, 16)
    texts = [tok.decode([t]) for t in ids]
    full = tok.decode(ids)

    # the first generated token's text as the stop: nothing is kept, one token generated
    first = texts[0]
    hf, lean, g = _both(model, tok, [prompt], first, max_new=16)
    assert lean == hf == [full.split(first, 1)[0].strip()]
    assert len(g.lean.generate_ids([tok(prompt)["input_ids"]])[0]) == 1

    # a stop that never comes: max_new_tokens tokens
    hf, lean, g = _both(model, tok, [prompt], "\x00never\x00", max_new=16)
    assert lean == hf == [full.strip()]
    assert g.lean.generate_ids([tok(prompt)["input_ids"]])[0] == ids

    # a stop spanning two tokens: the last character(s) of one and the first of the next
    i = next(
        i for i in range(3, 15) if texts[i] and texts[i + 1] and texts[i] + texts[i + 1] not in texts[: i - 1]
    )
    stop = texts[i][-1] + texts[i + 1][:1]
    assert len(stop) == 2 and not g.lean.stops.full[ids[i]]
    hf, lean, g = _both(model, tok, [prompt], stop, max_new=16)
    assert lean == hf == [full.split(stop, 1)[0].strip()]
    got = g.lean.generate_ids([tok(prompt)["input_ids"]])[0]
    assert stop in tok.decode(got) and stop not in tok.decode(got[:-1])  # stopped at the completing token


def test_stop_table_on_a_real_vocabulary(smol_tok):
    tok = smol_tok
    n = len(tok)
    table = StopTable(tok, n, "\n", [tok.eos_token_id])
    nl = tok("\n", add_special_tokens=False)["input_ids"]
    assert all(table.full[t] for t in nl)
    assert table.full.sum() > 1  # also "\n\n", ")\n", ...
    assert not table.partial.any()  # one character cannot be split over tokens
    assert table.eos[tok.eos_token_id] and table.eos.sum() == 1
    two = StopTable(tok, n, "]]", [])
    assert two.partial[tok("]", add_special_tokens=False)["input_ids"][0]]
    assert two.stopped(
        tok("]", add_special_tokens=False)["input_ids"][0], tok("a ]]", add_special_tokens=False)["input_ids"]
    )


def test_length_batches_bounds_rows_and_tokens():
    lens = [5, 1, 9, 3, 3, 7, 2]
    bs = length_batches(lens, max_rows=3, max_tokens=12)
    assert sorted(i for b in bs for i in b) == list(range(len(lens)))
    for b in bs:
        assert len(b) <= 3 and (len(b) == 1 or len(b) * max(lens[i] for i in b) <= 12)
        assert [lens[i] for i in b] == sorted(lens[i] for i in b)


@pytest.mark.parametrize("G", [1, 3])
def test_cached_attention_equals_sdpa_with_a_mask(G):
    torch.manual_seed(0)
    B, Hkv, S, D = 3, 2, 11, 8
    q = torch.randn(B, Hkv * G, 1, D)
    k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    mask = torch.rand(B, 1, 1, S) > 0.3
    mask[..., -1] = True
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.3, enable_gqa=G > 1
    )
    torch.testing.assert_close(cached_attention(q, k, v, mask, 0.3), ref)
    # a negative control: the mask matters
    assert not torch.allclose(cached_attention(q, k, v, torch.ones_like(mask), 0.3), ref)


def test_uncovered_architecture_falls_back_to_hf(smol_tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(smol_tok), n_embd=32, n_layer=2, n_head=2)).eval()
    g = Generator(model, smol_tok, 8, 4, "\n")
    assert g.engine == "hf" and g.lean is None
    assert len(g.generate(["turn on", "the lights"])) == 2
    with pytest.raises(ValueError, match="does not cover"):
        Generator(model, smol_tok, 8, 4, "\n", engine="lean")
    with pytest.raises(ValueError, match="engine"):
        Generator(model, smol_tok, 8, 4, "\n", engine="fast")


def test_empty_prompt_is_a_clear_error(tiny_smol):
    model, tok = tiny_smol
    from epr.lm.fastlm import fast_backbone

    dec = LeanDecoder(model, fast_backbone(model), tok, 4, "\n")
    with pytest.raises(ValueError, match="empty prompt"):
        dec.generate_ids([[]])


@pytest.mark.slow
def test_lean_equals_hf_on_smollm2_fp32():
    """The packaged SmolLM2 in fp32 on demo prompts (4 seeded demonstrations each): equal strings."""
    from epr.config import DataConfig
    from epr.lm.models import load_lm
    from epr.tasks import get_task

    task = get_task(DataConfig(task="demo"))
    pool, ev = task.load()
    rng = np.random.default_rng(0)
    prompts = [
        "".join(task.format_demo(pool[i]) for i in rng.choice(len(pool), 4, replace=False))
        + task.format_query(e.input)
        for e in ev[:24]
    ]
    model, tok = load_lm("smollm2", dtype="fp32")
    hf = Generator(model, tok, 40, 8, task.stop, engine="hf").generate(prompts)
    lean = Generator(model, tok, 40, stop=task.stop, engine="lean").generate(prompts)
    assert lean == hf
    assert sum(p == e.output for p, e in zip(lean, ev)) > 0  # a real model: some are right


def test_cache_slots_never_written_are_zeros_not_garbage():
    """A masked slot's attention weight is 0, and 0 x NaN is NaN: unwritten slots must hold finite values."""
    from epr.lm.kv_cache import KVCache

    c = KVCache(2, 3, 2, 5, 4, torch.float32, "cpu")
    assert all(bool((t == 0).all()) for t in c.k + c.v) and not c.valid.any()


def test_a_generation_config_with_logits_processors_falls_back_to_hf(tiny_smol):
    import copy

    model, tok = tiny_smol
    m = copy.deepcopy(model)
    m.generation_config.repetition_penalty = 1.3
    g = Generator(m, tok, 8, 4, "\n")
    assert g.engine == "hf"  # the lean decoder would ignore the penalty: not the same decoding
    with pytest.raises(ValueError, match="repetition_penalty"):
        Generator(m, tok, 8, 4, "\n", engine="lean")
    assert Generator(model, tok, 8, 4, "\n").engine == "lean"


def test_freed_memory_is_given_back_without_error():
    from epr.lm.decode import release_free_memory

    release_free_memory()  # glibc's malloc_trim; a no-op elsewhere, never raises


@pytest.mark.parametrize("max_new,rows,prefill", [(24, 3, 40), (24, 64, 100000), (2, 5, 60), (0, 4, 80)])
def test_gold_logprob_in_the_generation_pass_equals_the_scorer(tiny_smol, max_new, rows, prefill):
    """``log p(gold | prompt)`` read off the generation's prefill equals the scorer's, for golds shorter and longer
    than the generation, in many groups and slices, with rows dropped while decoding; the predictions are those of
    plain generation. Negative control: another gold per prompt gives other values."""
    from epr.lm.scoring import LMScorer

    model, tok = tiny_smol
    prompts = _prompts(40, seed=3)
    rng = np.random.default_rng(4)
    words = "lights kitchen alarm music queen weather on off".split()
    golds = [" " + " ".join(rng.choice(words, int(rng.integers(1, 30)))) for _ in prompts]
    g = Generator(model, tok, max_new, stop="\n", engine="lean", decode_rows=rows, prefill_tokens=prefill)
    preds, lps = g.generate_with_gold(prompts, golds)
    ref = LMScorer(model, tok).score(prompts, golds)
    np.testing.assert_allclose(lps, ref, atol=2e-4, rtol=0)
    assert preds == g.generate(prompts)
    _, other = g.generate_with_gold(prompts, golds[1:] + golds[:1])
    assert np.abs(np.array(other) - ref).max() > 0.1


def test_gold_in_the_generation_pass_is_nan_past_the_context_and_refuses_hf(tiny_smol):
    model, tok = tiny_smol
    g = Generator(model, tok, 4, stop="\n", engine="lean")
    long_gold = " on" * 600  # prompt + gold > max_position_embeddings (512)
    _, lps = g.generate_with_gold(["turn on:", "play music:"], [long_gold, " queen"])
    assert np.isnan(lps[0]) and np.isfinite(lps[1])
    with pytest.raises(ValueError, match="lean decoder"):
        Generator(model, tok, 4, stop="\n", engine="hf").generate_with_gold(["a:"], [" b"])


def test_bf16_decoding_over_the_whole_cache_equals_the_filled_slice(tiny_smol, monkeypatch):
    """bf16 decode steps attend over the whole preallocated cache (contiguous; the slots not yet filled are masked,
    some hold gold keys that were never marked valid): predictions and gold log-probs equal those of attending over
    the filled slice only, with rows dropped while decoding. The spy checks that each path ran as claimed."""
    import copy

    import epr.lm.decode as dec
    import epr.lm.kv_cache as kvc

    model, tok = tiny_smol
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    prompts = _prompts(30, seed=5)
    rng = np.random.default_rng(6)
    golds = [
        " " + " ".join(rng.choice(["on", "off", "queen", "kitchen"], int(rng.integers(1, 12))))
        for _ in prompts
    ]
    seen: list[int] = []
    real = kvc.cached_attention

    def spy(q, k, v, mask, scale):
        seen.append(k.shape[2])
        return real(q, k, v, mask, scale)

    monkeypatch.setattr(kvc, "cached_attention", spy)
    g = Generator(m16, tok, 20, stop="\n", engine="lean", decode_rows=7)
    whole = g.generate_with_gold(prompts, golds)
    whole_spans = set(seen)
    seen.clear()
    monkeypatch.setattr(dec.LeanDecoder, "WHOLE_CACHE_DTYPES", ())
    sliced = g.generate_with_gold(prompts, golds)
    assert whole[0] == sliced[0]
    np.testing.assert_array_equal(whole[1], sliced[1])
    assert len(set(seen)) > len(whole_spans)  # the slice grows step by step; the whole cache has a few sizes
    # negative control: over the whole cache the mask is what keeps out the unfilled and gold-only slots
    monkeypatch.setattr(dec.LeanDecoder, "WHOLE_CACHE_DTYPES", (torch.bfloat16,))
    monkeypatch.setattr(
        kvc, "cached_attention", lambda q, k, v, mask, scale: real(q, k, v, mask | True, scale)
    )
    unmasked = g.generate_with_gold(prompts, golds)
    assert unmasked[0] != sliced[0] or not np.array_equal(unmasked[1], sliced[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_first_max_index_is_argmax_with_ties(dtype):
    """The decoder's greedy pick equals ``argmax`` (first index on ties), on logits full of planted ties."""
    from epr.lm.decode import first_max_index

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (64, 49152), generator=g).to(dtype)  # every row: thousands of tied maxima
    x[5, 17] = 9
    x[5, 40000] = 9
    assert torch.equal(first_max_index(x), x.argmax(-1))
    assert first_max_index(x)[5] == 17
    first = [int((row == row.max()).nonzero()[0]) for row in x]  # independently: the smallest maximal index
    assert first_max_index(x).tolist() == first
    assert x.max(-1).values.eq(x[torch.arange(64), first_max_index(x)]).all()
