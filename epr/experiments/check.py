"""``epr experiment check``: every results folder's tables and paired tests recomputed from its committed rows
alone (no model, no run root) and compared with what the folder says: its ``curve.json`` / ``locked.json`` (the
tables) and its declaration's expected numbers. A changed row file or a changed expected number fails."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from epr.artifacts import read_json
from epr.experiments import digests
from epr.experiments.choices import recheck
from epr.experiments.declaration import Experiment, load
from epr.reports.curve import attach_em, curve_rows, seeded
from epr.reports.curve_rows import rows_from_dir
from epr.reports.served import served_report
from epr.reports.stats import gap_fraction_ci, paired_gain

__all__ = ["recompute", "check", "check_all", "show", "row_name", "folders", "lookup"]

SKIP_KEYS = {"train_seconds_or_eval_seconds"}  # what a redraw does not recompute (wall time)


def row_name(r: Mapping) -> str:
    """A curve row's name as its row file names it: ``bm25``, ``epr@2000-distill`` (seed 42), ``...-s1``,
    ``...-pooled``."""
    if r["loss"] is None:
        return r["retriever"]
    base = f"{r['retriever']}@{r['labels']}-{r['loss']}"
    return f"{base}-pooled" if r["seeds"] > 1 else seeded(base, r["seed"])


def _ttests(rows: list[dict]) -> dict[str, dict]:
    """The mean's t-test and 95% CI beside each Wilcoxon p of a learned row's log-prob gain over BM25 / SBERT."""
    ref = {r["retriever"]: r["per_query_logprob"] for r in rows if r["loss"] is None}
    out: dict[str, dict] = {}
    for r in rows:
        if r["loss"] is None:
            continue
        extra = {}
        for b in ("bm25", "sbert"):
            if b in ref:
                a = np.array([np.nan if v is None else v for v in r["per_query_logprob"]], dtype=float)
                c = np.array([np.nan if v is None else v for v in ref[b]], dtype=float)
                g = paired_gain(a, c)
                extra[f"logprob_ttest_p_vs_{b}"] = g["p_ttest"]
                extra[f"logprob_gain_ci_vs_{b}"] = g["gain_ci"]
        out[row_name(r)] = extra
    return out


def _curve(folder: Path) -> tuple[dict[str, dict], list[str]]:
    committed = read_json(folder / "curve.json")["rows"]
    split = committed[0]["split"] if committed else "dev"
    rows, em = rows_from_dir(folder / "rows", split)
    attach_em(rows, em)
    fresh = curve_rows(rows)
    got = {row_name(r): r for r in fresh}
    for name, extra in _ttests(rows).items():
        got.get(name, {}).update(extra)
    problems = []
    for r in rows:  # a row file's stored mean is its per-example values' mean
        lp = [np.nan if v is None else v for v in r.get("per_query_logprob") or ()]
        if (
            r["seeds"] == 1
            and lp
            and not math.isclose(float(np.nanmean(lp)), r["gold_logprob"], abs_tol=1e-6)
        ):
            problems.append(
                f"rows/{r['name']}.json: gold_logprob {r['gold_logprob']} is not the mean of its per-example "
                f"values ({float(np.nanmean(lp))})"
            )
    for r in committed:
        name = row_name(r)
        if name not in got:
            problems.append(f"curve.json row {name}: no row file recomputes it")
            continue
        for k, v in r.items():
            if k in SKIP_KEYS:
                continue
            if p := _differs(v, got[name].get(k)):
                problems.append(f"curve.json row {name} {k}: {p}")
    if extra := sorted(set(got) - {row_name(r) for r in committed}):
        problems.append(f"rows/ holds rows curve.json does not show: {extra}")
    return got, problems


def _run(folder: Path, exp: Experiment) -> tuple[dict[str, dict], list[str]]:
    """An ``epr run``'s committed rows: ``rows/per_query-<part>.jsonl.gz`` and ``select-report.json``; the table
    is ``<part>.json`` (``scripts/run_report.py``'s raw numbers)."""
    part = exp.extra.get("part", "locked")
    metric = exp.extra.get("metric", "correct")
    rows = [
        json.loads(x)
        for x in gzip.decompress((folder / "rows" / f"per_query-{part}.jsonl.gz").read_bytes()).splitlines()
    ]
    sel = read_json(folder / "select-report.json")
    _, raw = served_report(rows, sel, part, folder.name, metric)
    got: dict[str, dict] = {n: {**v, "n": raw["n"]} for n, v in raw["retrievers"].items()}
    served = got.setdefault(raw["served"], {})
    for k, t in raw["tests"].items():
        served[f"{k}_p"] = t["p"]
        if "p_ttest" in t:
            served[f"{k}_gain"], served[f"{k}_p_ttest"], served[f"{k}_gain_ci"] = (
                t["gain"],
                t["p_ttest"],
                t["gain_ci"],
            )
    for k, v in raw["holm"].items():
        served[f"{k}_holm"] = v
    problems = []
    table = folder / f"{part}.json"
    if not table.exists():
        problems.append(f"{table.name}: missing (python scripts/run_report.py <run> --part {part} --out ...)")
    elif p := _differs(read_json(table), json.loads(json.dumps(raw))):
        problems.append(f"{table.name}: {p}")
    return got, problems


def _side_row(r: dict) -> dict:
    """A slices side's row: its mean gold log-prob, its examples, its exact match where it has the metric (pooled
    sides: the seeds' mean per example) and how many seeds it pools."""
    vals = [v for v in r["per_query_logprob"] if v is not None]
    out = {"gold_logprob": float(np.mean(vals)), "n": len(vals)}
    if "correct" in r:
        out["em"] = 100 * float(np.mean(r["correct"]))
    if r.get("seeds", 1) > 1:
        out["seeds"] = r["seeds"]
    return out


def served_by(folder: Path, variant: str) -> str:
    """The retriever a slices folder's run served: what its ``select`` chose (``select-report-<variant>.json``)."""
    return read_json(folder / f"select-report-{variant}.json")["selected"]


def _slices(folder: Path, exp: Experiment) -> tuple[dict[str, dict], list[str]]:
    """Runs' rows side by side, for choices made on dev or on the training pool. A side ``<variant>:<retriever>``
    reads the first of ``rows/per_query-<variant>.jsonl.gz`` (a run's evaluation rows: gold log-prob and
    ``extra.metric`` per example), ``rows/select-<variant>.jsonl.gz`` (a run's selection slice: gold log-prob per
    held-out pool example) and ``rows/<variant>.json`` (a curve row of ``retriever``: gold log-prob). The retriever
    ``served`` names the one the run's ``select`` served (``select-report-<variant>.json``). Sides joined by commas
    (``s42:served,s1:served,s2:served``: seeds of the same examples) are one side, pooled per example: the seeds'
    mean gold log-prob and exact match (``compare_rows.pool``), as the curve folders pool.

    A row per side (its mean; ``em`` where it has the metric); per ``extra.pairs`` entry ``"A B"``
    (``fp32:hybrid bf16:hybrid``) a row ``B-vs-A`` with the paired gain, its 95% bootstrap interval and the
    Wilcoxon p (``compare_rows``), and ``B-vs-A:em`` with McNemar's where both sides have the metric. ``extra.gap``
    (``{base: side, top: side}``): every other side's ``oracle_gap_captured`` (and ``_ci``), the fraction of the
    base -> top gold log-prob gap it closes, paired."""
    from epr.experiments.compare_rows import compare, load_per_query, load_select, pool

    got: dict[str, dict] = {}
    problems: list[str] = []
    loaded: dict[str, dict] = {}
    metric = exp.extra.get("metric", "correct")

    def side(spec: str) -> dict:
        if "," in spec:  # seeds' sides of the same examples, pooled per example (compare_rows.pool)
            if spec not in loaded:
                loaded[spec] = pool([side(s) for s in spec.split(",")], spec)
                got[spec] = _side_row(loaded[spec])
            return loaded[spec]
        variant, retriever = spec.split(":")
        if spec not in loaded:
            # what the run's select served (select-report-<variant>.json), read once
            if retriever == "served":
                retriever = served_by(folder, variant)
            rows = folder / "rows"
            if (f := rows / f"per_query-{variant}.jsonl.gz").exists():
                loaded[spec] = load_per_query(f, retriever, metric)
            elif (f := rows / f"select-{variant}.jsonl.gz").exists():
                loaded[spec] = load_select(f, retriever)
            else:
                row = read_json(rows / f"{variant}.json")
                if row.get("key", {}).get("retriever") != retriever:
                    raise ValueError(f"rows/{variant}.json is not a {retriever!r} row")
                loaded[spec] = row
            got[spec] = _side_row(loaded[spec])
        return loaded[spec]

    for pair in exp.extra.get("pairs", []):
        a, b = pair.split()
        try:
            r = compare(side(a), side(b), a, b)
            got[f"{b}-vs-{a}"] = {
                k: r[k] for k in ("n", "gain", "gain_ci", "median_gain", "win_rate", "p_wilcoxon")
            }
            if "correct" in side(a) and "correct" in side(b):
                r = compare(side(a), side(b), a, b, metric="exact_match")
                got[f"{b}-vs-{a}:em"] = {
                    k: r[k] for k in ("n", "em_a", "em_b", "only_a", "only_b", "p_mcnemar")
                }
        except (OSError, ValueError) as e:
            problems.append(f"pair {pair!r}: {e}")
    if gap := exp.extra.get("gap"):
        try:
            base, top = side(gap["base"]), side(gap["top"])
            for spec in [s for s in list(got) if s in loaded and s not in (gap["base"], gap["top"])]:
                row = loaded[spec]["per_query_logprob"]
                if not len(row) == len(base["per_query_logprob"]) == len(top["per_query_logprob"]):
                    raise ValueError(f"{spec}, {gap['base']} and {gap['top']} do not hold the same examples")
                point, lo, hi = gap_fraction_ci(row, base["per_query_logprob"], top["per_query_logprob"])
                got[spec]["oracle_gap_captured"] = {"gold_logprob": point}
                got[spec]["oracle_gap_captured_ci"] = {"gold_logprob": [lo, hi]}
        except (OSError, ValueError, KeyError) as e:
            problems.append(f"gap {gap!r}: {e}")
    return got, problems


def _differs(want: Any, got: Any, path: str = "") -> str | None:
    """Where two JSON values differ (numbers to float rounding, the rest exactly); None when they agree."""
    if isinstance(want, Mapping) and isinstance(got, Mapping):
        for k in sorted(set(want) | set(got), key=str):
            if k in SKIP_KEYS:
                continue
            if k not in got or k not in want:
                return f"{path}{k}: only on {'the committed' if k in want else 'the recomputed'} side"
            if p := _differs(want[k], got[k], f"{path}{k}."):
                return p
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{path.rstrip('.')}: {len(want)} items committed, {len(got)} recomputed"
        for i, (a, b) in enumerate(zip(want, got)):
            if p := _differs(a, b, f"{path}{i}."):
                return p
        return None
    if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(want, bool):
        if (math.isnan(want) and math.isnan(got)) or math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-12):
            return None
        return f"{path.rstrip('.') or 'value'}: committed {want}, recomputed {got}"
    if want != got:
        return f"{path.rstrip('.') or 'value'}: committed {want!r}, recomputed {got!r}"
    return None


def lookup(row: Mapping | None, field: str) -> Any:
    """A dotted field of a recomputed row (``oracle_gap_captured.gold_logprob``); None where it is absent."""
    v: Any = row
    for part in field.split("."):
        if not isinstance(v, Mapping) or part not in v:
            return None
        v = v[part]
    return v


def recompute(exp: Experiment) -> tuple[dict[str, dict], list[str]]:
    """The folder's rows recomputed from its committed per-example files, and where its own tables disagree."""
    if exp.kind == "curve":
        got, problems = _curve(exp.folder)
    elif exp.kind == "run":
        got, problems = _run(exp.folder, exp)
    elif exp.kind == "slices":
        got, problems = _slices(exp.folder, exp)
    else:
        got, problems = _reports(exp.folder)
    return {**got, **_comparisons(exp)}, problems


def _reports(folder: Path) -> tuple[dict[str, dict], list[str]]:
    """A ``kind: other`` folder's TruthfulQA reports (``<sub>/per_question.jsonl`` beside ``<sub>/results.json``):
    each variant's MC1, MC2, MC3 and DPO recomputed from its per-question rows (``<sub>:<variant>``), and where the
    committed table disagrees."""
    from epr.truthfulqa.sets import summarise

    got: dict[str, dict] = {}
    problems: list[str] = []
    for pq in sorted(Path(folder).glob("*/per_question.jsonl")):
        sub = pq.parent
        table = read_json(sub / "results.json")["variants"]
        by_set: dict[str, list[dict]] = {}
        with open(pq, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{pq}:{i}: not JSON ({e})") from None
                by_set.setdefault(r["set"], []).append(r)
        for variant, said in table.items():
            if variant not in by_set:
                problems.append(
                    f"{sub.name}/results.json: variant {variant!r} has no rows in per_question.jsonl"
                )
                continue
            mine = summarise(by_set[variant])
            got[f"{sub.name}:{variant}"] = mine
            for k, v in mine.items():
                want = said.get(k)
                want = want[0] if isinstance(want, list) else want
                if isinstance(want, (int, float)) and not math.isclose(v, want, rel_tol=1e-9, abs_tol=1e-12):
                    problems.append(f"{sub.name}/results.json: {variant}.{k} {want} but its rows give {v}")
    return got, problems


def _comparisons(exp: Experiment) -> dict[str, dict]:
    """The declared comparisons of rows across folders (``cmp:<name>``: ``compare_rows``'s paired result)."""
    from epr.experiments.compare_rows import compare, load_side

    out = {}
    for name, c in exp.comparisons.items():
        side = {k: ",".join(str(exp.folder / p) for p in c[k].split(",") if p) for k in ("a", "b")}
        out[f"cmp:{name}"] = compare(load_side(side["a"]), load_side(side["b"]), "a", "b", c.get("metric"))
    return out


def check(folder: Path, rows_from: Path | None = None) -> list[str]:
    """Everything wrong with one results folder (empty: it recomputes to what it says). ``rows_from``: a rerun's
    folder, whose rows are checked against this folder's declared numbers (within their tolerances)."""
    exp = load(folder)
    pins = [f"{folder.name}: {p}" for p in digests.problems(folder, exp.files)] if rows_from is None else []
    if exp.status == "planned":  # pre-registered, not run: no rows yet (load checked its preregistration)
        if exp.expected:
            return [
                f"{folder.name}: status planned declares expected numbers: a plan has no results yet",
                *pins,
            ]
        return pins
    if exp.status in ("decisive", "supporting") and not exp.expected:
        pins.append(
            f"{folder.name}: a {exp.status} folder declares no expected number (nothing of it is checked)"
        )
    got, problems = recompute(exp if rows_from is None else dataclasses.replace(exp, folder=Path(rows_from)))
    # the served choices (select reports, reselect answers), recomputed from their rows
    problems += recheck(folder if rows_from is None else Path(rows_from))
    for e in exp.expected:
        if e.row not in got:
            problems.append(f"expected {e.row}.{e.field}: no such row (rows: {sorted(got)})")
        elif p := e.problem(lookup(got[e.row], e.field)):
            problems.append(f"expected {e.row}.{e.field}: {p}")
    for t in exp.tests:
        if not isinstance(lookup(got.get(t.row), t.field), (int, float)):
            problems.append(f"test {t.row}.{t.field} ({t.says}): no such p-value in the recomputed rows")
    return pins + [f"{folder.name}: {p}" for p in problems]


def folders(results: Path) -> list[Path]:
    return sorted(p for p in Path(results).iterdir() if p.is_dir() and p.name != "archive") + sorted(
        p for p in (Path(results) / "archive").glob("*") if p.is_dir()
    )


def check_all(results: Path) -> dict[str, list[str]]:
    return {f.name: check(f) for f in folders(results)}


def show(folder: Path) -> list[str]:
    """A folder's rows as ``epr experiment check`` recomputes them, one line each, for reading: each row's mean gold
    log-prob, exact match, gap share and pooled seeds where it has them; each pair's paired gain and p-values; any
    other row as its JSON. A planned folder shows the rows of the runs recorded so far, and names what cannot be
    computed yet (a pair whose runs are not in), so a pre-registered look whose seeds come in one by one can be
    read before its tests all compute."""
    exp = load(folder)
    try:
        got, problems = recompute(exp)
    except (OSError, ValueError) as e:  # a curve or run folder whose rows are not all there
        got, problems = {}, [str(e)]

    def ci(v: Any) -> str:
        return f" ({v[0]:.2f} to {v[1]:.2f})" if isinstance(v, list) and len(v) == 2 else ""

    def num(r: Mapping, k: str) -> bool:
        return isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)

    lines = [f"{exp.name} ({exp.status}, {exp.kind}, {exp.dataset} {exp.split}):"]
    for name, r in got.items():
        if num(r, "gain"):  # a pair in gold log-prob
            lines.append(
                f"  {name}: n {r.get('n')}, gain {r['gain']:+.3f} nats{ci(r.get('gain_ci'))}, "
                f"Wilcoxon p = {r.get('p_wilcoxon', float('nan')):.2g}"
            )
        elif num(r, "p_mcnemar"):  # a pair in the paper's metric
            lines.append(
                f"  {name}: EM {r['em_a']:.1f} vs {r['em_b']:.1f} (only A {r['only_a']}, only B {r['only_b']}), "
                f"McNemar p = {r['p_mcnemar']:.2g}"
            )
        elif num(r, "gold_logprob"):  # a row
            n = f"n {r['n']}, " if "n" in r else ""
            em = f", EM {r['em']:.1f}" if num(r, "em") else ""
            gap = lookup(r, "oracle_gap_captured.gold_logprob")
            share = (
                f", gap share {gap:.2f}{ci(lookup(r, 'oracle_gap_captured_ci.gold_logprob'))}"
                if isinstance(gap, (int, float))
                else ""
            )
            seeds = f", {r['seeds']} seeds pooled" if num(r, "seeds") and r["seeds"] > 1 else ""
            lines.append(f"  {name}: {n}gold log-prob {r['gold_logprob']:.3f}{em}{share}{seeds}")
        else:
            lines.append(f"  {name}: {json.dumps(r, default=str)[:200]}")
    lines += [f"  not computed: {p}" for p in problems]
    return lines
