"""Re-mining rounds inside one run (``candidates.rounds``): round r + 1's candidates are mined by round r's encoder
in ``<run>/rounds/round-r/``, fingerprinted by it, resumable on their own; and the ``select`` stage, which picks the
served retriever on a held-out slice of the pool and never reads the evaluation examples."""

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from epr import pipeline
from epr.cache import read_manifest
from epr.config import load_config
from epr.context import Context
from epr.stages import scores as scores_stage
from epr.stages.candidates import held_out_ids, labelled_ids
from epr.stages.select import BASELINE, choose, read_selection
from tests.conftest import SHARED_DATA, write_tiny_task

from .test_pipeline import ctx_overrides

# the default two rounds (ctx_overrides pins one for the stage tests) and a short training
TRAIN = [
    "train.batch_size=4",
    "train.epochs=1",
    "train.dev_size=2",
    "train.chunk_size=0",
    "candidates.rounds=2",
]


def make(root, data, lm, minilm, *extra, name="t"):
    sets = ctx_overrides(root, data, lm, f"models.encoder={minilm}", *TRAIN, *extra)
    return Context(load_config([], [*sets, f"name={name}"]))


def digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> sha256), the score cache and logs aside."""
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file() and "manifest.json" != f.name
    }


def rankings(ctx):
    return [
        json.loads(r) for r in (ctx.stage_dir("candidates") / "candidates.jsonl").read_text().splitlines()
    ]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return write_tiny_task(d)


def test_rounds_layout_and_fingerprints(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    ctx = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "candidates.rounds=3", "select.size=0")
    r1, r2, r3 = ctx.rounds()
    assert r3 is ctx and (r1.round, r2.round) == (1, 2)
    assert r1.cfg.run_dir == ctx.cfg.run_dir / "rounds" / "round-1"
    assert r2.cfg.run_dir == ctx.cfg.run_dir / "rounds" / "round-2"
    assert r2.prev_round().cfg.run_dir == r1.cfg.run_dir  # not nested under round-2
    # each round is mined by the round before's encoder (computed: known before anything trains)
    key3 = pipeline.STAGES["candidates"].keys(ctx)["mined_by"]
    key2 = pipeline.STAGES["candidates"].keys(r2)["mined_by"]
    assert key3 == {"encoder": pipeline.stage_fingerprint(r2, "encoder"), "round": 3}
    assert key2 == {"encoder": pipeline.stage_fingerprint(r1, "encoder"), "round": 2}
    assert "mined_by" not in pipeline.STAGES["candidates"].keys(r1)
    # round 1 of a rounds run is the one-round run: same candidates fingerprint (no orphaned round-1 runs)
    one = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "candidates.rounds=1", "select.size=0")
    assert pipeline.stage_fingerprint(r1, "encoder") == pipeline.stage_fingerprint(one, "encoder")


def _fp(tmp_path, tiny, lm, minilm, *extra):
    ctx = make(tmp_path, tiny, lm, minilm, "candidates.rounds=3", "candidates.num_queries=12", *extra)
    return {r.round: pipeline.stage_fingerprint(r, "candidates") for r in ctx.rounds()}


def test_a_rounds_candidates_follow_the_labels_of_the_round_before(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    base = _fp(tmp_path, tiny, tiny_lm_dir, minilm_dir)
    # round 1's labels change (k_neg): round 1's candidates do not (labels come after), every later round's do
    other_labels = _fp(tmp_path, tiny, tiny_lm_dir, minilm_dir, "labels.k_neg=1")
    assert other_labels[1] == base[1] and other_labels[2] != base[2] and other_labels[3] != base[3]
    # the training seed: an encoder changes, so do the rounds it mines
    other_seed = _fp(tmp_path, tiny, tiny_lm_dir, minilm_dir, "train.seed=7")
    assert other_seed[1] == base[1] and other_seed[2] != base[2] and other_seed[3] != base[3]
    # negative controls: settings no round's candidates depend on
    for unrelated in (
        "generate.max_new_tokens=12",
        "select.size=5",
        "retrieve.max_demos=3",
        "select.alpha=0.1",
    ):
        assert _fp(tmp_path, tiny, tiny_lm_dir, minilm_dir, unrelated) == base, unrelated


def test_a_kill_in_round_two_never_touches_round_one(tmp_path, tiny, tiny_lm_dir, minilm_dir, monkeypatch):
    ctx = make(tmp_path / "a", tiny, tiny_lm_dir, minilm_dir, "select.size=0")
    assert ctx.round == 2 == load_config([], []).candidates.rounds  # the default
    pipeline.run(ctx, until="rounds")
    r1 = ctx.prev_round()
    before = digests(r1.cfg.run_dir)
    mtimes = {f: f.stat().st_mtime_ns for f in r1.cfg.run_dir.rglob("*") if f.is_file()}
    assert {n: s for n, s in pipeline.status(r1, "encoder").items()} == dict.fromkeys(
        ("examples", "candidates", "scores", "labels", "encoder"), "fresh"
    )

    calls = {"n": 0}
    real_chunk = scores_stage.score_chunk

    def killed(*a, **k):
        if calls["n"] == 1:
            raise KeyboardInterrupt("killed in round 2")
        calls["n"] += 1
        return real_chunk(*a, **k)

    monkeypatch.setattr(scores_stage, "score_chunk", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(ctx, until="encoder")
    monkeypatch.setattr(scores_stage, "score_chunk", real_chunk)
    ran = pipeline.run(ctx, until="encoder")
    assert ran == ["scores", "labels", "encoder"]  # round 1 (and round 2's candidates) were fresh
    assert digests(r1.cfg.run_dir) == before
    assert {f: f.stat().st_mtime_ns for f in r1.cfg.run_dir.rglob("*") if f.is_file()} == mtimes
    # the resumed round 2 equals an uninterrupted two-round run from scratch, in another run root
    clean = make(tmp_path / "b", tiny, tiny_lm_dir, minilm_dir, "select.size=0")
    pipeline.run(clean, until="encoder")
    for stage, f in (("candidates", "candidates.jsonl"), ("labels", "labels.jsonl")):
        assert (ctx.stage_dir(stage) / f).read_bytes() == (clean.stage_dir(stage) / f).read_bytes(), stage
    a = [json.loads(x) for x in (ctx.stage_dir("scores") / "scores.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (clean.stage_dir("scores") / "scores.jsonl").read_text().splitlines()]
    np.testing.assert_allclose(
        [s for r in a for s in r["scores"]], [s for r in b for s in r["scores"]], atol=2e-4
    )
    # round 2 mined with round 1's encoder and scored only the pairs round 1 had not
    man = read_manifest(clean.stage_dir("candidates"))
    assert man["round"] == 2
    old = {(r["qid"], c) for r in rankings(clean.prev_round()) for c in r["ids"]}
    new = [(r["qid"], c) for r in rankings(clean) for c in r["ids"]]
    assert 0 < sum(p not in old for p in new) < len(new)
    sc = read_manifest(clean.stage_dir("scores"))["scoring_speed"]
    assert sc["scored_here"] == sum(p not in old for p in new)  # the cache served the rest
    # epr status lists each round's stages
    labels = [row[0] for row in pipeline.status_rows(clean, "encoder")]
    assert labels[:5] == [f"round-1/{s}" for s in ("examples", "candidates", "scores", "labels", "encoder")]
    assert "round-2/encoder" in labels


def test_held_out_slice_is_never_labelled():
    cfg = load_config(["configs/mtop.yaml"], [])
    n = 15667
    held, lab = held_out_ids(cfg, n), labelled_ids(cfg, n)
    assert len(held) == cfg.select.size and len(lab) == cfg.candidates.num_queries
    assert not set(held.tolist()) & set(lab.tolist())
    # every example labelled (num_queries null): a fifth at most is held out, the rest labelled
    cfg = load_config(["configs/mtop.yaml"], ["candidates.num_queries=null", "select.size=100000"])
    held, lab = held_out_ids(cfg, 100), labelled_ids(cfg, 100)
    assert len(held) == 20 and len(lab) == 80 and not set(held.tolist()) & set(lab.tolist())
    cfg = load_config(["configs/mtop.yaml"], ["candidates.num_queries=null", "select.size=0"])
    assert len(held_out_ids(cfg, 100)) == 0 and len(labelled_ids(cfg, 100)) == 100


def test_choose_serves_bm25_when_no_learned_retriever_beats_it():
    rng = np.random.default_rng(0)
    bm25 = rng.normal(-10, 2, 200)
    worse = bm25 - np.abs(rng.normal(0.5, 0.5, 200))
    noise = bm25 + rng.normal(0, 0.01, 200)
    rep = choose({"bm25": bm25, "epr": worse, "hybrid": noise}, ["epr", "hybrid"], 0.05)
    assert rep["selected"] == BASELINE
    assert "no learned retriever beat BM25" in rep["reason"] and "serving BM25" in rep["reason"]
    better = bm25 + np.abs(rng.normal(1.0, 0.5, 200))
    best = bm25 + np.abs(rng.normal(2.0, 0.5, 200))
    rep = choose({"bm25": bm25, "epr": better, "hybrid": best}, ["epr", "hybrid"], 0.05)
    assert rep["selected"] == "hybrid" and rep["rows"]["hybrid"]["gain"] > rep["rows"]["epr"]["gain"] > 0
    assert rep["rows"]["hybrid"]["gain_ci"][0] > 0 and rep["rows"]["hybrid"]["p_ttest"] < 0.05
    # a gain that is not significant is not served
    tiny_gain = bm25 + rng.normal(0.01, 1.0, 200)
    assert choose({"bm25": bm25, "epr": tiny_gain}, ["epr"], 1e-6)["selected"] == BASELINE


def test_select_reads_no_evaluation_example(tmp_path, tiny, tiny_lm_dir, minilm_dir, monkeypatch):
    ctx = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "candidates.rounds=1", "select.size=4")
    pipeline.run(ctx, until="select")
    rep = read_selection(ctx.cfg.run_dir)
    assert rep["n"] == 4 and rep["selected"] in ("bm25", "epr", "hybrid")
    per = [json.loads(x) for x in (ctx.stage_dir("select") / "per_example.jsonl").read_text().splitlines()]
    lp = {n: np.array([np.nan if r[n] is None else r[n] for r in per]) for n in ("bm25", "epr", "hybrid")}
    assert choose(lp, ["epr", "hybrid"], ctx.cfg.select.alpha) == {
        k: rep[k] for k in rep if k not in ("n", "backend")
    }
    assert not {r["idx"] for r in per} & set(labelled_ids(ctx.cfg, 24).tolist())
    want = (ctx.stage_dir("select") / "report.json").read_bytes()
    # poison the evaluation split's outputs; reading the eval split at all is an error
    ev = ctx.stage_dir("examples") / "eval.jsonl"
    rows = [json.loads(x) for x in ev.read_text().splitlines()]
    ev.write_text("".join(json.dumps({**r, "output": "POISON"}) + "\n" for r in rows))
    real = Context.examples

    def no_eval(self, split):
        assert split != "eval", "select read the evaluation split"
        return real(self, split)

    monkeypatch.setattr(Context, "examples", no_eval)
    pipeline.run_stage(ctx, "select", force=True)
    assert (ctx.stage_dir("select") / "report.json").read_bytes() == want


def _committed_fp(folder: str, row: str) -> str:
    root = Path(__file__).resolve().parents[2]
    return json.loads((root / "results" / folder / "rows" / row).read_text())["key"]["fp"]


@pytest.mark.skipif(not SHARED_DATA.exists(), reason="../shared/data not present")
def test_paper_config_and_round_one_reproduce_the_committed_fingerprints(monkeypatch):
    """Rounds and selection orphan no committed run: configs/paper.yaml (one round, the paper's loss) gives the
    committed round-1 labels' fingerprint, and round 1 of the default two-round MTOP run (fp32 labels) is the
    committed round-1 encoder (results/mtop-curve-round1/, -locked/), so its round 2 re-mines exactly what the
    chained runs mined."""
    import torch

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the configs' data_dir (../shared/data) is relative to the repository root
    # the committed runs were made on CPUs: on a GPU machine too, the keys are the CPU's (device and its sizes)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    paper = Context(load_config(["configs/mtop_curve.yaml", "configs/paper.yaml"], ["train.seed=42"]))
    assert paper.round == 1 and paper.cfg.train.loss == "epr" and paper.cfg.select.size == 0
    assert pipeline.stage_fingerprint(paper, "labels") == _committed_fp("mtop-curve-round1", "bm25.json")
    assert "rounds" not in pipeline.upstream(paper, "evaluate") and "select" not in pipeline.upstream(
        paper, "evaluate"
    )
    # (fp32 training in one padded batch a step, as those runs were made: the default trains in bf16 where the CPU
    # has it, in length-sorted sub-batches)
    # (and 2,000 labels, a CPU's count: a GPU's is 8,000)
    old = [
        "models.dtype=fp32",
        "train.mixed_precision=no",
        "train.length_buckets=1",
        "candidates.num_queries=2000",
    ]
    default = Context(load_config(["configs/mtop.yaml"], old))
    assert (
        default.round == 2
        and default.cfg.train.loss == "distill"
        and default.cfg.train.similarity == "cosine"
    )
    want = _committed_fp("mtop-curve-round1", "epr@2000-distill.json")
    assert want == _committed_fp("mtop-curve-locked", "epr@2000-distill.json")
    assert pipeline.stage_fingerprint(default.prev_round(), "encoder") == want
    assert {"rounds", "select"} <= set(pipeline.upstream(default, "evaluate"))


def test_the_encoder_choice_is_in_every_key_that_depends_on_it(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    """Issue 48: a paper-sized encoder (all-mpnet-base-v2) beside MiniLM must never be served a MiniLM run's
    encoder, re-mined candidates, selection or rows; what the encoder does not touch (round 1's candidates, scores
    and labels: BM25 and the LM) stays shared, so the labels are not scored twice."""
    sets = ("candidates.rounds=3", "candidates.num_queries=12", "select.size=5")
    a = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets)
    b = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets, "models.encoder=all-mpnet-base-v2")
    ra, rb = a.rounds(), b.rounds()
    for stage in ("candidates", "scores", "labels"):  # round 1: BM25 and the scoring LM only
        assert pipeline.stage_fingerprint(ra[0], stage) == pipeline.stage_fingerprint(rb[0], stage), stage
    for x, y in zip(ra, rb):  # every round's encoder
        assert pipeline.stage_fingerprint(x, "encoder") != pipeline.stage_fingerprint(y, "encoder")
    for x, y in zip(ra[1:], rb[1:]):  # rounds 2 and 3 are mined by a different encoder
        assert pipeline.stage_fingerprint(x, "candidates") != pipeline.stage_fingerprint(y, "candidates")
    for stage in ("select", "retrieve", "evaluate"):  # what serves and compares the trained encoder
        assert pipeline.stage_fingerprint(a, stage) != pipeline.stage_fingerprint(b, stage), stage


def _encoder_fps(ctx) -> list[str]:
    return [pipeline.stage_fingerprint(r, "encoder") for r in ctx.rounds()]


def test_training_precision_keys_as_it_runs(tmp_path, tiny, tiny_lm_dir, minilm_dir, monkeypatch):
    """Issue 49: ``train.mixed_precision: auto`` keys as what it runs on the machine: the fp32 keys (every encoder
    trained before the option) where the CPU has no bf16 instructions, explicit bf16's where it has."""
    from epr.lm import identity

    fps = {
        mp: _encoder_fps(make(tmp_path, tiny, tiny_lm_dir, minilm_dir, f"train.mixed_precision={mp}"))
        for mp in ("no", "bf16")
    }
    assert all(a != b for a, b in zip(fps["no"], fps["bf16"]))
    for has_bf16, want in ((False, "no"), (True, "bf16")):
        monkeypatch.setattr(identity, "_cpu_has_bf16", lambda v=has_bf16: v)
        auto = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "train.mixed_precision=auto")
        assert _encoder_fps(auto) == fps[want], has_bf16


def test_a_warm_start_keys_only_the_rounds_it_starts(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    """``train.init: previous`` (and ``warm_epochs``) change round 2's and 3's encoders, never round 1's, which
    has no earlier encoder to start from; ``warm_epochs`` is nothing without the warm start (negative control)."""
    sets = ("candidates.rounds=3", "candidates.num_queries=12")
    base = _encoder_fps(make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets, "train.init=base"))
    warm = _encoder_fps(
        make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets, "train.init=previous", "train.warm_epochs=null")
    )
    short = _encoder_fps(
        make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets, "train.init=previous", "train.warm_epochs=3")
    )
    assert warm[0] == base[0] == short[0]
    assert len({base[1], warm[1], short[1]}) == 3 and len({base[2], warm[2], short[2]}) == 3
    assert (
        _encoder_fps(
            make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets, "train.init=base", "train.warm_epochs=3")
        )
        == base
    )
    # the default is the warm start, one epoch (results/mtop-cheaper-training)
    assert _encoder_fps(make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets)) == _encoder_fps(
        make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets, "train.init=previous", "train.warm_epochs=1")
    )
    # issue 48's third round: a change to round 2's encoder alone (round 1 and round 2's labels as they were) re-mines
    # round 3, and only round 3
    cands = _fp(tmp_path, tiny, tiny_lm_dir, minilm_dir, "train.init=base")
    warm_cands = _fp(tmp_path, tiny, tiny_lm_dir, minilm_dir, "train.init=previous")
    assert (warm_cands[1], warm_cands[2]) == (cands[1], cands[2]) and warm_cands[3] != cands[3]


def test_a_warm_started_round_trains_from_the_round_before(
    tmp_path, tiny, tiny_lm_dir, minilm_dir, monkeypatch
):
    """Value for value: round 2 (warm) starts from exactly round 1's trained weights, round 1 from the base MiniLM;
    the warm round runs ``warm_epochs`` epochs."""
    import torch

    from epr.encoder import train as train_mod
    from epr.encoder.model import DualEncoder

    started: list[tuple[str, dict]] = []
    real = DualEncoder.from_pretrained

    def spy(name, *a, **k):
        m = real(name, *a, **k)
        started.append((str(name), {n: t.clone() for n, t in m.state_dict().items()}))
        return m

    class Spied:  # what the training (only) loads: mining loads round 1's encoder too
        from_pretrained = staticmethod(spy)

    monkeypatch.setattr(train_mod, "DualEncoder", Spied)
    warm = make(
        tmp_path,
        tiny,
        tiny_lm_dir,
        minilm_dir,
        "select.size=0",
        "train.best_by=last",
        "train.init=previous",
        "train.warm_epochs=2",
    )
    pipeline.run(warm, until="encoder")
    r1_dir = warm.prev_round().stage_dir("encoder") / "model"
    assert [n for n, _ in started] == [minilm_dir, str(r1_dir)]
    r1 = real(str(r1_dir)).state_dict()
    base = real(minilm_dir).state_dict()
    assert all(torch.equal(started[1][1][n], r1[n]) for n in r1)  # round 2 began at round 1's weights
    assert not all(torch.equal(started[1][1][n], base[n]) for n in base)  # which training had moved
    man = read_manifest(warm.stage_dir("encoder"))
    assert man["warm_start"] == str(r1_dir)
    assert [h["epoch"] for h in man["history"]] == [0, 1, 2]  # warm_epochs, not train.epochs (1)
    assert [h["epoch"] for h in read_manifest(warm.prev_round().stage_dir("encoder"))["history"]] == [0, 1]


def _all_fps(ctx) -> dict[str, str]:
    """Every stage fingerprint of a run: its rounds' stages as ``round-r/<stage>``, then its own."""
    out = {}
    for r in ctx.rounds()[:-1]:
        out |= {f"round-{r.round}/{n}": pipeline.stage_fingerprint(r, n) for n in pipeline.ROUND_STAGES}
    return out | {n: pipeline.stage_fingerprint(ctx, n) for n in RUN_STAGES}


# the stages of the last round and after it, each keyed by the rounds before it
RUN_STAGES = (
    "candidates",
    "scores",
    "labels",
    "encoder",
    "retrieve",
    "prompts",
    "predict",
    "select",
    "evaluate",
)


def test_round_three_follows_round_twos_labels(tmp_path, tiny, tiny_lm_dir, minilm_dir, monkeypatch):
    """Issue 48's third round: round 3 is mined by round 2's encoder, trained on round 2's labels, so a change to
    round 2's labels alone (nothing else: the labels stage keys of round 2 only) re-mines round 3, and leaves
    rounds 1 and 2's candidates and scores as they were."""
    sets = ("candidates.rounds=3", "candidates.num_queries=12")
    ctx = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets)
    base = _all_fps(ctx)
    labels = pipeline.STAGES["labels"]
    keys = labels.keys
    monkeypatch.setitem(
        pipeline.STAGES,
        "labels",
        dataclasses.replace(labels, keys=lambda c: {**keys(c), "x": 1} if c.round == 2 else keys(c)),
    )
    changed = {
        k for k, v in _all_fps(make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets)).items() if base[k] != v
    }
    assert changed == {"round-2/labels", "round-2/encoder", *RUN_STAGES}


def test_evaluate_reports_the_labels_cost_and_the_gap_captured(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    """Issue 48's cost beside gain, in every `epr run`: the LM-scored sequences of both rounds' labels (counted
    from the scores files: round 2's new ones are those round 1 did not score) and, with BM25 and LM-Oracle run,
    each other row's share of the gap, recomputed here from the per-example rows."""
    from epr.reports.stats import gap_fraction_ci

    ctx = make(
        tmp_path, tiny, tiny_lm_dir, minilm_dir, "select.size=0", "retrieve.retrievers=[bm25,epr,lm-oracle]"
    )
    pipeline.run(ctx, until="evaluate")
    man = json.loads((ctx.stage_dir("evaluate") / "manifest.json").read_text())
    cost = man["label_cost"]
    pairs = [
        {(r["qid"], c) for r in map(json.loads, (x.stage_dir("scores") / "scores.jsonl").read_text().splitlines())
         for c in r["ids"]}
        for x in ctx.rounds()
    ]  # fmt: skip
    assert [r["sequences"] for r in cost["rounds"]] == [len(p) for p in pairs]
    assert [r["new"] for r in cost["rounds"]] == [len(pairs[0]), len(pairs[1] - pairs[0])]
    assert (
        cost["scored_sequences"] == len(pairs[0] | pairs[1]) < sum(len(p) for p in pairs)
    )  # round 2 reuses some
    res = man["results"]
    per = [json.loads(x) for x in (ctx.stage_dir("evaluate") / "per_query.jsonl").read_text().splitlines()]
    lp = {k: [q[k]["gold_logprob"] for q in per] for k in ("epr", "bm25", "lm-oracle")}
    want = gap_fraction_ci(lp["epr"], lp["bm25"], lp["lm-oracle"])
    got = res["epr"]["oracle_gap_captured"]
    assert got["gold_logprob"] == pytest.approx(want[0])
    assert res["epr"]["oracle_gap_captured_ci"]["gold_logprob"] == pytest.approx(list(want[1:]))
    assert "oracle_gap_captured" not in res["bm25"] and "oracle_gap_captured" not in res["lm-oracle"]
    md = (ctx.stage_dir("evaluate") / "results.md").read_text()
    assert f"Labels: {cost['scored_sequences']:,} LM-scored sequences in all" in md
    assert "Share of the BM25 -> LM-Oracle gap captured" in md
    from epr.cli.ending import label_cost_line as _label_cost_line

    line = _label_cost_line(ctx)  # what `epr status` says of the same run
    assert f"{cost['scored_sequences']:,} distinct sequences scored" in line
    assert f"round 2 {cost['rounds'][1]['examples']:,} examples" in line


def test_gap_captured_needs_both_references():
    from epr.stages.evaluate import gap_captured

    per = [{k: {"gold_logprob": v, "correct": c} for k, (v, c) in row.items()} for row in (
        {"bm25": (-4.0, 0), "epr": (-3.0, 1), "lm-oracle": (-2.0, 1)},
        {"bm25": (-6.0, 0), "epr": (-4.0, 0), "lm-oracle": (-2.0, 1)},
    )]  # fmt: skip
    res = {k: {"oracle": k == "lm-oracle"} for k in ("bm25", "epr", "lm-oracle")}
    gap_captured(res, per)
    g = res["epr"]["oracle_gap_captured"]
    assert g["gold_logprob"] == pytest.approx(((-3.5) - (-5.0)) / ((-2.0) - (-5.0)))  # 0.5
    assert g["em"] == pytest.approx(0.5)  # EM: BM25 0, epr 0.5, LM-Oracle 1
    no_oracle = {k: {"oracle": False} for k in ("bm25", "epr")}
    gap_captured(no_oracle, per)  # negative control: without LM-Oracle there is no gap to share
    assert "oracle_gap_captured" not in no_oracle["epr"]


def test_a_warm_started_round_never_hands_on_its_starting_encoder(
    tmp_path, tiny, tiny_lm_dir, minilm_dir, monkeypatch
):
    """Issue 48: round 2 of the 4,000-label MTOP run kept its epoch 0 (round 1's encoder: MRR 0.64 against 0.60
    after its warm epoch, on 32 dev queries), so round 2 changed nothing and round 3 re-mined round 2's candidates.
    A warm-started round keeps a trained epoch; a cold round may still keep the untrained encoder. Here every
    evaluation scores below the one before, so epoch 0 always leads on dev."""
    import itertools

    import torch

    from epr.encoder import train as train_mod
    from epr.encoder.model import DualEncoder

    falling = itertools.count()
    monkeypatch.setattr(
        train_mod, "evaluate", lambda *a, **k: {"recall@3": 0.5, "mrr": 1.0 - 0.01 * next(falling)}
    )
    ctx = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, "select.size=0", "train.init=previous")
    pipeline.run(ctx, until="encoder")
    r1, r2 = ctx.prev_round().stage_dir("encoder"), ctx.stage_dir("encoder")
    assert read_manifest(r1)["best_epoch"] == 0  # cold: the untrained MiniLM, as dev says
    assert read_manifest(r2)["best_epoch"] == 1  # warm: its trained epoch, though epoch 0 led
    w = {n: DualEncoder.from_pretrained(str(d / "model")).state_dict() for n, d in (("r1", r1), ("r2", r2))}
    base = DualEncoder.from_pretrained(minilm_dir).state_dict()
    assert all(torch.equal(w["r1"][n], base[n]) for n in base)
    assert not all(torch.equal(w["r2"][n], w["r1"][n]) for n in base)


def test_this_run_exports_every_rounds_labels(tmp_path, tiny, tiny_lm_dir, minilm_dir):
    """`epr cache export --this-run` ships the labels of every round, not only the last round's candidates
    (a two-round run's round-1 scores were left out, so a machine change would have scored them again)."""
    import gzip

    from epr.cli import main
    from epr.lm.factory import score_cache
    from epr.lm.score_cache import pair_key

    sets = ["select.size=0"]
    ctx = make(tmp_path, tiny, tiny_lm_dir, minilm_dir, *sets)
    pipeline.run(ctx, until="scores")
    r1, r2 = ctx.rounds()
    per_round = []
    for r in (r1, r2):
        _, contexts, targets, _ = scores_stage.scored_pairs(
            r.task, r.examples("pool"), r.rankings("candidates", "candidates.jsonl")
        )
        per_round.append({pair_key(c, t) for c, t in zip(contexts, targets)})
    assert per_round[0] - per_round[1]  # round 1 scored pairs round 2 did not
    score_cache(ctx.cfg).put(["another run's context"], ["its target"], [-3.0], "other")
    f = tmp_path / "run.json.gz"
    args = [a for s in (*ctx_overrides(tmp_path, tiny, tiny_lm_dir), f"models.encoder={minilm_dir}", *TRAIN,
                        *sets, "name=t") for a in ("--set", s)]  # fmt: skip
    assert main(["cache", "export", str(f), "--this-run", *args]) == 0
    (store,) = json.loads(gzip.open(f, "rt").read())["stores"]
    assert set(store["scores"]) == per_round[0] | per_round[1]


def test_status_of_many_rounds_costs_about_one_round_each(monkeypatch, caplog):
    """Issue 76: each round's fingerprint walked the rounds before it twice (through the ``rounds`` stage and the
    re-mined candidates), so ``epr status`` doubled in work per round (nine rounds: minutes; fifty: never). Counted
    in fingerprints computed, not in seconds: ten rounds cost about ten times one round, twenty about twice ten;
    and the memo changes no key (every stage of every round as the unmemoized walk gives it). Many rounds warn."""
    import torch

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    calls = {"n": 0}
    from epr.pipeline import graph

    real = graph.fingerprint

    def counting(obj):
        calls["n"] += 1
        return real(obj)

    monkeypatch.setattr(graph, "fingerprint", counting)

    def cost(rounds: int) -> int:
        calls["n"] = 0
        ctx = Context(
            load_config(["configs/mtop.yaml"], [f"candidates.rounds={rounds}", "run_root=/nonexistent"])
        )
        pipeline.status_rows(ctx)
        return calls["n"]

    one, ten, twenty = cost(1), cost(10), cost(20)
    assert ten <= 12 * one and twenty <= 2.2 * ten, (one, ten, twenty)
    assert "candidates.rounds=20: each round mines, scores its labels" in caplog.text

    def walk(ctx, name):  # the keys without any memo: a fresh context chain for every lookup
        fresh = Context(ctx.cfg, ctx.dist, ctx.top, ctx.index)
        return pipeline.stage_fingerprint(fresh, name)

    ctx = Context(load_config(["configs/mtop.yaml"], ["candidates.rounds=4", "run_root=/nonexistent"]))
    for r in ctx.rounds():
        for name in pipeline.upstream(r, "encoder"):
            assert pipeline.stage_fingerprint(r, name) == walk(r, name), (r.round, name)
