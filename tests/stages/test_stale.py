"""Nothing stale, nothing lost: identities that see every byte, caches that never overwrite each other, temp files
and outputs of former configs removed. Each with a negative control (nothing changed: everything reused)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from epr import artifacts, cache, pipeline
from epr.config import load_config
from epr.context import Context
from epr.pipeline import keys as pipeline_keys


# ---- a local model's identity: its full weights ----------------------------------------------------------------
def _fake_model(root: Path, tail: bytes) -> Path:
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"\0" * (3 << 20) + tail)  # differs only after the first MiB
    return root


def test_model_identity_sees_the_whole_weights(tmp_path, monkeypatch):
    from epr.lm.factory import model_identity

    monkeypatch.setenv("EPR_CACHE", str(tmp_path / "cache"))
    a = _fake_model(tmp_path / "a", b"one")
    b = _fake_model(tmp_path / "b", b"two")
    ia, ib = model_identity(str(a))["files"], model_identity(str(b))["files"]
    assert ia != ib  # same sizes, same first MiB, other weights
    assert model_identity(str(a))["files"] == ia  # negative control: unchanged folder, same identity
    w = a / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    st = w.stat()
    w.write_bytes(bytes(data))  # edited in place, same size
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert model_identity(str(a))["files"] != ia


def test_digests_are_remembered_across_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("EPR_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w.bin"
    f.write_bytes(os.urandom(1 << 16))
    d = cache.cached_digest(f)
    assert d == cache.file_digest(f)
    store = json.loads((tmp_path / "cache" / "digests.json").read_text())
    assert list(store.values()) == [cache.cached_digest(f, full=True)]
    cache._DIGESTS.clear()  # a new process: the store answers, the file is not read again

    def no_read(*a, **k):
        raise AssertionError("hashed again")

    monkeypatch.setattr(cache.hashlib, "sha256", no_read)
    assert cache.cached_digest(f) == d


# ---- the score cache: no write replaces another ----------------------------------------------------------------
def test_score_cache_keeps_every_write_of_one_process(tmp_path):
    from epr.lm.score_cache import ScoreCache

    key = {"lm": "x"}
    c = ScoreCache(tmp_path, key)
    for i in range(5):  # the same name, the same process: five chunks
        c.put([f"ctx{i}"], [f"t{i}"], [float(-i)], name="gold")
    c.put(["ctx0"], ["t0"], [0.0], name="gold")  # the same entries again: one file, no loss
    again = ScoreCache(tmp_path, key)  # what the next run reads
    assert len(again) == 5
    assert again.get([f"ctx{i}" for i in range(5)], [f"t{i}" for i in range(5)]) == [
        0.0,
        -1.0,
        -2.0,
        -3.0,
        -4.0,
    ]
    assert len(list(again.dir.glob("shard-*.json"))) == 5


# ---- temp files left by a kill between the temp write and the rename ------------------------------------------
def test_temp_files_of_a_killed_writer_are_removed(tmp_path):
    root = tmp_path / "chunks"
    root.mkdir()
    dead = 2**22 + 12345  # above the default pid_max: no such process
    stale = [root / f".chunk-000001.json.{dead}.abc_123.tmp", root / f".x.faiss.{dead}.tmp"]
    live = root / f".chunk-000002.json.{os.getpid()}.q1w2e3.tmp"  # a live writer's: kept
    for f in [*stale, live]:
        f.write_text("half")
    (root / "chunk-000000.json").write_text("{}")
    cache.ChunkStore(root, {"k": 1})  # the next run opens the store
    assert not any(f.exists() for f in stale)
    assert live.exists() and (root / "KEY.json").exists()


def test_atomic_writers_name_their_temp_by_pid_and_leave_none(tmp_path, monkeypatch):
    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append(Path(src).name)
        return real(src, dst)

    monkeypatch.setattr(artifacts.os, "replace", spy)
    artifacts.atomic_write_text(tmp_path / "a.json", "{}")
    artifacts.save_npy(tmp_path / "b.npy", np.zeros(3))
    assert all(f".{os.getpid()}." in n and n.endswith(".tmp") for n in seen), seen
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.npy"]


def test_run_stage_removes_stale_temps(tmp_path):
    (tmp_path / "d.jsonl").write_text(
        "".join(json.dumps({"input": f"q{i} x", "output": f"a{i}"}) + "\n" for i in range(20))
    )
    cfg = load_config(
        [], [f"run_root={tmp_path}", "name=r", "data.task=jsonl", f"data.path={tmp_path / 'd.jsonl'}"]
    )
    ctx = Context(cfg)
    out = ctx.stage_dir("examples")
    out.mkdir(parents=True)
    left = out / f".pool.jsonl.{2**22 + 7}.zzz.tmp"
    left.write_text("half")
    assert pipeline.run(ctx, until="examples") == ["examples"]
    assert not left.exists()


# ---- files readable as the umask says --------------------------------------------------------------------------
@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        artifacts.atomic_write_text(tmp_path / "a.json", "{}")
        artifacts.save_npy(tmp_path / "b.npy", np.zeros(2))
        artifacts.write_jsonl(tmp_path / "c.jsonl", [{"a": 1}])
    finally:
        os.umask(old)
    for n in ("a.json", "b.npy", "c.jsonl"):
        assert stat.S_IMODE((tmp_path / n).stat().st_mode) == mode, n


# ---- a stage removes the outputs it no longer makes ------------------------------------------------------------
def test_rerank_drops_a_former_quality_bias(tmp_path):
    from epr.stages.rerank import run_rerank

    cfg = load_config([], [f"run_root={tmp_path}", "name=r", "retrieve.retrievers=[bm25]"])
    ctx = Context(cfg)
    first, out = ctx.stage_dir("retrieve"), ctx.stage_dir("rerank")
    first.mkdir(parents=True)
    out.mkdir(parents=True)
    artifacts.write_jsonl(first / "bm25.jsonl", [{"idx": 0, "ids": [1, 2], "scores": [1.0, 0.5]}])
    np.save(out / "quality_bias.npy", np.ones(3, dtype=np.float32))  # a former `+bias` run's, another LM's
    (out / "epr+div+bias.jsonl").write_text("{}\n")
    run_rerank(ctx, out, "fp")
    assert sorted(p.name for p in out.iterdir()) == ["bm25.jsonl"]
    # negative control: what the config makes stays
    run_rerank(ctx, out, "fp")
    assert (out / "bm25.jsonl").exists()


def test_prune_outputs_keeps_sub_folders_and_the_manifest(tmp_path):
    (tmp_path / "parts").mkdir()
    for n in ("a.jsonl", "b.jsonl", "manifest.json"):
        (tmp_path / n).write_text("x")
    assert artifacts.prune_outputs(tmp_path, ["a.jsonl"]) == ["b.jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "manifest.json", "parts"]


# ---- built-in tasks: the data files' content is part of the examples key --------------------------------------
@pytest.mark.parametrize(
    "task,files",
    [
        ("mtop", ["mtop/mtop_en.train.jsonl", "mtop/mtop_en.validation.jsonl"]),
        ("break", ["break/qdmr.validation.jsonl"]),
        ("smcalflow", ["smcalflow/smcalflow2.validation.jsonl.gz"]),
        ("truthfulqa", ["truthfulqa/truthfulqa.2021-10.jsonl"]),
    ],
)
def test_builtin_task_data_edited_in_place_makes_examples_stale(task, files, tmp_path):
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_bytes(b"version 1\n")
    cfg = load_config([], [f"run_root={tmp_path}", f"data.task={task}", f"data.data_dir={tmp_path}"])
    fp = pipeline.stage_fingerprint(Context(cfg), "examples")
    assert pipeline.stage_fingerprint(Context(cfg), "examples") == fp  # negative control
    p = tmp_path / files[-1]
    st = p.stat()
    p.write_bytes(b"version 2\n")  # replaced in place, same size
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    assert pipeline.stage_fingerprint(Context(cfg), "examples") != fp


def test_hub_revision_is_part_of_the_examples_key_and_unpinned_keys_stay(tmp_path):
    """A pinned hub revision keys the run (a different revision is different data); unpinned, the key is the one
    runs had before the option existed (no hub_revision entry), so committed runs stay fresh."""
    base = [f"run_root={tmp_path}", "data.task=mtop"]
    fp = pipeline.stage_fingerprint(Context(load_config([], base)), "examples")
    assert "hub_revision" not in pipeline_keys._examples_keys(Context(load_config([], base)))["data"]
    pinned = [
        pipeline.stage_fingerprint(Context(load_config([], [*base, f"data.hub_revision={r}"])), "examples")
        for r in ("abc123", "def456")
    ]
    assert pinned[0] != fp and pinned[1] != pinned[0]


@pytest.mark.parametrize(
    "name,marked", [("d.jsonl", True), ("d.json.gz", True), ("d.csv", False), ("d.TSV", False)]
)
def test_own_json_data_is_keyed_by_how_numbers_are_read(name, marked, tmp_path):
    """JSON numbers have been kept as written ("3.50") since the key ``json_numbers``: a run whose examples were read
    the old way (3.5) is stale; CSV / TSV rows were always text, so their keys stay."""
    p = tmp_path / name
    p.write_bytes(b"x")
    cfg = load_config([], [f"run_root={tmp_path}", "data.task=jsonl", f"data.path={p}"])
    keys = pipeline_keys._examples_keys(Context(cfg))
    assert ("json_numbers" in keys) is marked
    mtop = load_config([], [f"run_root={tmp_path}", "data.task=mtop"])
    assert "json_numbers" not in pipeline_keys._examples_keys(Context(mtop))  # built-in tasks' keys stay


# ---- epr experiment curve: a row's key by the stages' rules -------------------------------------------------------
@pytest.fixture(scope="module")
def curve():
    from epr.experiments import curve

    return curve


@pytest.mark.parametrize(
    "retriever,change",
    [
        ("bm25", "retrieve.k=10"),
        ("bm25", "retrieve.prompt_budget=500"),
        ("bm25", "retrieve.max_demos=4"),
        ("bm25", "models.inference_lm=gemma3-270m"),
        ("sbert", "models.encoder=mpnet"),
        ("epr", "retrieve.eval_limit=7"),
    ],
)
def test_curve_row_key_sees_what_the_row_depends_on(curve, tmp_path, retriever, change):
    def key(*extra):
        cfg = load_config([], [f"run_root={tmp_path}", "data.task=demo", *extra])
        return json.loads(json.dumps(curve.row_key(Context(cfg), retriever, "fp", 10)))

    assert key() == key()  # negative control
    assert key(change) != key()


@pytest.mark.parametrize("ref", ["bm25", "sbert", "lm-oracle", "untrained"])
def test_a_reference_row_is_keyed_by_the_data_it_reads_not_by_the_training_labels(curve, tmp_path, ref):
    """BM25 / SBERT / LM-Oracle rows read only the examples (the retrieve stage's deps): another label set, another
    re-mining round or loss serves them; other examples recompute them. The untrained encoder keeps its encoder's key."""

    def fp(*extra):
        ctx = Context(load_config([], [f"run_root={tmp_path}", "data.task=demo", *extra]))
        key = curve.row_key(ctx, curve.UNTRAINED.get(ref, ref), curve.reference_fp(ctx, ref), 10)
        return json.dumps(key, sort_keys=True)

    base = fp()
    other_labels = fp("candidates.num_queries=7", "labels.k_pos=2", "labels.k_neg=2", "name=round2")
    assert (other_labels == base) is (ref != "untrained")  # the untrained encoder's key includes its labels
    assert fp("data.eval_limit=3") != base  # other examples: recomputed
    # LM-Oracle re-ranks candidates.L candidates of each example; the untrained encoder's labels use them too
    assert (fp("candidates.L=12") != base) is (ref in ("lm-oracle", "untrained"))


def test_an_added_option_at_its_neutral_default_keeps_the_fingerprint(tmp_path):
    """train.demo_fields came after encoders were trained; at its default (what the code did before it) it is left
    out of the encoder's keys, so those encoders and their rows stay valid; any other value changes them."""

    def fp(*extra):
        cfg = load_config([], [f"run_root={tmp_path}", "data.task=demo", *extra])
        return pipeline.stage_fingerprint(Context(cfg), "encoder")

    base = fp()
    assert "demo_fields" not in pipeline_keys.section_keys(
        Context(load_config([], ["data.task=demo"])), "train"
    )
    assert fp("train.demo_fields=input_output") == base
    assert fp("train.demo_fields=input") != base and fp("train.max_length=32") != base  # negative controls
    for (
        section,
        fields,
    ) in pipeline_keys.ADDED_DEFAULTS.items():  # each listed default is the option's own default
        cfg = load_config([], ["data.task=demo"])
        for k, v in fields.items():
            assert cfg.section(section)[k] == v


def test_curve_rows_are_reused_only_under_their_own_key(curve, tmp_path):
    """A row on disk (computed, or committed) is served for the key it was computed from and recomputed for any
    other; the script skips a seed's training only when every learned row of it is served this way."""
    calls = []

    def compute():
        calls.append(1)
        return {"gold_logprob": -1.5, "best_epoch": 1}

    f, k = tmp_path / "hybrid@2000-distill-s1.json", {"fp": "abc", "n": 3, "retrieve": ("x",)}
    assert curve.keyed_row(f, k) is None
    first = curve.cached_row(f, k, compute)
    assert curve.keyed_row(f, k) == first and first["best_epoch"] == 1
    assert curve.cached_row(f, k, compute) == first and len(calls) == 1  # served, not computed again
    assert curve.keyed_row(f, {**k, "fp": "other"}) is None  # another encoder: not this row
    assert curve.cached_row(f, {**k, "n": 4}, compute)["key"]["n"] == 4 and len(calls) == 2


@pytest.mark.parametrize(
    "retrievers,deps",
    [
        ("[bm25,sbert]", ("examples",)),
        ("[epr]", ("examples", "encoder")),
        ("[hybrid]", ("examples", "encoder")),  # the fusion uses this run's trained encoder
        ("[bm25,dr-bm25+div]", ("examples", "dr-bm25")),
    ],
)
def test_retrieve_needs_the_encoders_its_retrievers_use(retrievers, deps, tmp_path):
    cfg = load_config([], [f"run_root={tmp_path}", f"retrieve.retrievers={retrievers}"])
    assert pipeline.STAGES["retrieve"].deps(Context(cfg)) == deps


def test_length_buckets_key_the_encoder_where_they_act(tmp_path, monkeypatch):
    """``train.length_buckets`` (issue 49) keys the encoder as it acts: 1 (one padded batch, as before the option)
    keeps the old keys, so committed encoders stay valid; under GradCache (which chunks the batch itself) it does
    nothing and keys nothing; otherwise another value is another encoder. Null (the default) acts as the device's
    size: 4 on a CPU (the keys of every CPU run since the option), 1 on a GPU; a set value wins on either."""
    from epr.encoder.settings import effective_train
    from epr.lm import identity

    def keys(*extra):
        cfg = load_config([], [f"run_root={tmp_path}", "data.task=demo", "train.chunk_size=0", *extra])
        return pipeline.STAGES["encoder"].keys(Context(cfg))["train"]

    monkeypatch.setattr(identity, "default_device", lambda: "cpu")
    assert "length_buckets" not in keys("train.length_buckets=1")
    assert load_config([], []).train.length_buckets is None
    assert (
        keys()["length_buckets"] == 4 == keys("train.length_buckets=4")["length_buckets"]
    )  # the CPU's size acts
    assert effective_train(load_config([], []).train, False).length_buckets == 4  # and trains
    assert keys("train.length_buckets=8")["length_buckets"] == 8
    gc = ("train.chunk_size=4", "train.batch_size=16")
    assert keys(*gc) == keys(*gc, "train.length_buckets=1") == keys(*gc, "train.length_buckets=8")
    monkeypatch.setattr(identity, "default_device", lambda: "cuda")
    assert keys() == keys("train.length_buckets=1") and "length_buckets" not in keys()  # one batch on a GPU
    assert effective_train(load_config([], []).train, False).length_buckets == 1
    # a run that pins 4 on a GPU (seed 2 of results/mtop-8000-locked, as its seeds 42 and 1 ran) keys as they did
    assert keys("train.length_buckets=4")["length_buckets"] == 4
    # TruthfulQA's encoders key the written train section, the buckets as they act: 4 on a CPU, as before
    from epr.truthfulqa.learned import encoders_keys

    def tqa(device):
        monkeypatch.setattr(identity, "default_device", lambda: device)
        cfg = load_config([], [f"run_root={tmp_path}", "data.task=truthfulqa"])
        return encoders_keys(Context(cfg))["train"]["length_buckets"]

    assert (tqa("cpu"), tqa("cuda")) == (4, 1)
