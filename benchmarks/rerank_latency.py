"""What the reward model's re-ranking costs a served query on a CPU (issue 74): the dense retriever alone (the query
encoded by MiniLM, exact inner-product search over MTOP's 15,667-example training pool) against the same plus the
reward model re-scoring the top K = ``reward.top_k`` (32) [query; demonstration] pairs with a MiniLM cross-encoder,
one query at a time (a served request) and in batches. Real MTOP text and the packaged MiniLM; untrained weights
(latency does not depend on them).

    python -m benchmarks.rerank_latency [--queries 64] [--top-k 32] [--data-dir ../shared/data]

Writes ``benchmarks/results/rerank-latency-<machine>.{json,md}``, naming the machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import describe, machine, machine_slug, save


def per_query(fn, queries: list[str]) -> float:
    fn(queries[0])  # warm-up
    t = time.perf_counter()
    for q in queries:
        fn(q)
    return (time.perf_counter() - t) / len(queries)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--max-length", type=int, default=160)
    a = ap.parse_args(argv)
    from epr.config import DataConfig
    from epr.encoder.model import DualEncoder
    from epr.retrieval.index import build_index, search
    from epr.reward.model import CrossEncoder, rerank
    from epr.tasks import get_task

    torch.set_num_threads(torch.get_num_threads())
    task = get_task(DataConfig(task="mtop", data_dir=a.data_dir))
    pool, ev = task.load()
    queries = [e.input for e in ev[: a.queries]]
    enc = DualEncoder.from_pretrained("minilm", max_length=64)
    enc.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        emb = np.concatenate([enc.embed_prompts(enc.tokenize([enc.demo(task, e) for e in pool[i : i + 256]])).numpy()
                              for i in range(0, len(pool), 256)])  # fmt: skip
    index_s = time.perf_counter() - t0
    index = build_index(emb.astype(np.float32), "Flat")
    cross = CrossEncoder.from_pretrained("minilm", max_length=a.max_length)
    texts = [cross.demo(task, e) for e in pool]

    def dense(q: str):
        with torch.no_grad():
            v = enc.embed_queries(enc.tokenize([q])).numpy().astype(np.float32)
        return search(index, v, a.top_k)[0][0]

    def reranked(q: str):
        ids = dense(q)
        return rerank(cross, q, ids, [texts[i] for i in ids])

    t_dense, t_rm = per_query(dense, queries), per_query(reranked, queries)
    rows = {"dense_ms": 1000 * t_dense, "dense_plus_rerank_ms": 1000 * t_rm, "ratio": t_rm / t_dense}
    m = machine()
    raw = {"machine": m, "pool": len(pool), "queries": len(queries), "top_k": a.top_k, "max_length": a.max_length,
           "threads": torch.get_num_threads(), "pool_embedding_s": index_s, **rows}  # fmt: skip
    md = (
        f"# The reward model's re-ranking, CPU latency per served query\n\n{describe(m)}; "
        f"MTOP pool {len(pool)}, {len(queries)} dev queries one at a time; "
        f"MiniLM dual encoder (query max 64 tokens), MiniLM cross-encoder over the top {a.top_k} "
        f"(pairs max {a.max_length} tokens), fp32.\n\n"
        "| path | ms per query | x dense |\n|---|---|---|\n"
        f"| dense (encode the query, exact search) | {rows['dense_ms']:.1f} | 1.0 |\n"
        f"| dense + reward re-ranking of the top {a.top_k} | {rows['dense_plus_rerank_ms']:.1f} | {rows['ratio']:.1f} |\n\n"
        f"Command: `python -m benchmarks.rerank_latency --queries {a.queries} --top-k {a.top_k}`.\n"
    )
    slug = machine_slug(m)
    save(f"rerank-latency-{slug}", raw, md)
    return raw


if __name__ == "__main__":
    main()
