"""The learned retriever on TruthfulQA (epr.truthfulqa.learned): candidates, labels, folds, contexts, resume."""

import json
from pathlib import Path

import numpy as np
import pytest

from epr.artifacts import read_jsonl
from epr.truthfulqa import learned
from epr.truthfulqa.sets import build_sets
from tests.truthfulqa.conftest import _real_row, tqa_ctx

LEARNED_SETS = (
    "truthfulqa.variants=[fix, rel, rel+div, epr, epr+div]",
    "truthfulqa.label_candidates=4",
    "truthfulqa.folds=2",
    "labels.k_pos=1",
    "labels.k_neg=1",
    "train.loss=distill",
    "train.similarity=cosine",
    "train.list_size=4",
    "train.batch_size=2",
    "train.chunk_size=0",
    "train.dev_size=0",
    "train.epochs=1",
    "train.lr=1e-3",  # one step that moves the towers: the two folds' encoders differ measurably
)


def test_candidates_are_the_top_inner_products_without_the_own_question():
    rng = np.random.default_rng(0)
    q, icl = rng.normal(size=(5, 8)), rng.normal(size=(20, 8))
    icl_q = np.repeat(np.arange(5), 4)
    got = learned.candidate_ids(q, icl, icl_q, [0, 3, 4], 6)
    for qi, cs in zip([0, 3, 4], got):
        s = icl @ q[qi]
        s[icl_q == qi] = -np.inf
        assert cs == np.argsort(-s, kind="stable")[:6].tolist()
        assert all(icl_q[j] != qi for j in cs)
    # ties broken by the lower index; L larger than what is left: every other pair
    tied = learned.candidate_ids(np.ones((2, 2)), np.ones((6, 2)), np.array([0, 0, 1, 1, 1, 1]), [0], 10)
    assert tied == [[2, 3, 4, 5]]


def test_label_targets_and_gain():
    row = {"question": "q?", "correct_answers": ["a", "b", "a"], "incorrect_answers": ["x", "b", "y"]}
    targets, n = learned.label_targets(row)
    assert targets == [" a", " b", " x", " y"] and n == 2  # deduplicated, "b" counts as correct
    assert learned.gain([-1.0, -3.0, -5.0, -9.0], 2) == pytest.approx(-2.0 - -7.0)
    with pytest.raises(ValueError, match="correct and incorrect"):
        learned.label_targets({"question": "q?", "correct_answers": ["a"], "incorrect_answers": ["a"]})


def test_folds_partition_the_questions_evenly_and_by_seed():
    qs = list(range(3, 20))
    f = learned.assign_folds(qs, 5, seed=0)
    assert sorted(f) == qs and set(f.values()) == set(range(5))
    sizes = np.bincount(list(f.values()))
    assert sizes.max() - sizes.min() <= 1
    assert f == learned.assign_folds(qs, 5, seed=0) and f != learned.assign_folds(qs, 5, seed=1)
    with pytest.raises(ValueError, match="folds"):
        learned.assign_folds([1, 2], 3, seed=0)


def test_training_pool_indexes_pairs_then_questions():
    data = build_sets([_real_row(i, "2021-10") for i in range(3)])
    pool = learned.training_pool(data)
    n = len(data.icl)
    assert [p.idx for p in pool] == list(range(n + 3))
    assert (pool[0].input, pool[0].output) == (data.icl[0][1], data.icl[0][2])
    assert pool[n + 2].input == data.rows[2]["question"]
    assert learned.DemoFormat.format_demo(pool[0]) == f"Q: {data.icl[0][1]}\nA: {data.icl[0][2]}\n\n"


def _rows(ctx, stage, name):
    return list(read_jsonl(ctx.stage_dir(stage) / name))


def test_learned_variants_end_to_end(tmp_path, tqa_data, tiny_lm_dir, tqa_stages, calls, monkeypatch):
    """Labels are the LM's gains recomputed from scratch; fold f never trains on its own questions; the epr sets are
    rel / rel+div on the fold's towers; a killed label stage resumes to the same labels; a new fold count retrains
    without rescoring."""
    import epr.encoder.train as train_mod
    from epr.encoder.model import DualEncoder
    from epr.lm.factory import build_scorer
    from epr.truthfulqa.sets import demo_text, query_text, select_context

    pipeline = tqa_stages
    trained = []
    real_train = train_mod.train

    kill_fold = {"name": None}

    def spy(cfg, data, out, fp, **kw):
        if out.name == kill_fold["name"]:
            kill_fold["name"] = None
            raise KeyboardInterrupt("killed while training " + out.name)
        res = real_train(cfg, data, out, fp, **kw)
        trained.append((out.name, [lab.qid for lab in data.labels]))
        return res

    monkeypatch.setattr(train_mod, "train", spy)
    monkeypatch.setattr(learned, "LABEL_CHUNK", 5)

    # killed in the middle of the label scores: the finished chunks are kept
    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, *LEARNED_SETS)
    calls["fail_at"] = 8
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(ctx, until="tqa_report")
    calls["fail_at"] = None
    before = len(calls["take"]()["prompts"])
    assert before == 7
    # then killed while training fold 1: the finished fold 0 is not trained again
    kill_fold["name"] = "fold-1"
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(ctx, until="tqa_report")
    label_prompts = [p for p in calls["take"]()["prompts"] if p.count("Q: ") == 2]
    assert len(label_prompts) == 16 - 5  # 4 questions x L = 4; the first chunk of 5 came from the cache
    assert [name for name, _ in trained] == ["fold-0"]
    ran = pipeline.run(ctx, until="tqa_report")
    assert ran == ["tqa_encoders", "tqa_contexts", "tqa_score", "tqa_report"]
    assert [name for name, _ in trained] == ["fold-0", "fold-1"]
    assert not list(ctx.stage_dir("tqa_encoders").glob("fold-*/done.json"))  # a forced rerun retrains all

    rows = [json.loads(line) for line in (tqa_data / "truthfulqa" / "truthfulqa.2021-10.jsonl").open()]
    data = build_sets([{**r, "question": r["question"].strip()} for r in rows])
    labels = _rows(ctx, "tqa_labels", "labels.jsonl")
    assert [r["qi"] for r in labels] == [0, 1, 2, 3]
    scorer = build_scorer(ctx.cfg)
    n_icl = len(data.icl)
    for r in labels:
        qi = r["qi"]
        assert r["qid"] == n_icl + qi and len(r["cands"]) == 4
        assert all(data.icl[j][0] != qi for j in r["cands"])  # leave-one-out
        targets, n_ok = learned.label_targets(data.rows[qi])
        for j, s in zip(r["cands"], r["cand_scores"]):
            prompt = demo_text(data.icl[j][1], data.icl[j][2]) + query_text(data.rows[qi]["question"])
            lp = scorer.score_after(prompt, targets).tolist()
            assert s == pytest.approx(learned.gain(lp, n_ok), abs=1e-4)
        assert r["pos"] == r["cands"][:1] and r["neg"] == r["cands"][-1:]

    # fold f's retriever never learns from fold f's questions
    folds = {
        int(q): f for q, f in json.loads((ctx.stage_dir("tqa_encoders") / "folds.json").read_text()).items()
    }
    assert sorted(folds) == [0, 1, 2, 3] and sorted(folds.values()) == [0, 0, 1, 1]
    assert [name for name, _ in trained] == ["fold-0", "fold-1"]
    for name, qids in trained:
        f = int(name.split("-")[1])
        assert qids and all(folds[q - n_icl] != f for q in qids)

    # each question is embedded by its own fold's towers (the folds' encoders differ)
    got_folds, q_learned, icl_learned = learned.fold_embeddings(ctx, data, [0, 1, 2, 3])
    assert got_folds == folds
    models = [
        DualEncoder.from_pretrained(str(ctx.stage_dir("tqa_encoders") / f"fold-{f}" / "model"))
        for f in (0, 1)
    ]
    demos = [demo_text(q, a).strip() for _, q, a in data.icl]
    assert not np.allclose(models[0].encode(demos, "prompt"), models[1].encode(demos, "prompt"), atol=1e-4)
    for f in (0, 1):
        np.testing.assert_allclose(icl_learned[f], models[f].encode(demos, "prompt"), atol=1e-6)
    for qi in range(4):
        own = [m.encode([data.rows[qi]["question"]], "query")[0] for m in models]
        np.testing.assert_allclose(q_learned[qi], own[folds[qi]], atol=1e-6)
        assert not np.allclose(q_learned[qi], own[1 - folds[qi]], atol=1e-4)

    # the epr sets: rel / rel+div with the fold's query and prompt towers
    meta = json.loads((ctx.stage_dir("tqa_contexts") / "contexts.json").read_text())
    sets = {s["name"]: s for s in meta["sets"]}
    icl_q = np.array([q for q, _, _ in data.icl])
    k, ld, lb = ctx.cfg.ragsys.k, ctx.cfg.ragsys.lambda_d, ctx.cfg.ragsys.lambda_b
    for qi, got, got_div in zip(meta["subset"], sets["epr"]["demos"], sets["epr+div"]["demos"]):
        m = models[folds[qi]]
        q = m.encode([data.rows[qi]["question"]], "query")[0]
        emb = m.encode(demos, "prompt")
        zero = np.zeros(len(demos), dtype=np.float32)
        assert got == select_context("rel", qi, q, emb, icl_q, zero, k, ld, lb)
        assert got_div == select_context("rel+div", qi, q, emb, icl_q, zero, k, ld, lb)
        assert all(icl_q[j] != qi for j in got)
    assert sets["epr+div"]["lambda_d"] == ld and sets["epr"]["lambda_d"] == 1.0

    res = json.loads((ctx.stage_dir("tqa_report") / "results.json").read_text())
    assert list(res["variants"]) == ["fix", "rel", "rel+div", "epr", "epr+div"]
    assert {("epr", "rel"), ("epr+div", "rel")} <= {(p["a"], p["b"]) for p in res["paired"]}
    assert {(f["a"], f["b"]) for f in res["findings"]} >= {("epr", "rel"), ("epr+div", "rel+div")}
    assert pipeline.run(ctx, until="tqa_report") == []

    # three folds: the encoders retrain, the labels and every label log-prob are reused
    trained.clear()
    ctx3 = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, *LEARNED_SETS, "truthfulqa.folds=3")
    ran = pipeline.run(ctx3, until="tqa_contexts")
    assert ran == ["tqa_encoders", "tqa_contexts"] and len(trained) == 3
    assert not [p for p in calls["take"]()["prompts"] if p.count("Q: ") == 2]


def test_without_learned_variants_the_graph_is_unchanged(tmp_path, tqa_data, tiny_lm_dir):
    from epr import pipeline

    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir)
    assert pipeline.STAGES["tqa_contexts"].deps(ctx) == ()
    assert pipeline.upstream(ctx, "tqa_report") == ["tqa_contexts", "tqa_score", "tqa_report"]
    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, *LEARNED_SETS)
    assert pipeline.upstream(ctx, "tqa_report")[:3] == ["tqa_labels", "tqa_encoders", "tqa_contexts"]


def test_config_rejects_bad_learned_settings(tmp_path, tqa_data, tiny_lm_dir):
    from epr.config import ConfigError

    with pytest.raises(ConfigError, match="folds"):
        tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, "truthfulqa.folds=1")
    with pytest.raises(ConfigError, match="label_candidates"):
        tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, "truthfulqa.label_candidates=1")
    with pytest.raises(ConfigError, match="variants"):
        tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, "truthfulqa.variants=[rel, epr+bias]")


def test_plans_that_would_fail_after_the_labels_are_named_first(tmp_path, tqa_data, tiny_lm_dir):
    from epr.types import InputError

    ok = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, *LEARNED_SETS)
    learned.check_plan(ok.cfg, 4)
    for extra, n, match in (
        (["truthfulqa.label_candidates=2", "labels.k_pos=2"], 4, "no hard negative"),
        (["truthfulqa.folds=3"], 2, "only 2 questions"),
        (["train.dev_size=1"], 4, "cannot hold out"),  # folds of 2: each trains on 2 labels, batch 2
    ):
        with pytest.raises(InputError, match=match):
            learned.check_plan(tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, *LEARNED_SETS, *extra).cfg, n)


@pytest.mark.skipif(
    not Path("../shared/data/truthfulqa/truthfulqa.2021-10.jsonl").is_file(), reason="the shared data"
)
def test_runs_without_learned_variants_keep_their_fingerprints():
    """The six-variant runs behind results/truthfulqa keep the keys they had before the learned variants (values
    computed with the code before them, commit 0844363): no committed run turns stale."""
    from epr import pipeline
    from epr.config import load_config
    from epr.context import Context

    ctx = Context(load_config(["configs/truthfulqa.yaml"], ["truthfulqa.limit=50"]))
    got = {s: pipeline.stage_fingerprint(ctx, s) for s in ("tqa_contexts", "tqa_score", "tqa_report")}
    assert got == {
        "tqa_contexts": "dda6c27c0426f5cf",
        "tqa_score": "25285f3bde67ba38",
        "tqa_report": "add89ef302a6774d",
    }
