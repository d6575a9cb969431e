"""Tiny end-to-end runs: manifests skip and invalidate, a killed scoring run resumes byte-identically."""

import json

import pytest

from epr import pipeline
from epr.config import load_config
from epr.context import Context
from epr.stages import scores as scores_stage
from epr.types import ConfigError
from tests.conftest import torchrun


def ctx_overrides(tmp_path, data_dir, lm_dir, *overrides) -> list[str]:
    return [
        f"run_root={tmp_path / 'runs'}",
        "name=t",
        f"data.data_dir={data_dir}",
        f"models.lm={lm_dir}",
        "models.dtype=fp32",
        "candidates.L=6",
        "labels.k_pos=2",
        "labels.k_neg=2",
        "scoring.chunk_size=4",
        "scoring.batch_tokens=256",
        # one round, no selection (the paper's shape): these tests are about the stages; the default two-round
        # recipe and the select stage have their own (tests/stages/test_rounds.py)
        "candidates.rounds=1",
        "select.size=0",
        *overrides,
    ]


def make_ctx(tmp_path, data_dir, lm_dir, *overrides):
    return Context(load_config([], ctx_overrides(tmp_path, data_dir, lm_dir, *overrides)))


def test_end_to_end_then_skip_then_invalidate(tmp_path, tiny_task_files, tiny_lm_dir):
    ctx = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir)
    assert set(pipeline.status(ctx).values()) == {"missing"}
    assert pipeline.run(ctx) == ["examples", "candidates", "scores", "labels"]
    st = pipeline.status(ctx)
    assert [st[s] for s in ("examples", "candidates", "scores", "labels")] == ["fresh"] * 4
    assert st["encoder"] == st["evaluate"] == "missing"
    labels = (ctx.stage_dir("labels") / "labels.jsonl").read_text().splitlines()
    assert len(labels) == 24
    man = json.loads((ctx.stage_dir("scores") / "manifest.json").read_text())
    speed = man["scoring_speed"]  # what the LM scored in this process (the cache was empty: every sequence)
    assert speed["scored_here"] == man["rows"]["sequences"] > 0 and speed["sequences_per_s"] > 0
    parts = speed["seconds_by_part"]  # where the time went: the LM, and the rest (on a GPU the rest can lead)
    assert set(parts) == {"prepare", "lm", "store", "load"} and parts["lm"] > 0
    # the model's loading is its own part, outside the scoring time (each part rounded to 0.1 s)
    assert parts["prepare"] + parts["lm"] + parts["store"] <= speed["scoring_seconds"] + 0.2
    # a CPU run has no allocator to report (tests/test_cuda.py: a GPU run does)
    assert "gpu_memory" not in speed
    assert pipeline.run(ctx) == []  # everything fresh: nothing reruns

    ctx2 = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "labels.k_pos=1")
    assert pipeline.status(ctx2)["labels"] == "stale" and pipeline.status(ctx2)["scores"] == "fresh"
    assert pipeline.run(ctx2) == ["labels"]

    ctx3 = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "candidates.L=5")
    assert pipeline.run(ctx3) == ["candidates", "scores", "labels"]


def test_killed_scoring_resumes_identically(tmp_path, tiny_task_files, tiny_lm_dir, monkeypatch):
    clean = make_ctx(tmp_path / "a", tiny_task_files, tiny_lm_dir)
    pipeline.run(clean, until="scores")
    expected = (clean.stage_dir("scores") / "scores.jsonl").read_bytes()

    ctx = make_ctx(tmp_path / "b", tiny_task_files, tiny_lm_dir)
    pipeline.run(ctx, until="candidates")
    real = scores_stage.score_chunk
    calls = {"n": 0}

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(scores_stage, "score_chunk", dying)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_stage(ctx, "scores")
    assert pipeline.status(ctx)["scores"] == "missing"  # no manifest: not mistaken for finished
    assert len(list((ctx.stage_dir("scores") / "parts").glob("chunk-*.json"))) == 2
    kept = {r[0]: r[3] for r in pipeline.status_rows(ctx, "scores")}  # what `epr status` says of it
    assert kept == {
        "examples": "",
        "candidates": "",
        "scores": "2 chunks kept, served again under the same settings and inputs",
    }

    calls["n"] = -100  # the resumed run must only score the 4 missing chunks
    monkeypatch.setattr(
        scores_stage,
        "score_chunk",
        lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1],
    )
    pipeline.run_stage(ctx, "scores")
    assert calls["n"] == -100 + 4
    assert (ctx.stage_dir("scores") / "scores.jsonl").read_bytes() == expected
    assert [r[3] for r in pipeline.status_rows(ctx, "scores")] == [
        "",
        "",
        "",
    ]  # fresh: nothing said of its parts


def test_bm25_label_source_needs_no_lm(tmp_path, tiny_task_files):
    ctx = make_ctx(tmp_path, tiny_task_files, "/nonexistent/lm", "labels.source=bm25")
    assert pipeline.run(ctx) == ["examples", "candidates", "labels"]


@pytest.mark.slow
def test_two_process_scoring_merges_to_single_process_bytes(tmp_path, tiny_task_files, tiny_lm_dir):

    import yaml

    one = make_ctx(tmp_path / "one", tiny_task_files, tiny_lm_dir)
    pipeline.run(one, until="scores")
    two = make_ctx(tmp_path / "two", tiny_task_files, tiny_lm_dir)
    pipeline.run(two, until="candidates")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(__import__("json").loads(__import__("json").dumps(two.cfg.to_dict()))))
    r = torchrun(["-m", "epr.cli", "scores", "-c", str(cfg)], port=29534)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (two.stage_dir("scores") / "scores.jsonl").read_bytes() == (
        one.stage_dir("scores") / "scores.jsonl"
    ).read_bytes()
    assert pipeline.status(two)["scores"] == "fresh"


def test_prefix_shared_scoring_stage_equals_plain(tmp_path, tiny_task_files, tiny_lm_dir):
    """Prefix sharing reorders the chunks (queries grouped by output) and scores through shared prefixes; the
    merged scores are those of the plain stage (separate run roots: no shared score cache)."""
    import json

    import numpy as np

    got = {}
    for share in ("true", "false"):
        ctx = make_ctx(tmp_path / share, tiny_task_files, tiny_lm_dir, f"scoring.prefix_share={share}")
        pipeline.run(ctx, until="scores")
        rows = [json.loads(x) for x in (ctx.stage_dir("scores") / "scores.jsonl").read_text().splitlines()]
        got[share] = rows
        stamp = json.loads((ctx.stage_dir("scores") / "parts" / "KEY.json").read_text())
        assert stamp["key"]["order"] == ("by-output-in-nested-blocks-250" if share == "true" else "qid")
    assert [(r["qid"], r["ids"]) for r in got["true"]] == [(r["qid"], r["ids"]) for r in got["false"]]
    a = np.array([s for r in got["true"] for s in r["scores"]])
    b = np.array([s for r in got["false"] for s in r["scores"]])
    np.testing.assert_allclose(a, b, atol=2e-4)


def test_scores_fingerprint_records_the_resolved_dtype(tmp_path, tiny_task_files, tiny_lm_dir, monkeypatch):
    """``auto`` is recorded as what it resolves to on this machine: a run resumed on hardware where ``auto`` means
    bf16 does not reuse fp32 chunks. In bf16 the batch layout changes scores, so it is part of the key; in fp32 not.
    One road: the model is loaded from the same spec the key is built from."""
    import torch

    from epr.lm import identity as factory
    from epr.lm.factory import lm_spec, load, scoring_key

    ctx = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "models.dtype=auto")
    monkeypatch.setattr(factory, "_cpu_has_bf16", lambda: False)
    k32 = scoring_key(ctx.cfg)
    fp32 = pipeline.stage_fingerprint(ctx, "scores")
    assert k32["dtype"] == "fp32" and "batch_tokens" not in k32
    assert (
        pipeline.stage_fingerprint(
            make_ctx(
                tmp_path, tiny_task_files, tiny_lm_dir, "models.dtype=auto", "scoring.batch_tokens=4096"
            ),
            "scores",
        )
        == fp32
    )  # fp32 scores do not depend on the batch layout (test_scoring: batch composition)
    m, _ = load(lm_spec(ctx.cfg))
    assert next(m.parameters()).dtype == torch.float32
    monkeypatch.setattr(factory, "_cpu_has_bf16", lambda: True)
    kbf = scoring_key(ctx.cfg)
    assert kbf["dtype"] == "bf16" and kbf["batch_tokens"] == 256
    assert pipeline.stage_fingerprint(ctx, "scores") != fp32
    # the key names the model that is loaded: a bf16 key loads a bf16 model
    m, _ = load(lm_spec(ctx.cfg))
    assert next(m.parameters()).dtype == torch.bfloat16
    assert (
        scoring_key(make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "scoring.batch_tokens=4096").cfg) != kbf
    )


def test_a_model_loaded_in_another_dtype_than_its_key_is_refused(
    tmp_path, tiny_task_files, tiny_lm_dir, monkeypatch
):
    """Negative control of the check above: if loading ever ignored the spec's dtype (here: a loader that always
    gives fp32), ``load`` refuses instead of computing under the bf16 key."""
    from epr.lm import factory, models
    from epr.lm.factory import lm_spec, load

    ctx = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "models.dtype=bf16")
    real = models.load_lm
    monkeypatch.setattr(models, "load_lm", lambda name, cache, dtype, *a: real(name, cache, "fp32", *a))
    with pytest.raises(RuntimeError, match="its key says bf16"):
        load(lm_spec(ctx.cfg))
    assert factory.lm_key(ctx.cfg)["dtype"] == "bf16"


def test_status_does_not_import_torch(tmp_path, tiny_task_files, tiny_lm_dir):
    """``epr status`` reads fingerprints (LM keys included) without importing torch, on a CPU machine."""
    import subprocess
    import sys

    sets = [
        x
        for o in ctx_overrides(tmp_path, tiny_task_files, tiny_lm_dir, "models.dtype=auto")
        for x in ("--set", o)
    ]
    code = (
        "import sys\n"
        "from epr.cli import main\n"
        f"main(['status', *{sets!r}])\n"
        "assert 'torch' not in sys.modules, 'epr status imported torch'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "examples" in r.stdout, r.stdout + r.stderr[-2000:]
    assert r.returncode == 0, r.stderr[-2000:]


def test_status_shows_this_configs_stages(tmp_path, tiny_task_files, tiny_lm_dir):
    """``epr status`` lists the stages this config's run goes through, in run order, not the whole registry
    (no TruthfulQA stages for a semantic-parsing run, DR-BM25 only where a retriever uses it)."""
    plain = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "retrieve.retrievers=[bm25,epr]")
    run_order = "examples candidates scores labels encoder retrieve rerank prompts predict evaluate".split()
    assert list(pipeline.status(plain, pipeline.final_stage(plain))) == run_order
    assert set(pipeline.status(plain)) == set(pipeline.STAGES)  # the whole registry when asked for no stage
    dr = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "retrieve.retrievers=[bm25,dr-bm25]")
    dr_names = pipeline.status(dr, pipeline.final_stage(dr))
    assert "dr-bm25" in dr_names and "encoder" not in dr_names
    tqa = Context(load_config(["configs/truthfulqa_epr.yaml"], [f"run_root={tmp_path}"]))
    assert list(pipeline.status(tqa, pipeline.final_stage(tqa))) == [
        n for n in pipeline.STAGES if n.startswith("tqa_")
    ]


def test_killed_predict_resumes_with_the_same_predictions(
    tmp_path, tiny_task_files, tiny_lm_dir, monkeypatch
):
    """Generation (the lean decoder) in chunks: a kill mid-stage keeps the finished chunks; the rerun generates only
    the missing ones and writes the same predictions as an uninterrupted run."""
    from epr.lm.generate import Generator

    sets = ("retrieve.retrievers=random,bm25", "generate.chunk_size=2", "generate.max_new_tokens=5")
    clean = make_ctx(tmp_path / "a", tiny_task_files, tiny_lm_dir, *sets)
    pipeline.run(clean, until="predict")
    expected = {n: (clean.stage_dir("predict") / f"{n}.jsonl").read_bytes() for n in ("random", "bm25")}

    ctx = make_ctx(tmp_path / "b", tiny_task_files, tiny_lm_dir, *sets)
    pipeline.run(ctx, until="prompts")
    real = Generator.generate_with_gold  # the lean decoder: predictions and gold log-probs in one pass
    calls = {"n": 0, "engines": set()}

    def dying(self, prompts, golds):
        calls["n"] += 1
        calls["engines"].add(self.engine)
        if calls["n"] == 4:
            raise KeyboardInterrupt("killed")
        return real(self, prompts, golds)

    monkeypatch.setattr(Generator, "generate_with_gold", dying)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_stage(ctx, "predict")
    assert calls["engines"] == {"lean"}  # the Llama test model takes the lean decoder
    assert pipeline.status(ctx)["predict"] == "missing"
    calls["n"] = -100
    monkeypatch.setattr(
        Generator,
        "generate_with_gold",
        lambda self, p, g: (calls.__setitem__("n", calls["n"] + 1), real(self, p, g))[1],
    )
    pipeline.run_stage(ctx, "predict")
    assert calls["n"] == -100 + 3  # 6 eval rows in chunks of 2 per retriever: 3 of the 6 chunks were done
    for n, b in expected.items():
        assert (ctx.stage_dir("predict") / f"{n}.jsonl").read_bytes() == b


def test_locked_part_is_the_rest_of_the_eval_split_and_training_is_shared(
    tmp_path, tiny_task_files, tiny_lm_dir
):
    from epr.stages.retrieve import eval_examples

    dev = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "data.eval_limit=4")
    locked = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "data.eval_limit=4", "data.eval_part=locked")
    pipeline.run(dev, until="labels")
    a, b = [e.idx for e in eval_examples(dev)], [e.idx for e in eval_examples(locked)]
    assert (
        len(a) == 4 and len(b) == 2 and sorted(a + b) == list(range(6))
    )  # disjoint, together the whole split
    # what trains the retriever does not depend on the compared part; what compares does
    for stage in ("examples", "candidates", "scores", "labels", "encoder"):
        assert pipeline.stage_fingerprint(dev, stage) == pipeline.stage_fingerprint(locked, stage)
    assert pipeline.stage_fingerprint(dev, "retrieve") != pipeline.stage_fingerprint(locked, "retrieve")
    assert pipeline.status(locked)["labels"] == "fresh"
    grouped = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "data.eval_limit=4", "data.eval_cut=groups")
    assert pipeline.stage_fingerprint(grouped, "labels") == pipeline.stage_fingerprint(dev, "labels")
    assert pipeline.stage_fingerprint(grouped, "retrieve") != pipeline.stage_fingerprint(dev, "retrieve")
    whole = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir, "data.eval_part=locked")
    with pytest.raises(Exception, match="eval_limit below"):
        eval_examples(whole)
    assert locked.stage_dir("labels") == dev.stage_dir("labels")
    assert locked.stage_dir("retrieve") != dev.stage_dir("retrieve")
    assert locked.stage_dir("retrieve").parent.name == "locked"


def test_forcing_a_stage_the_run_does_not_reach_is_an_error(tmp_path, tiny_task_files, tiny_lm_dir):
    ctx = make_ctx(tmp_path, tiny_task_files, tiny_lm_dir)
    with pytest.raises(ConfigError, match="--force encoder: not a stage of this run") as e:
        pipeline.run(ctx, until="candidates", force=("encoder",))
    assert "examples, candidates" in str(e.value)  # names what the run would do
    assert set(pipeline.status(ctx).values()) == {"missing"}  # refused before anything ran


def test_examples_key_covers_every_file_read(tmp_path):
    """A task that reads its own files (demo, from data.data_dir) with data.path also set: the files the task reads
    are in the key, so editing one makes the examples stale (data.path alone once stood in for them)."""
    import shutil

    from epr.tasks.semparse import DEMO_DIR

    d = tmp_path / "demo"
    shutil.copytree(DEMO_DIR, d, ignore=lambda *_: ["LICENSE"])
    (tmp_path / "x.jsonl").write_text('{"input": "a", "output": "b"}\n')
    ctx = Context(
        load_config(
            [],
            [
                f"run_root={tmp_path}",
                "data.task=demo",
                f"data.data_dir={d}",
                f"data.path={tmp_path / 'x.jsonl'}",
            ],
        )
    )
    before = pipeline.stage_fingerprint(ctx, "examples")
    with open(d / "demo.pool.jsonl", "a") as f:
        f.write('{"input": "turn on the fan", "output": "ON(fan)"}\n')
    assert pipeline.stage_fingerprint(Context(ctx.cfg), "examples") != before


def test_prefix_shared_chunks_keep_the_nested_label_sets_in_front():
    """Chunks grouped by output (prefix sharing) stay inside nested query-order blocks (250, 500, 1,000, ...): the
    first chunks of a 2,000-label run are exactly the 500-label set's queries, so a smaller curve point's pairs are
    scored (and cached) first. Negative control: grouping over the whole run would scatter them."""
    from types import SimpleNamespace

    import numpy as np

    from epr.stages.candidates import query_ids
    from epr.stages.scores import chunk_rankings, nested_blocks
    from epr.types import Example, Ranking

    assert nested_blocks(2000) == [(0, 250), (250, 500), (500, 1000), (1000, 2000)]
    assert nested_blocks(600) == [(0, 250), (250, 500), (500, 600)]
    assert nested_blocks(0) == [] and nested_blocks(100) == [(0, 100)]
    rng = np.random.default_rng(0)
    pool = [Example(i, f"x{i}", f"out {rng.integers(40)}", {}) for i in range(3000)]
    qids = query_ids(len(pool), 2000, 7)
    rankings = [Ranking(int(q), [0, 1], [0.0, 0.0]) for q in qids]
    ctx = SimpleNamespace(
        cfg=SimpleNamespace(scoring=SimpleNamespace(prefix_share=True)), examples=lambda _: pool
    )
    chunks = chunk_rankings(ctx, rankings, 50)
    assert sorted(r.qid for c in chunks for r in c) == sorted(int(q) for q in qids)  # every query, once
    first = {r.qid for c in chunks[:10] for r in c}
    assert first == {int(q) for q in query_ids(len(pool), 500, 7)}
    outs = [pool[r.qid].output for r in chunks[0]]
    assert outs == sorted(outs)  # grouped by output within a block
    scattered = sorted(rankings, key=lambda r: (pool[r.qid].output, r.qid))[:500]
    assert {r.qid for r in scattered} != first  # the old whole-run grouping
    plain = chunk_rankings(
        SimpleNamespace(cfg=SimpleNamespace(scoring=SimpleNamespace(prefix_share=False))), rankings, 50
    )
    assert [r.qid for c in plain for r in c] == [int(q) for q in qids]


def test_logs_name_an_earlier_rounds_stages_with_their_round(tmp_path):
    """A first two-round run runs ``examples`` twice (round 1's and its own): the log says which, as status does."""
    from epr.config import load_config
    from epr.context import Context
    from epr.pipeline import stage_label

    ctx = Context(load_config([], [f"run_root={tmp_path}", "candidates.rounds=2"]))
    assert stage_label(ctx.prev_round(), "examples") == "round-1/examples"
    assert stage_label(ctx, "examples") == "examples"
