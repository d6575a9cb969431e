"""Stage ``evaluate``: the task's metrics for every retriever on the same examples, paired comparisons, and the
report (``epr.reports.tables``): ``results.{md,csv,json}``, ``paired.{md,json}``, ``em.png``, ``report.html`` and
``per_query.jsonl`` (what each retriever chose and predicted for each example).

Beside them, what the learned rows cost and how much of the room they took: with ``bm25`` and ``lm-oracle`` among
the retrievers, each other row's ``oracle_gap_captured`` ((row - BM25) / (LM-Oracle - BM25) in gold log-prob, with
its paired bootstrap interval, and in exact match); with a learned retriever, ``label_cost``: the LM-scored
sequences of every round's labels (in the manifest, and a note under the table)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from epr.artifacts import read_jsonl, write_jsonl
from epr.config import parse_retriever_name
from epr.context import Context
from epr.reports.stats import PAPER, gap_fraction_ci, mean_ci
from epr.retrieval.retrievers import ORACLES
from epr.stages.retrieve import eval_examples
from epr.types import UpstreamError

log = logging.getLogger(__name__)


def logprob_metrics(lp: np.ndarray, lp_empty: np.ndarray) -> dict:
    """Mean gold log-prob (nats, with a bootstrap interval) and its DPO form against the empty context: the mean of
    ``log sigmoid(lp - lp_empty)`` (0 is best: the demonstrations always make the gold answer more likely)."""
    ok = ~np.isnan(lp) & ~np.isnan(lp_empty)
    m, lo, hi = mean_ci(lp[ok].tolist())
    dpo = -np.logaddexp(0.0, -(lp[ok] - lp_empty[ok]))
    dm, dlo, dhi = mean_ci(dpo.tolist())
    return {
        "gold_logprob": {"value": m, "ci_low": lo, "ci_high": hi},
        "dpo": {"value": dm, "ci_low": dlo, "ci_high": dhi},
        "gold_logprob_n": int(ok.sum()),
    }


def _arr(rows: list[dict], key: str) -> np.ndarray:
    return np.array([np.nan if r[key] is None else r[key] for r in rows], dtype=np.float64)


def retriever_result(task, name: str, ev: list, prompts: list[dict], preds: list[dict], lp_empty) -> tuple:
    """One retriever's row of the table and its per-example records."""
    base, div, bias, rm = parse_retriever_name(name)
    correct = [task.is_correct(p["prediction"], e.output) for p, e in zip(preds, ev)]
    extra = [task.metrics(p["prediction"], e.output) for p, e in zip(preds, ev)]
    m, lo, hi = mean_ci([100.0 * c for c in correct])
    res = {
        "em": m,
        "ci_low": lo,
        "ci_high": hi,
        "oracle": base in ORACLES,
        "mean_demos": float(np.mean([len(p["demo_ids"]) for p in prompts])),
        "mean_prompt_tokens": float(np.mean([p["n_tokens"] for p in prompts])),
        "prompt_status": {
            s: sum(p["status"] == s for p in prompts) for s in ("ok", "no_demo_fits", "query_too_long")
        },
        "paper": PAPER.get(task.name, {}).get(base) if not (div or bias or rm) else None,
        **logprob_metrics(_arr(preds, "gold_logprob"), lp_empty),
    }
    for k in task.extra_metrics:
        km, klo, khi = mean_ci([100.0 * x[k] for x in extra])
        res[k] = {"value": km, "ci_low": klo, "ci_high": khi}
    records = [
        {
            "demos": p["demo_ids"],
            "prediction": y["prediction"],
            "correct": c,
            "gold_logprob": y["gold_logprob"],
            **x,
        }
        for p, y, c, x in zip(prompts, preds, correct, extra)
    ]
    return res, records


def gap_captured(results: dict, per_query: list[dict]) -> None:
    """``oracle_gap_captured`` on every row but BM25's and the oracles', where ``bm25`` and ``lm-oracle`` were both
    run: the fraction of the BM25 -> LM-Oracle gap the row closes in gold log-prob (point, 95% paired bootstrap
    interval, ``epr.reports.stats.gap_fraction_ci``) and in exact match (point)."""
    if "bm25" not in results or "lm-oracle" not in results:
        return
    lp = {k: [q[k]["gold_logprob"] for q in per_query] for k in results}
    em = {k: [float(q[k]["correct"]) for q in per_query] for k in results}
    for name, r in results.items():
        if r["oracle"] or name == "bm25":
            continue
        point, lo, hi = gap_fraction_ci(lp[name], lp["bm25"], lp["lm-oracle"])
        b, o = np.mean(em["bm25"]), np.mean(em["lm-oracle"])
        # the curve rows' layout: {metric: share}, and the interval apart
        r["oracle_gap_captured"] = {
            "gold_logprob": None if np.isnan(point) else point,
            "em": None if o == b else float((np.mean(em[name]) - b) / (o - b)),
        }
        r["oracle_gap_captured_ci"] = {"gold_logprob": None if np.isnan(lo) else [lo, hi]}


def label_cost(ctx: Context) -> dict | None:
    """The LM-scored sequences behind a run's labels, every round: per round the labelled examples, the sequences
    scored for them (one per candidate) and those no earlier round scored; in all, the distinct sequences (a
    sequence is a (labelled example, candidate) pair of the pool). None where the labels are not the LM's
    (``labels.source: bm25``) or no learned retriever is compared (the scores are then not this row's upstream)."""
    if ctx.cfg.labels.source != "lm" or not {"epr", "hybrid"} & {
        parse_retriever_name(n)[0] for n in ctx.cfg.retrieve.retrievers
    }:
        return None
    seen: set[tuple[int, int]] = set()
    rounds = []
    for i, r in enumerate(ctx.rounds(), 1):
        try:
            ranks = r.rankings("scores", "scores.jsonl")
        except UpstreamError:  # an encoder from elsewhere (no scores here): no cost to report
            return None
        pairs = {(k.qid, c) for k in ranks for c in k.ids}
        rounds.append({"round": i, "examples": len(ranks), "sequences": len(pairs), "new": len(pairs - seen)})
        seen |= pairs
    return {"rounds": rounds, "scored_sequences": len(seen)}


def by_idx(path: Path, ev: list) -> list[dict]:
    """The rows of an upstream file in the order of ``ev``, joined by ``idx`` (never by position): a file that
    misses an example, repeats one or holds one that is not compared is an error naming the file and the ``idx``."""
    rows: dict[int, dict] = {}
    for r in read_jsonl(path, required=("idx",)):
        if r["idx"] in rows:
            raise UpstreamError(f"{path}: idx {r['idx']} appears twice; rerun the stage that wrote it")
        rows[r["idx"]] = r
    want = [e.idx for e in ev]
    missing = [i for i in want if i not in rows]
    extra = sorted(set(rows) - set(want))
    if missing or extra:
        raise UpstreamError(
            f"{path}: does not hold the compared examples (missing idx {missing[:5]}, unexpected idx {extra[:5]}); "
            "rerun the stage that wrote it"
        )
    return [rows[i] for i in want]


def run_evaluate(ctx: Context, out: Path, fp: str) -> dict:
    from epr.reports import tables as report

    cfg, task, pool = ctx.cfg, ctx.task, ctx.examples("pool")
    ev = eval_examples(ctx)
    empty = by_idx(ctx.stage_dir("predict") / "empty.jsonl", ev)
    lp_empty = _arr(empty, "gold_logprob")
    per_query = [
        {"idx": e.idx, "input": e.input, "gold": e.output, "gold_logprob_empty": r["gold_logprob"]}
        for e, r in zip(ev, empty)
    ]
    results = {}
    for name in cfg.retrieve.retrievers:
        prompts = by_idx(ctx.stage_dir("prompts") / f"{name}.jsonl", ev)
        preds = by_idx(ctx.stage_dir("predict") / f"{name}.jsonl", ev)
        results[name], records = retriever_result(task, name, ev, prompts, preds, lp_empty)
        for row, rec in zip(per_query, records):
            row[name] = {**rec, "demo_inputs": [pool[i].input for i in rec["demos"][:3]]}
        r = results[name]
        log.info(
            "%s: EM %.1f [%.1f, %.1f], gold log-prob %.2f",
            name,
            r["em"],
            r["ci_low"],
            r["ci_high"],
            r["gold_logprob"]["value"],
        )
    write_jsonl(out / "per_query.jsonl", per_query)
    gap_captured(results, per_query)
    cost = label_cost(ctx)
    report.write_comparison(out, report.comparison_table(task, results, len(ev), cfg, cost))
    report.write_paired(out, per_query, list(results), ("correct", *task.extra_metrics))
    extra = {"results": results, **({"label_cost": cost} if cost else {})}
    return {"rows": {"eval": len(ev), "retrievers": len(results)}, "extra": extra}
