"""Two label sets of the same training examples side by side: how good their candidates are by the LM's own scores.

    epr experiment compare-labels runs/mtop-curve/labels runs/mtop-round2/labels     # round 1 vs round 2

Reads each run's ``labels/labels.jsonl`` (the ``labels`` stage's output: every candidate's LM score
log p(y | candidate, x) per training example) and reports, over the examples both hold: the share of candidates they
have in common, the mean best and median candidate score, and the share of examples whose best candidate is better
in B. Re-mining (``candidates.miner: retriever``) is worth its scoring only where B's candidates are at least as
good as the ones they replace; this shows whether they are.

Where the two sets share candidates (the same candidates scored by two LMs: ``--set models.lm=...``), it also
reports how alike the two LMs rank them: the mean Spearman correlation of their scores over each example's shared
candidates, and the share of A's top k (the positives, ``labels.k_pos``) among them that are B's top k too.

    epr experiment compare-labels runs/mtop-curve/labels runs/mtop-gemma-labels/labels   # SmolLM2 vs Gemma
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from epr.artifacts import read_jsonl_lines

ROOT = Path(__file__).resolve().parents[2]  # the repository


def load(path: Path) -> dict[int, dict]:
    """``{qid: row}`` of a ``labels.jsonl`` (or the folder holding it)."""
    path = path / "labels.jsonl" if path.is_dir() else path
    rows = {}
    for where, r in read_jsonl_lines(path, required=("qid", "cands", "cand_scores")):
        if not r["cand_scores"] or len(r["cand_scores"]) != len(r["cands"]):
            raise ValueError(f"{where}: cand_scores missing or not one per candidate")
        rows[r["qid"]] = r
    return rows


def agreement(a: dict[int, dict], b: dict[int, dict], q: list[int], k: int) -> dict:
    """How alike A and B rank the candidates they share, per example: Spearman's rho (examples with >= 3 shared
    candidates whose scores are not all tied) and the share of A's top k that are B's top k (examples with more
    than k shared)."""
    from scipy.stats import spearmanr

    rhos, tops, diffs = [], [], []
    for i in q:
        sa, sb = (dict(zip(x[i]["cands"], x[i]["cand_scores"])) for x in (a, b))
        shared = [c for c in b[i]["cands"] if c in sa]
        xa, xb = [sa[c] for c in shared], [sb[c] for c in shared]
        diffs += [abs(u - v) for u, v in zip(xa, xb)]
        if len(shared) >= 3 and len(set(xa)) > 1 and len(set(xb)) > 1:
            rhos.append(float(spearmanr(xa, xb)[0]))
        # ties broken by candidate id in both (as the labels stage breaks them), not by B's order
        if len(shared) > k:
            top = [set(sorted(shared, key=lambda c, m=m: (-m[c], c))[:k]) for m in (sa, sb)]
            tops.append(len(top[0] & top[1]) / k)
    return {
        "rank_agreement": float(np.mean(rhos)) if rhos else None,
        "rank_agreement_examples": len(rhos),
        "top_k": k,
        "top_k_shared": float(np.mean(tops)) if tops else None,
        "top_k_identical": float(np.mean([t == 1.0 for t in tops])) if tops else None,  # the same positives
        # the same candidates scored twice (another dtype, batch layout or LM): how far the scores are apart
        "score_abs_diff_mean": float(np.mean(diffs)) if diffs else None,
        "score_abs_diff_max": float(np.max(diffs)) if diffs else None,
    }


def compare(a: dict[int, dict], b: dict[int, dict], k: int = 3) -> dict:
    """The two label sets on the examples both hold (pure: the numbers the script prints)."""
    q = sorted(set(a) & set(b))
    if not q:
        raise ValueError("the two label sets share no training example")
    best = np.array([[max(a[i]["cand_scores"]), max(b[i]["cand_scores"])] for i in q])
    med = np.array([[np.median(a[i]["cand_scores"]), np.median(b[i]["cand_scores"])] for i in q])
    overlap = [len(set(a[i]["cands"]) & set(b[i]["cands"])) / len(b[i]["cands"]) for i in q]
    return {
        "examples": len(q),
        "only_a": len(set(a) - set(b)),
        "only_b": len(set(b) - set(a)),
        "candidates_shared": float(np.mean(overlap)),
        "best_a": float(best[:, 0].mean()),
        "best_b": float(best[:, 1].mean()),
        "best_b_higher": float(np.mean(best[:, 1] > best[:, 0])),
        "best_b_lower": float(np.mean(best[:, 1] < best[:, 0])),
        "median_a": float(med[:, 0].mean()),
        "median_b": float(med[:, 1].mean()),
        **agreement(a, b, q, k),
        **kept(a, b, q),
    }


def kept(a: dict[int, dict], b: dict[int, dict], q: list[int]) -> dict:
    """The labels as training reads them, on the examples whose candidates are the same in both (the same
    candidates scored twice): the share of examples whose positives (``pos``) are the same set in B as in A, and
    whose hard negatives (``neg``) are. Empty where no example has the same candidates in both."""
    same = [i for i in q if set(a[i]["cands"]) == set(b[i]["cands"]) and "pos" in a[i] and "pos" in b[i]]
    if not same:
        return {}
    return {
        "same_candidates_examples": len(same),
        "positives_identical": float(np.mean([set(a[i]["pos"]) == set(b[i]["pos"]) for i in same])),
        "negatives_identical": float(np.mean([set(a[i]["neg"]) == set(b[i]["neg"]) for i in same])),
    }
