"""The served retriever of a finished run against the unsupervised ones, from the run's own rows: exact match with
exact McNemar tests, gold log-prob with Wilcoxon and the mean's t-test (and its 95% CI), Holm over the two primary
tests (the served retriever's EM vs max(BM25, SBERT); its gold log-prob vs BM25), the selection it was served by.

    python scripts/run_report.py runs/mtop                 # the dev part (runs/mtop/evaluate/)
    python scripts/run_report.py runs/mtop --part locked   # the locked part (runs/mtop/locked/evaluate/)
    python scripts/run_report.py runs/mtop --part locked --out results/mtop-default-recipe/locked.md

Reads ``<run>/[locked/]evaluate/per_query.jsonl`` and ``<run>/select/report.json``; prints Markdown (and writes it to
``--out``, with the raw numbers beside it as ``.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from epr.reports.stats import mcnemar_exact
from epr.stages.select import _paired, read_selection


def holm(ps: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given."""
    order = np.argsort(ps)
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def report(run: Path, part: str) -> tuple[str, dict]:
    ev = run / ("locked/evaluate" if part == "locked" else "evaluate")
    rows = [json.loads(x) for x in (ev / "per_query.jsonl").read_text().splitlines()]
    sel = read_selection(run)
    if sel is None:
        raise SystemExit(f"{run}: no finished select stage")
    names = [n for n in rows[0] if isinstance(rows[0][n], dict)]
    served = sel["selected"]
    em = {n: np.array([bool(r[n]["correct"]) for r in rows]) for n in names}
    lp = {
        n: np.array([np.nan if r[n]["gold_logprob"] is None else r[n]["gold_logprob"] for r in rows])
        for n in names
    }
    best_unsup = max(("bm25", "sbert"), key=lambda n: em[n].mean())
    raw: dict = {"n": len(rows), "part": part, "served": served, "selection": sel, "retrievers": {}}
    for n in names:
        raw["retrievers"][n] = {"em": 100 * float(em[n].mean()), "gold_logprob": float(np.nanmean(lp[n]))}
    tests = {}
    for b in ("bm25", "sbert"):
        if b == served:
            continue
        a_only, b_only = int(np.sum(em[served] & ~em[b])), int(np.sum(~em[served] & em[b]))
        tests[f"em_vs_{b}"] = {"a_only": a_only, "b_only": b_only, "p": mcnemar_exact(a_only, b_only)}
        tests[f"logprob_vs_{b}"] = _paired(lp[served], lp[b])
    primary = [
        tests.get(f"em_vs_{best_unsup}", {}).get("p", 1.0),
        tests.get("logprob_vs_bm25", {}).get("p", 1.0),
    ]
    raw["tests"], raw["best_unsupervised"] = tests, best_unsup
    raw["holm"] = dict(zip((f"em_vs_{best_unsup}", "logprob_vs_bm25"), holm(primary)))
    lines = [
        f"# {run.name}, {part} part: {len(rows)} examples; served retriever `{served}`",
        "",
        f"Selection: {sel['reason']}.",
        "",
        "| retriever | exact match | gold log-prob (nats) |",
        "|---|---|---|",
        *[
            f"| {n}{' (served)' if n == served else ''} | {raw['retrievers'][n]['em']:.1f} | "
            f"{raw['retrievers'][n]['gold_logprob']:.3f} |"
            for n in names
        ],
        "",
        "| test (served vs) | result | p | Holm (primary) |",
        "|---|---|---|---|",
    ]
    for b in ("bm25", "sbert"):
        if f"em_vs_{b}" not in tests:
            continue
        t, g = tests[f"em_vs_{b}"], tests[f"logprob_vs_{b}"]
        h_em = raw["holm"].get(f"em_vs_{b}")
        lines.append(
            f"| EM vs {b} (McNemar) | {t['a_only']} wins / {t['b_only']} losses | {t['p']:.2g} | "
            f"{'' if h_em is None else f'{h_em:.2g}'} |"
        )
        h_lp = raw["holm"].get(f"logprob_vs_{b}")
        lines.append(
            f"| gold log-prob vs {b} (Wilcoxon; t-test p {g['p_ttest']:.2g}) | {g['gain']:+.2f} nats "
            f"(95% CI {g['gain_ci'][0]:+.2f} to {g['gain_ci'][1]:+.2f}; median {g['median_gain']:+.2f}, higher on "
            f"{g['win_rate']:.0%}) | {g['p']:.2g} | {'' if h_lp is None else f'{h_lp:.2g}'} |"
        )
    return "\n".join(lines) + "\n", raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path)
    ap.add_argument("--part", choices=("dev", "locked"), default="dev")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    md, raw = report(a.run, a.part)
    print(md)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(md)
        a.out.with_suffix(".json").write_text(json.dumps(raw, indent=2) + "\n")


if __name__ == "__main__":
    main()
