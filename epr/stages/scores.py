"""Stage ``scores``: s(e_l) = log p(y | e_l, x) for every candidate of every labelled training example.

Work is cut into chunks of ``scoring.chunk_size`` training examples. Chunk c is scored by process
``c % world`` and written atomically to ``parts/`` (an ``epr.cache.ChunkStore``: a chunk is served again only
under the same fingerprint and for the same rankings); finished chunks are skipped on restart, so a killed run
resumes and the merged ``scores.jsonl`` (sorted by query id) is byte-identical. A
candidate sequence longer than the LM context gets score ``null``; it is logged and counted, and the
labels stage leaves it out.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from epr.artifacts import write_jsonl
from epr.cache import ChunkStore
from epr.context import Context
from epr.lm.factory import build_scorer, device_for_rank, gpu_memory, score_cache
from epr.lm.score_cache import ScoreCache
from epr.prompt import as_format
from epr.reports.machine import describe, machine
from epr.types import Example, Ranking

if TYPE_CHECKING:
    from epr.lm.scoring import LMScorer

log = logging.getLogger(__name__)


def scored_pairs(
    fmt, pool: list[Example], rankings: list[Ranking]
) -> tuple[list[str], list[str], list[str], list[tuple[int, int]]]:
    """What the LM scores for each candidate of each ranking, rendered by the run's prompt format ``fmt`` (a
    :class:`epr.prompt.PromptFormat`; a task stands for its own): (the context's start that the
    demonstration fixes, context = the prompt of the demonstration and the query, target = the query's gold answer,
    (qid, candidate position)), four parallel lists."""
    fmt = as_format(fmt)
    demos, contexts, targets, where = [], [], [], []
    for r in rankings:
        x = pool[r.qid]
        target = fmt.target(x)
        for j, cid in enumerate(r.ids):
            demos.append(fmt.shared_prefix(pool[cid], x))
            contexts.append(fmt.render([pool[cid]], x))
            targets.append(target)
            where.append((r.qid, j))
    return demos, contexts, targets, where


def run_pair_keys(ctx: Context) -> set[str]:
    """The score-cache keys of every pair this run's scores stages score (every round's candidates): what `epr
    cache export --this-run` ships, so a results folder holds all of its own labels and nothing else."""
    from epr.lm.score_cache import pair_key

    keys: set[str] = set()
    for r in ctx.rounds():
        _, contexts, targets, _ = scored_pairs(
            r.prompt(), r.examples("pool"), r.rankings("candidates", "candidates.jsonl")
        )
        keys |= {pair_key(c, t) for c, t in zip(contexts, targets)}
    return keys


def score_chunk(
    scorer: LMScorer,
    fmt,
    pool: list[Example],
    rankings: list[Ranking],
    cache: ScoreCache | None = None,
    name: str = "",
    timing: dict[str, float] | None = None,
) -> tuple[list[dict], int]:
    """Score one chunk of rankings; returns rows ``{qid, ids, scores}`` and the number of too-long pairs.

    Pairs found in ``cache`` are not scored again; the new scores are added to it. ``timing``: seconds added to its
    ``prepare`` (prompts, cache lookups, tokenisation), ``lm`` (the scorer, synchronised: it returns host arrays) and
    ``store`` (the cache's writes), so a run can say where its scoring time went (on a GPU the LM part can be the
    small one)."""
    clock = time.perf_counter()
    demos, contexts, targets, where = scored_pairs(fmt, pool, rankings)
    flat: list[float | None] = [None] * len(contexts)
    cached = cache.get(contexts, targets) if cache is not None else flat
    todo = [i for i, v in enumerate(cached) if v is None]
    pairs = scorer.encode([contexts[i] for i in todo], [targets[i] for i in todo]) if todo else []
    too_long = {todo[i] for i in scorer.too_long(pairs)} if todo else set()
    for i in sorted(too_long):
        log.warning(
            "scores: query %d, candidate #%d is longer than the LM context; score left null", *where[i]
        )
    keep = [i for i in todo if i not in too_long]
    pos = {i: j for j, i in enumerate(todo)}
    t_lm = time.perf_counter()
    if keep and scorer.prefix_share:
        vals = scorer.score_prefixed(
            [demos[i] for i in keep],
            [contexts[i] for i in keep],
            [targets[i] for i in keep],
            pairs=[pairs[pos[i]] for i in keep],
        )
    elif keep:
        vals = scorer.score_pairs(
            [contexts[i] for i in keep], [targets[i] for i in keep], [pairs[pos[i]] for i in keep]
        )
    else:
        vals = []
    vals = [round(float(v), 4) for v in vals]
    t_store = time.perf_counter()
    if cache is not None and keep:
        cache.put([contexts[i] for i in keep], [targets[i] for i in keep], vals, name)
    if timing is not None:
        for k, v in (
            ("prepare", t_lm - clock),
            ("lm", t_store - t_lm),
            ("store", time.perf_counter() - t_store),
        ):
            timing[k] = timing.get(k, 0.0) + v
    for i, v in enumerate(cached):
        if v is not None:
            flat[i] = v
    for i, v in zip(keep, vals):
        flat[i] = v
    rows, k = [], 0
    for r in rankings:
        rows.append({"qid": r.qid, "ids": r.ids, "scores": flat[k : k + len(r.ids)]})
        k += len(r.ids)
    return rows, len(too_long)


NEST_BASE = (
    250  # the smallest label set whose chunks come first: then 500, 1,000, 2,000, ... (the curve's sizes)
)


def nested_blocks(n: int, base: int = NEST_BASE) -> list[tuple[int, int]]:
    """Query-order blocks ``[0, base)``, ``[base, 2 base)``, ``[2 base, 4 base)``, ...: every prefix of ``base * 2^k``
    queries (a smaller label set of the same seed, see ``epr.stages.candidates.query_ids``) is a union of whole
    blocks."""
    out, lo, hi = [], 0, min(base, n)
    while lo < n:
        out.append((lo, hi))
        lo, hi = hi, min(2 * hi, n)
    return out


def chunk_rankings(ctx: Context, rankings: list[Ranking], cs: int) -> list[list[Ranking]]:
    """The chunks queries are scored in. With prefix sharing, queries with the same or similar outputs sit together,
    so a chunk's queries share many BM25-over-outputs candidates (on MTOP's full pool, chunks of 200 queries hold
    ~4.5 pairs per distinct demonstration instead of ~1.2 in query order): each demonstration's prefix is computed
    once for all of them. The grouping is done within :func:`nested_blocks` of the query order and no chunk spans
    two blocks, so the first chunks of a long run are exactly a smaller label set's pairs (500 of 2,000 labels are
    done, and cached, after the chunks of the first two blocks), not a sample of every size. Scores do not depend on
    the order (the merged file is sorted by query)."""
    if not ctx.cfg.scoring.prefix_share:
        return [rankings[i : i + cs] for i in range(0, len(rankings), cs)]
    pool = ctx.examples("pool")
    chunks: list[list[Ranking]] = []
    for lo, hi in nested_blocks(len(rankings)):
        block = sorted(rankings[lo:hi], key=lambda r: (pool[r.qid].output, r.qid))
        chunks += [block[i : i + cs] for i in range(0, len(block), cs)]
    return chunks


class _Lazy:
    """An object made on its first attribute access; ``seconds``: how long making it took."""

    def __init__(self, make):
        self._make, self._obj, self.seconds = make, None, 0.0

    def __getattr__(self, name):
        if self._obj is None:
            t = time.perf_counter()
            self._obj = self._make()
            self.seconds = time.perf_counter() - t
        return getattr(self._obj, name)


def run_scores(ctx: Context, out: Path, fp: str) -> dict:
    cs = ctx.cfg.scoring.chunk_size
    pool = ctx.examples("pool")
    rankings = ctx.rankings("candidates", "candidates.jsonl")
    chunks = chunk_rankings(ctx, rankings, cs)
    # a chunk is reused only under this stage fingerprint (scoring key + upstream) and for the same rankings
    order = f"by-output-in-nested-blocks-{NEST_BASE}" if ctx.cfg.scoring.prefix_share else "qid"
    key = {"stage": fp, "chunk_size": cs, "order": order}
    parts = ChunkStore(out / "parts", key, claim=ctx.dist.is_main)
    ctx.dist.barrier()
    mine = [c for c in range(len(chunks)) if c % ctx.dist.world == ctx.dist.rank]
    inputs = {c: [r.to_json() for r in chunks[c]] for c in mine}
    todo = [c for c in mine if parts.get(c, inputs[c]) is None]
    log.info("scores: %d chunks for this process, %d already done", len(mine), len(mine) - len(todo))
    if todo:
        cache = score_cache(ctx.cfg)
        log.info("scores: %d scores in the shared cache %s", len(cache), cache.dir)
        device = device_for_rank(ctx.dist.rank, ctx.dist.world)
        # loaded when a pair is first missing from the stores (labels a cache serves whole, none too long for the
        # LM, need no model: on a GPU its loading was a third of round 1's scores stage)
        scorer = _Lazy(lambda: build_scorer(ctx.cfg, device=device))
        n_seq = sum(len(r.ids) for c in todo for r in chunks[c])
        bar = tqdm(
            total=n_seq, desc=f"scoring [rank {ctx.dist.rank}]", unit="seq", disable=not ctx.dist.is_main
        )
        n0, t0 = len(cache), time.perf_counter()
        timing: dict[str, float] = {}
        for c in todo:
            rows, _ = score_chunk(
                scorer, ctx.prompt(), pool, chunks[c], cache, name=f"{fp}-{c:06d}", timing=timing
            )
            t_part = time.perf_counter()
            parts.put(c, rows, inputs[c])
            timing["store"] = timing.get("store", 0.0) + time.perf_counter() - t_part
            bar.update(sum(len(r.ids) for r in chunks[c]))
        bar.close()
        # this process's own throughput (sequences the LM scored, not those the cache served; a resumed stage
        # reports its last process), for the results files: how long labels take on this machine
        # the model's loading (where a pair needed it) is its own part, out of the throughput and of ``prepare``
        timing["prepare"] = timing.get("prepare", 0.0) - scorer.seconds
        timing["load"] = scorer.seconds
        new, secs = len(cache) - n0, max(time.perf_counter() - t0 - scorer.seconds, 1e-9)
        speed = {
            "scored_here": new,
            "scoring_seconds": round(secs, 1),
            "sequences_per_s": round(new / secs, 2),
            "seconds_by_part": {k: round(v, 1) for k, v in timing.items()},  # prepare, lm, store, load
        }
        # the CUDA allocator's peak and its retries (a full or fragmented GPU is slow); nothing off CUDA
        mem = gpu_memory(device)
        if mem:
            speed["gpu_memory"] = mem
        if cache.served:  # scoring.accept_devices: what other devices' stores answered (the manifest's
            log.info("scores: served by other devices' stores %s", cache.served)  # label_sources: every pair)
        log.info(
            "scores: %d sequences scored in %.0f s (%.2f/s on rank %d; %s)%s",
            new,
            secs,
            new / secs,
            ctx.dist.rank,
            ", ".join(f"{k} {v:.0f} s" for k, v in timing.items()),
            f"; GPU memory {mem}" if mem else "",
        )
    ctx.dist.barrier()
    if not ctx.dist.is_main:
        return {}
    merged: dict[int, dict] = {}
    for c in range(len(chunks)):
        rows = parts.get(c, [r.to_json() for r in chunks[c]])
        if rows is None:
            raise RuntimeError(f"scores: chunk {c} is missing after every process finished ({parts.root})")
        for row in rows:
            merged[row["qid"]] = row
    missing = [r.qid for r in rankings if r.qid not in merged]
    if missing:
        raise RuntimeError(
            f"scores: {len(missing)} queries have no scores after merging (first {missing[:5]})"
        )
    rows = [merged[q] for q in sorted(merged)]
    n_null = sum(s is None for r in rows for s in r["scores"])
    write_jsonl(out / "scores.jsonl", rows)
    res = {"rows": {"queries": len(rows), "sequences": sum(len(r["ids"]) for r in rows), "too_long": n_null}}
    res["extra"] = {"scoring_speed": {"machine": describe(machine()), **speed}} if todo else {}
    if ctx.cfg.scoring.accept_devices and not ctx.cfg.server.base_url:
        # where each of the run's distinct pairs' score comes from (every chunk, every attempt and process): the
        # accepted stores first, then this device's (``missing``: too long for the LM)
        from epr.lm.score_cache import pair_key

        _, contexts, targets, _ = scored_pairs(ctx.prompt(), pool, rankings)
        keys = {pair_key(c, t) for c, t in zip(contexts, targets)}
        res["extra"]["label_sources"] = score_cache(ctx.cfg).sources(keys)
    return res
