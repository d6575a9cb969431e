"""CUDA against CPU, value for value: the scorer, the lean decoder, GradCache's replayed dropout, one training step
and a whole tiny run (LM labels -> training -> retrieval -> generation -> evaluation). Skipped where no GPU is
visible; on a GPU machine: ``pytest -m gpu`` (docs/development.md). Tiny random models, so it needs no download;
``EPR_TEST_ENCODER`` may point the encoder fixture at a small local folder instead of the packaged MiniLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from epr.lm.generate import Generator
from epr.lm.models import load_lm
from epr.lm.scoring import LMScorer
from tests.lm.test_scoring import CTX, TGT  # the scorer tests' contexts and targets

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("prefix_share", [False, True])
def test_scorer_on_cuda_equals_cpu_fp32(tiny_lm_dir, prefix_share):
    ctx, tgt = CTX * 4, TGT * 4
    got = {}
    for dev in ("cpu", "cuda"):
        model, tok = load_lm(tiny_lm_dir, dtype="fp32", device=dev)
        got[dev] = LMScorer(model, tok, batch_tokens=128, prefix_share=prefix_share).score(ctx, tgt)
    np.testing.assert_allclose(got["cuda"], got["cpu"], rtol=1e-4, atol=1e-4)
    assert np.all(got["cpu"] < 0)


def test_shared_prefix_and_greedy_scoring_on_cuda_equal_cpu_fp32(tiny_lm_dir):
    """The label scorer's own path (each demonstration's keys and values once, ``score_prefixed``) and the gold
    pass's greedy check on CUDA, where host tensors go through pinned memory and a call's batches are brought back
    together: the CPU's values, in batches small enough that a call has several."""
    demos = ["Demo one: a -> b.", "Demo two is a little longer: c -> d."]
    pre = [demos[i % 2] for i in range(len(CTX) * 2)]
    ctx = [p + " " + c for p, c in zip(pre, CTX * 2)]
    tgt = TGT * 2
    got = {}
    for dev in ("cpu", "cuda"):
        sc = LMScorer(*load_lm(tiny_lm_dir, dtype="fp32", device=dev), batch_tokens=64, prefix_share=True)
        pairs = sc.encode(ctx, tgt)
        got[dev] = (sc.score_prefixed(pre, ctx, tgt), *sc.score_greedy(pairs))
    for a, b in zip(got["cuda"], got["cpu"]):
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["cpu"][0], got["cpu"][1], rtol=1e-4, atol=1e-4)  # shared = plain


def test_bf16_scorer_on_cuda_stays_near_fp32(tiny_lm_dir):
    """bf16 (what ``models.dtype: auto`` picks on CUDA) keeps each sequence's log-prob within 2% of fp32."""
    a = LMScorer(*load_lm(tiny_lm_dir, dtype="fp32", device="cuda")).score(CTX, TGT)
    b = LMScorer(*load_lm(tiny_lm_dir, dtype="bf16", device="cuda")).score(CTX, TGT)
    np.testing.assert_allclose(b, a, rtol=2e-2)


def test_lean_decoder_on_cuda_equals_cpu_and_transformers(tiny_lm_dir):
    prompts = ["turn on the lights", "a", "dim the garage lights please now", "set an alarm"] * 3
    out = {}
    for dev in ("cpu", "cuda"):
        model, tok = load_lm(tiny_lm_dir, dtype="fp32", device=dev)
        out[dev] = Generator(model, tok, 10, stop="\n", engine="lean", decode_rows=4).generate(prompts)
        out[dev + "-hf"] = Generator(model, tok, 10, 5, "\n", engine="hf").generate(prompts)
    assert out["cuda"] == out["cpu"] == out["cuda-hf"] == out["cpu-hf"]
    assert len(set(out["cuda"])) > 1  # not one constant string


def test_grad_cache_replays_cuda_dropout(monkeypatch):
    """GradCache re-runs each chunk's forward: on CUDA its dropout masks must come from the restored CUDA RNG.
    (CUDA's dropout draws a chunk's mask by offset, not element by element as the CPU does, so the reference is
    the same chunks embedded with a graph from the same RNG state, not the whole batch at once.) Negative
    control: restoring the CPU generator alone changes the gradients."""
    import epr.encoder.losses as L

    dev = "cuda"
    torch.manual_seed(0)
    enc_q = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 4)).to(dev)
    enc_d = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 4)).to(dev)
    xq, xd = torch.randn(8, 6, device=dev), torch.randn(16, 6, device=dev)
    qc = [{"x": xq[i : i + 3]} for i in range(0, 8, 3)]
    dc = [{"x": xd[i : i + 5]} for i in range(0, 16, 5)]
    params = [*enc_q.parameters(), *enc_d.parameters()]

    def take():
        g = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        return g

    torch.manual_seed(1)
    state = torch.cuda.get_rng_state_all()
    plain = L.contrastive_loss(torch.cat([enc_q(c["x"]) for c in qc]), torch.cat([enc_d(c["x"]) for c in dc]))
    plain.backward()
    g_plain = take()

    def cached():
        torch.cuda.set_rng_state_all(state)
        loss = L.grad_cache_backward(
            lambda b: enc_q(b["x"]), lambda b: enc_d(b["x"]), qc, dc, L.contrastive_loss
        )
        return loss, take()

    loss, g = cached()
    assert loss.item() == pytest.approx(plain.item(), rel=1e-5)
    for a, b in zip(g_plain, g):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    monkeypatch.setattr(L._RandState, "restore", lambda self: torch.set_rng_state(self.cpu))
    _, g_broken = cached()
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(g_plain, g_broken))


@pytest.mark.parametrize("loss,chunk", [("epr", 0), ("distill", 0), ("distill", 3), ("listwise", 3)])
def test_training_step_on_cuda_equals_cpu(tmp_path, minilm_dir, loss, chunk):
    """One step's loss and both towers' gradients (tests/dist_grad_worker.py), on the GPU and on the CPU."""
    worker = str(ROOT / "tests" / "dist_grad_worker.py")
    got = {}
    for dev in ("cpu", "cuda"):
        out = tmp_path / f"{dev}.pt"
        _python([worker, str(out), loss, str(chunk), minilm_dir, dev], cuda=dev == "cuda")
        got[dev] = torch.load(out)
    a, b = got["cpu"], got["cuda"]
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
    assert set(a["grads"]) == set(b["grads"]) and {n.split(".")[0] for n in a["grads"]} == {
        "q_model",
        "p_model",
    }
    for tower in ("q_model", "p_model"):
        names = [n for n in a["grads"] if n.startswith(tower)]
        g = torch.cat([a["grads"][n].flatten() for n in names])
        h = torch.cat([b["grads"][n].flatten() for n in names])
        assert ((h - g).norm() / g.norm()).item() < 1e-4, tower


RUN = """
import sys
from epr import pipeline
from epr.config import load_config
from epr.context import Context
from tests.stages.test_pipeline import ctx_overrides
from pathlib import Path
tmp, data, lm, enc = Path(sys.argv[1]), *sys.argv[2:5]
cfg = load_config([], ctx_overrides(tmp, data, lm, f"models.encoder={enc}", "train.epochs=2", "train.batch_size=4",
                  "train.dev_size=4", "retrieve.k=8", "retrieve.max_demos=3", "generate.max_new_tokens=6",
                  "retrieve.retrievers=[bm25,sbert,epr,epr+div+bias]"))
print(pipeline.run(Context(cfg), until="evaluate"))
"""


def _python(args: list[str], cuda: bool) -> None:
    """Run ``python ARGS`` from the repository root with the repository importable; on the CPU alone unless
    ``cuda``."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    if not cuda:
        env.update(CUDA_VISIBLE_DEVICES="", ACCELERATE_USE_CPU="1")
    r = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-4000:]


def _tiny_run(tmp: Path, data: Path, lm: str, enc: str, cuda: bool) -> Path:
    _python(["-c", RUN, str(tmp), str(data), lm, enc], cuda)
    return tmp / "runs" / "t"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_whole_tiny_run_on_cuda_equals_the_cpu_run(tmp_path, tiny_task_files, tiny_lm_dir, minilm_dir):
    """Same LM scores (labels), same trained encoder, same demonstrations, predictions and gold log-probs."""
    cpu = _tiny_run(tmp_path / "cpu", tiny_task_files, tiny_lm_dir, minilm_dir, cuda=False)
    gpu = _tiny_run(tmp_path / "gpu", tiny_task_files, tiny_lm_dir, minilm_dir, cuda=True)
    man = {
        d: json.loads((r / "scores" / "manifest.json").read_text()) for d, r in (("cpu", cpu), ("gpu", gpu))
    }
    assert "cuda" in json.dumps(man["gpu"]) and "cuda" not in json.dumps(man["cpu"])  # really ran on each
    mem = man["gpu"]["scoring_speed"]["gpu_memory"]  # the allocator's note: what the GPU run held and retried
    assert 0 < mem["max_allocated_gb"] <= mem["max_reserved_gb"] <= mem["total_gb"]
    assert mem["alloc_retries"] >= 0
    assert "gpu_memory" not in man["cpu"]["scoring_speed"]
    # generate's sizes are left null: each device ran (and keyed) its own (epr.lm.identity.DEVICE_SIZES)
    gen = {d: json.loads((r / "predict" / "manifest.json").read_text())["config"]["generate"] for d, r in
           (("cpu", cpu), ("gpu", gpu))}  # fmt: skip
    assert [(g["decode_rows"], g["chunk_size"]) for g in (gen["cpu"], gen["gpu"])] == [(64, 256), (256, 1024)]
    la, lb = _rows(cpu / "labels" / "labels.jsonl"), _rows(gpu / "labels" / "labels.jsonl")
    assert [(r["qid"], r["cands"], r["pos"], r["neg"]) for r in la] == [
        (r["qid"], r["cands"], r["pos"], r["neg"]) for r in lb
    ]
    for x, y in zip(la, lb):
        np.testing.assert_allclose(y["cand_scores"], x["cand_scores"], rtol=1e-4, atol=1e-4)
    qa, qb = _rows(cpu / "evaluate" / "per_query.jsonl"), _rows(gpu / "evaluate" / "per_query.jsonl")
    assert len(qa) == len(qb) > 0
    for x, y in zip(qa, qb):
        for name in ("bm25", "sbert", "epr"):
            assert y[name]["demos"] == x[name]["demos"], (name, x["idx"])
            assert y[name]["prediction"] == x[name]["prediction"], (name, x["idx"])
            assert y[name]["gold_logprob"] == pytest.approx(x[name]["gold_logprob"], rel=1e-4, abs=1e-4)
    # RAGSys: the same quality bias; MMR over a random tiny LM's near-equal biases may swap a near-tied pick
    # (seen on an H100), so the selections must agree slot by slot on most slots and on every first pick
    qc, qg = (np.load(r / "rerank" / "quality_bias.npy") for r in (cpu, gpu))
    np.testing.assert_allclose(qg, qc, rtol=1e-4, atol=1e-4)
    name = "epr+div+bias"
    slots = [(a == b) for x, y in zip(qa, qb) for a, b in zip(x[name]["demos"], y[name]["demos"])]
    print(f"{name}: {sum(slots)} of {len(slots)} demonstration slots agree between CPU and CUDA")
    assert np.mean(slots) >= 0.8 and all(x[name]["demos"][0] == y[name]["demos"][0] for x, y in zip(qa, qb))
    same = [(x, y) for x, y in zip(qa, qb) if x[name]["demos"] == y[name]["demos"]]
    assert same and all(x[name]["prediction"] == y[name]["prediction"] for x, y in same)


def test_the_trained_encoder_encodes_on_cuda_as_on_the_cpu(tmp_path, minilm_dir, monkeypatch):
    """``make_retriever`` puts the trained encoder on the GPU (before, it encoded on the host's cores); the pool's
    and a query's embeddings agree with the CPU's (fp32), and the GPU's pool embeddings have a cache file of their own."""
    import epr.lm.identity as identity
    from epr.config import DataConfig, load_config
    from epr.encoder.model import DualEncoder
    from epr.retrieval.retrievers import make_retriever
    from epr.tasks import get_task

    task = get_task(DataConfig(task="demo"))  # the embedded demo's pool
    pool = task.load()[0][:120]
    enc = tmp_path / "model"
    DualEncoder.from_pretrained(minilm_dir).save_pretrained(enc)
    cfg = load_config([], [f"models.encoder={minilm_dir}", f"run_root={tmp_path}", "candidates.L=12"])
    got = {}
    for dev in ("cpu", "cuda"):
        monkeypatch.setattr(identity, "default_device", lambda dev=dev: dev)
        loaded = {}
        r = make_retriever("epr", pool, task, cfg, str(enc), loaded)
        assert next(loaded[str(enc)].parameters()).device.type == dev
        got[dev] = (r.pool_emb, r.query_embeddings(pool[:3]))
    for a, b in zip(got["cuda"], got["cpu"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert len(list((tmp_path / ".cache" / "pool_embeddings").iterdir())) == 2
