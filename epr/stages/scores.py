"""Stage ``scores``: s(e_l) = log p(y | e_l, x) for every candidate of every labelled training example.

Work is cut into chunks of ``scoring.chunk_size`` training examples. Chunk c is scored by process
``c % world`` and written atomically as ``parts/chunk-<c>.jsonl``; finished chunks are skipped on restart,
so a killed run resumes and the merged ``scores.jsonl`` (sorted by query id) is byte-identical. A
candidate sequence longer than the LM context gets score ``null``; it is logged and counted, and the
labels stage leaves it out.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tqdm.auto import tqdm

from epr.artifacts import read_jsonl, write_jsonl
from epr.scoring import LMScorer
from epr.stages.context import Context
from epr.types import Example, Ranking

log = logging.getLogger(__name__)


def build_scorer(ctx: Context) -> LMScorer:
    from epr.models import load_lm_for

    m = ctx.cfg.models
    device = "cuda" if _cuda() else "cpu"
    if ctx.dist.world > 1 and device == "cuda":
        device = f"cuda:{ctx.dist.rank}"
    model, tok = load_lm_for(m, device=device)
    sc = ctx.cfg.scoring
    return LMScorer(model, tok, batch_tokens=sc.batch_tokens, forward=sc.forward, compile=sc.compile)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def score_chunk(
    scorer: LMScorer, task, pool: list[Example], rankings: list[Ranking]
) -> tuple[list[dict], int]:
    """Score one chunk of rankings; returns rows ``{qid, ids, scores}`` and the number of too-long pairs."""
    contexts, targets, where = [], [], []
    for r in rankings:
        x = pool[r.qid]
        for j, cid in enumerate(r.ids):
            contexts.append(task.format_demo(pool[cid]) + task.format_query(x.input))
            targets.append(task.format_target(x.output))
            where.append((r.qid, j))
    pairs = scorer.encode(contexts, targets)
    too_long = set(scorer.too_long(pairs))
    for i in sorted(too_long):
        log.warning(
            "scores: query %d, candidate #%d is longer than the LM context; score left null", *where[i]
        )
    keep = [i for i in range(len(pairs)) if i not in too_long]
    vals = scorer.score_ids([pairs[i] for i in keep]) if keep else []
    flat: list[float | None] = [None] * len(pairs)
    for i, v in zip(keep, vals):
        flat[i] = round(float(v), 4)
    rows, k = [], 0
    for r in rankings:
        rows.append({"qid": r.qid, "ids": r.ids, "scores": flat[k : k + len(r.ids)]})
        k += len(r.ids)
    return rows, len(too_long)


def run_scores(ctx: Context, out: Path, fp: str) -> dict:
    cs = ctx.cfg.scoring.chunk_size
    pool = ctx.examples("pool")
    rankings = ctx.rankings("candidates", "candidates.jsonl")
    parts = out / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    # a fingerprint file guards the chunks: chunks from another config are never reused
    stamp = parts / "FINGERPRINT"
    if ctx.dist.is_main:
        if stamp.exists() and stamp.read_text() != fp:
            for f in parts.glob("chunk-*.jsonl"):
                f.unlink()
        stamp.write_text(fp)
    ctx.dist.barrier()
    chunks = [rankings[i : i + cs] for i in range(0, len(rankings), cs)]
    mine = [c for c in range(len(chunks)) if c % ctx.dist.world == ctx.dist.rank]
    todo = [c for c in mine if not (parts / f"chunk-{c:06d}.jsonl").exists()]
    log.info("scores: %d chunks for this process, %d already done", len(mine), len(mine) - len(todo))
    too_long = 0
    if todo:
        scorer = build_scorer(ctx)
        n_seq = sum(len(r.ids) for c in todo for r in chunks[c])
        bar = tqdm(
            total=n_seq, desc=f"scoring [rank {ctx.dist.rank}]", unit="seq", disable=not ctx.dist.is_main
        )
        for c in todo:
            rows, tl = score_chunk(scorer, ctx.task, pool, chunks[c])
            too_long += tl
            write_jsonl(parts / f"chunk-{c:06d}.jsonl", rows)
            bar.update(sum(len(r.ids) for r in chunks[c]))
        bar.close()
    ctx.dist.barrier()
    if not ctx.dist.is_main:
        return {}
    merged: dict[int, dict] = {}
    for c in range(len(chunks)):
        for row in read_jsonl(parts / f"chunk-{c:06d}.jsonl"):
            merged[row["qid"]] = row
    missing = [r.qid for r in rankings if r.qid not in merged]
    if missing:
        raise RuntimeError(
            f"scores: {len(missing)} queries have no scores after merging (first {missing[:5]})"
        )
    rows = [merged[q] for q in sorted(merged)]
    n_null = sum(s is None for r in rows for s in r["scores"])
    write_jsonl(out / "scores.jsonl", rows)
    return {"rows": {"queries": len(rows), "sequences": sum(len(r["ids"]) for r in rows), "too_long": n_null}}
