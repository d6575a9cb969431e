"""Exact match read off the gold pass (``LMScorer.score_greedy``, ``cached_greedy``, ``greedy_exact``) against the
greedy decoder it stands in for, value for value."""

from __future__ import annotations

import numpy as np
import pytest

from epr.lm.generate import Generator
from epr.lm.scoring import LMScorer
from tests.lm.test_decode import _prompts, smol_tok, tiny_smol  # noqa: F401  (fixtures)


def test_the_decoders_own_path_is_greedy_and_any_changed_token_is_not(tiny_smol):  # noqa: F811
    """Each prompt's lean-decoded tokens, scored after the prompt, are all the greedy choice (and their log-prob is
    the plain scorer's); changing one token (the first, a middle one, the last) makes the check fail there."""
    model, tok = tiny_smol
    prompts = _prompts(30, seed=5)
    g = Generator(model, tok, 12, stop=None, engine="lean", decode_rows=4, prefill_tokens=64)
    ids = tok(prompts)["input_ids"]
    gen = g.lean.generate_ids(ids)
    assert all(len(x) == 12 for x in gen)
    sc = LMScorer(model, tok, batch_tokens=200)
    pairs = list(zip(ids, gen))
    lp, match = sc.score_greedy(pairs)
    assert match.all()
    np.testing.assert_allclose(lp, sc.score_ids(pairs), atol=1e-5, rtol=0)
    for at in (0, 5, 11):
        bad = [(c, t[:at] + [(t[at] + 1) % len(tok)] + t[at + 1 :]) for c, t in pairs]
        _, m = sc.score_greedy(bad)
        assert not m.any()


def test_cached_greedy_serves_held_scores_unchanged_and_resumes(tiny_smol, tmp_path):  # noqa: F811
    from epr.lm.score_cache import ScoreCache, cached_greedy, cached_scores, greedy_cache

    model, tok = tiny_smol
    sc = LMScorer(model, tok)
    prompts = _prompts(12, seed=6)
    golds = [" lights on\n"] * 6 + [" play queen\n"] * 6
    cache = ScoreCache(tmp_path, {"lm": "tiny"})
    held = cached_scores(sc, cache, prompts[:5], golds[:5], "gold")
    cache.put(prompts[:1], golds[:1], [-1.25], "gold")  # a held score, as another pass rounded it
    lp, m = cached_greedy(sc, cache, prompts, golds, "gold")
    assert lp[0] == -1.25 and np.allclose(lp[1:5], held[1:5])  # served, not replaced
    np.testing.assert_allclose(lp[5:], sc.score(prompts[5:], golds[5:]), atol=1e-4)
    assert set(np.unique(m)) <= {0.0, 1.0}
    assert len(greedy_cache(cache)) == 12 and greedy_cache(cache).dir != cache.dir

    class Refuse(LMScorer):
        def score_greedy(self, pairs):
            raise AssertionError("recomputed what the store holds")

    again = Refuse(model, tok)
    lp2, m2 = cached_greedy(again, ScoreCache(tmp_path, {"lm": "tiny"}), prompts, golds, "gold")
    assert np.array_equal(lp2, lp) and np.array_equal(m2, m)


@pytest.mark.slow
def test_greedy_exact_is_a_lower_bound_of_generated_exact_match_on_smollm2():
    """The packaged SmolLM2 (fp32) on demo prompts: against the lean decoder's predictions, every example the gold
    pass counts is one generation gets right; with the generated answers as golds, it counts (nearly) all of them;
    and it finds some of the true golds, as generation does."""
    from epr.config import DataConfig
    from epr.lm.models import load_lm
    from epr.stages.predict import greedy_exact
    from epr.tasks import get_task
    from epr.types import Example

    task = get_task(DataConfig(task="demo"))
    pool, ev = task.load()
    rng = np.random.default_rng(1)
    ev = ev[:40]
    prompts = [
        "".join(task.format_demo(pool[i]) for i in rng.choice(len(pool), 4, replace=False))
        + task.format_query(e.input)
        for e in ev
    ]
    model, tok = load_lm("smollm2", dtype="fp32")
    gen = Generator(model, tok, 48, stop=task.stop, engine="lean")
    raw = gen.lean.generate_ids(tok(prompts)["input_ids"])
    preds = [gen._cut(tok.decode(x, skip_special_tokens=True)) for x in raw]
    stopped = [task.stop in tok.decode(x) for x in raw]  # the rest ran out of tokens (degenerate repeats)
    assert sum(stopped) >= 30
    sc = LMScorer(model, tok)
    got, _ = greedy_exact(sc, None, task, prompts, ev, 48)
    gen_ok = [task.is_correct(p, e.output) for p, e in zip(preds, ev)]
    tf_ok = [g["correct"] for g in got]
    assert sum(gen_ok) > 0 and sum(tf_ok) > 0
    assert all(g for t, g in zip(tf_ok, gen_ok) if t)  # a lower bound, example by example
    assert sum(tf_ok) >= sum(gen_ok) - 2
    keep = [i for i, (p, s) in enumerate(zip(preds, stopped)) if p and s]
    as_gold = [Example(ev[i].idx, ev[i].input, preds[i]) for i in keep]
    got2, _ = greedy_exact(sc, None, task, [prompts[i] for i in keep], as_gold, 48)
    assert all(g["correct"] for g in got2)  # each answer the decoder generated and ended, the gold pass finds
    short, _ = greedy_exact(sc, None, task, prompts, ev, 2)  # golds longer than the decoder may generate
    assert not any(g["correct"] for g in short)


def test_the_dense_metric_fills_the_greedy_store_in_its_own_pass(
    tmp_path, tiny_lm_dir, minilm_dir, monkeypatch
):
    """With ``greedy`` the curve's dense metric gives the same log-probs as without (held ones served) and fills the
    greedy-match store on the way, so the row's exact match (``greedy_em``) runs no forward pass; the row holds the
    evaluation examples in order, says its method, and agrees with the scorer's own check."""
    from epr import pipeline
    from epr.config import load_config
    from epr.context import Context
    from epr.stages.dense_metric import DenseMetric
    from tests.conftest import write_tiny_task
    from tests.stages.test_pipeline import ctx_overrides

    (tmp_path / "data").mkdir()
    data = write_tiny_task(tmp_path / "data")
    sets = ctx_overrides(
        tmp_path, data, tiny_lm_dir, f"models.encoder={minilm_dir}", "generate.max_new_tokens=64"
    )
    ctx = Context(load_config([], sets))
    pipeline.run(ctx, until="examples")
    plain = DenseMetric(ctx)(ctx, "bm25")
    dm = DenseMetric(ctx, greedy=True)
    row = dm(ctx, "bm25")
    assert row["per_query_logprob"] == plain["per_query_logprob"]
    texts = dm.prompts(ctx, "bm25")
    pairs = dm.scorer.encode(texts, [ctx.task.format_target(e.output) for e in dm.ev])
    _, want = dm.scorer.score_greedy(pairs)

    def no_pass(*a, **k):
        raise AssertionError("a second forward pass")

    monkeypatch.setattr(dm.scorer, "score_greedy", no_pass)
    monkeypatch.setattr(dm.scorer, "score_ids", no_pass)
    em = dm.greedy_em(ctx, "bm25")
    assert em["method"] == "greedy" and em["idx"] == [e.idx for e in dm.ev]
    assert em["correct"] == [bool(w) for w in want]
