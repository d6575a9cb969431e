"""Every retriever behind one protocol (``epr.types.Retriever``), so the comparison grid is a loop.

Unsupervised: ``random``, ``bm25`` (over inputs), ``sbert`` (frozen encoder, cosine; KATE).
Learned: ``epr`` (trained dual encoder, inner product over a faiss index); ``dr-bm25`` is the same class
pointed at an encoder trained on BM25 labels (the pipeline's ``dr-bm25`` sub-run trains it); ``hybrid`` fuses the
``epr`` and ``bm25`` rankings by reciprocal rank (:class:`FusionRetriever`). Every ``retrieve``
returns :class:`epr.types.Hits` (ids and the retriever's scores). Oracles (they see the gold output; never a fair
baseline):
``bm25-oracle`` (BM25 over outputs with the gold y) and ``lm-oracle`` (those candidates re-ranked by the scoring LM's
log p(y_test | e, x_test), the label-generation score applied to the test example).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from epr.config import RETRIEVERS
from epr.prompt import as_format
from epr.retrieval.bm25 import BM25Index
from epr.retrieval.index import build_index, search
from epr.types import Example, Hits, Retriever

__all__ = [
    "RandomRetriever",
    "BM25Retriever",
    "DenseRetriever",
    "LMOracleRetriever",
    "FusionRetriever",
    "rrf_fuse",
    "RRF_K",
    "make_retriever",
    "ORACLES",
    "KNOWN",
]

ORACLES = {"bm25-oracle", "lm-oracle"}

log = logging.getLogger(__name__)


def _drop_excluded(ids: np.ndarray, scores: np.ndarray, exclude: np.ndarray | None, k: int) -> Hits:
    """Rows of ``ids`` (over-fetched by one when ``exclude`` is given) without the excluded id and without faiss's
    ``-1`` padding (IVF / HNSW indexes may return fewer than asked), cut to ``k``."""
    n = min(k, ids.shape[1] - (exclude is not None))
    out, sc = np.empty((ids.shape[0], n), dtype=np.int64), np.empty((ids.shape[0], n), dtype=np.float64)
    for i, (row, srow) in enumerate(zip(ids, scores)):
        keep = row >= 0
        if exclude is not None:
            keep &= row != exclude[i]
        if keep.sum() < n:
            raise ValueError(
                f"the index returned {int(keep.sum())} ids for query {i}, fewer than k={n}: "
                "use a Flat index or raise its nprobe / efSearch"
            )
        out[i], sc[i] = row[keep][:n], srow[keep][:n]
    return Hits(out, sc)


class RandomRetriever:
    name, is_oracle = "random", False

    def __init__(self, pool: Sequence[Example], seed: int = 0):
        self.n, self.seed = len(pool), seed

    def retrieve(self, queries, k, exclude=None):
        out = np.empty((len(queries), min(k, self.n - 1)), dtype=np.int64)
        for i, q in enumerate(queries):  # per-query draw from (seed, query idx): order-independent
            key = q.idx if q.idx >= 0 else zlib.crc32(q.input.encode())  # an ad-hoc query: its text
            perm = np.random.default_rng([self.seed, key]).permutation(self.n)
            if exclude is not None:
                perm = perm[perm != exclude[i]]
            out[i] = perm[: out.shape[1]]
        return Hits(out, np.zeros(out.shape))


class BM25Retriever:
    def __init__(
        self, pool: Sequence[Example], view: str = "input", backend: str = "bm25s", oracle: bool = False
    ):
        self.view, self.is_oracle = view, oracle
        self.name = "bm25-oracle" if oracle else "bm25"
        self.index = BM25Index([e.output if view == "output" else e.input for e in pool], backend)

    def retrieve(self, queries, k, exclude=None):
        texts = [q.output if self.is_oracle else q.input for q in queries]
        ids, sc = self.index.search(texts, k, exclude=exclude)
        return Hits(ids, sc.astype(np.float64))


class DenseRetriever:
    """Query embeddings against a faiss inner-product index of demonstration embeddings."""

    is_oracle = False

    def __init__(self, name: str, pool_emb: np.ndarray, embed_queries, factory: str = "Flat"):
        self.name = name
        self.pool_emb = pool_emb
        self.index = build_index(pool_emb, factory)
        self.embed_queries = embed_queries

    def query_embeddings(self, queries: Sequence[Example]) -> np.ndarray:
        return self.embed_queries([q.input for q in queries])

    def retrieve(self, queries, k, exclude=None):
        ids, sc = search(self.index, self.query_embeddings(queries), k + (exclude is not None))
        return _drop_excluded(ids, sc, exclude, k)


RRF_K = 60  # Cormack, Clarke & Buettcher (SIGIR 2009): the constant they fixed for every collection; not tuned here


def rrf_fuse(rankings: Sequence[np.ndarray], k: int, c: int = RRF_K) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal-rank fusion of one query's rankings (arrays of pool ids, best first): each id scores
    ``sum over rankings of 1 / (c + rank)`` (rank from 1; absent from a ranking: no term). Returns the ``k`` best
    ids and their fused scores; ties go to the id ranked best in the earliest ranking (deterministic)."""
    score: dict[int, float] = {}
    first: dict[int, tuple[int, int]] = {}
    for r_i, ranking in enumerate(rankings):
        for pos, i in enumerate(int(x) for x in ranking):
            score[i] = score.get(i, 0.0) + 1.0 / (c + pos + 1)
            first.setdefault(i, (r_i, pos))
    order = sorted(score, key=lambda i: (-score[i], first[i]))[:k]
    return np.array(order, dtype=np.int64), np.array([score[i] for i in order], dtype=np.float64)


class FusionRetriever:
    """Several first stages fused by reciprocal rank (:func:`rrf_fuse`): each retrieves its top ``k`` and the fused
    top ``k`` is returned. ``hybrid`` is the trained dual encoder with BM25: the dense ranking carries what the LM's
    labels taught, BM25 the exact lexical matches (near-duplicate inputs) a dense encoder can rank lower."""

    is_oracle = False

    def __init__(self, name: str, parts: Sequence):
        self.name, self.parts = name, list(parts)

    def retrieve(self, queries, k, exclude=None):
        hits = [p.retrieve(queries, k, exclude) for p in self.parts]
        n = min(h.ids.shape[1] for h in hits)  # every part's k (the pool may be smaller than k)
        ids, sc = np.empty((len(queries), n), dtype=np.int64), np.empty((len(queries), n), dtype=np.float64)
        for q in range(len(queries)):
            ids[q], sc[q] = rrf_fuse([h.ids[q] for h in hits], n)
        return Hits(ids, sc)


class LMOracleRetriever:
    """BM25-Oracle's top ``L`` candidates, re-ranked by the scoring LM with the gold output (ties by id).

    ``L`` is ``retrieve.oracle_candidates`` (default: ``candidates.L``, the label set's L, so LM-Oracle is what the
    labels could teach). Costs ``L`` scored sequences per query, like label generation, scored in chunks with a
    progress bar and reusing the run root's score cache (the same sequences as labels); returns ``min(k, L)`` ids."""

    name, is_oracle = "lm-oracle", True

    def __init__(
        self,
        pool: Sequence[Example],
        task,  # or the run's prompt format (epr.prompt.PromptFormat): what the scoring LM reads
        scorer,
        L: int = 50,
        backend: str = "bm25s",
        cache=None,
        chunk: int = 32,
    ):
        self.pool, self.task, self.scorer, self.L = pool, task, scorer, L
        self.cache, self.chunk = cache, chunk
        self.first = BM25Retriever(pool, "output", backend, oracle=True)

    def _scores(self, ctx: list[str], tgt: list[str]) -> np.ndarray:
        from epr.lm.score_cache import cached_scores

        s = cached_scores(self.scorer, self.cache, ctx, tgt, "lm-oracle", progress=False)  # retrieve's bar
        return np.where(np.isnan(s), -np.inf, s)  # a candidate too long for the LM's context ranks last

    def retrieve(self, queries, k, exclude=None):
        from tqdm.auto import tqdm

        cand = self.first.retrieve(queries, self.L, exclude).ids
        t = as_format(self.task)
        out = np.empty((len(queries), min(k, cand.shape[1])), dtype=cand.dtype)
        out_sc = np.empty(out.shape, dtype=np.float64)
        bar = tqdm(total=len(queries), desc=f"lm-oracle (L={self.L})", unit="query")
        for s0 in range(0, len(queries), self.chunk):
            qs, cs = queries[s0 : s0 + self.chunk], cand[s0 : s0 + self.chunk]
            ctx = [t.render([self.pool[c]], q) for q, row in zip(qs, cs) for c in row]
            tgt = [t.target(q) for q, row in zip(qs, cs) for _ in row]
            sc = self._scores(ctx, tgt).reshape(cs.shape)
            order = np.lexsort((cs, -sc), axis=1)[:, :k]  # best score first, ties by id
            out[s0 : s0 + len(qs)] = np.take_along_axis(cs, order, axis=1)
            out_sc[s0 : s0 + len(qs)] = np.take_along_axis(sc, order, axis=1)
            bar.update(len(qs))
        bar.close()
        return Hits(out, out_sc)


KNOWN = RETRIEVERS  # the names a config may use


def pool_embeddings(de, encoder: str | Path, texts: list[str], cache_root: Path | None) -> np.ndarray:
    """The prompt tower's embeddings of the pool's demonstrations, computed once per trained encoder and pool and
    kept in ``<run_root>/.cache/pool_embeddings/`` (select, retrieve and the next round's mining embed the same
    pool with the same encoder). Keyed by the content of the encoder's files (weights, tokenizer, its
    ``dual_encoder.json``: max length, similarity, fields) and of the texts, so a retrained encoder or an edited
    pool is never served another's embeddings; and by the device where it is not the CPU (a GPU's fp32 sums round
    otherwise; CPU keys are those of before). ``cache_root`` None: computed, not kept."""
    import hashlib
    import io

    from epr.artifacts import atomic_write_bytes
    from epr.cache import cached_digest, fingerprint

    if cache_root is None:
        return de.encode(texts, "prompt", progress=True)
    files = sorted(f for f in Path(encoder).rglob("*") if f.is_file())
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    what = {
        "encoder": {str(f.relative_to(encoder)): cached_digest(f, full=True) for f in files},
        "texts": [len(texts), h.hexdigest()],
        "side": "prompt",
    }
    dev = str(next(de.parameters()).device)
    if dev != "cpu":
        what["device"] = dev.split(":")[0]
    key = fingerprint(what)
    path = Path(cache_root) / "pool_embeddings" / f"{key}.npy"
    if path.exists():
        emb = np.load(path)
        if emb.shape[0] == len(texts):
            log.info("pool embeddings of %d demonstrations served by %s", len(texts), path)
            return emb
    emb = de.encode(texts, "prompt", progress=True)
    buf = io.BytesIO()
    np.save(buf, emb)
    try:
        atomic_write_bytes(path, buf.getvalue())
    except OSError as e:  # a read-only run root (a shipped retriever): served, not kept
        log.warning("pool embeddings not kept in %s: %s", path.parent, e)
    return emb


def make_retriever(
    name: str,
    pool: Sequence[Example],
    task,
    cfg,
    encoder: str | None = None,
    loaded: dict | None = None,
    fmt=None,
) -> Retriever:
    """Build a retriever by name. ``encoder``: the trained dual encoder's folder (``epr``, ``dr-bm25``); the
    pipeline says which. ``loaded`` caches loaded models (encoders, the scoring LM) between retrievers. ``fmt``: the
    run's prompt format for the scoring LM, which LM-Oracle scores in (default: the task's own)."""
    from epr.lm.identity import default_device
    from epr.lm.models import load_encoder

    loaded = {} if loaded is None else loaded
    if name == "random":
        return RandomRetriever(pool, cfg.seed)
    if name == "bm25":
        return BM25Retriever(pool, "input", cfg.candidates.backend)
    if name == "bm25-oracle":
        return BM25Retriever(pool, "output", cfg.candidates.backend, oracle=True)
    if name == "lm-oracle":
        from epr.lm.factory import build_scorer, score_cache

        if "lm" not in loaded:
            loaded["lm"] = build_scorer(cfg)
        L = cfg.retrieve.oracle_candidates or cfg.candidates.L
        return LMOracleRetriever(
            pool, fmt or task, loaded["lm"], L, cfg.candidates.backend, cache=score_cache(cfg)
        )
    if name == "sbert":
        st = loaded.setdefault("sbert", load_encoder(cfg.models.encoder, cfg.models.cache_dir))

        def enc(texts):
            return st.encode(list(texts), batch_size=128, normalize_embeddings=True, convert_to_numpy=True)

        return DenseRetriever("sbert", enc([e.input for e in pool]), enc, cfg.retrieve.index_factory)
    if name in ("epr", "dr-bm25"):
        from epr.encoder.model import DualEncoder

        if encoder is None or not Path(encoder).exists():
            raise FileNotFoundError(f"retriever {name}: no trained encoder at {encoder}; run training first")
        if str(encoder) not in loaded:  # (loaded once: setdefault would load it on every call)
            # on the device the LMs use: a GPU encodes the pool and the queries there, not on its host's cores
            loaded[str(encoder)] = DualEncoder.from_pretrained(str(encoder)).to(default_device())
        de = loaded[str(encoder)]
        key = (str(encoder), "pool")  # epr and hybrid in one run encode the pool once
        if key not in loaded or loaded[key][0] is not pool:  # the pool object kept beside its embeddings
            texts = [de.demo(task, e) for e in pool]
            loaded[key] = (pool, pool_embeddings(de, encoder, texts, Path(cfg.run_root) / ".cache"))
        pool_emb = loaded[key][1]
        return DenseRetriever(
            name, pool_emb, lambda texts: de.encode(list(texts), "query"), cfg.retrieve.index_factory
        )
    if name == "hybrid":
        parts = [make_retriever(n, pool, task, cfg, encoder, loaded) for n in ("epr", "bm25")]
        return FusionRetriever("hybrid", parts)
    raise ValueError(f"unknown retriever {name!r}; known: {', '.join(KNOWN)}")
