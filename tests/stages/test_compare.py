"""The back half of the pipeline (retrieve -> rerank -> prompts -> predict -> evaluate) on own data with a tiny LM:
what each setting reruns, and that no cache serves a result computed under another setting."""

import json
import shutil

import numpy as np
import pytest

from epr import pipeline
from epr.context import Context
from epr.lm.generate import Generator
from tests.test_own_data import own_config

NAMES = "bm25,sbert,sbert+div+bias"
BACK = ["retrieve", "rerank", "prompts", "predict", "evaluate"]


@pytest.fixture
def counted(monkeypatch):
    """Counts the prompts the inference LM generates for and the quality-bias demonstrations it scores."""
    import epr.retrieval.ragsys

    calls = {"generate": 0, "quality": 0}
    real_gen, real_q = Generator.generate, epr.retrieval.ragsys.mean_logprob
    real_both = Generator.generate_with_gold

    def gen(self, prompts):
        calls["generate"] += len(prompts)
        return real_gen(self, prompts)

    def both(self, prompts, golds):  # the lean decoder's path: generation and gold log-prob in one pass
        calls["generate"] += len(prompts)
        return real_both(self, prompts, golds)

    def q(scorer, contexts, targets):
        calls["quality"] += len(contexts)
        return real_q(scorer, contexts, targets)

    monkeypatch.setattr(Generator, "generate", gen)
    monkeypatch.setattr(Generator, "generate_with_gold", both)
    monkeypatch.setattr(epr.retrieval.ragsys, "mean_logprob", q)
    return calls


def ctx_for(tmp_path, minilm_dir, lm_dir, *extra):
    return Context(
        own_config(
            tmp_path,
            minilm_dir,
            f"models.lm={lm_dir}",
            "models.dtype=fp32",
            "generate.max_new_tokens=4",
            "generate.chunk_size=2",
            "retrieve.k=8",
            "retrieve.max_demos=3",
            f"retrieve.retrievers={NAMES}",
            *extra,
        )
    )


def predictions(ctx, name="bm25"):
    return [r["prediction"] for r in map(json.loads, (ctx.stage_dir("predict") / f"{name}.jsonl").open())]


def distinct_prompts(ctx) -> int:
    """The (prompt, example) pairs of every retriever's prompts: what the LM generates for, each once (two modes
    that build the same prompt for an example share its generation)."""
    return len(
        {
            (p["text"], p["idx"])
            for n in NAMES.split(",")
            for p in map(json.loads, (ctx.stage_dir("prompts") / f"{n}.jsonl").open())
        }
    )


def gold_logprobs(ctx, name="bm25") -> np.ndarray:
    rows = map(json.loads, (ctx.stage_dir("predict") / f"{name}.jsonl").open())
    return np.array([r["gold_logprob"] for r in rows], dtype=float)


def test_back_half_stages_and_what_each_setting_reruns(tmp_path, minilm_dir, tiny_lm_dir, counted):
    ctx = ctx_for(tmp_path, minilm_dir, tiny_lm_dir)
    ran = pipeline.run(ctx, until="compare")
    assert ran == ["examples", "retrieve", "rerank", "prompts", "predict", "evaluate"]
    n_eval = 4
    assert 2 * n_eval < counted["generate"] == distinct_prompts(ctx) <= 3 * n_eval
    assert counted["quality"] == 20 - n_eval
    res = json.loads((ctx.stage_dir("evaluate") / "results.json").read_text())
    assert list(res) == NAMES.split(",")
    for name in NAMES.split(","):  # rankings carry ids and the retriever's scores, best first
        for row in map(json.loads, (ctx.stage_dir("retrieve") / f"{name.split('+')[0]}.jsonl").open()):
            assert len(row["ids"]) == len(row["scores"]) == 8 and row["scores"] == sorted(row["scores"])[::-1]
    for name in NAMES.split(","):  # prompt rows keep the scores of the demonstrations they hold
        ranked = {r["idx"]: r for r in map(json.loads, (ctx.stage_dir("rerank") / f"{name}.jsonl").open())}
        for p in map(json.loads, (ctx.stage_dir("prompts") / f"{name}.jsonl").open()):
            want = dict(zip(ranked[p["idx"]]["ids"], ranked[p["idx"]]["scores"]))
            assert p["demo_ids"] and p["demo_scores"] == [want[i] for i in p["demo_ids"]], name
    html = (ctx.stage_dir("evaluate") / "report.html").read_text()
    assert "<table>" in html and "<td>sbert+div+bias</td>" in html and "data:image/png;base64" in html
    assert pipeline.run(ctx, until="compare") == []
    orig = predictions(ctx)

    # generation settings: only predict (and evaluate) rerun, and every prompt is generated again
    ctx2 = ctx_for(tmp_path, minilm_dir, tiny_lm_dir, "generate.max_new_tokens=2")
    counted["generate"] = 0
    assert pipeline.run(ctx2, until="compare") == ["predict", "evaluate"]
    assert counted["generate"] == distinct_prompts(ctx2)
    assert all(len(p.split()) <= 2 for p in predictions(ctx2))

    # back to the first setting: the predictions are the first run's, served from the run root's generation store
    # (keyed by the settings: the other setting's entries sit in a store of their own), nothing generated again
    ctx3 = ctx_for(tmp_path, minilm_dir, tiny_lm_dir)
    counted["generate"] = 0
    assert pipeline.run(ctx3, until="compare") == ["predict", "evaluate"]
    assert counted["generate"] == 0 and predictions(ctx3) == orig
    man = json.loads((ctx3.stage_dir("predict") / "manifest.json").read_text())
    assert man["generations"] | {"store": 0} == {
        "store": 0,
        "held_before": distinct_prompts(ctx3),
        "generated": 0,
    }

    # RAGSys's lambda_d: re-ranking reruns and its rows follow the setting (a hard-coded value would not change
    # them); the first-stage rows stay
    def reranked(c):
        return {
            n: (c.stage_dir("rerank") / f"{n}.jsonl").read_text()
            for n in NAMES.split(",")
            if (c.stage_dir("rerank") / f"{n}.jsonl").exists()
        }

    before = reranked(ctx)
    ctx_d = ctx_for(tmp_path, minilm_dir, tiny_lm_dir, "ragsys.lambda_d=0.1")
    assert pipeline.run(ctx_d, until="rerank") == ["rerank"]
    after = reranked(ctx_d)
    assert set(before) == set(after) and any("+div" in n for n in after)
    for n in after:
        assert (after[n] != before[n]) == ("+div" in n), n


def test_generations_carried_to_another_machine_are_served_value_for_value(
    tmp_path, minilm_dir, tiny_lm_dir, counted, capsys
):
    """`epr cache export` on one run root, `epr cache import` on another: the predict stage there generates
    nothing and writes the same rows, byte for byte; another generation setting (the negative control) generates
    every prompt again."""
    from pathlib import Path

    from epr.cli.cache import unread_stores
    from epr.lm.factory import scoring_key
    from epr.lm.score_cache import export_scores, import_scores
    from epr.stages.predict import generation_key

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    a = ctx_for(tmp_path / "a", minilm_dir, tiny_lm_dir)
    pipeline.run(a, until="predict")
    f = tmp_path / "carry.json.gz"
    export_scores(Path(a.cfg.run_root) / ".cache" / "scores", f)  # what `epr cache export` writes
    b = ctx_for(tmp_path / "b", minilm_dir, tiny_lm_dir)
    root = Path(b.cfg.run_root) / ".cache" / "scores"
    got = import_scores(root, f)
    assert len(got) >= 2 and all(c["added"] > 0 for c in got.values())  # scores and generations
    mine = [
        scoring_key(b.cfg),
        scoring_key(b.cfg, inference=True),
        generation_key(b.cfg, b.prompt(True).stop),
    ]
    assert unread_stores(root, list(got), mine) == []  # every imported store is one this config reads
    counted["generate"] = 0
    pipeline.run(b, until="predict")
    assert counted["generate"] == 0
    for name in [*NAMES.split(","), "empty"]:
        assert (b.stage_dir("predict") / f"{name}.jsonl").read_bytes() == (
            a.stage_dir("predict") / f"{name}.jsonl"
        ).read_bytes()
    c = ctx_for(tmp_path / "b", minilm_dir, tiny_lm_dir, "generate.max_new_tokens=3")
    pipeline.run(c, until="predict")
    assert counted["generate"] == distinct_prompts(c)
    other = [d.name for d in root.iterdir() if (d / "KEY.json").exists() and d.name not in got]
    assert (
        len(other) == 1 and len(unread_stores(root, other, mine)) == 1
    )  # b's config does not read c's store


def test_another_inference_lm_with_the_same_tokenizer_is_not_served_old_predictions(
    tmp_path, minilm_dir, tiny_lm_dir, counted
):
    import torch
    from transformers import AutoModelForCausalLM

    other = tmp_path / "other_lm"
    shutil.copytree(tiny_lm_dir, other)
    m = AutoModelForCausalLM.from_pretrained(other)
    torch.manual_seed(1)
    for p in m.parameters():
        p.data.normal_(0, 0.5)
    m.save_pretrained(other)

    ctx = ctx_for(tmp_path, minilm_dir, tiny_lm_dir)
    pipeline.run(ctx, until="compare")
    first, q_first, lp1 = predictions(ctx), counted["quality"], gold_logprobs(ctx)
    ctx2 = ctx_for(tmp_path, minilm_dir, tiny_lm_dir, f"models.inference_lm={other}")
    counted["generate"] = counted["quality"] = 0
    ran = pipeline.run(ctx2, until="compare")
    assert ran == [
        "rerank",
        "prompts",
        "predict",
        "evaluate",
    ]  # the quality bias and the tokenizer are the LM's
    assert counted["generate"] == distinct_prompts(ctx2) and counted["quality"] == q_first
    assert predictions(ctx2) != first
    # the gold log-probs are the other LM's too, not the first LM's served from a cache
    from epr.lm.models import load_lm
    from epr.lm.scoring import reference_score
    from epr.stages.retrieve import eval_examples

    lp2 = gold_logprobs(ctx2)  # (the same run folder: ctx's files now hold ctx2's outputs)
    assert np.isfinite(lp2).all() and not np.allclose(lp1, lp2, atol=0.5)
    m2, tok2 = load_lm(str(other), dtype=ctx2.cfg.models.dtype)
    p = json.loads((ctx2.stage_dir("prompts") / "bm25.jsonl").open().readline())
    ex = {e.idx: e for e in eval_examples(ctx2)}[p["idx"]]
    ref = reference_score(m2, tok2, p["text"], ctx2.task.format_target(ex.output))
    assert lp2[0] == pytest.approx(ref, rel=0.02) and abs(lp1[0] - ref) > 10 * abs(lp2[0] - ref)


def test_the_resolved_dtype_is_part_of_the_prediction_key(tmp_path, minilm_dir, tiny_lm_dir):
    a = ctx_for(tmp_path, minilm_dir, tiny_lm_dir)
    b = ctx_for(tmp_path, minilm_dir, tiny_lm_dir, "models.dtype=bf16")
    assert pipeline.stage_fingerprint(a, "retrieve") == pipeline.stage_fingerprint(b, "retrieve")
    assert pipeline.stage_fingerprint(a, "predict") != pipeline.stage_fingerprint(b, "predict")
    assert pipeline.stage_fingerprint(a, "rerank") != pipeline.stage_fingerprint(b, "rerank")  # +bias


def test_changed_pool_recomputes_the_quality_bias(tmp_path, minilm_dir, tiny_lm_dir, counted):
    ctx = ctx_for(tmp_path, minilm_dir, tiny_lm_dir)
    pipeline.run(ctx, until="rerank")
    q = np.load(ctx.stage_dir("rerank") / "quality_bias.npy")
    counted["quality"] = 0
    ctx2 = ctx_for(tmp_path, minilm_dir, tiny_lm_dir, "data.pool_limit=15")  # one demonstration fewer
    assert pipeline.run(ctx2, until="rerank") == ["examples", "retrieve", "rerank"]
    q2 = np.load(ctx2.stage_dir("rerank") / "quality_bias.npy")
    assert len(q2) == len(q) - 1 and counted["quality"] > 0


def test_inspect_shows_what_each_retriever_picks_and_the_prompt(tmp_path, minilm_dir, tiny_lm_dir):
    import io

    from epr.cli.inspect import inspect_query

    ctx = ctx_for(tmp_path, minilm_dir, tiny_lm_dir, "retrieve.retrievers=random,bm25,sbert,sbert+div+bias")
    pipeline.run(ctx, until="examples")
    buf = io.StringIO()
    shown = inspect_query(ctx, "how do I reset my email", k=3, out=buf)
    assert list(shown) == ["random", "bm25", "sbert", "sbert+div+bias"]
    assert all(len(v) == 3 for v in shown.values())
    assert (
        "reset my email" in buf.getvalue().split("## bm25")[1].split("##")[0]
    )  # BM25's best shares the words
    assert buf.getvalue().count("prompt:") == 4 and "quality (mean log p(output | input))" in buf.getvalue()
    assert inspect_query(ctx, "how do I reset my email", k=3, out=io.StringIO())["random"] == shown["random"]
