"""The reward model served (issue 74, item 2): a ``+rm`` mode of ``PromptRetriever`` ranks as the pipeline's rerank
stage ranked, round-trips through ``epr export``, selects for the LangChain / dspy adapters, and ``select`` compares
``+rm`` retrievers on the held-out pool slice (the reward model then upstream of it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from epr import pipeline
from epr.api import PromptRetriever
from epr.retrieval.modes import rank
from epr.stages.retrieve import eval_examples

from .test_reward import _ctx

SETS = (
    "reward.epochs=1",
    "reward.top_k=4",
    "retrieve.retrievers=[epr,hybrid,epr+rm,hybrid+rm]",
    "retrieve.eval_limit=4",
    "train.epochs=1",
    "train.batch_size=4",
    "train.chunk_size=0",
    "train.dev_size=2",
    "candidates.num_queries=16",
    "select.size=6",
    "select.alpha=0.5",
    "select.retrievers=[epr,epr+rm]",
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.conftest import write_tiny_task

    return write_tiny_task(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny, tiny_lm_dir, minilm_dir):
    root = tmp_path_factory.mktemp("rm-serving")
    ctx = _ctx(root, tiny, tiny_lm_dir, minilm_dir, f"models.encoder={minilm_dir}", *SETS)
    pipeline.run(ctx, until="select")
    pipeline.run(ctx, until="prompts")
    return ctx


def rows(ctx, name):
    return {
        r["idx"]: r["ids"]
        for r in map(json.loads, (ctx.stage_dir("rerank") / f"{name}.jsonl").read_text().splitlines())
    }


def test_a_served_plus_rm_mode_ranks_as_the_rerank_stage_did(run):
    r = PromptRetriever.from_run(run.cfg.run_dir, mode="epr+rm")
    assert r.reward is not None and r.reward.top_k == 4
    k = run.cfg.retrieve.k
    for mode in ("epr+rm", "hybrid+rm"):
        r.mode = mode
        want = rows(run, mode)
        for ex in eval_examples(run):
            assert [d.idx for d in r.retrieve(ex.input, k=k).demos] == want[ex.idx], (mode, ex.idx)
            assert r.select(ex.input, k=3) == want[ex.idx][:3]  # what LangChain's and dspy's selectors return
    # negative control: the first stage alone orders otherwise (and returns its k, not the reward model's top_k)
    r.mode = "epr"
    plain = {ex.idx: [d.idx for d in r.retrieve(ex.input, k=k).demos] for ex in eval_examples(run)}
    assert plain == rows(run, "epr")
    assert any(plain[i][:4] != ids for i, ids in rows(run, "epr+rm").items())


def test_plus_rm_round_trips_through_export(run, tmp_path):
    r = PromptRetriever.from_run(run.cfg.run_dir, mode="hybrid+rm")
    out = r.save_pretrained(tmp_path / "ship", run=run.cfg.run_dir)
    assert (out / "reward" / "reward_model.json").is_file()
    assert json.loads((out / "retriever.json").read_text())["reward"] == {"top_k": 4}
    back = PromptRetriever.from_pretrained(out)
    assert back.mode == "hybrid+rm"
    for ex in eval_examples(run):
        assert [d.idx for d in back.retrieve(ex.input).demos] == [d.idx for d in r.retrieve(ex.input).demos]
        assert back.retrieve(ex.input).prompt == r.retrieve(ex.input).prompt
    # a plain mode's export carries no reward model, and cannot be switched to +rm (negative control)
    r.mode = "epr"
    plain = PromptRetriever.from_pretrained(r.save_pretrained(tmp_path / "plain"))
    assert not (tmp_path / "plain" / "reward").exists() and plain.reward is None
    with pytest.raises(ValueError, match="has none"):
        plain.mode = "epr+rm"
    with pytest.raises(ValueError, match="has none"):
        PromptRetriever(plain.encoder, plain.pool, plain.task, plain.index, mode="bm25+rm")


def test_select_compares_plus_rm_retrievers_with_the_reward_model_upstream(
    run, tiny, tiny_lm_dir, minilm_dir
):
    from epr.stages.select import read_selection

    assert "reward" in pipeline.STAGES["select"].deps(run)
    rep = read_selection(run.cfg.run_dir)
    assert set(rep["rows"]) == {"bm25", "epr", "epr+rm"} and rep["n"] == 6
    per = [json.loads(x) for x in (run.stage_dir("select") / "per_example.jsonl").read_text().splitlines()]
    assert any(p["epr+rm"] != p["epr"] for p in per)  # re-ranked prompts are other prompts

    def fp(*sets):
        ctx = _ctx(Path("/nonexistent"), tiny, tiny_lm_dir, minilm_dir, f"models.encoder={minilm_dir}", *sets)
        return pipeline.stage_fingerprint(ctx, "select"), pipeline.STAGES["select"].deps(ctx)

    assert fp(*SETS)[0] != fp(*SETS, "reward.top_k=5")[0]  # the re-ranking depth keys select
    # ... only when select compares a +rm retriever (negative control)
    plain = [s for s in SETS if not s.startswith("select.retrievers")]
    assert fp(*plain) == fp(*plain, "reward.top_k=9") and "reward" not in fp(*plain)[1]


def test_a_plus_rm_mode_without_a_reranker_is_refused():
    with pytest.raises(ValueError, match="has none"):
        rank("epr+rm", "q", 3, lambda n: (np.arange(n), np.zeros(n)), lambda: None)
