"""Training on the tiny task: decreasing loss, a killed training resumes mid-epoch to identical weights,
checkpoints of another config are never resumed, bad labels, 2-process launch."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from epr import pipeline
from epr.encoder import train as train_mod
from epr.encoder.data import LabelRow, read_labels
from epr.types import InputError
from tests.conftest import torchrun
from tests.stages.test_pipeline import make_ctx

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "training" / "train_epr.py"


def bm25_ctx(tmp_path, data, minilm_dir, *extra):
    ctx = make_ctx(
        tmp_path,
        data,
        "/unused",
        "labels.source=bm25",
        "candidates.L=8",
        f"models.encoder={minilm_dir}",
        "train.batch_size=4",
        "train.chunk_size=2",
        "train.dev_size=4",
        "train.lr=1e-4",
        "train.warmup_ratio=0",
        *extra,
    )
    pipeline.run(ctx, until="labels")
    return ctx


def write_cfg(ctx, path: Path) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(json.loads(json.dumps(ctx.cfg.to_dict()))))
    return path


def weights(model_dir: Path) -> dict:
    from epr.encoder.model import DualEncoder

    return DualEncoder.from_pretrained(str(model_dir)).state_dict()


def count_steps(monkeypatch) -> dict:
    """Count the training steps (``compute_loss`` calls) of the trainings that follow."""
    n = {"steps": 0}
    real = train_mod.compute_loss

    def counted(*a, **k):
        n["steps"] += 1
        return real(*a, **k)

    monkeypatch.setattr(train_mod, "compute_loss", counted)
    return n


def test_three_steps_decrease_loss(tmp_path, tiny_task_files, minilm_dir):
    ctx = bm25_ctx(tmp_path, tiny_task_files, minilm_dir, "train.epochs=3", "train.dev_size=0")
    # the same 4 instances every epoch: loss must go down and stay finite
    from epr.stages.encoder import run_encoder

    hist = run_encoder(ctx, ctx.stage_dir("encoder"), "test")["extra"]["history"]
    losses = [h["loss"] for h in hist[1:]]
    assert all(map(lambda x: x == x and x < 1e6, losses))
    assert losses[-1] < losses[0]
    assert not (ctx.stage_dir("encoder") / "checkpoints").exists()  # a finished training removes them


@pytest.mark.parametrize("precision,want", [("no", "torch.float32"), ("bf16", "torch.bfloat16")])
def test_training_runs_in_the_precision_it_is_keyed_by(
    tmp_path, tiny_task_files, minilm_dir, monkeypatch, precision, want
):
    """``train.mixed_precision: bf16`` (what ``auto`` resolves to on a bf16 CPU) runs the towers' matrix products in
    bf16 during training steps, ``no`` in fp32; the loss stays finite and the saved weights fp32."""
    import torch

    from epr.encoder.model import DualEncoder
    from epr.stages.encoder import run_encoder

    ctx = bm25_ctx(
        tmp_path,
        tiny_task_files,
        minilm_dir,
        "train.epochs=1",
        "train.dev_size=0",
        f"train.mixed_precision={precision}",
    )
    seen: set[str] = set()
    real = train_mod.compute_loss

    def hooked(model, *a, **k):
        q = model.q_model if hasattr(model, "q_model") else model.module.q_model
        h = q.encoder.layer[0].attention.self.query.register_forward_hook(
            lambda m, i, o: seen.add(str(o.dtype))
        )
        try:
            return real(model, *a, **k)
        finally:
            h.remove()

    monkeypatch.setattr(train_mod, "compute_loss", hooked)
    hist = run_encoder(ctx, ctx.stage_dir("encoder"), "test")["extra"]["history"]
    assert seen == {want} and all(h["loss"] == h["loss"] for h in hist[1:])
    saved = DualEncoder.from_pretrained(str(ctx.stage_dir("encoder") / "model")).state_dict()
    assert {t.dtype for t in saved.values() if t.is_floating_point()} == {torch.float32}


def test_truncation_counts_texts_longer_than_the_encoder_keeps():
    from epr.encoder.data import truncation

    r = truncation([3, 10, 64, 65, 200], 64)
    assert (r["texts"], r["truncated"], r["share"], r["tokens_p50"]) == (5, 2, 0.4, 64)
    assert r["tokens_p99"] >= 195 and truncation([], 64)["share"] == 0.0


def test_training_reports_the_demonstrations_its_max_length_cuts(
    tmp_path, tiny_task_files, minilm_dir, caplog
):
    """Every demonstration the training draws on is counted (its tokens with [CLS]/[SEP]); over 5% cut warns."""
    from transformers import AutoTokenizer

    from epr.artifacts import read_jsonl
    from epr.encoder.data import demo_text
    from epr.stages.encoder import run_encoder

    ctx = bm25_ctx(
        tmp_path, tiny_task_files, minilm_dir, "train.epochs=1", "train.dev_size=0", "train.max_length=8"
    )
    with caplog.at_level("WARNING", logger="epr.encoder.train"):
        cut = run_encoder(ctx, ctx.stage_dir("encoder"), "test")["extra"]["demo_truncation"]
    pool = ctx.examples("pool")
    labels = read_labels(list(read_jsonl(ctx.stage_dir("labels") / "labels.jsonl")), len(pool), "x")
    ids = {i for r in labels for i in (*r.pos, *r.neg, *r.cands)}
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    lengths = [len(tok(demo_text(ctx.task, pool[i]))["input_ids"]) for i in ids]
    assert (cut["texts"], cut["truncated"]) == (len(ids), sum(n > 8 for n in lengths))
    assert cut["truncated"] > 0 and "train.max_length=8 cuts" in caplog.text


def test_max_length_zero_takes_the_encoder_length_from_the_data(tmp_path, tiny_task_files, minilm_dir):
    """``train.max_length: 0``: the longest query or demonstration the training reads, rounded up to 8, cuts none
    of them, and the saved encoder serves with that length (the 8-token run above is the negative control)."""
    import json

    from transformers import AutoTokenizer

    from epr.artifacts import read_jsonl
    from epr.config import load_config
    from epr.encoder.data import demo_text, length_from_data
    from epr.stages.encoder import run_encoder
    from epr.types import ConfigError

    assert (length_from_data([5, 17, 9], 512), length_from_data([600], 512), length_from_data([], 512)) == (
        24, 512, 8,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="train.max_length: 1"):
        load_config([], ["train.max_length=1"])
    ctx = bm25_ctx(
        tmp_path, tiny_task_files, minilm_dir, "train.epochs=1", "train.dev_size=0", "train.max_length=0"
    )
    cut = run_encoder(ctx, ctx.stage_dir("encoder"), "test")["extra"]["demo_truncation"]
    pool = ctx.examples("pool")
    labels = read_labels(list(read_jsonl(ctx.stage_dir("labels") / "labels.jsonl")), len(pool), "x")
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    texts = [demo_text(ctx.task, pool[i]) for i in {i for r in labels for i in (*r.pos, *r.neg, *r.cands)}]
    longest = max(len(tok(t)["input_ids"]) for t in [*texts, *(pool[r.qid].input for r in labels)])
    want = -(-longest // 8) * 8
    assert cut["truncated"] == 0 and cut["max_length"] == want > 8
    saved = json.loads((ctx.stage_dir("encoder") / "model" / "dual_encoder.json").read_text())
    assert saved["max_length"] == want


# 20 training instances (24 labelled, 4 dev) in batches of 4: 5 steps per epoch, 10 in all; checkpoints
# every 2 steps mid-epoch (2, 4, 6, 8) and at each epoch end (5, 10)
RESUME = ("train.epochs=2", "train.checkpoint_every=2")


def test_killed_training_resumes_mid_epoch_to_identical_weights(
    tmp_path, tiny_task_files, minilm_dir, monkeypatch
):
    clean = bm25_ctx(tmp_path / "a", tiny_task_files, minilm_dir, *RESUME)
    steps = count_steps(monkeypatch)
    pipeline.run_stage(clean, "encoder")
    m_clean = json.loads((clean.stage_dir("encoder") / "manifest.json").read_text())
    assert (steps["steps"], m_clean["rows"]["steps"], m_clean["resumed_from_step"]) == (10, 10, 0)

    # the script, killed with SIGKILL while writing the step-8 checkpoint (weights on disk, progress.json
    # not): the newest complete checkpoint is step 6, in the middle of epoch 2
    ctx = bm25_ctx(tmp_path / "b", tiny_task_files, minilm_dir, *RESUME)
    cfg = write_cfg(ctx, tmp_path / "cfg.yaml")
    killer = f"""
import os, runpy, signal, sys
import epr.encoder.checkpoints as ck
real = ck.atomic_write_text
def dying(path, text):
    if path.name == "progress.json" and path.parent.name == "step_8":
        os.kill(os.getpid(), signal.SIGKILL)
    real(path, text)
ck.atomic_write_text = dying
sys.argv = [{str(SCRIPT)!r}, "-c", {str(cfg)!r}, "--resume"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    r = subprocess.run([sys.executable, "-c", killer], capture_output=True, text=True, timeout=600)
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    out = ctx.stage_dir("encoder")
    assert pipeline.status(ctx)["encoder"] == "missing"
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_6", "step_8"]
    assert not (out / "checkpoints" / "step_8" / "progress.json").exists()
    # `epr status` names the step the next run resumes from: 6, the newest complete one (not the half-written 8)
    row = [r for r in pipeline.status_rows(ctx) if r[0] == "encoder"]
    assert row[0][1] == "missing" and row[0][3] == "training resumes from its checkpoint at step 6"

    steps["steps"] = 0
    pipeline.run_stage(ctx, "encoder")  # the stage again, same config: resumes in-process
    m = json.loads((out / "manifest.json").read_text())
    assert steps["steps"] == 4  # steps 7-10 only (a restart from zero would run 10)
    assert (m["resumed_from_step"], m["steps_run"], m["rows"]) == (6, 4, m_clean["rows"])
    assert m["history"] == m_clean["history"]
    assert json.loads((out / "history.json").read_text()) == m_clean["history"]
    a, b = weights(clean.stage_dir("encoder") / "model"), weights(out / "model")
    assert a.keys() == b.keys()
    import torch

    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)
    assert not (out / "checkpoints").exists()


def test_checkpoints_of_another_config_are_not_resumed(tmp_path, tiny_task_files, minilm_dir, monkeypatch):
    ctx = bm25_ctx(tmp_path, tiny_task_files, minilm_dir, "train.epochs=1", "train.checkpoint_every=2")
    real = train_mod.compute_loss
    calls = {"n": 0}

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(train_mod, "compute_loss", dying)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_stage(ctx, "encoder")
    root = ctx.stage_dir("encoder") / "checkpoints"
    assert [p.name for p in root.glob("step_*")] == ["step_2"]
    old_fp = json.loads((root / "FINGERPRINT.json").read_text())["fingerprint"]
    assert old_fp == pipeline.stage_fingerprint(ctx, "encoder")

    other_lr = ("train.epochs=1", "train.checkpoint_every=2", "train.lr=2e-4")
    other = bm25_ctx(tmp_path, tiny_task_files, minilm_dir, *other_lr)
    new_fp = pipeline.stage_fingerprint(other, "encoder")
    assert new_fp != old_fp
    seen = []
    steps = count_steps(monkeypatch)
    counted = train_mod.compute_loss

    def look(*a, **k):  # what the checkpoint folder holds when training starts
        if not seen:
            seen.append(
                (sorted(p.name for p in root.iterdir()), json.loads((root / "FINGERPRINT.json").read_text()))
            )
        return counted(*a, **k)

    monkeypatch.setattr(train_mod, "compute_loss", look)
    pipeline.run_stage(other, "encoder")
    m = json.loads((other.stage_dir("encoder") / "manifest.json").read_text())
    assert steps["steps"] == 5 and (m["resumed_from_step"], m["steps_run"]) == (0, 5)
    assert seen == [(["FINGERPRINT.json"], {"fingerprint": new_fp})]  # step_2 of the other config: deleted


class FakeAccelerator:
    is_main_process, num_processes = True, 1

    def wait_for_everyone(self):
        pass

    def save_state(self, d):
        Path(d).mkdir(parents=True)
        (Path(d) / "model.safetensors").write_text("weights")


def test_checkpoint_bookkeeping(tmp_path):
    """Only complete checkpoints of this fingerprint and process count are resumed; a newer one replaces the
    older; another fingerprint or ``fresh`` empties the folder."""
    from epr.encoder.checkpoints import Checkpoints

    root, acc = tmp_path / "checkpoints", FakeAccelerator()
    ck = Checkpoints(root, "fp1", acc)
    ck.claim()
    assert ck.latest() is None
    ck.save(3, {"epoch": 0, "step_in_epoch": 3})
    ck.save(5, {"epoch": 1, "step_in_epoch": 0})
    assert sorted(p.name for p in root.iterdir()) == ["FINGERPRINT.json", "step_5"]
    (root / "step_9").mkdir()  # killed while saving: weights but no progress.json
    (root / "step_9" / "model.safetensors").write_text("half")
    (root / "step_7").mkdir()  # unreadable progress
    (root / "step_7" / "progress.json").write_text('{"fingerp')
    last = ck.latest()
    assert (last.path.name, last.progress["epoch"], last.progress["fingerprint"]) == ("step_5", 1, "fp1")
    acc.num_processes = 2  # saved by one process: not resumed by two
    assert ck.latest() is None
    acc.num_processes = 1
    ck.save(9, {"epoch": 1, "step_in_epoch": 4})  # over the half-written folder: replaced, not written into
    assert (root / "step_9" / "model.safetensors").read_text() == "weights"
    assert sorted(p.name for p in root.iterdir()) == ["FINGERPRINT.json", "step_9"]
    Checkpoints(root, "fp1", acc).claim()  # same fingerprint: kept
    assert Checkpoints(root, "fp1", acc).latest().path.name == "step_9"
    other = Checkpoints(root, "fp2", acc)
    other.claim()  # another fingerprint: deleted
    assert sorted(p.name for p in root.iterdir()) == ["FINGERPRINT.json"] and other.latest() is None
    other.save(2, {"epoch": 0, "step_in_epoch": 2})
    other.claim(fresh=True)
    assert sorted(p.name for p in root.iterdir()) == ["FINGERPRINT.json"]


def test_bad_labels_are_clear_errors(tmp_path):
    with pytest.raises(InputError, match="empty file"):
        read_labels([], 10, "x.jsonl")
    with pytest.raises(InputError, match=r"x.jsonl:1: ids \[99\] are not in the pool of 10"):
        read_labels([{"qid": 1, "pos": [99], "neg": [2]}], 10, "x.jsonl")
    with pytest.raises(InputError, match="0 negatives"):
        read_labels([{"qid": 1, "pos": [3], "neg": []}], 10, "x.jsonl")
    assert read_labels([{"qid": 1, "pos": [3], "neg": [4]}], 10) == [LabelRow(1, (3,), (4,))]
    # the two candidate-score checks, and a bad query id, each name the row
    ok = {"qid": 1, "pos": [3], "neg": [4]}
    with pytest.raises(InputError, match=r"x.jsonl:2: 2 candidates but 1 candidate scores"):
        read_labels([ok, {**ok, "cands": [3, 4], "cand_scores": [-1.0]}], 10, "x.jsonl")
    with pytest.raises(InputError, match=r"x.jsonl:1: a candidate score is null"):
        read_labels([{**ok, "cands": [3, 4], "cand_scores": [-1.0, None]}], 10, "x.jsonl")
    with pytest.raises(InputError, match=r"x.jsonl:1: ids \[10\] are not in the pool"):
        read_labels([{**ok, "qid": 10}], 10, "x.jsonl")
    row = read_labels([{**ok, "cands": [3, 4], "cand_scores": [-1, -2.5]}], 10)[0]
    assert row.cands == (3, 4) and row.cand_scores == (-1.0, -2.5)


@pytest.mark.slow
def test_two_process_accelerate_launch(tmp_path, tiny_task_files, minilm_dir):
    ctx = bm25_ctx(tmp_path, tiny_task_files, minilm_dir, "train.epochs=1")
    cfg = write_cfg(ctx, tmp_path / "cfg.yaml")
    r = torchrun([str(SCRIPT), "-c", str(cfg)], port=29533)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((ctx.stage_dir("encoder") / "manifest.json").read_text())
    assert m["processes"] == 2 and m["rows"]["steps"] >= 1


@pytest.mark.slow
@pytest.mark.parametrize("loss,chunk", [("epr", 0), ("epr", 2), ("distill", 0), ("listwise", 3)])
def test_two_processes_give_the_one_process_gradient(tmp_path, minilm_dir, loss, chunk):
    """Both towers' gradients of one step on 8 instances: 2 gloo processes (4 each) == 1 process (all 8)."""
    worker = str(ROOT / "tests" / "dist_grad_worker.py")
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    r1 = subprocess.run(
        [sys.executable, worker, str(one), loss, str(chunk), minilm_dir],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = torchrun([worker, str(two), loss, str(chunk), minilm_dir], port=29547, env={"OMP_NUM_THREADS": "1"})
    assert r2.returncode == 0, r2.stderr[-3000:]
    import torch

    a, b = torch.load(one), torch.load(two)
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    # unused parameters (the pooler) get zero gradients in the all-reduce, None in one process
    assert set(a["grads"]) <= set(b["grads"])
    assert all(not b["grads"][n].any() for n in set(b["grads"]) - set(a["grads"]))
    towers = {n.split(".")[0] for n in a["grads"]}
    assert towers == {"q_model", "p_model"}  # both towers have gradients, and both must match
    for tower in towers:  # (the defect this guards against: 27% relative error on the prompt tower)
        names = [n for n in a["grads"] if n.startswith(tower)]
        g = torch.cat([a["grads"][n].flatten() for n in names])
        h = torch.cat([b["grads"][n].flatten() for n in names])
        assert ((h - g).norm() / g.norm()).item() < 1e-5, tower
        scale = g.abs().max().item()
        for (
            n
        ) in names:  # element-wise too, on the tower's scale (some gradients are exactly 0 up to rounding)
            torch.testing.assert_close(b["grads"][n], a["grads"][n], rtol=1e-4, atol=1e-5 * scale, msg=n)


def test_input_only_demonstrations_are_what_training_and_retrieval_encode(
    tmp_path, tiny_task_files, minilm_dir
):
    """train.demo_fields=input: the saved encoder records it, and the retriever's pool embeddings are the prompt
    tower's embeddings of the inputs alone, value for value (not of input + output)."""
    import numpy as np

    from epr.encoder.data import demo_text
    from epr.encoder.model import DualEncoder
    from epr.retrieval.retrievers import make_retriever
    from epr.stages.encoder import run_encoder

    ctx = bm25_ctx(
        tmp_path, tiny_task_files, minilm_dir, "train.epochs=1", "train.dev_size=0", "train.demo_fields=input"
    )
    run_encoder(ctx, ctx.stage_dir("encoder"), "test")
    folder = ctx.stage_dir("encoder") / "model"
    assert json.loads((folder / "dual_encoder.json").read_text())["demo_fields"] == "input"
    de = DualEncoder.from_pretrained(str(folder))
    pool = ctx.examples("pool")
    assert de.demo(ctx.task, pool[0]) == pool[0].input.strip() != demo_text(ctx.task, pool[0])
    r = make_retriever("epr", pool, ctx.task, ctx.cfg, str(folder))
    np.testing.assert_array_equal(r.pool_emb, de.encode([e.input.strip() for e in pool], "prompt"))
    with pytest.raises(ValueError, match="demo fields"):
        demo_text(ctx.task, pool[0], "output")


@pytest.mark.parametrize("buckets", [2, 4, 7])
def test_length_buckets_give_the_one_batch_values_and_gradients(minilm_dir, buckets):
    """``train.length_buckets`` (issue 49): texts of mixed lengths embedded in length-sorted sub-batches, each padded
    to its own longest, give the one padded batch's embeddings in the same order and, through a loss of both towers,
    the same gradients (within float rounding); and they do pad fewer tokens."""
    import torch

    from epr.encoder.losses import contrastive_loss
    from epr.encoder.model import DualEncoder

    torch.manual_seed(0)
    words = "set an alarm for seven tomorrow morning and remind me to call my mother about the trip".split()
    qs = [" ".join(words[: 2 + (i * 5) % 14]) for i in range(8)]
    ds = [" ".join(words[(i * 3) % 7 : (i * 3) % 7 + 1 + (i * 7) % 15]) for i in range(24)]
    runs = []
    for nb in (1, buckets):
        m = DualEncoder.from_pretrained(minilm_dir, max_length=16)
        q, d = m.embed_buckets(qs, "query", nb), m.embed_buckets(ds, "prompt", nb)
        contrastive_loss(q, d[:16]).backward()  # a loss over both towers (a positive and a negative a query)
        grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        runs.append((q.detach(), d.detach(), grads))
    (q1, d1, g1), (qb, db, gb) = runs
    torch.testing.assert_close(qb, q1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(db, d1, rtol=1e-4, atol=1e-5)
    assert set(g1) == set(gb) and {n.split(".")[0] for n in g1} == {"q_model", "p_model"}
    for tower in ("q_model", "p_model"):
        g = torch.cat([g1[n].flatten() for n in g1 if n.startswith(tower)])
        h = torch.cat([gb[n].flatten() for n in gb if n.startswith(tower)])
        assert ((h - g).norm() / g.norm()).item() < 1e-4, tower
    # negative control: a wrong order back (the sorted order) is not the batch's
    m = DualEncoder.from_pretrained(minilm_dir, max_length=16)
    with torch.no_grad():
        lens = [len(x) for x in m.tok(ds, truncation=True, max_length=16)["input_ids"]]
        sorted_d = m.embed_buckets(sorted(ds, key=lambda t: len(m.tok(t)["input_ids"])), "prompt", 1)
    assert not torch.allclose(sorted_d, d1, atol=1e-3)
    # fewer padded tokens: each sub-batch's longest instead of the batch's
    order = sorted(lens)
    size = -(-len(ds) // buckets)
    padded = sum(max(order[s : s + size]) * len(order[s : s + size]) for s in range(0, len(order), size))
    assert padded < max(lens) * len(lens)
