"""``epr inspect``: for one query, what each retriever picks, with its scores, what RAGSys diversity / quality
changed, and the prompt the inference LM would see (built as the compare stages build it)."""

from __future__ import annotations

import sys

import numpy as np

from epr.config import parse_retriever_name
from epr.retrieval.ragsys import rerank_by_name
from epr.retrieval.retrievers import DenseRetriever, make_retriever
from epr.types import Example


def inspect_query(ctx, query: str, k: int = 5, out=sys.stdout) -> dict:
    from epr.stages.prompts import prompt_maker

    cfg, task, pool = ctx.cfg, ctx.task, ctx.examples("pool")
    q = Example(-1, query, "", {})
    loaded: dict = {}
    shown: dict[str, list[int]] = {}
    quality = None
    make_prompt = prompt_maker(ctx)
    for name in [n for n in cfg.retrieve.retrievers if "oracle" not in n]:
        base, div, bias, _ = parse_retriever_name(name)
        try:
            r = make_retriever(base, pool, task, cfg, ctx.encoder_dir(base), loaded, ctx.prompt())
        except FileNotFoundError as e:
            out.write(f"\n## {name}: skipped ({e})\n")
            continue
        hits = r.retrieve([q], cfg.retrieve.k)
        ids, scores = hits.ids[0], hits.scores[0]
        if div or bias:
            if bias and quality is None:
                from epr.stages.rerank import pool_quality

                quality = pool_quality(ctx)
            assert isinstance(r, DenseRetriever)
            qe = r.query_embeddings([q])
            rs = cfg.ragsys
            sel, sc = rerank_by_name(
                name, qe, r.pool_emb, ids[None], cfg.retrieve.max_demos, rs.lambda_d, rs.lambda_b, quality
            )
            ids, scores = sel[0], sc[0]
        prompt = make_prompt(q, ids)
        shown[name] = ids[:k].tolist()
        out.write(f"\n## {name}\n")
        for rank, (i, s) in enumerate(zip(shown[name], scores), start=1):
            out.write(f"{rank:>2}. {float(s):8.3f}  [{i}] {pool[i].input}  ->  {pool[i].output}\n")
        out.write(
            f"   prompt: {len(prompt.demo_ids)} demonstrations, {prompt.n_tokens} tokens with the answer reserve "
            f"({prompt.status})\n"
        )
        if (div or bias) and base in shown:
            _explain(out, cfg, r, shown[base], shown[name], div, bias, quality)
    return shown


def _explain(out, cfg, r, before: list[int], ids: list[int], div: bool, bias: bool, quality) -> None:
    dropped = [i for i in before if i not in ids]
    added = [i for i in ids if i not in before]
    what = " + ".join(
        x
        for x, on in (
            (f"diversity (lambda_d={cfg.ragsys.lambda_d})", div),
            (f"quality bias (lambda_b={cfg.ragsys.lambda_b})", bias),
        )
        if on
    )
    out.write(f"   {what} dropped {dropped} and added {added} vs the first stage\n")
    if bias:
        out.write(
            "   quality (mean log p(output | input)): "
            + ", ".join(f"[{i}] {quality[i]:.2f}" for i in ids)
            + "\n"
        )
    if added:
        sims = r.pool_emb[ids] / np.linalg.norm(r.pool_emb[ids], axis=1, keepdims=True)
        out.write(f"   mean pairwise cosine: {float((sims @ sims.T).mean()):.3f}\n")
