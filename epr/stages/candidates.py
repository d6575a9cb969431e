"""Stage ``candidates``: for each labelled training example, L candidates from the pool by BM25 (round 1) or by a
trained retriever (iterative re-mining, round r + 1).

The default view searches the *outputs* (query y, corpus all y_j), as EPR does. The example itself is
excluded by id. Which training examples get labelled: all, or the first ``num_queries`` of a seeded permutation
(nested: a larger set contains the smaller ones).

Re-mining (``candidates.miner: retriever``, UDR / LLM-R): the trained dual encoder of ``candidates.mine_run``
retrieves each labelled example's L candidates (query tower on its input, prompt tower on the pool), so the LM
scores the demonstrations the retriever now believes in, and the next training round sees its own mistakes as
hard negatives. The round-r encoder's fingerprint and the round number are part of this stage's key; the scores
stage then scores only the pairs the run root's score cache does not already hold.

Mixed (``candidates.miner: mixed``): the retriever's top ceil(L / 2) and BM25's best that are not among them, up to L
(half retriever-mined, half output-mined): where re-mining finds few good demonstrations (SMCalFlow,
results/smcalflow-curve-round2/README.md), BM25-over-outputs keeps the candidates the LM rated well in round 1.
Each candidate keeps its own miner's score.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from epr.artifacts import write_jsonl
from epr.cache import read_manifest
from epr.context import Context
from epr.retrieval.bm25 import BM25Index
from epr.types import ConfigError, Example, Ranking

log = logging.getLogger(__name__)


def view_text(ex: Example, view: str) -> str:
    if view == "output":
        return ex.output
    if view == "input":
        return ex.input
    return f"{ex.input} {ex.output}"


def query_ids(n_pool: int, num_queries: int | None, seed: int) -> np.ndarray:
    """The first ``num_queries`` of a seeded permutation of the pool, in that order.

    Nested: a larger label set contains every smaller one of the same seed (so it reuses their scores), and the
    scoring stage keeps that order at the level of blocks (``epr.stages.scores.nested_blocks``: 250, 500, 1,000,
    ... queries), so the first chunks of a long scoring run form the smaller sets."""
    if num_queries is None or num_queries >= n_pool:
        return np.arange(n_pool)
    return np.random.default_rng(seed).permutation(n_pool)[:num_queries]


def mine(
    pool: list[Example], qids: np.ndarray, L: int, view: str, backend: str, progress: bool = True
) -> list[Ranking]:
    index = BM25Index([view_text(e, view) for e in pool], backend)
    ids, scores = index.search([view_text(pool[q], view) for q in qids], L, exclude=qids, progress=progress)
    return rankings_of(qids, ids, scores)


def rankings_of(qids, ids, scores) -> list[Ranking]:
    """One ranking per labelled example from a search's ``(ids, scores)`` rows."""
    return [
        Ranking(int(q), i.tolist(), [round(float(s), 5) for s in sc]) for q, i, sc in zip(qids, ids, scores)
    ]


def mine_with_retriever(ctx: Context, qids: np.ndarray, L: int | None = None) -> tuple[list[Ranking], int]:
    """``L`` (default ``candidates.L``) candidates per labelled example from the trained encoder of the round before
    (this run's, or ``candidates.mine_run``'s), the example itself excluded."""
    import dataclasses

    from epr.retrieval.retrievers import make_retriever
    from epr.types import ConfigError, UpstreamError

    cfg, pool, rnd = ctx.cfg, ctx.examples("pool"), ctx.this_round
    d = rnd.mine_dir
    # an in-run round's encoder is fresh here (the pipeline's ``rounds`` stage, upstream, checked it); an outside
    # mine_run's is named by its manifest
    ident = rnd.outside_identity() if rnd.outside else {"encoder": "in-run", "round": rnd.number()}
    if d.resolve() == Path(cfg.run_dir).resolve():
        raise ConfigError(
            f"candidates.mine_run={rnd.mine_run} is this run: round r + 1 needs its own run name "
            "(--set name=...) that mines with round r's"
        )
    if ident["encoder"] is None or not (d / "encoder" / "model").exists():
        raise UpstreamError(
            f"candidates.mine_run={rnd.mine_run}: no trained encoder in {d / 'encoder'}; train that "
            "run first (epr run --until encoder with its config)"
        )
    mine_ex, my_ex = read_manifest(d / "examples"), read_manifest(ctx.stage_dir("examples"))
    if (mine_ex or {}).get("fingerprint") != (my_ex or {}).get("fingerprint"):
        raise UpstreamError(
            f"candidates.mine_run={rnd.mine_run}: its pool ({d / 'examples'}) is not this run's "
            f"({ctx.stage_dir('examples')}); the encoder's ids would point at other examples"
        )
    # exact search (Flat), whatever retrieve.index_factory says: the candidates' key does not hold that setting
    flat = dataclasses.replace(cfg, retrieve=dataclasses.replace(cfg.retrieve, index_factory="Flat"))
    r = make_retriever("epr", pool, ctx.task, flat, str(d / "encoder" / "model"))
    hits = r.retrieve([pool[int(q)] for q in qids], L or cfg.candidates.L, exclude=qids)
    return rankings_of(qids, hits.ids, hits.scores), ident["round"]


def mix(first: list[Ranking], second: list[Ranking], L: int) -> list[Ranking]:
    """Per query: ``first``'s top ceil(L / 2), then ``second``'s best not among them, up to ``L`` (each with its own
    score)."""
    out = []
    for a, b in zip(first, second, strict=True):
        ids, sc = list(a.ids[: (L + 1) // 2]), list(a.scores[: (L + 1) // 2])
        for i, s in zip(b.ids, b.scores):
            if len(ids) == L:
                break
            if i not in ids:
                ids.append(i)
                sc.append(s)
        out.append(Ranking(a.qid, ids, sc))
    return out


def held_out_ids(cfg, n_pool: int) -> np.ndarray:
    """The pool examples ``select`` compares the retrievers on (``select.size``, seeded): never labelled queries.
    Drawn from the examples ``candidates.num_queries`` leaves unlabelled; when every example would be labelled
    (``num_queries`` null) the slice, at most a fifth of the pool, is drawn first and left out of the labelled set.
    Sorted ids."""
    s = cfg.select
    if s.size <= 0:
        return np.zeros(0, dtype=np.int64)
    c = cfg.candidates
    rng = np.random.default_rng(s.seed)
    if c.num_queries is None or c.num_queries >= n_pool:
        free, size = np.arange(n_pool), min(s.size, n_pool // 5)
    else:
        free = np.setdiff1d(np.arange(n_pool), query_ids(n_pool, c.num_queries, c.query_seed))
        size = min(s.size, len(free))
    return np.sort(rng.permutation(free)[:size]).astype(np.int64)


def labelled_ids(cfg, n_pool: int) -> np.ndarray:
    """The pool examples whose candidates the LM scores: :func:`query_ids`, less the ``select`` slice where the
    labels would take the whole pool."""
    c = cfg.candidates
    qids = query_ids(n_pool, c.num_queries, c.query_seed)
    if cfg.select.size > 0 and (c.num_queries is None or c.num_queries >= n_pool):
        qids = np.setdiff1d(qids, held_out_ids(cfg, n_pool))
    return qids


def check_dev_size(ctx: Context, trains: tuple[str, ...] = ("encoder",)) -> None:
    """Refuse a held-out share that leaves no instance to train on: ``train.dev_size`` where the run trains the
    encoder, ``reward.dev_size`` where it trains the reward model (``trains``). ``epr.pipeline.run`` asks before the
    LM scores a label for a run that goes on to train (the training stage would refuse it only after the scoring)."""
    num_queries = ctx.cfg.candidates.num_queries
    n_pool = len(ctx.examples("pool"))
    n_labelled = len(labelled_ids(ctx.cfg, n_pool))
    sizes = {
        "encoder": ("train.dev_size", ctx.cfg.train.dev_size),
        "reward": ("reward.dev_size", ctx.cfg.reward.dev_size),
    }
    for setting, dev_size in (sizes[t] for t in trains):
        if dev_size < n_labelled:
            continue
        less = " less the select slice" if n_labelled < min(n_pool, num_queries or n_pool) else ""
        suggest = min(max(1, n_labelled // 10), n_labelled - 1) if n_labelled > 1 else 0  # a tenth, never all
        raise ConfigError(
            f"{setting}={dev_size} would leave no training instances: the run labels {n_labelled} pool examples "
            f"(candidates.num_queries={num_queries}, a pool of {n_pool}{less}); set {setting} below {n_labelled} "
            f"(e.g. --set {setting}={suggest}), or 0 for no dev metrics"
        )


def mine_round(ctx: Context, qids: np.ndarray, L: int) -> tuple[list[Ranking], int, str]:
    """``L`` candidates per example of ``qids`` as this round mines them (``candidates.miner``): the rankings, the
    round number and, in words, who mined. The ``candidates`` stage mines ``candidates.L``; the ``teacher`` stage the
    wider ``reward.teach_k``."""
    c, pool = ctx.cfg.candidates, ctx.examples("pool")
    miner, by = ctx.this_round.miner, ctx.this_round.mine_dir
    if miner == "retriever":
        rankings, rnd = mine_with_retriever(ctx, qids, L)
        return rankings, rnd, f"the trained encoder of {by}"
    if miner == "mixed":
        retrieved, rnd = mine_with_retriever(ctx, qids, L)
        rankings = mix(retrieved, mine(pool, qids, L, c.view, c.backend), L)
        return (
            rankings,
            rnd,
            f"the trained encoder of {by} (top {(L + 1) // 2}) and {c.backend} over {c.view}",
        )
    return mine(pool, qids, L, c.view, c.backend), 1, f"{c.backend} over {c.view}"


def run_candidates(ctx: Context, out, fp: str) -> dict:
    c = ctx.cfg.candidates
    pool = ctx.examples("pool")
    qids = labelled_ids(ctx.cfg, len(pool))
    rankings, rnd, how = mine_round(ctx, qids, c.L)
    n = write_jsonl(out / "candidates.jsonl", rankings)
    L = min(c.L, len(pool) - 1)  # what a query can get: the pool less itself
    capped = f" (candidates.L={c.L} capped: the pool holds {len(pool)} examples, a query never its own)"
    level = logging.WARNING if L < c.L else logging.INFO
    log.log(
        level, "candidates (round %d): %d queries x L=%d%s (%s)", rnd, n, L, capped if L < c.L else "", how
    )
    return {"rows": {"queries": n}, "extra": {"round": rnd, "L": L, **({"L_asked": c.L} if L < c.L else {})}}
