"""A finished run's served retriever against the unsupervised ones, from the run's own per-example rows: the paper's
metric with exact McNemar tests, gold log-prob with Wilcoxon and the mean's t-test (and its 95% CI), Holm over the
two primary tests (the served retriever's metric vs max(BM25, SBERT); its gold log-prob vs BM25).

Pure: it takes the rows and the selection (``<run>/[locked/]evaluate/per_query.jsonl``, ``<run>/select/report.json``)
and returns Markdown and the raw numbers; ``scripts/run_report.py`` and ``epr experiment check`` call it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from epr.reports.stats import holm, mcnemar_exact, paired_gain

__all__ = ["served_report", "METRIC_LABEL"]

METRIC_LABEL = {"correct": "exact match", "lf_em": "LF-EM"}  # per-example keys of per_query.jsonl


def _metric(row: Mapping, metric: str) -> bool:
    if metric not in row:
        raise KeyError(f"per-example rows have no {metric!r} (keys: {sorted(row)})")
    return bool(row[metric])


def served_report(
    rows: Sequence[Mapping], selection: Mapping, part: str, title: str, metric: str = "correct"
) -> tuple[str, dict]:
    """``rows``: one dict per evaluation example, a dict per retriever (``correct``, ``gold_logprob``, the task's
    extra metrics such as ``lf_em``); ``selection``: the select stage's report; ``metric``: the per-example key
    of the paper's metric (``correct``: exact match; ``lf_em``: BREAK's logical-form EM)."""
    if not rows:
        raise ValueError(f"{title}: no per-example rows")
    names = [n for n in rows[0] if isinstance(rows[0][n], Mapping)]
    served = selection["selected"]
    m = {n: np.array([_metric(r[n], metric) for r in rows]) for n in names}
    lp = {
        n: np.array([np.nan if r[n]["gold_logprob"] is None else r[n]["gold_logprob"] for r in rows])
        for n in names
    }
    unsup = [
        n for n in ("bm25", "sbert") if n in m
    ]  # the unsupervised baselines the run compared (any of them)
    best_unsup = max(unsup, key=lambda n: m[n].mean()) if unsup else None
    label = METRIC_LABEL.get(metric, metric)
    raw: dict = {
        "n": len(rows),
        "part": part,
        "metric": metric,
        "served": served,
        "selection": dict(selection),
        "retrievers": {},
    }
    for n in names:
        raw["retrievers"][n] = {"metric": 100 * float(m[n].mean()), "gold_logprob": float(np.nanmean(lp[n]))}
        if metric != "correct":
            raw["retrievers"][n]["em"] = 100 * float(np.mean([bool(r[n]["correct"]) for r in rows]))
    tests = {}
    for b in unsup:
        if b == served:
            continue
        a_only, b_only = int(np.sum(m[served] & ~m[b])), int(np.sum(~m[served] & m[b]))
        tests[f"metric_vs_{b}"] = {"a_only": a_only, "b_only": b_only, "p": mcnemar_exact(a_only, b_only)}
        tests[f"logprob_vs_{b}"] = paired_gain(lp[served], lp[b])
    primary = {
        k: tests[k]["p"] for k in (f"metric_vs_{best_unsup}", "logprob_vs_bm25") if k in tests
    }  # a baseline the run did not compare is not tested
    raw["tests"], raw["best_unsupervised"] = tests, best_unsup
    raw["holm"] = dict(zip(primary, holm(list(primary.values()))))
    lines = [
        f"# {title}, {part} part: {len(rows)} examples; served retriever `{served}`",
        "",
        f"Selection: {selection['reason']}.",
        "",
        f"| retriever | {label} | gold log-prob (nats) |",
        "|---|---|---|",
        *[
            f"| {n}{' (served)' if n == served else ''} | {raw['retrievers'][n]['metric']:.1f} | "
            f"{raw['retrievers'][n]['gold_logprob']:.3f} |"
            for n in names
        ],
        "",
        "| test (served vs) | result | p | Holm (primary) |",
        "|---|---|---|---|",
    ]
    for b in ("bm25", "sbert"):
        if f"metric_vs_{b}" not in tests:
            continue
        t, g = tests[f"metric_vs_{b}"], tests[f"logprob_vs_{b}"]
        h_m, h_lp = raw["holm"].get(f"metric_vs_{b}"), raw["holm"].get(f"logprob_vs_{b}")
        lines.append(
            f"| {label} vs {b} (McNemar) | {t['a_only']} wins / {t['b_only']} losses | {t['p']:.2g} | "
            f"{'' if h_m is None else f'{h_m:.2g}'} |"
        )
        lines.append(
            f"| gold log-prob vs {b} (Wilcoxon; t-test p {g['p_ttest']:.2g}) | {g['gain']:+.2f} nats "
            f"(95% CI {g['gain_ci'][0]:+.2f} to {g['gain_ci'][1]:+.2f}; median {g['median_gain']:+.2f}, higher on "
            f"{g['win_rate']:.0%}) | {g['p']:.2g} | {'' if h_lp is None else f'{h_lp:.2g}'} |"
        )
    return "\n".join(lines) + "\n", raw
