import numpy as np
import pytest

from epr.config import DataConfig, load_config
from epr.reports.stats import mean_ci
from epr.retrieval.index import brute_force, build_index, search
from epr.retrieval.prompt_budget import build_prompt
from epr.retrieval.retrievers import KNOWN, RRF_K, make_retriever, rrf_fuse
from epr.tasks import get_task
from epr.types import Hits, Retriever


@pytest.mark.parametrize("factory", ["Flat", "HNSW16"])
def test_faiss_equals_brute_force(factory):
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(500, 16)).astype(np.float32)
    emb[7] = emb[3]  # an exact tie
    q = rng.normal(size=(40, 16)).astype(np.float32)
    ids, sc = search(build_index(emb, factory), q, 10, block=16)
    ref_ids, ref_sc = brute_force(emb, q, 10)
    if factory == "Flat":  # exact: same scores and the same ids, except where scores tie
        np.testing.assert_allclose(sc, ref_sc, rtol=1e-4, atol=1e-4)
        _, ref11 = brute_force(emb, q, 11)  # the 11th score: is rank 10 apart from what is left out?
        compared = 0
        for a, b, r in zip(ids, ref_ids, ref11):
            gaps = np.abs(np.diff(r)) > 1e-4  # gaps[j]: rank j's score apart from rank j + 1's
            for j in range(10):
                if (j == 0 or gaps[j - 1]) and gaps[j]:  # untied: the one id that belongs there
                    assert a[j] == b[j], (j, a, b)
                    compared += 1
        assert compared > 300  # most ranks are compared: the check is not vacuous
    else:  # approximate: high recall of the exact top-10
        assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ref_ids)]) >= 0.8


def test_empty_pool_is_an_error():
    with pytest.raises(ValueError, match="pool is empty"):
        build_index(np.zeros((0, 4), dtype=np.float32))


@pytest.fixture(scope="module")
def demo():
    task = get_task(DataConfig(task="demo"))
    pool, ev = task.load()
    return task, pool[:120], ev[:10]


NAMES = ("random", "bm25", "sbert", "epr", "dr-bm25", "bm25-oracle", "lm-oracle", "hybrid")


@pytest.fixture(scope="module")
def all_retrievers(demo, tmp_path_factory, minilm_dir, tiny_lm_dir):
    from epr.encoder.model import DualEncoder

    task, pool, _ = demo
    run = tmp_path_factory.mktemp("run")
    enc = run / "model"
    DualEncoder.from_pretrained(minilm_dir).save_pretrained(enc)  # an untrained dual encoder
    sets = [f"models.encoder={minilm_dir}", f"models.lm={tiny_lm_dir}", "candidates.L=12", f"run_root={run}"]
    cfg = load_config([], sets)
    loaded: dict = {}
    return {
        n: make_retriever(n, pool, task, cfg, enc if n in ("epr", "dr-bm25", "hybrid") else None, loaded)
        for n in NAMES
    }


def test_every_known_retriever_is_in_the_contract_test():
    assert set(NAMES) == set(KNOWN)


@pytest.mark.parametrize("name", NAMES)
def test_retriever_contract(demo, all_retrievers, name):
    """Every retriever: the protocol, k distinct ids best first with their scores, never the excluded id,
    at most what the pool holds, deterministic."""
    task, pool, _ = demo
    r = all_retrievers[name]
    assert isinstance(r, Retriever) and r.name == name and r.is_oracle == name.endswith("-oracle")
    queries = pool[:15]
    exclude = np.array([q.idx for q in queries])
    h = r.retrieve(queries, 8, exclude=exclude)
    assert isinstance(h, Hits) and h.ids.shape == h.scores.shape == (15, 8) and h.ids.dtype == np.int64
    for row, sc, q in zip(h.ids, h.scores, queries):
        assert len(set(row.tolist())) == 8 and q.idx not in row and row.min() >= 0 and row.max() < len(pool)
        assert np.all(np.diff(sc) <= 1e-6), "best first"
    again = r.retrieve(queries, 8, exclude=exclude)
    np.testing.assert_array_equal(h.ids, again.ids)
    np.testing.assert_allclose(h.scores, again.scores, rtol=1e-6)
    # without exclusion the query may come back; k is honoured
    assert r.retrieve(queries[:3], 5).ids.shape == (3, 5)


def test_rrf_fuse_by_hand():
    c = RRF_K
    ids, sc = rrf_fuse([np.array([1, 2, 3]), np.array([3, 1, 4])], 4)
    # 1: 1/(c+1) + 1/(c+2); 3: 1/(c+3) + 1/(c+1); 2: 1/(c+2); 4: 1/(c+3)
    assert ids.tolist() == [1, 3, 2, 4]
    np.testing.assert_allclose(
        sc, [1 / (c + 1) + 1 / (c + 2), 1 / (c + 3) + 1 / (c + 1), 1 / (c + 2), 1 / (c + 3)]
    )
    # a tie goes to the id the earliest ranking put first (either order of the rankings)
    assert rrf_fuse([np.array([1, 2]), np.array([2, 1])], 2)[0].tolist() == [1, 2]
    assert rrf_fuse([np.array([2, 1]), np.array([1, 2])], 2)[0].tolist() == [2, 1]
    assert rrf_fuse([np.array([5, 6, 7])], 2)[0].tolist() == [5, 6]  # one ranking: itself


def test_hybrid_is_the_rrf_of_epr_and_bm25(demo, all_retrievers):
    """Value for value against its parts: the fused ranking of the epr and bm25 hits of the same queries; and it
    differs from both (a fusion that returned one part would pass the contract test)."""
    _, pool, _ = demo
    queries = pool[:15]
    exclude = np.array([q.idx for q in queries])
    h = all_retrievers["hybrid"].retrieve(queries, 8, exclude=exclude)
    e = all_retrievers["epr"].retrieve(queries, 8, exclude=exclude)
    b = all_retrievers["bm25"].retrieve(queries, 8, exclude=exclude)
    for i in range(len(queries)):
        want, _ = rrf_fuse([e.ids[i], b.ids[i]], 8)
        assert h.ids[i].tolist() == want.tolist()
    assert not np.array_equal(h.ids, e.ids) and not np.array_equal(h.ids, b.ids)


def test_lm_oracle_reorders_bm25_oracle_candidates_by_lm_score(demo, all_retrievers):
    task, pool, _ = demo
    bm25o, lmo = all_retrievers["bm25-oracle"], all_retrievers["lm-oracle"]
    q = pool[:3]
    got = lmo.retrieve(q, 12)
    cand = bm25o.retrieve(q, 12).ids
    for i in range(3):
        assert set(got.ids[i].tolist()) == set(cand[i].tolist())  # the same candidates, re-ranked
        s = lmo.scorer.score(
            [task.format_demo(pool[c]) + task.format_query(q[i].input) for c in got.ids[i]],
            [task.format_target(q[i].output)] * 12,
        )
        np.testing.assert_allclose(got.scores[i], s, atol=1e-3)  # the scores returned are the LM's
        assert np.all(np.diff(got.scores[i]) <= 0)  # best LM score first
        # (re-scored in other batches, fp32 sums differ by ~1e-4: near-ties may swap, nothing more)
        assert np.all(np.diff(s) <= 2e-3)


def test_prompt_never_exceeds_budget(demo):
    task, pool, ev = demo
    count = lambda s: len(s.split())  # noqa: E731
    for budget in (8, 20, 40, 200):
        p = build_prompt(task, ev[0], list(range(50)), pool, count, budget, reserve=5, max_demos=16)
        assert count(p.text) + 5 <= budget or p.status != "ok"
        assert p.text.endswith(task.format_query(ev[0].input))
        if p.demo_ids:  # the best demonstration sits right before the query
            assert p.text.endswith(task.format_demo(pool[p.demo_ids[0]]) + task.format_query(ev[0].input))
    nq = count(task.format_query(ev[0].input))
    assert build_prompt(task, ev[0], [0, 1], pool, count, nq + 5 + 1, 5, 16).status == "no_demo_fits"
    assert build_prompt(task, ev[0], [0, 1], pool, count, nq + 5 - 1, 5, 16).status == "query_too_long"


def test_metrics_on_hand_made_cases():
    mtop = get_task(DataConfig(task="mtop"))
    assert mtop.is_correct("[IN:A  [SL:B x ] ]", "[IN:A [SL:B x ] ]")
    assert not mtop.is_correct("[IN:A [SL:B y ] ]", "[IN:A [SL:B x ] ]")
    brk = get_task(DataConfig(task="break"))
    assert brk.is_correct("return flights ;return #1 from  denver", "Return flights; return #1 from denver")
    assert not brk.is_correct(
        "return flights ;return #2 from denver", "return flights ;return #1 from denver"
    )
    m, lo, hi = mean_ci([100, 0, 100, 100])
    assert m == 75 and 0 <= lo <= m <= hi <= 100


def test_pool_embeddings_are_kept_per_encoder_and_pool(demo, tmp_path, minilm_dir, monkeypatch):
    """The pool is embedded once per trained encoder and pool (select, retrieve and mining share it), value for
    value; a changed encoder (its weights) or a changed demonstration is embedded anew, never served the old."""
    import torch

    from epr.encoder.model import DualEncoder
    from epr.retrieval.retrievers import pool_embeddings

    task, pool, _ = demo
    enc = tmp_path / "model"
    de = DualEncoder.from_pretrained(minilm_dir)
    de.save_pretrained(enc)
    calls = []
    real = DualEncoder.encode

    def counted(self, texts, side, *a, **k):
        calls.append(len(texts))
        return real(self, texts, side, *a, **k)

    monkeypatch.setattr(DualEncoder, "encode", counted)
    texts = [de.demo(task, e) for e in pool]
    cache = tmp_path / ".cache"
    first = pool_embeddings(de, enc, texts, cache)
    again = pool_embeddings(DualEncoder.from_pretrained(str(enc)), enc, texts, cache)
    assert calls == [len(texts)] and np.array_equal(first, again)
    assert np.array_equal(first, real(de, texts, "prompt"))  # what the encoder itself gives
    edited = texts[:-1] + [texts[-1] + " (edited)"]
    pool_embeddings(de, enc, edited, cache)
    assert calls == [len(texts)] * 2
    with torch.no_grad():  # a retrained encoder in the same folder
        next(de.p_model.parameters()).add_(0.01)
    de.save_pretrained(enc)
    moved = pool_embeddings(de, enc, texts, cache)
    assert calls == [len(texts)] * 3 and not np.array_equal(moved, first)
    # the retrievers built by make_retriever read the same cache: a fresh process (no ``loaded``) embeds nothing
    cfg = load_config([], [f"models.encoder={minilm_dir}", f"run_root={tmp_path}", "candidates.L=12"])
    make_retriever("epr", pool, task, cfg, str(enc), {})
    assert len(calls) == 3


def test_the_trained_encoder_runs_on_the_lms_device_and_its_pool_cache_says_which(
    demo, tmp_path, minilm_dir, monkeypatch
):
    """``make_retriever`` puts the trained encoder on ``default_device()`` (on a GPU machine it encoded the pool and
    every query on the host's cores: 5 batches a second on the H200 run of 2026-11-27); the pool-embedding cache keys a
    non-CPU device, so a GPU's embeddings are never served to the CPU nor the CPU's to a GPU. A CPU's key is unchanged.
    The ``meta`` device stands in for a GPU here (tests/test_cuda.py checks the values on a real one)."""
    import epr.lm.identity as identity
    from epr.encoder.model import DualEncoder
    from epr.retrieval.retrievers import pool_embeddings

    task, pool, _ = demo
    enc = tmp_path / "model"
    DualEncoder.from_pretrained(minilm_dir).save_pretrained(enc)
    cache = tmp_path / ".cache"
    cfg = load_config([], [f"models.encoder={minilm_dir}", f"run_root={tmp_path}", "candidates.L=12"])
    make_retriever("epr", pool, task, cfg, str(enc), {})  # on the CPU: one cache file
    files = sorted((cache / "pool_embeddings").iterdir())
    assert len(files) == 1

    calls = []

    def fake(self, texts, side, *a, **k):  # a meta tensor has no values: what a GPU would return, in shape
        calls.append(str(next(self.parameters()).device))
        return np.zeros((len(texts), self.q_model.config.hidden_size), dtype=np.float32)

    monkeypatch.setattr(DualEncoder, "encode", fake)
    monkeypatch.setattr(identity, "default_device", lambda: "meta")
    loaded = {}
    make_retriever("epr", pool, task, cfg, str(enc), loaded)
    assert str(next(loaded[str(enc)].parameters()).device) == "meta"
    assert calls == ["meta"]  # not served the CPU's embeddings
    assert len(list((cache / "pool_embeddings").iterdir())) == 2
    texts = [loaded[str(enc)].demo(task, e) for e in pool]
    again = pool_embeddings(
        DualEncoder.from_pretrained(str(enc)), enc, texts, cache
    )  # the CPU again: its own file
    assert calls == ["meta"] and np.array_equal(again, np.load(files[0]))
