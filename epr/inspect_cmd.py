"""``epr inspect``: for one query, what each retriever picks, with scores, and what RAGSys diversity / quality changed."""

from __future__ import annotations

import sys

import numpy as np

from epr.rerank import parse_retriever_name, rerank
from epr.retrievers import DenseRetriever, make_retriever
from epr.types import Example


def inspect_query(ctx, query: str, k: int = 5, out=sys.stdout) -> dict:
    cfg, task, pool = ctx.cfg, ctx.task, ctx.examples("pool")
    q = Example(-1, query, "", {})
    encoders: dict = {}
    shown: dict[str, list[int]] = {}
    names = [n for n in cfg.retrieve.retrievers if "oracle" not in n]
    quality = None
    for name in names:
        base, div, bias = parse_retriever_name(name)
        try:
            r = make_retriever(base, pool, task, cfg, cfg.run_dir, encoders)
        except FileNotFoundError as e:
            out.write(f"\n## {name}: skipped ({e})\n")
            continue
        ids = r.retrieve([q], cfg.retrieve.k)[0]
        if (div or bias) and isinstance(r, DenseRetriever):
            if bias and quality is None:
                quality = _quality(ctx)
            ids = rerank(
                r.query_embeddings([q]),
                r.pool_emb,
                ids[None],
                k,
                cfg.ragsys.lambda_d if div else 1.0,
                cfg.ragsys.lambda_b,
                quality if bias else None,
            )[0]
        ids = ids[:k].tolist()
        shown[name] = ids
        scores = None
        if isinstance(r, DenseRetriever):
            scores = r.pool_emb[ids] @ r.query_embeddings([q])[0]
        elif hasattr(r, "index") and hasattr(r.index, "scores"):
            scores = r.index.scores(query)[ids]
        out.write(f"\n## {name}\n")
        for rank, i in enumerate(ids, start=1):
            s = "" if scores is None else f"{float(scores[rank - 1]):8.3f}  "
            out.write(f"{rank:>2}. {s}[{i}] {pool[i].input}  ->  {pool[i].output}\n")
        if (div or bias) and base in shown:
            dropped = [i for i in shown[base] if i not in ids]
            added = [i for i in ids if i not in shown[base]]
            what = " + ".join(
                x
                for x, on in (
                    (f"diversity (lambda_d={cfg.ragsys.lambda_d})", div),
                    (f"quality bias (lambda_b={cfg.ragsys.lambda_b})", bias),
                )
                if on
            )
            out.write(f"   {what} dropped {dropped} and added {added} vs {base}\n")
            if bias:
                out.write(
                    "   quality (mean log p(output | input)): "
                    + ", ".join(f"[{i}] {quality[i]:.2f}" for i in ids)
                    + "\n"
                )
            if added:
                sims = r.pool_emb[ids] / np.linalg.norm(r.pool_emb[ids], axis=1, keepdims=True)
                out.write(f"   mean pairwise cosine: {float((sims @ sims.T).mean()):.3f}\n")
    return shown


def _quality(ctx) -> np.ndarray:
    """The pool's quality bias, as the compare stage caches it (computed here if missing)."""
    from epr.models import load_lm_for
    from epr.rerank import pool_quality

    cfg = ctx.cfg
    model, tok = load_lm_for(cfg.models, inference=True)
    out = ctx.stage_dir("compare")
    out.mkdir(parents=True, exist_ok=True)
    return pool_quality(model, tok, ctx.task, ctx.examples("pool"), cfg, out)
