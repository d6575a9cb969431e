"""Every retriever behind one protocol (``epr.types.Retriever``), so the comparison grid is a loop.

Unsupervised: ``random``, ``bm25`` (over inputs), ``sbert`` (frozen encoder, cosine; KATE).
Learned: ``epr`` (trained dual encoder, inner product over a faiss index); ``dr-bm25`` is the same class
pointed at an encoder trained on BM25 labels (a sub-run in ``<run_dir>/dr-bm25/``, trained on first use). Oracles (they see the gold output; never a fair baseline):
``bm25-oracle`` (BM25 over outputs with the gold y) and ``lm-oracle`` (those candidates re-ranked by the scoring LM's
log p(y_test | e, x_test), the label-generation score applied to the test example).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from epr.bm25 import BM25Index
from epr.index import build_index, search
from epr.types import Example

__all__ = [
    "RandomRetriever",
    "BM25Retriever",
    "DenseRetriever",
    "LMOracleRetriever",
    "make_retriever",
    "ORACLES",
]

ORACLES = {"bm25-oracle", "lm-oracle"}

log = logging.getLogger(__name__)


def _drop_excluded(ids: np.ndarray, exclude: np.ndarray | None, k: int) -> np.ndarray:
    """Rows of ``ids`` (over-fetched by one) without the excluded id, cut to ``k``."""
    if exclude is None:
        return ids[:, :k]
    out = np.empty((ids.shape[0], min(k, ids.shape[1])), dtype=np.int64)
    for i, row in enumerate(ids):
        row = row[(row != exclude[i]) & (row >= 0)]
        out[i] = row[: out.shape[1]]
    return out


class RandomRetriever:
    name, is_oracle = "random", False

    def __init__(self, pool: Sequence[Example], seed: int = 0):
        self.n, self.seed = len(pool), seed

    def retrieve(self, queries, k, exclude=None):
        out = np.empty((len(queries), min(k, self.n - 1)), dtype=np.int64)
        for i, q in enumerate(queries):  # per-query draw from (seed, query idx): order-independent
            perm = np.random.default_rng([self.seed, q.idx]).permutation(self.n)
            if exclude is not None:
                perm = perm[perm != exclude[i]]
            out[i] = perm[: out.shape[1]]
        return out


class BM25Retriever:
    def __init__(
        self, pool: Sequence[Example], view: str = "input", backend: str = "bm25s", oracle: bool = False
    ):
        self.view, self.is_oracle = view, oracle
        self.name = "bm25-oracle" if oracle else "bm25"
        self.index = BM25Index([e.output if view == "output" else e.input for e in pool], backend)

    def retrieve(self, queries, k, exclude=None):
        texts = [q.output if self.is_oracle else q.input for q in queries]
        return self.index.search(texts, k, exclude=exclude)[0]


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
        ids, _ = search(self.index, self.query_embeddings(queries), k + (exclude is not None))
        return _drop_excluded(ids, exclude, k)


class LMOracleRetriever:
    """BM25-Oracle's top ``L`` candidates, re-ranked by the scoring LM with the gold output (ties by id).

    ``L`` is ``retrieve.oracle_candidates`` (default: ``candidates.L``, the label set's L, so LM-Oracle is what the
    labels could teach). Costs ``L`` scored sequences per query, like label generation, scored in chunks with a
    progress bar and reusing the run root's score cache (the same sequences as labels); returns ``min(k, L)`` ids."""

    name, is_oracle = "lm-oracle", True

    def __init__(
        self,
        pool: Sequence[Example],
        task,
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
        s = np.full(len(ctx), -np.inf)  # a candidate too long for the LM's context ranks last
        known = self.cache.get(ctx, tgt) if self.cache is not None else [None] * len(ctx)
        todo = [i for i, v in enumerate(known) if v is None]
        for i, v in enumerate(known):
            if v is not None:
                s[i] = v
        if todo:
            pairs = self.scorer.encode([ctx[i] for i in todo], [tgt[i] for i in todo])
            long = set(self.scorer.too_long(pairs))
            ok = [j for j in range(len(todo)) if j not in long]
            vals = np.round(self.scorer.score_ids([pairs[j] for j in ok]), 4) if ok else []
            for j, v in zip(ok, vals):
                s[todo[j]] = v
            if self.cache is not None and ok:
                self.cache.put(
                    [ctx[todo[j]] for j in ok], [tgt[todo[j]] for j in ok], list(vals), "lm-oracle"
                )
        return s

    def retrieve(self, queries, k, exclude=None):
        from tqdm.auto import tqdm

        cand = self.first.retrieve(queries, self.L, exclude)
        t = self.task
        out = np.empty((len(queries), min(k, cand.shape[1])), dtype=cand.dtype)
        bar = tqdm(total=len(queries), desc=f"lm-oracle (L={self.L})", unit="query")
        for s0 in range(0, len(queries), self.chunk):
            qs, cs = queries[s0 : s0 + self.chunk], cand[s0 : s0 + self.chunk]
            ctx = [
                t.format_demo(self.pool[c]) + t.format_query(q.input) for q, row in zip(qs, cs) for c in row
            ]
            tgt = [t.format_target(q.output) for q, row in zip(qs, cs) for _ in row]
            sc = self._scores(ctx, tgt).reshape(cs.shape)
            order = np.lexsort((cs, -sc), axis=1)  # best score first, ties by id
            out[s0 : s0 + len(qs)] = np.take_along_axis(cs, order, axis=1)[:, :k]
            bar.update(len(qs))
        bar.close()
        return out


def dr_bm25_config(cfg):
    """DR-BM25's run: this run's config with BM25-ranked labels (no LM scoring), in ``<run_dir>/dr-bm25/``."""
    import dataclasses

    return dataclasses.replace(
        cfg, name=f"{cfg.name}/dr-bm25", labels=dataclasses.replace(cfg.labels, source="bm25")
    )


def dr_bm25_encoder(cfg):
    """The DR-BM25 dual encoder: trained (or reused when fresh) by the sub-run of :func:`dr_bm25_config`:
    same candidates, positives / negatives ranked by BM25 instead of the LM (SPEC 2.6), same training."""
    from epr import pipeline
    from epr.stages.context import Context

    sub = Context(dr_bm25_config(cfg))
    ran = pipeline.run(sub, until="encoder")
    log.info("dr-bm25: encoder in %s (%s)", sub.stage_dir("encoder"), "trained" if ran else "fresh, reused")
    return sub.stage_dir("encoder") / "model"


def make_retriever(name: str, pool: Sequence[Example], task, cfg, run_dir, encoders: dict):
    """Build a retriever by name. ``encoders`` caches loaded models (encoders, the scoring LM) between retrievers."""
    from epr.encoder import DualEncoder
    from epr.models import load_encoder

    if name == "random":
        return RandomRetriever(pool, cfg.seed)
    if name == "bm25":
        return BM25Retriever(pool, "input", cfg.candidates.backend)
    if name == "bm25-oracle":
        return BM25Retriever(pool, "output", cfg.candidates.backend, oracle=True)
    if name == "lm-oracle":
        from epr.models import load_lm_for
        from epr.scoring import LMScorer

        key = f"lm:{cfg.models.lm}"
        if key not in encoders:
            encoders[key] = load_lm_for(cfg.models)
        from epr.stages.scores import score_cache

        scorer = LMScorer(*encoders[key], batch_tokens=cfg.scoring.batch_tokens, forward=cfg.scoring.forward)
        L = cfg.retrieve.oracle_candidates or cfg.candidates.L
        return LMOracleRetriever(pool, task, scorer, L, cfg.candidates.backend, cache=score_cache(cfg))
    if name == "sbert":
        st = encoders.setdefault("sbert", load_encoder(cfg.models.encoder, cfg.models.cache_dir))

        def enc(texts):
            return st.encode(list(texts), batch_size=128, normalize_embeddings=True, convert_to_numpy=True)

        return DenseRetriever("sbert", enc([e.input for e in pool]), enc, cfg.retrieve.index_factory)
    if name in ("epr", "dr-bm25"):
        path = run_dir / "encoder" / "model" if name == "epr" else dr_bm25_encoder(cfg)
        if not path.exists():
            raise FileNotFoundError(f"retriever {name}: no trained encoder at {path}; run training first")
        de = encoders.setdefault(str(path), DualEncoder.from_pretrained(str(path)))
        pool_emb = de.encode([task.format_demo(e).strip() for e in pool], "prompt", progress=True)
        return DenseRetriever(
            name, pool_emb, lambda texts: de.encode(list(texts), "query"), cfg.retrieve.index_factory
        )
    raise ValueError(
        f"unknown retriever {name!r}; known: random, bm25, sbert, epr, dr-bm25, bm25-oracle, lm-oracle"
    )
