"""``scoring.int8`` (issue 77): the labels' scorer with SmoothQuant int8 projections scores near the plain one (and
not equal to it: the int8 path runs), is keyed apart from it, leaves the model's decoder alone, and falls back to
the dtype, keyed as the dtype, with a message, where the CPU has no native int8 product."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from epr.config import load_config
from epr.lm import int8_scoring
from epr.lm.factory import build_scorer, label_key, scoring_key
from epr.lm.int8_linear import fused_supported

needs_int8 = pytest.mark.skipif(fused_supported() is not None, reason=f"no int8 here: {fused_supported()}")

CTX = ["turn on the kitchen lights\t[IN:ON [SL:ROOM kitchen ] ]\ndim the porch\t", "who is my manager?\t"] * 3
TGT = ["[IN:DIM [SL:ROOM porch ] ]\n", "(Yield (FindManager (CurrentUser)))\n"] * 3


def _cfg(lm: str, *extra: str):
    return load_config(["configs/mtop.yaml"], [f"models.lm={lm}", "models.dtype=fp32", *extra])


@pytest.fixture(autouse=True)
def _fresh_warnings():
    from epr.lm import factory

    factory._warn_once.cache_clear()


def test_default_keys_do_not_move(tiny_lm_dir):
    """The option off adds nothing (every existing label keeps its key); on, only the labels' LM is re-keyed."""
    plain, on = _cfg(tiny_lm_dir), _cfg(tiny_lm_dir, "scoring.int8=true")
    assert "int8" not in scoring_key(plain)
    assert scoring_key(on, inference=True) == scoring_key(plain, inference=True)
    if fused_supported() is None:
        assert scoring_key(on) == scoring_key(plain) | int8_scoring.key()
        assert label_key(on) != label_key(plain)


def test_key_names_the_calibration(monkeypatch):
    k = int8_scoring.key()
    monkeypatch.setattr(int8_scoring, "CALIBRATION", (*int8_scoring.CALIBRATION, "one more line"))
    assert int8_scoring.key() != k


def test_fallback_keeps_the_dtype_and_its_key_and_says_why(tiny_lm_dir, monkeypatch, caplog):
    plain, on = _cfg(tiny_lm_dir), _cfg(tiny_lm_dir, "scoring.int8=true")
    monkeypatch.setattr(int8_scoring, "unavailable", lambda device, forward: "no VNNI on this test CPU")
    with caplog.at_level(logging.WARNING):
        assert scoring_key(on) == scoring_key(plain)
    assert "scoring.int8: not used (no VNNI on this test CPU); scoring in fp32" in caplog.text
    np.testing.assert_array_equal(build_scorer(on).score(CTX, TGT), build_scorer(plain).score(CTX, TGT))


def test_unavailable_names_the_reason():
    assert "CPU" in int8_scoring.unavailable("cuda:0", "fast")
    assert "lean forward" in int8_scoring.unavailable("cpu", "hf")


@needs_int8
def test_int8_scores_near_the_plain_ones_and_not_equal(tiny_lm_dir):
    plain = build_scorer(_cfg(tiny_lm_dir))
    q = build_scorer(_cfg(tiny_lm_dir, "scoring.int8=true"))
    ref, got = plain.score(CTX, TGT), q.score(CTX, TGT)
    assert not np.array_equal(got, ref)  # negative control: the int8 projections are in the forward
    np.testing.assert_allclose(got, ref, rtol=0, atol=0.05 * np.abs(ref).max())
    # the prefix-shared path (the labels') computes the same int8 function
    np.testing.assert_allclose(q.score_prefixed([c[:10] for c in CTX], CTX, TGT), got, atol=1e-3)


@needs_int8
def test_the_models_own_lean_forward_is_left_alone(tiny_lm):
    from epr.lm.fastlm import fast_backbone

    model, tok = tiny_lm
    shared = fast_backbone(model)
    before = list(shared.layers)
    q = int8_scoring.quantized_backbone(model, tok)
    assert q is not shared and shared.layers == before
    assert (
        type(q.layers[0][1]).__name__ == "FusedInt8Linear"
        and type(q.layers[0][5]).__name__ != "FusedInt8Linear"
    )


@pytest.mark.slow
@needs_int8
def test_smollm2_int8_labels_keep_the_ranking():
    """SmolLM2 (the packaged scoring LM), fp32 against bf16 + int8: the order of 12 candidates after one query is
    kept (Spearman >= 0.9; 0.986 when written) and the mean |difference| is under 3% of the mean score (0.96 nats of
    ~75 for these long targets; benchmarks.int8_labels: 0.81 nats against bf16 on MTOP's pairs)."""
    from scipy.stats import spearmanr

    plain = build_scorer(load_config(["configs/mtop.yaml"], ["models.dtype=fp32"]))
    q = build_scorer(load_config(["configs/mtop.yaml"], ["models.dtype=bf16", "scoring.int8=true"]))
    demos = [
        "set an alarm for 7 am\t[IN:CREATE_ALARM [SL:DATE_TIME for 7 am ] ]\n",
        "what's the weather in rome\t[IN:GET_WEATHER [SL:LOCATION rome ] ]\n",
        "call my sister\t[IN:CREATE_CALL [SL:CONTACT my sister ] ]\n",
        "play the beatles\t[IN:PLAY_MUSIC [SL:MUSIC_ARTIST_NAME the beatles ] ]\n",
        "remind me to buy milk tonight\t[IN:CREATE_REMINDER [SL:TODO buy milk ] [SL:DATE_TIME tonight ] ]\n",
        "how hot is it in cairo today\t[IN:GET_WEATHER [SL:LOCATION cairo ] [SL:DATE_TIME today ] ]\n",
        "delete my 6 am alarm\t[IN:DELETE_ALARM [SL:ALARM_NAME [IN:GET_TIME [SL:DATE_TIME 6 am ] ] ] ]\n",
        "message john that i'm late\t[IN:SEND_MESSAGE [SL:RECIPIENT john ] [SL:CONTENT_EXACT i'm late ] ]\n",
        "turn the volume up\t[IN:INCREASE_VOLUME ]\n",
        "is it going to rain tomorrow\t[IN:GET_WEATHER [SL:WEATHER_ATTRIBUTE rain ] [SL:DATE_TIME tomorrow ] ]\n",
        "what time is it in tokyo\t[IN:GET_TIME [SL:LOCATION tokyo ] ]\n",
        "stop the music\t[IN:STOP_MUSIC ]\n",
    ]
    ctx = [d + "will it snow in oslo this weekend\t" for d in demos]
    tgt = [
        "[IN:GET_WEATHER [SL:WEATHER_ATTRIBUTE snow ] [SL:LOCATION oslo ] [SL:DATE_TIME this weekend ] ]\n"
    ] * 12
    ref, got = plain.score(ctx, tgt), q.score(ctx, tgt)
    print(
        f"int8 vs fp32: Spearman {spearmanr(ref, got).statistic:.3f}, mean |diff| {np.abs(got - ref).mean():.2f}"
    )
    assert not np.array_equal(got, ref)
    assert spearmanr(ref, got).statistic >= 0.9
    assert np.abs(got - ref).mean() < 0.03 * np.abs(ref).mean()
