"""Stage ``rerank``: RAGSys re-ranking (Algorithm 1) of the first-stage rankings, for ``+div`` / ``+div+bias`` names,
and the reward model's (``+rm``: the first stage's top ``reward.top_k`` re-scored with each query, best first).

Writes ``<name>.jsonl`` for every name of ``retrieve.retrievers``: the first stage's ranking unchanged for a plain
name, the MMR selection (``retrieve.max_demos`` ids) for a re-ranked one. The quality bias (``+bias``) is the mean
token log-prob of each pool demonstration's output given its input under the inference LM, computed in resumable
chunks keyed by that LM's scoring key (identity, dtype, device; in bf16 the batch layout).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from epr.artifacts import load_npy, prune_outputs, read_jsonl, save_npy, write_jsonl
from epr.cache import ChunkStore
from epr.config import parse_retriever_name
from epr.context import Context
from epr.retrieval.ragsys import rerank_by_name

log = logging.getLogger(__name__)


def pool_quality(ctx: Context) -> np.ndarray:
    """``(len(pool),) float32`` quality bias of every pool demonstration under the inference LM (SPEC 3.2), in
    resumable chunks in the run root's cache (``.cache/quality/<key>``), shared with ``epr inspect``."""
    from epr.cache import fingerprint
    from epr.lm.factory import build_scorer, scoring_key

    fmt, pool = ctx.prompt(inference=True), ctx.examples("pool")
    key = {"what": "quality-bias", **scoring_key(ctx.cfg, inference=True)}
    if (
        fmt.key() is not None
    ):  # the demonstration as the run prompts it (the task's own format: keyed as before)
        key["prompt"] = fmt.key()
    chunks = ChunkStore(Path(ctx.cfg.run_root) / ".cache" / "quality" / fingerprint(key), key)
    scorer: list = []

    def compute(items: list[list[str]]) -> list[float]:
        if not scorer:
            scorer.append(build_scorer(ctx.cfg, inference=True))
        from epr.retrieval.ragsys import mean_logprob

        return mean_logprob(scorer[0], [c for c, _ in items], [t for _, t in items]).tolist()

    items = [[fmt.render([], e), fmt.target(e)] for e in pool]
    return np.asarray(chunks.map(items, 256, compute, desc="quality bias", unit="demo"), dtype=np.float32)


def reward_rerank(ctx: Context, rows: list[dict]) -> list[dict]:
    """The first stage's ``rows`` (one per compared example, ``idx`` its row of the eval split), each cut to its top
    ``reward.top_k`` and ordered by the trained reward model's score of (example input, demonstration): the served
    ``+rm`` modes' code (:class:`epr.reward.serve.Reranker`)."""
    from epr.reward.serve import Reranker
    from epr.stages.retrieve import eval_examples
    from epr.stages.reward import reward_dir

    rr = Reranker(reward_dir(ctx), ctx.cfg.reward.top_k)
    pool, ev = ctx.examples("pool"), {e.idx: e for e in eval_examples(ctx)}
    out = []
    for r in rows:
        sel, sc = rr(ev[r["idx"]].input, r["ids"], pool, ctx.task)
        out.append({"idx": r["idx"], "ids": sel.tolist(), "scores": [round(float(x), 6) for x in sc]})
    return out


def run_rerank(ctx: Context, out: Path, fp: str) -> dict:
    cfg = ctx.cfg
    first = ctx.stage_dir("retrieve")
    quality = None
    for name in cfg.retrieve.retrievers:
        base, div, bias, rm = parse_retriever_name(name)
        rows = list(read_jsonl(first / f"{base}.jsonl"))
        if rm:
            rows = reward_rerank(ctx, rows)
        elif div or bias:
            if bias and quality is None:
                quality = pool_quality(ctx)
            ids = np.array([r["ids"] for r in rows], dtype=np.int64)
            q, p = load_npy(first / f"{base}.query.npy"), load_npy(first / f"{base}.pool.npy")
            rs = cfg.ragsys
            sel, sc = rerank_by_name(
                name, q, p, ids, cfg.retrieve.max_demos, rs.lambda_d, rs.lambda_b, quality
            )
            rows = [
                {"idx": r["idx"], "ids": s.tolist(), "scores": [round(float(x), 6) for x in row]}
                for r, s, row in zip(rows, sel, sc)
            ]
        write_jsonl(out / f"{name}.jsonl", rows)
    produced = [f"{name}.jsonl" for name in cfg.retrieve.retrievers]
    if quality is not None:
        save_npy(out / "quality_bias.npy", quality)
        produced.append("quality_bias.npy")
    prune_outputs(out, produced)  # a former run's quality bias must not ship as this LM's (epr export)
    return {"rows": {"retrievers": len(cfg.retrieve.retrievers)}}
