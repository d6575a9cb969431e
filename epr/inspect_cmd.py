"""``epr inspect``: for one query, what each retriever picks, with scores, and what RAGSys diversity changed."""

from __future__ import annotations

import sys

import numpy as np

from epr.retrievers import DenseRetriever, make_retriever
from epr.types import Example


def inspect_query(ctx, query: str, k: int = 5, out=sys.stdout) -> dict:
    cfg, task, pool = ctx.cfg, ctx.task, ctx.examples("pool")
    q = Example(-1, query, "", {})
    encoders: dict = {}
    shown: dict[str, list[int]] = {}
    names = [n for n in cfg.retrieve.retrievers if "oracle" not in n]
    for name in names:
        base = name[:-4] if name.endswith("+div") else name
        try:
            r = make_retriever(base, pool, task, cfg, cfg.run_dir, encoders)
        except FileNotFoundError as e:
            out.write(f"\n## {name}: skipped ({e})\n")
            continue
        ids = r.retrieve([q], cfg.retrieve.k)[0]
        if name.endswith("+div") and isinstance(r, DenseRetriever):
            from ragsys import mmr_select

            sel = mmr_select(r.query_embeddings([q])[0], r.pool_emb[ids], None, k, cfg.ragsys.lambda_d, 1.0)
            ids = ids[sel]
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
        if name.endswith("+div") and base in shown:
            dropped = [i for i in shown[base] if i not in ids]
            added = [i for i in ids if i not in shown[base]]
            out.write(f"   diversity (lambda_d={cfg.ragsys.lambda_d}) dropped {dropped} and added {added} vs {base}\n")
            if added:
                sims = r.pool_emb[ids] / np.linalg.norm(r.pool_emb[ids], axis=1, keepdims=True)
                out.write(f"   mean pairwise cosine: {float((sims @ sims.T).mean()):.3f}\n")
    return shown
