"""The reward model (issue 74): its listwise loss against an independent reference, re-ranking against a brute-force
re-scoring of the top K, its training stage on tiny data (fingerprint, resume after a kill, a trained model that
fits its labels better than the untrained one: the negative control)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from epr import pipeline
from epr.cache import read_manifest
from epr.config import load_config
from epr.context import Context
from epr.encoder.data import LabelRow
from epr.encoder.losses import distill_loss, group_kl
from epr.reward.model import CrossEncoder, rerank
from epr.types import ConfigError, InputError
from tests.stages.test_pipeline import ctx_overrides


def kl_reference(student, teacher, valid, tau):
    """KL(p_t || p_s) per row over the valid entries, written out in plain Python floats."""
    out = []
    for s, t, v in zip(student, teacher, valid):
        idx = [j for j in range(len(s)) if v[j]]
        zt = sum(math.exp(t[j] / tau) for j in idx)
        zs = sum(math.exp(s[j]) for j in idx)
        out.append(
            sum(math.exp(t[j] / tau) / zt * (t[j] / tau - math.log(zt) - s[j] + math.log(zs)) for j in idx)
        )
    return sum(out) / len(out)


def test_the_listwise_loss_is_the_kl_of_the_reference():
    rng = np.random.default_rng(0)
    s, t = rng.normal(size=(5, 7)), rng.normal(size=(5, 7)) * 3
    v = rng.random((5, 7)) > 0.3
    v[:, 0] = True
    got = float(group_kl(torch.tensor(s), torch.tensor(t), torch.tensor(v), 0.7))
    assert got == pytest.approx(kl_reference(s, t, v, 0.7), rel=1e-5)
    assert float(group_kl(torch.tensor(t / 0.7), torch.tensor(t), torch.tensor(v), 0.7)) == pytest.approx(
        0, abs=1e-6
    )
    # negative control: another temperature, or the padding counted, is another number
    assert got != pytest.approx(kl_reference(s, t, v, 1.0), rel=1e-3)
    assert got != pytest.approx(kl_reference(s, t, np.ones_like(v), 0.7), rel=1e-3)


def test_the_dual_encoders_distillation_keeps_its_value():
    """``distill_loss`` now takes its KL from ``group_kl``: the same number as the formula written out."""
    rng = np.random.default_rng(1)
    sim = torch.tensor(rng.normal(size=(3, 12)), dtype=torch.float32)
    teacher = torch.tensor(rng.normal(size=(3, 4)), dtype=torch.float32)
    valid = torch.ones(3, 4, dtype=torch.bool)
    own = np.stack([sim[i, 4 * i : 4 * i + 4].numpy() for i in range(3)])
    got = float(distill_loss(sim, teacher, valid, 4, teacher_temperature=2.0, weight=0))
    assert got == pytest.approx(kl_reference(own, teacher.numpy(), valid.numpy(), 2.0), rel=1e-5)


@pytest.fixture(scope="module")
def cross(minilm_dir):
    return CrossEncoder.from_pretrained(minilm_dir, max_length=48, seed=3)


def test_a_reranked_list_is_the_brute_force_order_of_the_top_k(cross):
    texts = ["play a song by adele", "set an alarm for 7 am", "what is the weather", "call mom", "play jazz"]
    ids = [40, 11, 7, 23, 5]
    got_ids, got_scores = rerank(cross, "play some music", ids, texts, k=3)
    one_by_one = [float(cross.score(["play some music"], [t])[0]) for t in texts]  # no batching, no padding
    want = sorted(range(5), key=lambda j: (-one_by_one[j], j))[:3]
    assert got_ids == [ids[j] for j in want]
    assert got_scores == pytest.approx([one_by_one[j] for j in want], abs=1e-4)
    # negative control: another head (another seed) scores the same pairs otherwise
    other = CrossEncoder.from_pretrained(cross.encoder.config._name_or_path, max_length=48, seed=4)
    assert not np.allclose(other.score(["play some music"] * 5, texts), one_by_one, atol=1e-4)


def test_a_saved_reward_model_scores_as_it_did(cross, tmp_path):
    cross.save(tmp_path / "m")
    back = CrossEncoder.from_pretrained(str(tmp_path / "m"))
    q, d = ["turn the lights off"] * 2, ["turn off the lights in the kitchen", "what time is it"]
    assert np.allclose(back.score(q, d), cross.score(q, d), atol=1e-6)
    assert back.max_length == 48


def _ctx(tmp_path, tiny, lm, minilm, *extra):
    sets = ctx_overrides(tmp_path, tiny, lm, f"reward.backbone={minilm}", "reward.batch_size=4",
                         "reward.list_size=4", "reward.dev_size=2", "reward.max_length=48", "reward.lr=1e-3",
                         "reward.teacher_temperature=0.05", *extra)  # fmt: skip
    return Context(load_config([], sets))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.conftest import write_tiny_task

    return write_tiny_task(tmp_path_factory.mktemp("data"))


def test_the_reward_stage_trains_resumes_and_beats_its_untrained_self(
    tmp_path, tiny, tiny_lm_dir, minilm_dir, monkeypatch
):
    from epr.reward import train as rtrain

    ctx = _ctx(tmp_path / "a", tiny, tiny_lm_dir, minilm_dir, "reward.epochs=2", "reward.checkpoint_every=1")
    assert "reward" not in pipeline.upstream(ctx, "evaluate")  # asked for, not in the default run
    # a kill after three optimizer steps: the checkpoint of step 2 is what a rerun resumes from
    real, calls = rtrain.group_kl, {"n": 0}

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(rtrain, "group_kl", dies)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(ctx, until="reward")
    monkeypatch.setattr(rtrain, "group_kl", real)
    pipeline.run(ctx, until="reward")
    m = read_manifest(ctx.stage_dir("reward"))
    assert m["resumed_from_step"] > 0 and m["fingerprint"] == pipeline.stage_fingerprint(ctx, "reward")
    # the same training uninterrupted gives the same model
    whole = _ctx(
        tmp_path / "b", tiny, tiny_lm_dir, minilm_dir, "reward.epochs=2", "reward.checkpoint_every=1"
    )
    pipeline.run(whole, until="reward")
    a = CrossEncoder.from_pretrained(str(ctx.stage_dir("reward") / "model"))
    b = CrossEncoder.from_pretrained(str(whole.stage_dir("reward") / "model"))
    q, d = ["a query"] * 3, ["one demo", "another demonstration", "a third"]
    assert np.allclose(a.score(q, d), b.score(q, d), atol=1e-4)
    hist = read_manifest(whole.stage_dir("reward"))["history"]
    assert [h["epoch"] for h in hist] == [0, 1, 2]
    # negative control: the trained model fits the held-out labels better than the untrained one (epoch 0)
    assert hist[-1]["dev_kl"] < hist[0]["dev_kl"]
    # top_k acts when re-ranking, not on the training: no retraining for it
    assert pipeline.stage_fingerprint(whole, "reward") == pipeline.stage_fingerprint(
        _ctx(tmp_path / "b", tiny, tiny_lm_dir, minilm_dir, "reward.epochs=2", "reward.checkpoint_every=1",
             "reward.top_k=5"), "reward")  # fmt: skip
    assert pipeline.stage_fingerprint(whole, "reward") != pipeline.stage_fingerprint(
        _ctx(tmp_path / "b", tiny, tiny_lm_dir, minilm_dir, "reward.epochs=2"), "reward"
    )
    # a held-out share that leaves nothing to train on is named by the reward model's own setting
    big = _ctx(tmp_path / "b", tiny, tiny_lm_dir, minilm_dir, "reward.epochs=2", "reward.dev_size=100000")
    with pytest.raises(
        (InputError, ConfigError), match=r"^reward\.dev_size=100000 (would leave|leaves) no training"
    ):
        pipeline.run(big, until="reward")


def test_old_labels_without_candidate_lists_are_refused(tmp_path, minilm_dir):
    from epr.encoder.train import TrainingData
    from epr.reward.train import train_reward

    cfg = load_config([], [f"reward.backbone={minilm_dir}"])
    rows = [LabelRow(0, (1,), (2,)), LabelRow(1, (0,), (2,))]
    with pytest.raises(ValueError, match="rerun the labels stage"):
        train_reward(cfg.reward, TrainingData([], None, rows, {}), tmp_path, "fp")


def test_a_plus_rm_retriever_is_its_first_stage_reranked_by_the_trained_reward_model(
    tmp_path, tiny, tiny_lm_dir, minilm_dir
):
    """``bm25+rm`` in the rerank stage: BM25's top ``reward.top_k`` ordered by the trained reward model, equal to a
    brute-force re-scoring of each pair one by one; the reward stage runs because a +rm retriever asks for it, and
    the re-ranking depth re-keys the rerank stage without retraining the reward model."""
    from epr.stages.retrieve import eval_examples

    sets = (
        "reward.epochs=1",
        "reward.top_k=4",
        "retrieve.retrievers=[bm25,bm25+rm]",
        "retrieve.eval_limit=3",
    )
    ctx = _ctx(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets)
    assert "reward" in pipeline.upstream(ctx, "rerank")
    pipeline.run(ctx, until="rerank")
    first = [json.loads(x) for x in (ctx.stage_dir("retrieve") / "bm25.jsonl").read_text().splitlines()]
    got = [json.loads(x) for x in (ctx.stage_dir("rerank") / "bm25+rm.jsonl").read_text().splitlines()]
    plain = [json.loads(x) for x in (ctx.stage_dir("rerank") / "bm25.jsonl").read_text().splitlines()]
    assert plain == first  # a plain name passes through
    model = CrossEncoder.from_pretrained(str(ctx.stage_dir("reward") / "model"))
    pool, ev = ctx.examples("pool"), {e.idx: e for e in eval_examples(ctx)}
    for f, g in zip(first, got):
        ids = f["ids"][:4]
        s = [float(model.score([ev[f["idx"]].input], [model.demo(ctx.task, pool[i])])[0]) for i in ids]
        want = [ids[j] for j in sorted(range(len(ids)), key=lambda j: (-s[j], j))]
        assert g["ids"] == want and sorted(g["ids"]) == sorted(ids)
    assert any(g["ids"] != f["ids"][:4] for f, g in zip(first, got))  # negative control: it does re-order
    deeper = _ctx(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets[:-3], "reward.top_k=5", *sets[2:])
    assert pipeline.stage_fingerprint(deeper, "reward") == pipeline.stage_fingerprint(ctx, "reward")
    assert pipeline.stage_fingerprint(deeper, "rerank") != pipeline.stage_fingerprint(ctx, "rerank")


def test_every_rounds_candidates_are_merged_per_example():
    from epr.reward.train import merge_rounds

    r1 = [
        LabelRow(0, (5,), (7,), (5, 6, 7), (-1.0, -2.0, -3.0)),
        LabelRow(1, (2,), (3,), (2, 3), (-0.5, -4.0)),
    ]
    r2 = [
        LabelRow(0, (8,), (6,), (8, 5, 6), (-0.2, -1.0, -2.0)),
        LabelRow(4, (1,), (2,), (1, 2), (-1.0, -1.0)),
    ]
    got = {r.qid: r for r in merge_rounds([r1, r2])}
    assert list(got) == [0, 1, 4]
    assert got[0].cands == (8, 5, 6, 7) and got[0].cand_scores == (-0.2, -1.0, -2.0, -3.0)
    assert (got[0].pos, got[0].neg) == ((8,), (6,))  # the last round's
    assert got[4].cands == (1, 2)  # a tie: lower id first
    assert merge_rounds([r1]) == r1  # one round: its rows as they were (negative control: nothing invented)


def test_the_reward_model_learns_from_every_rounds_labels(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    """Two rounds: the reward stage trains on the union of round 1's (BM25's) and round 2's (re-mined) scored
    candidates of each example, as many pairs as the two label files hold distinct (query, candidate) pairs."""
    from epr.artifacts import read_jsonl

    ctx = _ctx(tmp_path, tiny, tiny_lm_dir, minilm_dir, "reward.epochs=0", "reward.dev_size=0", "candidates.rounds=2",
               f"models.encoder={minilm_dir}", "train.epochs=1", "train.batch_size=4", "train.chunk_size=0",
               "train.dev_size=2")  # fmt: skip
    pipeline.run(ctx, until="reward")
    pairs = set()
    for r in ctx.rounds():
        pairs |= {
            (x["qid"], c) for x in read_jsonl(r.stage_dir("labels") / "labels.jsonl") for c in x["cands"]
        }
    m = read_manifest(ctx.stage_dir("reward"))
    assert m["rounds"] == 2 and m["rows"]["pairs"] == len(pairs)
    last = {(x["qid"], c) for x in read_jsonl(ctx.stage_dir("labels") / "labels.jsonl") for c in x["cands"]}
    assert len(pairs) > len(last)  # negative control: round 2's labels alone are fewer pairs
