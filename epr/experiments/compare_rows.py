"""Two committed rows of a learning curve, paired on the same examples: is B better than A?

    epr experiment compare-rows results/mtop-curve-round1/rows/epr@2000-distill.json results/mtop-curve-round2/rows/epr@2000-distill.json
    epr experiment compare-rows results/mtop-curve-locked/rows/em-bm25.json.gz results/mtop-curve-locked/rows/em-epr@2000-distill.json.gz
    epr experiment compare-rows results/mtop-curve-locked/rows/bm25.json \
      results/mtop-curve-locked/rows/epr@2000-distill.json,results/mtop-curve-locked/rows/epr@2000-distill-s1.json,results/mtop-curve-locked/rows/epr@2000-distill-s2.json

Dense rows (``*.json``: ``per_query_logprob``): the mean paired gain of B over A in gold log-prob with its 95%
bootstrap interval, the median gain, the share of examples where B is higher and the Wilcoxon signed-rank p.
Exact-match rows (``em-*.json.gz``: ``idx``, ``correct``): both exact-match rates, the discordant examples and the
exact McNemar p. The rows must hold the same examples (same count; EM rows: the same ``idx`` in the same order);
examples either row could not score (``null``) are left out of the dense comparison, and counted.

A run's selection slice pairs as a dense row: ``runs/x/select/per_example.jsonl:hybrid`` (examples paired by ``idx``;
two runs' slices must be the same examples).

Either side may be several rows (training seeds) joined by commas: they are pooled per example as the curve's pooled
rows are (dense: the seeds' mean gold log-prob; exact match: the seeds' mean correctness), so that each example
counts once; the exact-match test is then the exact sign test on the examples where the pooled means differ (with
one seed per side, McNemar's).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

from epr.reports.curve import paired_logprob, seed_mean
from epr.reports.stats import mcnemar_exact, mean_ci

ROOT = Path(__file__).resolve().parents[2]  # the repository


def load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def pool(rows: list[dict], name: str = "rows") -> dict:
    """Several seeds' rows of the same examples as one row: per example the seeds' mean (see the module doc)."""
    if len(rows) == 1:
        return rows[0]
    if all("per_query_logprob" in r for r in rows):
        if len({len(r["per_query_logprob"]) for r in rows}) != 1:
            raise ValueError(
                f"{name}: the seeds' rows hold different numbers of examples: not the same examples"
            )
        out = {"per_query_logprob": seed_mean([r["per_query_logprob"] for r in rows]), "seeds": len(rows)}
        if all("correct" in r and "idx" in r for r in rows):  # a run's evaluation rows: both metrics pool
            if any(r["idx"] != rows[0]["idx"] for r in rows):
                raise ValueError(
                    f"{name}: the seeds' rows do not hold the same examples in the same order (idx)"
                )
            mean = np.mean([np.asarray(r["correct"], float) for r in rows], axis=0)
            out.update(idx=rows[0]["idx"], correct=mean.tolist())
        return out
    if all("correct" in r for r in rows):
        if any(r["idx"] != rows[0]["idx"] for r in rows):
            raise ValueError(f"{name}: the seeds' rows do not hold the same examples in the same order (idx)")
        mean = np.mean([np.asarray(r["correct"], float) for r in rows], axis=0)
        return {"idx": rows[0]["idx"], "correct": mean.tolist(), "seeds": len(rows)}
    raise ValueError(f"{name}: rows of different kinds (dense and exact match) cannot be pooled")


def load_select(path: Path, retriever: str) -> dict:
    """A run's selection slice (``<run>/select/per_example.jsonl``: ``idx`` and each retriever's gold log-prob) as a
    dense row of ``retriever``, in ``idx`` order, so two runs' slices pair example by example."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode()
    rows = sorted((json.loads(x) for x in text.splitlines() if x.strip()), key=lambda r: r["idx"])
    if not rows or retriever not in rows[0]:
        raise ValueError(f"{path}: no {retriever!r} column (has {sorted(rows[0]) if rows else 'no rows'})")
    return {"per_query_logprob": [r[retriever] for r in rows], "idx": [r["idx"] for r in rows]}


def load_per_query(path: Path, retriever: str, metric: str = "correct") -> dict:
    """A run's evaluation rows (``<run>/evaluate/per_query.jsonl``, or committed as ``rows/per_query-*.jsonl.gz``)
    as one retriever's row, in ``idx`` order: its gold log-prob (dense) and its ``metric`` per example (exact
    match: ``correct``; BREAK: ``lf_em``), so two runs' evaluations of the same examples pair both ways."""
    raw = path.read_bytes()
    text = (gzip.decompress(raw) if path.name.endswith(".gz") else raw).decode()
    rows = sorted((json.loads(x) for x in text.splitlines() if x.strip()), key=lambda r: r["idx"])
    if not rows or retriever not in rows[0]:
        have = sorted(k for k, v in rows[0].items() if isinstance(v, dict)) if rows else "no rows"
        raise ValueError(f"{path}: no {retriever!r} rows (has {have})")
    cells = [r[retriever] for r in rows]
    if any(metric not in c for c in cells):
        raise ValueError(f"{path}: {retriever!r} rows without {metric!r}")
    return {
        "per_query_logprob": [c.get("gold_logprob") for c in cells],
        "idx": [r["idx"] for r in rows],
        "correct": [float(c[metric]) for c in cells],
    }


def load_one(spec: str) -> dict:
    """A row file, or ``<run>/select/per_example.jsonl:<retriever>`` (a run's selection slice)."""
    if ".jsonl:" in spec or ".jsonl.gz:" in spec:
        path, retriever = spec.rsplit(":", 1)
        return load_select(Path(path), retriever)
    return load(Path(spec))


def load_side(spec: str) -> dict:
    """One side of the comparison: a row file (or a selection slice's column), or several (seeds) joined by commas,
    pooled per example."""
    return pool([load_one(p) for p in spec.split(",") if p], spec)


def compare(a: dict, b: dict, name_a: str = "A", name_b: str = "B", metric: str | None = None) -> dict:
    """B against A on the same examples (dense rows or exact-match rows; see the module doc). Rows that hold both
    (a run's evaluation rows) compare in gold log-prob unless ``metric="exact_match"``."""
    if metric != "exact_match" and "per_query_logprob" in a and "per_query_logprob" in b:
        la, lb = a["per_query_logprob"], b["per_query_logprob"]
        if "idx" in a and "idx" in b and a["idx"] != b["idx"]:
            raise ValueError(f"{name_a} and {name_b} do not hold the same examples (idx)")
        if len(la) != len(lb):
            raise ValueError(f"{name_a} holds {len(la)} examples, {name_b} {len(lb)}: not the same examples")
        both = [(x, y) for x, y in zip(la, lb) if x is not None and y is not None]
        d = [y - x for x, y in both]
        gain, p, med, win = paired_logprob([y for _, y in both], [x for x, _ in both])
        _, lo, hi = mean_ci(d, n_boot=2000)
        from scipy.stats import ttest_1samp

        p_t = float(ttest_1samp(d, 0.0).pvalue) if len(d) > 1 and np.any(d) else 1.0
        return {
            "metric": "gold_logprob",
            "seeds_a": a.get("seeds", 1),
            "seeds_b": b.get("seeds", 1),
            "n": len(both),
            "left_out": len(la) - len(both),
            "mean_a": float(np.mean([x for x, _ in both])),
            "mean_b": float(np.mean([y for _, y in both])),
            "gain": gain,
            "gain_ci": [lo, hi],
            "median_gain": med,
            "win_rate": win,
            "p_wilcoxon": p,
            "p_ttest": p_t,  # the mean's test: a claim about the mean gain
        }
    if "correct" in a and "correct" in b:
        if a["idx"] != b["idx"]:
            raise ValueError(f"{name_a} and {name_b} do not hold the same examples in the same order (idx)")
        ca, cb = np.asarray(a["correct"], float), np.asarray(b["correct"], float)  # pooled: the seeds' mean
        only_a, only_b = int(np.sum(ca > cb)), int(np.sum(cb > ca))
        return {
            "metric": "exact_match",
            "seeds_a": a.get("seeds", 1),
            "seeds_b": b.get("seeds", 1),
            "n": len(ca),
            "em_a": 100 * float(ca.mean()),
            "em_b": 100 * float(cb.mean()),
            "only_a": only_a,
            "only_b": only_b,
            "p_mcnemar": mcnemar_exact(only_b, only_a),
        }
    raise ValueError(
        f"{name_a} / {name_b}: not two dense rows (per_query_logprob) nor two exact-match rows (correct)"
    )
