"""Algorithm 1 of SPEC 3.1, vectorised: one matrix-vector product per selection step."""

from __future__ import annotations

import numpy as np

__all__ = ["mmr_select", "mmr_select_reference", "select_variant", "VARIANTS", "normalise"]

# name -> (lambda_d, lambda_b) overrides; None keeps the caller's value. "fix" is not a re-ranker.
VARIANTS = {
    "bias": (1.0, 0.0),  # quality only
    "rel": (1.0, 1.0),  # cosine only (KATE)
    "rel+bias": (1.0, None),
    "rel+div": (None, 1.0),  # MMR
    "rel+div+bias": (None, None),  # Algorithm 1
}


def normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def _check(k: int, n: int, lambda_d: float, lambda_b: float) -> None:
    for name, v in (("lambda_d", lambda_d), ("lambda_b", lambda_b)):
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name}={v} must be in [0, 1]")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    if k > n:
        raise ValueError(f"k={k} is larger than the candidate pool ({n})")


def mmr_select(
    query: np.ndarray,
    emb: np.ndarray,
    quality: np.ndarray | None,
    k: int,
    lambda_d: float,
    lambda_b: float,
) -> np.ndarray:
    """Pick ``k`` of ``n`` demonstrations, returned in selection order as ``(k,) int64`` row indices.

    query: ``(H,)``; emb: ``(n, H)`` demonstration (question) embeddings, both normalised here;
    quality: ``(n,)`` bias b_i (mean answer-token log-prob), or None (only allowed with lambda_b = 1).
    Ties go to the lower index (``argmax`` takes the first).
    """
    n = emb.shape[0]
    _check(k, n, lambda_d, lambda_b)
    if quality is None:
        if lambda_b != 1.0:
            raise ValueError("quality is needed unless lambda_b = 1")
        quality = np.zeros(n, dtype=np.float32)
    e = normalise(emb)
    v = lambda_b * (e @ normalise(query)) + (1.0 - lambda_b) * np.asarray(quality, dtype=np.float32)
    chosen = np.empty(k, dtype=np.int64)
    taken = np.zeros(n, dtype=bool)
    m = np.full(n, -np.inf, dtype=np.float32)
    chosen[0] = int(np.argmax(v))
    taken[chosen[0]] = True
    for s in range(1, k):
        m = np.maximum(m, e @ e[chosen[s - 1]])  # running max similarity to the chosen set
        w = lambda_d * v - (1.0 - lambda_d) * m
        w[taken] = -np.inf
        chosen[s] = int(np.argmax(w))
        taken[chosen[s]] = True
    return chosen


def mmr_select_reference(query, emb, quality, k, lambda_d=0.75, lambda_b=0.95) -> list[int]:
    """A direct, loop-based transcription of the pseudo-code (for tests)."""
    import math

    def nrm(x):
        s = math.sqrt(sum(float(t) * float(t) for t in x)) or 1e-12
        return [float(t) / s for t in x]

    def dot(a, b):
        return sum(x * y for x, y in zip(a, b))

    Q = nrm(query)
    E = [nrm(r) for r in emb]
    b = [0.0] * len(E) if quality is None else [float(t) for t in quality]
    v = [lambda_b * dot(Q, E[i]) + (1 - lambda_b) * b[i] for i in range(len(E))]
    C = [max(range(len(E)), key=lambda i: (v[i], -i))]
    for _ in range(2, k + 1):
        best, best_w = None, -math.inf
        for i in range(len(E)):
            if i in C:
                continue
            m = max(dot(E[i], E[c]) for c in C)
            w = lambda_d * v[i] - (1 - lambda_d) * m
            if w > best_w + 1e-9 or (best is None):
                best, best_w = i, w
        C.append(best)
    return C


def select_variant(
    variant: str,
    query: np.ndarray,
    emb: np.ndarray,
    quality: np.ndarray | None,
    k: int,
    lambda_d: float,
    lambda_b: float,
) -> np.ndarray:
    """Run one of the paper's variants by name (``bias``, ``rel``, ``rel+bias``, ``rel+div``, ``rel+div+bias``)."""
    if variant not in VARIANTS:
        raise ValueError(
            f"variant {variant!r}: choose from {sorted(VARIANTS)} (or 'fix', which needs no re-ranker)"
        )
    d, b = VARIANTS[variant]
    return mmr_select(query, emb, quality, k, lambda_d if d is None else d, lambda_b if b is None else b)
