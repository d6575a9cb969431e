"""A faiss MIPS index over demonstration embeddings: exact inner product by default, any factory string."""

from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

__all__ = ["build_index", "search", "save_index", "load_index", "brute_force"]


def build_index(emb: np.ndarray, factory: str = "Flat") -> faiss.Index:
    """``emb``: ``(n, H) float32``. ``factory`` e.g. ``Flat``, ``IVF256,Flat``, ``HNSW32`` (inner-product metric)."""
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] == 0:
        raise ValueError(f"cannot index an embedding matrix of shape {emb.shape}: the pool is empty")
    index = faiss.index_factory(emb.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(emb)
    index.add(emb)
    return index


def search(
    index: faiss.Index, queries: np.ndarray, k: int, block: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """``(n_queries, k)`` ids (int64) and scores (float32), searched in blocks to bound memory."""
    q = np.ascontiguousarray(queries, dtype=np.float32)
    k = min(k, index.ntotal)
    ids = np.empty((len(q), k), dtype=np.int64)
    sc = np.empty((len(q), k), dtype=np.float32)
    for s in range(0, len(q), block):
        sc[s : s + block], ids[s : s + block] = index.search(q[s : s + block], k)
    return ids, sc


def brute_force(emb: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy reference: full score matrix, top-k by (score desc, id asc)."""
    s = queries.astype(np.float32) @ emb.astype(np.float32).T
    ids = np.stack([np.lexsort((np.arange(s.shape[1]), -row))[:k] for row in s])
    return ids, np.take_along_axis(s, ids, 1)


def save_index(index: faiss.Index, path: str | Path) -> None:
    """Write atomically (a temp file, then a rename), creating the folder."""
    import os

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    faiss.write_index(index, str(tmp))
    os.replace(tmp, path)


def load_index(path: str | Path) -> faiss.Index:
    return faiss.read_index(str(path))
