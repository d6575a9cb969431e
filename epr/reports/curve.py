"""The learning-curve rows (``epr experiment curve``, any dataset): seeds pooled into one row, exact match and the
gold log-prob paired against BM25 and SBERT on the same examples, the fraction of the BM25 -> LM-Oracle gap, and the
``curve.json`` / ``curve.md`` / ``curve.png`` a results folder holds. Pure functions of the rows (no model): the
script runs the stages and hands the rows here.

A row is a dict ``{name, retriever, loss, labels, seed, seeds, split, n, gold_logprob, gold_logprob_ci, dpo,
per_query_logprob}``; exact-match rows (``em``) are ``{idx, correct, prediction[, metrics]}`` per example."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from epr.artifacts import atomic_write_bytes, atomic_write_text
from epr.reports.machine import describe, machine
from epr.reports.stats import gap_fraction_ci, mcnemar_exact

__all__ = [
    "BASE_SEED",
    "seeded",
    "save_em",
    "pooled",
    "em_values",
    "paired_p",
    "add_pooled",
    "attach_em",
    "paired_logprob",
    "write_curve",
]


BASE_SEED = 42  # TrainConfig.seed's default: the committed single-seed runs


def seeded(name: str, seed: int) -> str:
    """A run or row name for training seed ``seed`` (the base seed keeps the committed names)."""
    return name if seed == BASE_SEED else f"{name}-s{seed}"


def save_em(rows_dir: Path, name: str, e: dict) -> None:
    """Per-example correctness and prediction of an exact-match row (gzipped JSON, written atomically and without
    a timestamp: the same row gives the same bytes): every EM figure and McNemar test can be recomputed from the
    repository."""
    import gzip

    data = gzip.compress(json.dumps(e).encode("utf-8"), mtime=0)
    atomic_write_bytes(rows_dir / f"em-{name}.json.gz", data)


def pooled(es: list[dict]) -> dict:
    """Several seeds' EM rows as one: examples x seeds, paired against a reference repeated per seed."""
    out = {k: [x for e in es for x in e[k]] for k in ("idx", "correct", "prediction")}
    if len({em_method(e) for e in es}) > 1:
        raise ValueError("pooling exact-match rows of different methods (generated and greedy)")
    if "method" in es[0]:
        out["method"] = es[0]["method"]
    if "metrics" in es[0]:
        out["metrics"] = {m: [x for e in es for x in e["metrics"][m]] for m in es[0]["metrics"]}
    return out


def em_method(e: dict) -> str:
    """How an exact-match row was measured: ``generate`` (greedy generation; rows without the field) or ``greedy``
    (read off the gold pass: ``epr.stages.predict.greedy_exact``, a lower bound of the generated one)."""
    return e.get("method", "generate")


def em_values(e: dict, metric: str = "correct") -> list:
    """Per-example correctness under ``metric``: ``correct`` (the task's exact match) or one of ``metrics``."""
    return e["correct"] if metric == "correct" else e["metrics"][metric]


def paired_p(e: dict, ref: dict, k: int = 1, metric: str = "correct") -> float:
    """Exact sign test, one pair per example, of a row's correctness (with ``k`` seeds pooled: the seeds' mean
    correctness) against a reference's; with one seed, the exact McNemar test. The seeds of an example are not
    independent examples: pairing examples x seeds with a repeated reference would count each example k times."""
    n = len(ref["correct"])
    if em_method(e) != em_method(ref):
        raise ValueError(f"paired test across exact-match methods ({em_method(e)} vs {em_method(ref)})")
    if len(e["correct"]) != k * n or any(e["idx"][s * n : (s + 1) * n] != ref["idx"] for s in range(k)):
        raise ValueError("paired test on different examples")
    mean = np.mean(np.reshape(np.asarray(em_values(e, metric), dtype=float), (k, n)), axis=0)
    r = np.asarray(em_values(ref, metric), dtype=float)
    return mcnemar_exact(int(np.sum(mean > r)), int(np.sum(mean < r)))


def untrained_note(best_epoch) -> str:
    """A learned row whose training kept epoch 0 (``train.best_by``: no epoch beat the untrained encoder on the dev
    labels) is the untrained encoder: its table cell says so."""
    epochs = best_epoch if isinstance(best_epoch, list) else [best_epoch]
    n0 = sum(e == 0 for e in epochs)
    if not n0:
        return ""
    return (
        "; kept epoch 0 (untrained)"
        if len(epochs) == 1
        else f"; {n0} of {len(epochs)} seeds kept epoch 0 (untrained)"
    )


def seed_mean(per_query: list[list]) -> list:
    """Several seeds' per-example gold log-probs of the same examples as one list: per example the mean over the seeds
    that scored it (``None`` where none did)."""
    per = np.array([[np.nan if v is None else v for v in r] for r in per_query], dtype=float)
    seen = ~np.all(np.isnan(per), axis=0)
    mean = np.full(per.shape[1], np.nan)
    mean[seen] = np.nanmean(per[:, seen], axis=0)
    return [None if np.isnan(v) else float(v) for v in mean]


def add_pooled(rows: list[dict], n: int, loss: str, seeds: list[int], retriever: str = "epr") -> None:
    """A row pooling the seeds of one curve point of one learned retriever (``epr``, ``hybrid``): mean and spread
    of the seeds' gold log-probs; per example the mean over seeds (the paired tests compare that with a reference on
    the same examples)."""
    mine = [
        r
        for r in rows
        if r["loss"] == loss and r["labels"] == n and r["seeds"] == 1 and r["retriever"] == retriever
    ]
    if len(seeds) < 2 or len(mine) < len(seeds):
        return
    means = [r["gold_logprob"] for r in mine]
    rows.append(
        {
            **{k: mine[0][k] for k in ("retriever", "loss", "labels", "split", "n")},
            "name": f"{retriever}@{n}-{loss}-pooled",
            "seed": None,
            "seeds": len(mine),
            "gold_logprob": float(np.mean(means)),
            "gold_logprob_sd": float(np.std(means, ddof=1)),
            "gold_logprob_seed_values": means,
            "gold_logprob_ci": [float(min(means)), float(max(means))],
            "dpo": float(np.mean([r["dpo"] for r in mine])),
            "per_query_logprob": seed_mean([r["per_query_logprob"] for r in mine]),
            "best_epoch": [r.get("best_epoch") for r in mine],
            # per seed: a re-mined round's candidates follow the seed's round-1 encoder
            **(
                {"scored_sequences": [r["scored_sequences"] for r in mine]}
                if all(r.get("scored_sequences") is not None for r in mine)
                else {}
            ),
        }
    )


def attach_em(rows: list[dict], em: dict[str, dict]) -> None:
    for row in rows:
        key = row["retriever"] if row["loss"] is None else row["name"]
        if key not in em:
            continue
        e, k = em[key], row["seeds"]
        row["em_metrics"], row["em_method"] = list(e.get("metrics", {})), em_method(e)
        # the task's exact match ("em") and its other exact-match metrics, each with the same paired tests
        for m, field in [("em", "correct"), *((m, m) for m in row["em_metrics"])]:
            row[m] = 100.0 * float(np.mean(em_values(e, field)))
            prefix = "" if m == "em" else f"{m}_"
            for b in ("bm25", "sbert"):
                ok = em.get(b) is not None and key != b
                row[f"{prefix}p_vs_{b}"] = paired_p(e, em[b], k, field) if ok else None
        if k > 1:
            per_seed = [100.0 * float(np.mean(c)) for c in np.array_split(e["correct"], k)]
            row["em_seed_values"], row["em_sd"] = per_seed, float(np.std(per_seed, ddof=1))
        row["em_n"] = len(e["correct"]) // k  # evaluation examples (a pooled row holds k predictions each)


def paired_logprob(a: list, b: list) -> tuple[float, float, float, float]:
    """Per-example differences of gold log-probs (a - b, examples both scored): mean, Wilcoxon signed-rank p, median
    and the fraction of examples where a is higher. The mean is heavy-tailed (a demonstration with the gold's parse
    skeleton moves an example by ~10-20 nats: results/mtop-curve/diagnose-sbert.md), so the median and the win rate
    say what the typical example does."""
    from scipy.stats import wilcoxon

    d = np.array([x - y for x, y in zip(a, b) if x is not None and y is not None])
    if len(d) == 0 or not np.any(d):
        return 0.0, 1.0, 0.0, 0.0
    return float(d.mean()), float(wilcoxon(d).pvalue), float(np.median(d)), float(np.mean(d > 0))


def curve_rows(rows: list[dict]) -> list[dict]:
    """The rows of ``curve.json`` from the computed rows (each with its per-example gold log-probs): the paired
    log-prob tests against BM25 and SBERT and the fraction of the BM25 -> LM-Oracle gap captured, with its interval.
    Pure: ``epr experiment check`` recomputes a folder's table with it from the committed rows alone."""
    ref = {r["retriever"]: r["per_query_logprob"] for r in rows if r["loss"] is None}
    for r in rows:
        for b in ("bm25", "sbert"):
            if b in ref and (r["retriever"] != b or r["loss"] is not None):
                (
                    r[f"logprob_gain_vs_{b}"],
                    r[f"logprob_p_vs_{b}"],
                    r[f"logprob_median_gain_vs_{b}"],
                    r[f"logprob_win_rate_vs_{b}"],
                ) = paired_logprob(r["per_query_logprob"], ref[b])
    gap = {m: {r["retriever"]: r.get(m) for r in rows if r["loss"] is None} for m in ("gold_logprob", "em")}
    extra = sorted({m for r in rows for m in r.get("em_metrics", ())})  # e.g. BREAK's lf_em

    def captured(r: dict, m: str):
        """(row - BM25) / (LM-Oracle - BM25) on the same examples and metric."""
        b, o, v = gap[m].get("bm25"), gap[m].get("lm-oracle"), r.get(m)
        return None if None in (b, o, v) or o == b else (v - b) / (o - b)

    def captured_ci(r: dict) -> list[float] | None:
        """The gold log-prob's captured fraction's paired bootstrap interval (examples resampled with BM25's and
        LM-Oracle's): how sure the fraction is, not only what it is."""
        if "bm25" not in ref or "lm-oracle" not in ref or r["retriever"] in ("bm25", "lm-oracle"):
            return None
        _, lo, hi = gap_fraction_ci(r["per_query_logprob"], ref["bm25"], ref["lm-oracle"])
        return None if np.isnan(lo) else [lo, hi]

    slim = [
        {
            "retriever": r["retriever"],
            "loss": r["loss"],
            "labels": r["labels"],
            "split": r.get("split", "dev"),
            "seeds": r.get("seeds", 1),
            "seed": r.get("seed"),
            "best_epoch": r.get("best_epoch"),  # the training epoch the row's encoder is (0: untrained)
            "oracle_gap_captured": {m: captured(r, m) for m in ("gold_logprob", "em")},
            "oracle_gap_captured_ci": {"gold_logprob": captured_ci(r)},
            "n": r.get("em_n", r["n"]),
            "em": r.get("em"),
            **({"em_method": r["em_method"]} if r.get("em_method", "generate") != "generate" else {}),
            "p_vs_bm25": r.get("p_vs_bm25"),
            "p_vs_sbert": r.get("p_vs_sbert"),
            "gold_logprob": r["gold_logprob"],
            "gold_logprob_ci": r["gold_logprob_ci"],
            "dpo": r["dpo"],
            **{
                k: r[k]
                for k in (
                    "logprob_gain_vs_bm25",
                    "logprob_p_vs_bm25",
                    "logprob_median_gain_vs_bm25",
                    "logprob_win_rate_vs_bm25",
                    "logprob_gain_vs_sbert",
                    "logprob_p_vs_sbert",
                    "logprob_median_gain_vs_sbert",
                    "logprob_win_rate_vs_sbert",
                )
                if k in r
            },
            **{
                k: r[k]
                for k in ("em_sd", "em_seed_values", "gold_logprob_sd", "gold_logprob_seed_values")
                if k in r
            },
            **{k: v for k, v in r.items() if any(k == m or k.startswith(m + "_p_vs_") for m in extra)},
            "train_seconds_or_eval_seconds": r.get("seconds"),
            # the LM-scored sequences of the row's labels, every round (rows made before it was counted lack it)
            **({"scored_sequences": r["scored_sequences"]} if r.get("scored_sequences") is not None else {}),
        }
        for r in rows
    ]
    return slim


def write_curve(
    out: Path,
    rows: list[dict],
    *,
    name: str,
    split: str,
    lms: str,
    t0: float,
    labels_info: dict | None = None,
    redraw_of: dict | None = None,
) -> None:
    """``curve.json`` / ``.md`` / ``.png`` in ``out``: ``name`` the curve's, ``split`` the compared part, ``lms`` the
    scoring and inference LMs in words, ``t0`` when the curve started, ``labels_info`` the scored sequences.
    ``redraw_of``: the ``info`` of the curve.json being redrawn from its rows (``--from-rows``): its machine, command
    and labels are kept (they say where the rows were computed), and the redraw is recorded beside them."""
    out.mkdir(parents=True, exist_ok=True)
    slim = curve_rows(rows)
    extra = sorted({m for r in rows for m in r.get("em_metrics", ())})  # e.g. BREAK's lf_em
    here = {"machine": machine(), "command": " ".join(sys.argv), "elapsed_seconds": round(time.time() - t0)}
    info = here if redraw_of is None else {**redraw_of, "redrawn_from_rows": here}
    if labels_info:  # the scored sequences, and the last scoring process's throughput
        info["labels"] = labels_info
    atomic_write_text(out / "curve.json", json.dumps({"info": info, "rows": slim}, indent=2) + "\n")
    lines = [
        f"# {name}: learning curve",
        "",
        f"Machine: {describe(info['machine'])}. Command: `{info['command']}`."
        + (
            f" Redrawn from `rows/` alone by `{r['command']}` ({describe(r['machine'])})."
            if (r := info.get("redrawn_from_rows"))
            else ""
        ),
        *(
            [
                f"Labels: {lab['sequences']} scored sequences"
                + (
                    f"; the last scoring process scored {lab['speed']['scored_here']} at "
                    f"{lab['speed']['sequences_per_s']} sequences/s ({lab['speed']['machine']})."
                    if (lab.get("speed") or {}).get("scored_here")
                    else " (served from the score cache: imported or scored by an earlier run; no throughput measured "
                    "in this run)."
                )
            ]
            if (lab := info.get("labels"))
            else []
        ),
        f"Evaluation: {slim[0]['n'] if slim else 0} seeded evaluation examples of {name.split('-')[0]}; {lms}. Gold log-prob: log p(gold parse | prompt), nats, mean with 95% bootstrap interval; DPO: mean "
        "log sigmoid(gold log-prob - without demonstrations). Δ: mean paired gain in gold log-prob over BM25 / SBERT "
        "on the same examples (p: Wilcoxon signed-rank; the median paired gain and the share of examples where the row "
        "is higher: the mean is heavy-tailed). EM: exact match (%), p: exact McNemar vs BM25 / SBERT "
        "on the same examples"
        + (
            " (**EM read off the gold pass, not generated**: an example counts when every gold token is the LM's "
            "greedy choice after the prompt, a lower bound of generated exact match; `--em-method greedy`)"
            if any(r.get("em_method") == "greedy" for r in slim)
            else ""
        )
        + (
            f"; the task's other exact-match metrics ({', '.join(extra)}) with the same tests."
            if extra
            else "."
        ),
        "",
        f"Split: **{slim[0]['split'] if slim else split}** (dev: the curve's seeded subset every choice was made "
        "on; locked: the rest of the validation split, evaluated once with the settings fixed beforehand). Seeds: "
        "training seeds pooled in the row (pooled rows: mean over seeds, the interval column is the seeds' "
        "min-max; EM p-values: exact sign test per example of the seeds' mean correctness vs the reference; "
        "log-prob Δ: per example, the seeds' mean). Gap: the fraction of the BM25 → LM-Oracle gap captured "
        "(gold log-prob, with its paired 95% bootstrap interval; EM where both are measured).",
        "",
        "| retriever | loss | labels | seeds | gold log-prob | 95% CI | Δ vs BM25 (p) | Δ vs SBERT (p) | DPO | EM | "
        "EM p vs BM25 | EM p vs SBERT | "
        + "".join(f"{m} | {m} p vs BM25 | {m} p vs SBERT | " for m in extra)
        + "gap (log-prob / EM) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|" * (3 * len(extra)) + "---|",
    ]

    def gain(r: dict, b: str) -> str:
        k = f"logprob_gain_vs_{b}"
        if k not in r:
            return ""
        med, win = r.get(f"logprob_median_gain_vs_{b}"), r.get(f"logprob_win_rate_vs_{b}")
        typical = "" if med is None else f"; median {med:+.2f}, {100 * win:.0f}% higher"
        return f"{r[k]:+.3f} ({r[f'logprob_p_vs_{b}']:.2g}{typical})"

    def seeds(r: dict) -> str:  # which seed a single-seed learned row is, so its lines can be told apart
        cell = f"1 (seed {r['seed']})" if r["seeds"] == 1 and r.get("seed") is not None else str(r["seeds"])
        return cell + untrained_note(r.get("best_epoch"))

    for r in slim:
        f = lambda v, d=1: "" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))  # noqa: E731
        p = lambda v: "" if v is None else f"{v:.3g}"  # noqa: E731
        g = r["oracle_gap_captured"]
        gp = " / ".join("" if g[m] is None else f"{g[m]:.2f}" for m in ("gold_logprob", "em"))
        if (ci := r["oracle_gap_captured_ci"]["gold_logprob"]) is not None:
            gp = gp.replace(" / ", f" ({ci[0]:.2f} to {ci[1]:.2f}) / ", 1)
        lines.append(
            f"| {r['retriever']} | {r['loss'] or ''} | {r['labels'] or ''} | {seeds(r)} | {f(r['gold_logprob'], 3)} | "
            f"{r['gold_logprob_ci'][0]:.3f} to {r['gold_logprob_ci'][1]:.3f} | {gain(r, 'bm25')} | {gain(r, 'sbert')} | "
            f"{r['dpo']:.2e} | {f(r['em'])} | "
            f"{p(r['p_vs_bm25'])} | {p(r['p_vs_sbert'])} | "
            + "".join(
                f"{f(r.get(m))} | {p(r.get(f'{m}_p_vs_bm25'))} | {p(r.get(f'{m}_p_vs_sbert'))} | "
                for m in extra
            )
            + f"{gp} |"
        )
    atomic_write_text(out / "curve.md", "\n".join(lines) + "\n")
    from epr.reports.plots import plot_curve

    plot_curve(out, slim, BASE_SEED)
