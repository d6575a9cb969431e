"""The scoreboard: every committed learning curve's learned rows against the better of BM25 and SBERT, in one table.

Read from the ``curve.json`` files under ``results/`` (what ``epr experiment curve`` writes), nothing recomputed:
``python scripts/scoreboard.py`` writes ``results/SCOREBOARD.md``. For each learned row (pooled over its seeds where
a pooled row exists, else each seed's row) it takes, per metric, the reference that scores higher on the same
examples (max(BM25, SBERT), issue 22's bar), and reports the row's paired difference and p against it (exact match:
McNemar for one seed, exact sign test per example for pooled seeds; gold log-prob: Wilcoxon), and the fraction of
the BM25 -> LM-Oracle gap the row captures where the folder has an LM-Oracle row. Locked splits (evaluated once,
after the recipe was fixed) decide; dev rows are where the choices were made.
"""

from __future__ import annotations

import re
from pathlib import Path

from epr.artifacts import read_json

__all__ = ["ALPHA", "REFS", "entries", "load_curves", "markdown", "verdict"]

REFS = ("bm25", "sbert")
ALPHA = 0.05
_SET = re.compile(r"--set\s+([\w.]+)=(\S+)")


def load_curves(results: Path) -> dict[str, dict]:
    """``{folder name: curve.json}`` for every ``results/*/curve.json``, in name order."""
    return {f.parent.name: read_json(f) for f in sorted(results.glob("*/curve.json"))}


def _recipe(command: str) -> str:
    """What the run changed from its config, read from its recorded command's ``--set`` overrides (``-`` if none)."""
    sets = dict(_SET.findall(command or ""))
    parts = []
    if sets.get("candidates.miner") == "retriever":
        parts.append("re-mined (round 2)")
    if sets.get("candidates.miner") == "mixed":
        parts.append("re-mined, half BM25 (round 2)")
    if "models.lm" in sets:
        parts.append(f"labels by {sets['models.lm']}")
    if "models.inference_lm" in sets:
        parts.append(f"inference LM {sets['models.inference_lm']}")
    if "--em-method greedy" in (command or ""):
        parts.append("EM read off the gold pass")
    return ", ".join(parts) or "-"


def _learned(rows: list[dict]) -> list[dict]:
    """The learned rows to show: the pooled row of each (retriever, loss, labels) that has one, else its seeds."""
    learned = [r for r in rows if r.get("loss")]
    pooled = {(r["retriever"], r["loss"], r["labels"]) for r in learned if (r.get("seeds") or 1) > 1}
    return [
        r
        for r in learned
        if (r.get("seeds") or 1) > 1 or (r["retriever"], r["loss"], r["labels"]) not in pooled
    ]


def _vs_best(row: dict, refs: dict[str, dict], metric: str, p_key: str, gain_key: str = "") -> dict | None:
    """The row against the reference that scores higher on ``metric``: {ref, ref value, gain, p}; None if unmeasured.
    The gain is the row's recorded paired gain (``gain_key``) where it has one, else the difference of the two values."""
    have = {n: r for n, r in refs.items() if r.get(metric) is not None}
    if row.get(metric) is None or not have:
        return None
    ref = max(have, key=lambda n: have[n][metric])
    gain = row.get(gain_key.format(ref=ref)) if gain_key else None
    if gain is None:
        gain = row[metric] - have[ref][metric]
    return {"ref": ref, "ref_value": have[ref][metric], "gain": gain, "p": row.get(p_key.format(ref=ref))}


def verdict(cmp: dict | None) -> str:
    """``win`` / ``loss`` where the paired difference is significant at ALPHA, ``tie`` where not, ``-`` unmeasured."""
    if cmp is None or cmp["p"] is None:
        return "-"
    if cmp["p"] >= ALPHA:
        return "tie"
    return "win" if cmp["gain"] > 0 else "loss"


def entries(curves: dict[str, dict]) -> list[dict]:
    """One entry per shown learned row of every curve: where it ran, how it did against max(BM25, SBERT)."""
    out = []
    for folder, curve in curves.items():
        rows = curve["rows"]
        refs = {r["retriever"]: r for r in rows if r["retriever"] in REFS and not r.get("loss")}
        for r in _learned(rows):
            # the paper's exact-match metric: BREAK's is LF-EM (its "em" is NEM, the stricter string match)
            metric = "lf_em" if r.get("lf_em") is not None else "em"
            em = _vs_best(r, refs, metric, "p_vs_{ref}" if metric == "em" else metric + "_p_vs_{ref}")
            lp = _vs_best(r, refs, "gold_logprob", "logprob_p_vs_{ref}", "logprob_gain_vs_{ref}")
            gap = (r.get("oracle_gap_captured") or {}).get("gold_logprob")
            gap_ci = (r.get("oracle_gap_captured_ci") or {}).get("gold_logprob")
            out.append(
                {
                    "folder": folder,
                    "dataset": folder.split("-")[0],
                    "split": r.get("split") or "dev",
                    "recipe": _recipe(curve.get("info", {}).get("command", "")),
                    "row": f"{r['retriever']} {r['loss']} @{r['labels']}"
                    + (
                        f" seed {r['seed']}"
                        if (r.get("seeds") or 1) == 1 and r.get("seed") is not None
                        else ""
                    ),
                    "seeds": r.get("seeds") or 1,
                    "n": r["n"],
                    "em": em,
                    "em_label": "LF-EM" if metric == "lf_em" else "EM",
                    "gold_logprob": lp,
                    "gap": gap,
                    "gap_ci": gap_ci,
                }
            )
    order = {"locked": 0, "dev": 1}
    return sorted(out, key=lambda e: (order.get(e["split"], 2), e["dataset"], e["folder"]))


def _fmt_p(p) -> str:
    return "-" if p is None else (f"{p:.2g}" if p >= 1e-3 else f"{p:.0e}")


def _cell(cmp: dict | None, unit: str, digits: int) -> str:
    if cmp is None:
        return "-"
    return f"{cmp['gain']:+.{digits}f} {unit} vs {cmp['ref']} (p {_fmt_p(cmp['p'])}): **{verdict(cmp)}**"


def markdown(es: list[dict]) -> str:
    """The scoreboard as Markdown: locked rows first (they decide), then dev rows."""
    lines = [
        "# Scoreboard of the learning curves: every curve row learned against max(BM25, SBERT)",
        "",
        "**The page of every result is [README.md](README.md)**: every folder, the one-run folders (the default"
        " recipes, the recipe choices, MTOP's 8,000-label locked look) included, with Holm over each dataset's locked"
        " tests and the ledger of locked looks. This table holds the learning-curve folders (`curve.json`) only.",
        "",
        "Generated by `python scripts/scoreboard.py` from the `curve.json` files under `results/` (nothing recomputed;"
        " each folder's README and `curve.md` name its machine, command and caveats). Per metric the reference is the"
        " better of BM25 and SBERT on the same examples. Exact match: points, McNemar (one seed) or exact sign test per"
        " example (pooled seeds); gold log-prob: nats per example, Wilcoxon signed-rank. **win** / **loss**: p < 0.05;"
        " **tie**: not separable (each p alone, not corrected for the table's many rows: the pre-registered tests, Holm"
        " included, are in each locked folder's README). Gap: the fraction of the BM25 → LM-Oracle gold log-prob gap captured, with its 95%"
        " paired interval, where the folder has an LM-Oracle row. `locked` rows were evaluated once, after the recipe"
        ' was fixed: they decide. `dev` rows are where the recipe was chosen. "EM read off the gold pass": exact match'
        " counted where every gold token is the LM's greedy choice (`--em-method greedy`), a lower bound of generated"
        " exact match (docs/training.md).",
        "",
        "| split | folder | recipe | row | seeds | n | exact match (the paper's: LF-EM on BREAK) | gold log-prob | gap captured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in es:
        gap = "-" if e["gap"] is None else f"{e['gap']:.2f}"
        if e["gap"] is not None and e["gap_ci"]:
            gap += f" ({e['gap_ci'][0]:.2f} to {e['gap_ci'][1]:.2f})"
        lines.append(
            f"| {e['split']} | [{e['folder']}]({e['folder']}/) | {e['recipe']} | {e['row']} | {e['seeds']} | {e['n']} "
            f"| {_cell(e['em'], e.get('em_label', 'EM'), 1)} | {_cell(e['gold_logprob'], 'nats', 2)} | {gap} |"
        )
    return "\n".join(lines) + "\n"
