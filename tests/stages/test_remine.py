"""Iterative re-mining (candidates.miner=retriever): round 2 mines with round 1's trained encoder, is fingerprinted by
it, scores only pairs the score cache lacks, and resumes."""

import json

import numpy as np
import pytest

from epr import pipeline
from epr.cache import read_manifest
from epr.config import load_config
from epr.context import Context
from epr.stages import scores as scores_stage
from epr.types import ConfigError, UpstreamError
from tests.conftest import write_tiny_task

from .test_pipeline import ctx_overrides

TRAIN = [
    "train.batch_size=4",
    "train.epochs=1",
    "train.dev_size=2",
    "train.chunk_size=0",
    "train.loss=distill",
]


def make(tmp_path, data_dir, lm_dir, minilm_dir, name, *extra):
    sets = ctx_overrides(tmp_path, data_dir, lm_dir, f"models.encoder={minilm_dir}", *TRAIN, *extra)
    return Context(load_config([], [*sets, f"name={name}"]))


def remine(tmp_path, data, lm, minilm, name, mine_run, *extra):
    """A re-mining run ``name`` whose candidates come from the trained encoder of ``mine_run``."""
    return make(
        tmp_path,
        data,
        lm,
        minilm,
        name,
        "candidates.miner=retriever",
        f"candidates.mine_run={mine_run}",
        *extra,
    )


def rankings(ctx):
    rows = (ctx.stage_dir("candidates") / "candidates.jsonl").read_text().splitlines()
    return [json.loads(r) for r in rows]


def brute_force(run_dir, pool, task, qids, L):
    """Top-L of the trained encoder by plain numpy inner products (no faiss), the query itself excluded."""
    from epr.encoder.data import demo_text
    from epr.encoder.model import DualEncoder

    de = DualEncoder.from_pretrained(str(run_dir / "encoder" / "model"))
    p = de.encode([demo_text(task, e) for e in pool], "prompt")
    q = de.encode([pool[i].input for i in qids], "query")
    sims = q @ p.T
    out = []
    for row, qi in zip(sims, qids):
        row = row.copy()
        row[qi] = -np.inf
        out.append(np.argsort(-row, kind="stable")[:L].tolist())
    return out, sims


@pytest.fixture(scope="module")
def trained_round1(tmp_path_factory, tiny_lm_dir, minilm_dir):
    """Round 1 (BM25 candidates, LM labels, one training epoch), trained once for the module; its score cache is
    kept aside as round 1 left it."""
    import shutil

    tmp = tmp_path_factory.mktemp("round1")
    (tmp / "data").mkdir()
    data = write_tiny_task(tmp / "data")
    ctx = make(tmp, data, tiny_lm_dir, minilm_dir, "r1")
    pipeline.run(ctx, until="encoder")
    shutil.copytree(tmp / "runs" / ".cache", tmp / "cache-after-round1")
    return tmp, data


@pytest.fixture
def round1(trained_round1, tmp_path, tiny_lm_dir, minilm_dir):
    """Round 1 copied under this test's run root, with the score cache it left (tests may retrain it)."""
    import shutil

    src, data = trained_round1
    shutil.copytree(src / "runs" / "r1", tmp_path / "runs" / "r1")
    shutil.copytree(src / "cache-after-round1", tmp_path / "runs" / ".cache")
    return make(tmp_path, data, tiny_lm_dir, minilm_dir, "r1")


@pytest.fixture
def tiny_task_files(trained_round1):  # round 1's data (the same files: the same pool key)
    return trained_round1[1]


def test_round_two_mines_with_round_one_encoder(round1, tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir):
    r2 = remine(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", round1.cfg.run_dir)
    pipeline.run(r2, until="candidates")
    got = rankings(r2)
    pool = r2.examples("pool")
    qids = [r["qid"] for r in got]
    want, sims = brute_force(round1.cfg.run_dir, pool, r2.task, qids, r2.cfg.candidates.L)
    for r, w, q in zip(got, want, qids):
        assert q not in r["ids"]
        # the same top-L as the brute-force inner products (ties aside: compare the similarities in rank order)
        np.testing.assert_allclose(sims[qids.index(q)][r["ids"]], sims[qids.index(q)][w], rtol=0, atol=1e-5)
        np.testing.assert_allclose(r["scores"], sims[qids.index(q)][w], atol=1e-4)
    assert rankings(r2) != rankings(round1)  # not BM25's candidates
    assert read_manifest(r2.stage_dir("candidates"))["round"] == 2
    assert read_manifest(round1.stage_dir("candidates"))["round"] == 1

    # round 3 mines with round 2's encoder: its round is 3
    pipeline.run(r2, until="encoder")
    r3 = remine(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r3", r2.cfg.run_dir)
    pipeline.run(r3, until="candidates")
    assert read_manifest(r3.stage_dir("candidates"))["round"] == 3


def test_mixed_candidates_take_the_first_miners_top_half_then_the_seconds_best_not_among_them():
    """``epr.stages.candidates.mix`` (``candidates.miner=mixed``), on hand-made rankings: ceil(L / 2) from the
    retriever (odd L: 3 of 5), the rest from BM25 in its order, skipping ids already taken, each with its own score;
    a retriever ranking shorter than ceil(L / 2) is filled from BM25."""
    from epr.stages.candidates import mix
    from epr.types import Ranking

    retr = [Ranking(0, [1, 2, 3, 4, 5], [0.9, 0.8, 0.7, 0.6, 0.5]), Ranking(7, [8], [0.9])]
    bm25 = [
        Ranking(0, [3, 9, 1, 10, 11], [30.0, 20.0, 10.0, 5.0, 1.0]),
        Ranking(7, [9, 8, 10, 11, 12], [5.0] * 5),
    ]
    got = mix(retr, bm25, 5)
    assert (got[0].qid, got[0].ids, got[0].scores) == (0, [1, 2, 3, 9, 10], [0.9, 0.8, 0.7, 20.0, 5.0])
    assert (got[1].qid, got[1].ids) == (7, [8, 9, 10, 11, 12])
    assert [r.ids for r in mix(retr[:1], bm25[:1], 4)] == [[1, 2, 3, 9]]  # even L: 2 + 2 (BM25's 3, then 9)


def test_mixed_candidates_are_the_retrievers_top_half_then_bm25s_best(
    round1, tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir
):
    """``candidates.miner=mixed``: per query the round-1 encoder's top ceil(L / 2), then BM25's best not among them
    (round 1's own candidates, in BM25's order), L distinct ids without the query; round 2, keyed apart from a
    retriever-only round 2 of the same encoder."""
    r2 = remine(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", round1.cfg.run_dir)
    mixed = make(
        tmp_path,
        tiny_task_files,
        tiny_lm_dir,
        minilm_dir,
        "r2-mixed",
        "candidates.miner=mixed",
        f"candidates.mine_run={round1.cfg.run_dir}",
    )
    for c in (r2, mixed):
        pipeline.run(c, until="candidates")
    L = mixed.cfg.candidates.L
    h = (L + 1) // 2
    got, retrieved, bm25 = rankings(mixed), rankings(r2), rankings(round1)
    assert [g["qid"] for g in got] == [r["qid"] for r in retrieved] == [b["qid"] for b in bm25]
    changed = 0
    for g, r, b in zip(got, retrieved, bm25):
        assert g["ids"][:h] == r["ids"][:h] and g["scores"][:h] == r["scores"][:h]
        assert g["ids"][h:] == [i for i in b["ids"] if i not in r["ids"][:h]][: L - h]
        assert len(set(g["ids"])) == L and g["qid"] not in g["ids"]
        changed += g["ids"] != r["ids"]
    assert changed > 0  # not the retriever's candidates under another name
    assert read_manifest(mixed.stage_dir("candidates"))["round"] == 2
    assert pipeline.stage_fingerprint(mixed, "candidates") != pipeline.stage_fingerprint(r2, "candidates")


def test_round_two_is_fingerprinted_by_the_round_one_encoder(
    round1, tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir
):
    remine = ("candidates.miner=retriever", "candidates.mine_run=r1")  # a run name under run_root works too
    r2 = make(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", *remine)
    pipeline.run(r2, until="candidates")
    assert pipeline.status(r2)["candidates"] == "fresh"
    # retraining round 1 (another seed) makes round 2's candidates stale
    r1b = make(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r1", "train.seed=7")
    pipeline.run(r1b, until="encoder")
    r2 = make(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", *remine)
    assert pipeline.status(r2)["candidates"] == "stale"
    # BM25 (round 1) candidates keep the keys they had before re-mining existed (values computed with the code
    # before it, commit 0f2c854): existing runs stay fresh
    from epr.cache import fingerprint

    for sets, want in (
        ([], "14a3258ded248efb"),
        (["candidates.L=7", "candidates.num_queries=100"], "19a3ed247de9ce13"),
    ):
        c = Context(load_config(["configs/mtop_curve.yaml"], sets))
        assert fingerprint(pipeline.STAGES["candidates"].keys(c)) == want
    # a re-mining run's DR-BM25 sub-run ranks BM25's candidates by BM25 (round 1), not the encoder's
    sub = r2.sub_run("dr-bm25").cfg
    assert sub.candidates.miner == "bm25" and sub.candidates.mine_run is None and sub.labels.source == "bm25"


def test_round_two_scores_only_pairs_the_cache_lacks_and_resumes(
    round1, tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, monkeypatch
):
    remine = ("candidates.miner=retriever", f"candidates.mine_run={round1.cfg.run_dir}")
    r2 = make(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", *remine)
    pipeline.run(r2, until="candidates")
    old = {(r["qid"], c) for r in rankings(round1) for c in r["ids"]}
    new = [(r["qid"], c) for r in rankings(r2) for c in r["ids"]]
    fresh = sum(p not in old for p in new)
    assert 0 < fresh < len(new)  # some overlap with round 1 (else this test shows nothing)

    from epr.lm.scoring import LMScorer

    scored = {"n": 0, "chunks": 0}
    real_pairs, real_prefixed = LMScorer.score_pairs, LMScorer.score_prefixed

    def count_pairs(self, contexts, *a, **k):
        scored["n"] += len(contexts)
        return real_pairs(self, contexts, *a, **k)

    def count_prefixed(self, demos, contexts, *a, **k):
        scored["n"] += len(contexts)
        return real_prefixed(self, demos, contexts, *a, **k)

    monkeypatch.setattr(LMScorer, "score_pairs", count_pairs)
    monkeypatch.setattr(LMScorer, "score_prefixed", count_prefixed)
    real_chunk = scores_stage.score_chunk

    def killed_after_two(*a, **k):
        if scored["chunks"] == 2:
            raise KeyboardInterrupt("killed")
        scored["chunks"] += 1
        return real_chunk(*a, **k)

    monkeypatch.setattr(scores_stage, "score_chunk", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(r2, until="scores")
    monkeypatch.setattr(scores_stage, "score_chunk", real_chunk)
    pipeline.run(r2, until="scores")
    assert scored["n"] == fresh  # the cache served round 1's pairs; nothing was scored twice across the kill

    # the resumed round-2 scores equal a clean, uninterrupted round 2 scored from scratch (no shared cache)
    clean = make(tmp_path / "clean", tiny_task_files, tiny_lm_dir, minilm_dir, "r2", *remine)
    pipeline.run(clean, until="scores")
    a = [json.loads(x) for x in (r2.stage_dir("scores") / "scores.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (clean.stage_dir("scores") / "scores.jsonl").read_text().splitlines()]
    assert [r["ids"] for r in a] == [r["ids"] for r in b]
    np.testing.assert_allclose(
        [s for r in a for s in r["scores"]], [s for r in b for s in r["scores"]], atol=2e-4
    )


def test_remining_refuses_clearly(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir):
    with pytest.raises(ConfigError, match="mine_run"):
        make(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", "candidates.miner=retriever")
    with pytest.raises(ConfigError, match="mine_run"):
        make(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", f"candidates.mine_run={tmp_path}")
    r2 = remine(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir, "r2", tmp_path / "nowhere")
    with pytest.raises(UpstreamError, match="no trained encoder in .*nowhere"):
        pipeline.run(r2, until="candidates")
    me = make(
        tmp_path,
        tiny_task_files,
        tiny_lm_dir,
        minilm_dir,
        "r2",
        "candidates.miner=retriever",
        "candidates.mine_run=r2",
    )
    with pytest.raises(ConfigError, match="is this run"):
        pipeline.run(me, until="candidates")
