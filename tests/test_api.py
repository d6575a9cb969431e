"""The Python API (epr.api): the prompt it hands out is the one the compare stages evaluated, and its cached faiss
index is keyed by the encoder and pool that built it (a retrained encoder never reuses an old index)."""

import json

import numpy as np
import pytest

from epr import pipeline
from epr.api import PromptRetriever
from epr.context import Context
from epr.retrieval.index import search

from .test_own_data import own_config


def test_api_prompt_is_the_evaluated_prompt(tmp_path, minilm_dir, tiny_lm_dir):
    ctx = Context(
        own_config(
            tmp_path,
            minilm_dir,
            f"models.lm={tiny_lm_dir}",
            "generate.max_new_tokens=2",
            "retrieve.retrievers=[epr]",
            "retrieve.k=6",
            "retrieve.max_demos=4",
            "retrieve.prompt_budget=40",  # tight: not every retrieved demonstration fits
            "retrieve.answer_reserve=8",
        )
    )
    pipeline.run(ctx, until="prompts")
    r = PromptRetriever.from_run(ctx.cfg.run_dir)
    ev = {e.idx: e for e in ctx.examples("eval")}
    rows = [json.loads(x) for x in (ctx.stage_dir("prompts") / "epr.jsonl").open()]
    assert any(0 < len(p["demo_ids"]) < 4 for p in rows)  # the budget binds somewhere
    for p in rows:
        res = r.retrieve(ev[p["idx"]].input)  # the run's retrieve.k
        assert res.prompt == p["text"] and res.prompt_demos == len(p["demo_ids"])


def test_api_index_cache_follows_the_encoder(tmp_path, minilm_dir, caplog):
    cfg = own_config(tmp_path, minilm_dir)
    pipeline.run(Context(cfg), until="encoder")
    first = PromptRetriever.from_run(cfg.run_dir)
    assert "changed since this run read them" not in caplog.text
    cached = sorted((cfg.run_dir / ".cache" / "index").glob("*.faiss"))
    assert len(cached) == 1
    again = PromptRetriever.from_run(cfg.run_dir)  # served from the cache: same ids
    q = first.encoder.encode(["how do I reset my email"], "query")
    np.testing.assert_array_equal(search(first.index, q, 5)[0], search(again.index, q, 5)[0])

    cfg2 = own_config(tmp_path, minilm_dir, "train.lr=1e-3")  # another encoder in the same run folder
    pipeline.run(Context(cfg2), until="encoder")
    r2 = PromptRetriever.from_run(cfg2.run_dir)
    assert len(sorted((cfg.run_dir / ".cache" / "index").glob("*.faiss"))) == 2
    fresh = PromptRetriever(r2.encoder, r2.pool, r2.task)  # built from the new encoder, no cache
    q2 = r2.encoder.encode(["how do I reset my email"], "query")
    np.testing.assert_allclose(search(r2.index, q2, 5)[1], search(fresh.index, q2, 5)[1], rtol=1e-5)
    assert not np.allclose(search(r2.index, q2, 5)[1], search(first.index, q2, 5)[1])

    # the data file edited after the run: the run still serves the pool it read, and says so
    with open(cfg.data.path, "a") as f:
        f.write("how do I rename my printer,rename printer\n")
    again = PromptRetriever.from_run(cfg.run_dir)
    assert len(again.pool) == len(first.pool)
    assert f"the data file(s) {cfg.data.path} changed since this run read them" in caplog.text


def test_shipped_retriever_loads_in_a_fresh_process_without_its_run(tmp_path, minilm_dir, tiny_lm_dir):
    import shutil
    import subprocess
    import sys

    (tmp_path / "run").mkdir()
    ctx = Context(
        own_config(tmp_path / "run", minilm_dir, f"models.lm={tiny_lm_dir}", "generate.max_new_tokens=2",
                   "retrieve.retrievers=[epr, epr+div+bias]", "retrieve.k=6", "retrieve.max_demos=4",
                   "retrieve.prompt_budget=40", "ragsys.lambda_d=0.5")
    )  # fmt: skip
    pipeline.run(ctx, until="prompts")
    r = PromptRetriever.from_run(ctx.cfg.run_dir)
    assert r.quality is not None and r.ragsys["lambda_d"] == 0.5  # the run's RAGSys settings and quality bias
    queries = [e.input for e in ctx.examples("eval")]
    want = [r.retrieve(q) for q in queries]
    out = r.save_pretrained(tmp_path / "shipped", run=ctx.cfg.run_dir)
    card = (out / "README.md").read_text()
    assert "Dev metrics per epoch" in card and "task `jsonl`" in card and "lambda_d = 0.5" in card
    shutil.rmtree(tmp_path / "run")  # no run folder, no config, no data files: the shipped folder alone
    code = (
        "import json, sys\n"
        "from epr.api import PromptRetriever\n"
        "r = PromptRetriever.from_pretrained(sys.argv[1])\n"
        "qs = json.loads(sys.stdin.read())\n"
        "res = [r.retrieve(q) for q in qs]\n"
        "print(json.dumps({'res': [[x.prompt, [d.idx for d in x.demos], x.scores] for x in res],\n"
        "                  'q': r.quality.tolist(), 'ragsys': r.ragsys}))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(out)], input=json.dumps(queries), capture_output=True,
                       text=True, check=True)  # fmt: skip
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for w, (prompt, ids, scores) in zip(want, got["res"]):
        assert prompt == w.prompt and ids == [d.idx for d in w.demos]
        np.testing.assert_allclose(scores, w.scores, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["q"], r.quality, rtol=0, atol=0)
    assert got["ragsys"] == r.ragsys


def test_push_to_hub_and_load_by_repo_id(shipped, tmp_path, monkeypatch):
    """sentence-transformers' conventions: ``push_to_hub(repo_id)`` uploads the shipped folder (card included),
    ``from_pretrained("owner/name")`` downloads and loads it. No hub is reachable here: a local folder stands in for
    it behind huggingface_hub's own functions, so what is checked is what we send and how we load what comes back."""
    import shutil

    import huggingface_hub

    from epr.api import PromptRetriever

    path, queries = shipped
    hub, calls = tmp_path / "hub", []

    def create_repo(self, repo_id, private=False, exist_ok=False, repo_type=None):
        calls.append(("create", repo_id, private, repo_type))
        (hub / repo_id).mkdir(parents=True, exist_ok=exist_ok)

    def upload_folder(self, repo_id, folder_path, commit_message, repo_type=None):
        calls.append(("upload", repo_id, commit_message, repo_type))
        shutil.copytree(folder_path, hub / repo_id, dirs_exist_ok=True)
        return type("Info", (), {"commit_url": f"https://hub/{repo_id}/commit/1"})()

    def snapshot_download(repo_id, revision=None, token=None):
        calls.append(("download", repo_id, revision))
        if not (hub / repo_id).exists():
            raise huggingface_hub.errors.RepositoryNotFoundError(f"{repo_id} not found")
        return str(hub / repo_id)

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    r = PromptRetriever.from_pretrained(path)
    url = r.push_to_hub("me/tiny-epr", private=True)
    assert url == "https://hub/me/tiny-epr/commit/1"
    assert calls[:2] == [
        ("create", "me/tiny-epr", True, "model"),
        ("upload", "me/tiny-epr", "Add EPR retriever", "model"),
    ]
    back = PromptRetriever.from_pretrained("me/tiny-epr", revision="main")
    assert calls[-1] == ("download", "me/tiny-epr", "main")
    assert (hub / "me/tiny-epr/README.md").read_text() == (path / "README.md").read_text()  # the card travels
    for q in queries[:3]:
        assert back.select(q, 3) == r.select(q, 3)
    with pytest.raises(
        FileNotFoundError, match=r"nobody/nothing: no such folder, and the hub did not give it"
    ):
        PromptRetriever.from_pretrained("nobody/nothing")
