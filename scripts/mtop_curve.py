"""The learning curve: what the learned retriever gains as it gets more LM-labelled training examples (MTOP by
default; any dataset with a curve config: ``-c configs/smcalflow_curve.yaml``, ``-c configs/break_curve.yaml``).

    python scripts/mtop_curve.py                                  # the committed curve (results/mtop-curve/)
    python scripts/mtop_curve.py -c configs/break_curve.yaml      # BREAK's (results/break-curve/)
    python scripts/mtop_curve.py --sizes 250,500 --losses distill --em none     # a quick partial curve
    python scripts/mtop_curve.py --set models.dtype=auto          # any config key (here: bf16 where fast)

Every step is resumable (stages, the run root's score cache, per-row files): rerun the same command after a kill.

1. Labels for the largest size (``configs/mtop_curve.yaml``: nested seeded label sets, so each smaller set is a
   prefix of the largest and reuses its scores from the score cache).
2. For each size x loss: train (``runs/<name>/<size>-<loss>/``, ``name`` from the config), then the dense metric on the evaluation examples:
   the gold answer's log-probability under the inference LM given the retrieved demonstrations (one forward pass
   per example; RAGSys's way of judging a retriever) and its DPO form against the empty context.
3. Reference rows, with the same metric: BM25, SBERT, the untrained dual encoder, BM25-Oracle, LM-Oracle.
4. Exact match (generation) for the rows that decide the bar (``--em``: the references and the largest size of
   each loss, by default), with paired exact McNemar tests against BM25 and SBERT on the same examples.

Writes ``curve.json`` (rows ``{retriever, loss, labels, n, em, p_vs_bm25, p_vs_sbert, gold_logprob, dpo}``),
``curve.md`` and ``curve.png`` into ``--out``, naming the machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import describe, machine  # noqa: E402
from epr import pipeline  # noqa: E402
from epr.config import load_config  # noqa: E402
from epr.context import Context  # noqa: E402
from epr.reports.stats import mcnemar_exact  # noqa: E402

log = logging.getLogger("mtop_curve")

LOSS_SETTINGS = {  # the similarity each loss is trained with (EPR: the paper's raw inner product)
    "epr": ["train.loss=epr", "train.similarity=dot"],
    "listwise": ["train.loss=listwise", "train.similarity=cosine"],
    "distill": ["train.loss=distill", "train.similarity=cosine"],
}
REFERENCES = ("bm25", "sbert", "untrained", "bm25-oracle", "lm-oracle")


SPLIT_SETTINGS = {  # dev: the seeded evaluation subset every choice is made on; locked: the rest, once at the end
    "dev": [],
    "locked": ["data.eval_part=locked", "retrieve.eval_limit=null"],
}
BASE_SEED = 42  # TrainConfig.seed's default: the committed single-seed runs


def ctx_for(args, name: str, *extra: str) -> Context:
    sets = [f"run_root={args.run_root}", *args.set, f"name={name}", *SPLIT_SETTINGS[args.split], *extra]
    return Context(load_config([args.config], sets))


def seeded(name: str, seed: int) -> str:
    """A run or row name for training seed ``seed`` (the base seed keeps the committed names)."""
    return name if seed == BASE_SEED else f"{name}-s{seed}"


class DenseMetric:
    """Gold log-prob (and DPO vs the empty context) of one retriever's prompts; the inference LM loaded once."""

    def __init__(self, ctx: Context):
        from epr.lm.factory import lm_spec, load, score_cache, scorer_for
        from epr.stages.predict import gold_logprob
        from epr.stages.retrieve import eval_examples

        self.model, self.tok = load(lm_spec(ctx.cfg, inference=True))
        self.scorer, self.cache = (
            scorer_for(ctx.cfg, self.model, self.tok),
            score_cache(ctx.cfg, inference=True),
        )
        self.ev = eval_examples(ctx)
        task = ctx.task
        self.empty = gold_logprob(
            self.scorer, self.cache, task, [task.format_query(e.input) for e in self.ev], self.ev
        )

    def __call__(self, ctx: Context, retriever: str) -> dict:
        from epr.retrieval.retrievers import make_retriever
        from epr.stages.evaluate import logprob_metrics
        from epr.stages.predict import gold_logprob
        from epr.stages.prompts import prompt_maker

        r = make_retriever(retriever, ctx.examples("pool"), ctx.task, ctx.cfg, ctx.encoder_dir(retriever))
        make = prompt_maker(ctx, self.tok)
        prompts = [make(e, ids) for e, ids in zip(self.ev, r.retrieve(self.ev, ctx.cfg.retrieve.k).ids)]
        lp = gold_logprob(self.scorer, self.cache, ctx.task, [p.text for p in prompts], self.ev)
        m = logprob_metrics(lp, self.empty)
        return {
            "n": len(self.ev),
            "gold_logprob": m["gold_logprob"]["value"],
            "gold_logprob_ci": [m["gold_logprob"]["ci_low"], m["gold_logprob"]["ci_high"]],
            "dpo": m["dpo"]["value"],
            "per_query_logprob": [None if np.isnan(v) else float(v) for v in lp],
        }


def row_key(ctx: Context, retriever: str, fp: str, n: int) -> dict:
    """What a dense-metric row was computed from, by the stages' own fingerprint rules: ``fp`` (the run's labels or
    encoder), the retrieve stage's keys for this one retriever (``retrieve.k``, the eval subset, the SBERT encoder,
    ...), the prompts stage's keys (``retrieve.prompt_budget``, ``retrieve.max_demos``, the inference LM's
    tokenizer), the gold log-prob's scoring key (``models.inference_lm``: identity, dtype, forward) and ``n``."""
    import dataclasses

    from epr.lm.factory import scoring_key

    cfg = ctx.cfg
    one = Context(
        dataclasses.replace(cfg, retrieve=dataclasses.replace(cfg.retrieve, retrievers=(retriever,)))
    )
    return {
        "fp": fp,
        "n": n,
        "retriever": retriever,
        "retrieve": pipeline.STAGES["retrieve"].keys(one),
        "prompts": pipeline.STAGES["prompts"].keys(one),
        "gold_logprob": scoring_key(cfg, inference=True),
    }


def cached_row(path: Path, key: dict, compute) -> dict:
    """A row file reused while its key (what it was computed from) is unchanged."""
    key = json.loads(json.dumps(key))  # as the file holds it (tuples as lists)
    if path.exists():
        row = json.loads(path.read_text())
        if row.get("key") == key:
            return row
    t = time.time()
    row = {"key": key, **compute(), "seconds": round(time.time() - t, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row) + "\n")
    return row


def em_rows(ctx: Context, retrievers: list[str]) -> dict[str, dict]:
    """Run the compare stages (generation, resumable) for ``retrievers``; per-query correctness by retriever, and
    the task's other exact-match metrics (``metrics``: BREAK's LF-EM beside its NEM)."""
    pipeline.run(ctx, until="evaluate")
    per_query = [
        json.loads(x) for x in (ctx.stage_dir("evaluate") / "per_query.jsonl").read_text().splitlines()
    ]
    extra = list(ctx.task.extra_metrics)
    return {
        r: {
            "idx": [q["idx"] for q in per_query],
            "correct": [bool(q[r]["correct"]) for q in per_query],
            "prediction": [q[r]["prediction"] for q in per_query],
            **({"metrics": {m: [bool(q[r][m]) for q in per_query] for m in extra}} if extra else {}),
        }
        for r in retrievers
    }


def save_em(rows_dir: Path, name: str, e: dict) -> None:
    """Per-example correctness and prediction of an exact-match row (gzipped JSON): every EM figure and McNemar
    test can be recomputed from the repository."""
    import gzip

    rows_dir.mkdir(parents=True, exist_ok=True)
    with gzip.open(rows_dir / f"em-{name}.json.gz", "wt", encoding="utf-8") as f:
        json.dump(e, f)


def pooled(es: list[dict]) -> dict:
    """Several seeds' EM rows as one: examples x seeds, paired against a reference repeated per seed."""
    out = {k: [x for e in es for x in e[k]] for k in ("idx", "correct", "prediction")}
    if "metrics" in es[0]:
        out["metrics"] = {m: [x for e in es for x in e["metrics"][m]] for m in es[0]["metrics"]}
    return out


def em_values(e: dict, metric: str = "correct") -> list:
    """Per-example correctness under ``metric``: ``correct`` (the task's exact match) or one of ``metrics``."""
    return e["correct"] if metric == "correct" else e["metrics"][metric]


def paired_p(e: dict, ref: dict, k: int = 1, metric: str = "correct") -> float:
    """Exact sign test, one pair per example, of a row's correctness (with ``k`` seeds pooled: the seeds' mean
    correctness) against a reference's; with one seed, the exact McNemar test. The seeds of an example are not
    independent examples: pairing examples x seeds with a repeated reference would count each example k times."""
    n = len(ref["correct"])
    if len(e["correct"]) != k * n or any(e["idx"][s * n : (s + 1) * n] != ref["idx"] for s in range(k)):
        raise ValueError("paired test on different examples")
    mean = np.mean(np.reshape(np.asarray(em_values(e, metric), dtype=float), (k, n)), axis=0)
    r = np.asarray(em_values(ref, metric), dtype=float)
    return mcnemar_exact(int(np.sum(mean > r)), int(np.sum(mean < r)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "mtop_curve.yaml"))
    ap.add_argument("--sizes", default="250,500,1000,2000")
    ap.add_argument("--losses", default="distill,listwise,epr")
    ap.add_argument(
        "--em", default="largest", help="which learned rows get exact match: largest | all | none"
    )
    ap.add_argument("--refs", default=",".join(REFERENCES), help="reference rows (gold log-prob)")
    ap.add_argument("--refs-em", default=",".join(REFERENCES), help="reference rows that get exact match")
    ap.add_argument("--run-root", default="runs")
    ap.add_argument("--out", default=None, help="default: results/<config name>[-locked]/")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--split", choices=sorted(SPLIT_SETTINGS), default="dev")
    ap.add_argument(
        "--seeds",
        default=str(BASE_SEED),
        help="training seeds (train.seed) of every learned row; >1: pooled rows",
    )
    ap.add_argument(
        "--import-scores",
        action="append",
        default=[],
        metavar="FILE",
        help="add an `epr cache export` file (e.g. committed labels) to the run root's score cache first",
    )
    a = ap.parse_args(argv)
    cfg0 = load_config([a.config], [f"run_root={a.run_root}", *a.set])
    a.name = cfg0.name  # the runs' and the results' name (mtop-curve, break-curve, ...)
    a.lms = (
        f"scoring LM {cfg0.models.lm}, inference LM {cfg0.models.inference_lm or cfg0.models.lm} "
        f"(models.dtype={cfg0.models.dtype})"
    )
    if a.out is None:
        a.out = str(ROOT / "results" / (a.name + ("-locked" if a.split == "locked" else "")))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sizes = sorted(int(s) for s in a.sizes.split(","))
    seeds = [int(s) for s in a.seeds.split(",") if s]
    losses = [s for s in a.losses.split(",") if s]
    out = Path(a.out)
    rows_dir = out / "rows"
    t0 = time.time()

    for f in a.import_scores:  # scores of the same computation key are served, never scored again
        from epr.lm.score_cache import import_scores

        for store, c in import_scores(Path(cfg0.run_root) / ".cache" / "scores", f).items():
            log.info("imported %s into %s: %s", f, store, c)

    # 1. labels for the largest set (smaller sets reuse its scores)
    base = ctx_for(a, a.name, f"candidates.num_queries={sizes[-1]}")
    pipeline.run(base, until="labels")
    log.info("labels for %d training examples ready (%.0f s)", sizes[-1], time.time() - t0)

    metric = DenseMetric(base)
    rows: list[dict] = []

    def add(
        retriever: str, loss: str | None, labels: int | None, ctx: Context, name: str, fp: str, seed=None
    ) -> dict:
        key = row_key(ctx, retriever, fp, len(metric.ev))
        r = cached_row(rows_dir / f"{name}.json", key, lambda: metric(ctx, retriever))
        row = {
            "name": name,
            "retriever": name.split("@")[0],
            "loss": loss,
            "labels": labels,
            "seed": seed,
            "seeds": 1,
            "split": a.split,
            "run": str(ctx.cfg.run_dir),
            **r,
        }
        rows.append(row)
        log.info("%s: gold log-prob %.3f (DPO %.3f)", name, row["gold_logprob"], row["dpo"])
        return row

    # 2. references (dense metric)
    # (reference runs depend only on the largest size: rows of a partial run are reused by the full one)
    top = f"candidates.num_queries={sizes[-1]}"
    ref_ctx = ctx_for(a, f"{a.name}/ref", top)
    pipeline.run(ref_ctx, until="labels")
    untrained = ctx_for(a, f"{a.name}/untrained", top, "train.epochs=0", *LOSS_SETTINGS["distill"])
    pipeline.run(untrained, until="encoder")
    for r in [r for r in a.refs.split(",") if r]:
        c = untrained if r == "untrained" else ref_ctx
        fp = pipeline.stage_fingerprint(c, "encoder" if r == "untrained" else "labels")
        add("epr" if r == "untrained" else r, None, None, c, r, fp)

    # 3. the curve: train each (size, loss), dense metric
    runs: dict[tuple[int, str], Context] = {}
    for n in sizes:
        for loss in losses:
            for seed in seeds:
                c = curve_ctx(a, n, loss, seed)
                t = time.time()
                pipeline.run(c, until="encoder")
                log.info("trained %d-%s seed %d (%.0f s)", n, loss, seed, time.time() - t)
                runs[(n, loss, seed)] = c
                fp = pipeline.stage_fingerprint(c, "encoder")
                add("epr", loss, n, c, seeded(f"epr@{n}-{loss}", seed), fp, seed)
            _add_pooled(rows, n, loss, seeds)
            _write(out, rows, a, t0)

    # 4. exact match for the rows that decide the bar
    em: dict[str, dict] = {}
    refs = [r for r in a.refs_em.split(",") if r]
    if a.em != "none":
        plain = [r for r in refs if r != "untrained"]
        ref_em = ctx_for(a, f"{a.name}/ref", top, f"retrieve.retrievers=[{','.join(plain)}]")
        em |= em_rows(ref_em, plain)
        if "untrained" in refs:
            u = ctx_for(
                a,
                f"{a.name}/untrained",
                top,
                "train.epochs=0",
                *LOSS_SETTINGS["distill"],
                "retrieve.retrievers=[epr]",
            )
            em["untrained"] = em_rows(u, ["epr"])["epr"]
        for n, loss, seed in runs:
            if a.em == "all" or n == sizes[-1]:
                c2 = curve_ctx(a, n, loss, seed, "retrieve.retrievers=[epr]")
                em[seeded(f"epr@{n}-{loss}", seed)] = em_rows(c2, ["epr"])["epr"]
                if len(seeds) > 1 and all(seeded(f"epr@{n}-{loss}", s) in em for s in seeds):
                    em[f"epr@{n}-{loss}-pooled"] = pooled([em[seeded(f"epr@{n}-{loss}", s)] for s in seeds])
                _attach_em(rows, em)
                _write(out, rows, a, t0)
    _attach_em(rows, em)
    for name, e in em.items():
        if not name.endswith("-pooled"):
            save_em(rows_dir, name, e)
    _write(out, rows, a, t0)
    log.info("done in %.0f s: %s", time.time() - t0, out)
    return 0


def curve_ctx(a, n: int, loss: str, seed: int, *extra: str) -> Context:
    """The training run of one curve point: ``n`` labels, ``loss``, training seed ``seed``."""
    settings = [f"candidates.num_queries={n}", *LOSS_SETTINGS[loss], f"train.seed={seed}", *extra]
    return ctx_for(a, seeded(f"{a.name}/{n}-{loss}", seed), *settings)


def _add_pooled(rows: list[dict], n: int, loss: str, seeds: list[int]) -> None:
    """A row pooling the seeds of one curve point: mean and spread of the seeds' gold log-probs; per example the
    mean over seeds (the paired tests compare that with a reference on the same examples)."""
    mine = [r for r in rows if r["loss"] == loss and r["labels"] == n and r["seeds"] == 1]
    if len(seeds) < 2 or len(mine) < len(seeds):
        return
    per = np.array([[np.nan if v is None else v for v in r["per_query_logprob"]] for r in mine], dtype=float)
    means = [r["gold_logprob"] for r in mine]
    rows.append(
        {
            **{k: mine[0][k] for k in ("retriever", "loss", "labels", "split", "n")},
            "name": f"epr@{n}-{loss}-pooled",
            "seed": None,
            "seeds": len(mine),
            "gold_logprob": float(np.mean(means)),
            "gold_logprob_sd": float(np.std(means, ddof=1)),
            "gold_logprob_seed_values": means,
            "gold_logprob_ci": [float(min(means)), float(max(means))],
            "dpo": float(np.mean([r["dpo"] for r in mine])),
            "per_query_logprob": [None if np.isnan(v) else float(v) for v in np.nanmean(per, axis=0)],
        }
    )


def _attach_em(rows: list[dict], em: dict[str, dict]) -> None:
    for row in rows:
        key = row["retriever"] if row["loss"] is None else row["name"]
        if key in em:
            e = em[key]
            row["em"] = 100.0 * float(np.mean(e["correct"]))
            k = row["seeds"]
            for b in ("bm25", "sbert"):
                ref = em.get(b)
                ok = ref is not None and key != b
                row[f"p_vs_{b}"] = paired_p(e, ref, k) if ok else None
            if row["seeds"] > 1:
                per_seed = [100.0 * float(np.mean(c)) for c in np.array_split(e["correct"], row["seeds"])]
                row["em_seed_values"], row["em_sd"] = per_seed, float(np.std(per_seed, ddof=1))
            row["em_n"] = (
                len(e["correct"]) // k
            )  # evaluation examples (a pooled row holds k predictions each)
            row["em_metrics"] = list(e.get("metrics", {}))
            for m in row["em_metrics"]:  # the task's other exact-match metrics, with the same tests
                row[m] = 100.0 * float(np.mean(e["metrics"][m]))
                for b in ("bm25", "sbert"):
                    ref = em.get(b)
                    ok = ref is not None and key != b
                    row[f"{m}_p_vs_{b}"] = paired_p(e, ref, k, m) if ok else None


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


def _write(out: Path, rows: list[dict], a, t0: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
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

    slim = [
        {
            "retriever": r["retriever"],
            "loss": r["loss"],
            "labels": r["labels"],
            "split": r.get("split", "dev"),
            "seeds": r.get("seeds", 1),
            "seed": r.get("seed"),
            "oracle_gap_captured": {m: captured(r, m) for m in ("gold_logprob", "em")},
            "n": r.get("em_n", r["n"]),
            "em": r.get("em"),
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
        }
        for r in rows
    ]
    info = {"machine": machine(), "command": " ".join(sys.argv), "elapsed_seconds": round(time.time() - t0)}
    (out / "curve.json").write_text(json.dumps({"info": info, "rows": slim}, indent=2) + "\n")
    lines = [
        f"# {a.name}: learning curve",
        "",
        f"Machine: {describe(info['machine'])}. Command: `{info['command']}`.",
        f"Evaluation: {slim[0]['n'] if slim else 0} seeded evaluation examples of {a.name.split('-')[0]}; {a.lms}. Gold log-prob: log p(gold parse | prompt), nats, mean with 95% bootstrap interval; DPO: mean "
        "log sigmoid(gold log-prob - without demonstrations). Δ: mean paired gain in gold log-prob over BM25 / SBERT "
        "on the same examples (p: Wilcoxon signed-rank; the median paired gain and the share of examples where the row "
        "is higher: the mean is heavy-tailed). EM: exact match (%), p: exact McNemar vs BM25 / SBERT "
        "on the same examples"
        + (
            f"; the task's other exact-match metrics ({', '.join(extra)}) with the same tests."
            if extra
            else "."
        ),
        "",
        f"Split: **{slim[0]['split'] if slim else a.split}** (dev: the curve's seeded subset every choice was made "
        "on; locked: the rest of the validation split, evaluated once with the settings fixed beforehand). Seeds: "
        "training seeds pooled in the row (pooled rows: mean over seeds, the interval column is the seeds' "
        "min-max; EM p-values: exact sign test per example of the seeds' mean correctness vs the reference; "
        "log-prob Δ: per example, the seeds' mean). Gap: the fraction of the BM25 → LM-Oracle gap captured "
        "(gold log-prob; EM where both are measured).",
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
        return f"1 (seed {r['seed']})" if r["seeds"] == 1 and r.get("seed") is not None else str(r["seeds"])

    for r in slim:
        f = lambda v, d=1: "" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))  # noqa: E731
        p = lambda v: "" if v is None else f"{v:.3g}"  # noqa: E731
        g = r["oracle_gap_captured"]
        gp = " / ".join("" if g[m] is None else f"{g[m]:.2f}" for m in ("gold_logprob", "em"))
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
    (out / "curve.md").write_text("\n".join(lines) + "\n")
    _plot(out, slim)


def _plot(out: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in (
        (axes[0], "gold_logprob", "gold log-prob (nats, higher is better)"),
        (axes[1], "em", "exact match (%)"),
    ):
        refs = [r for r in rows if r["loss"] is None and r[key] is not None]
        for i, r in enumerate(refs):
            ax.axhline(r[key], ls="--", lw=1, color=f"C{i + 3}", label=r["retriever"])
        for j, loss in enumerate(sorted({r["loss"] for r in rows if r["loss"]})):
            best = {}  # per point: the pooled row where seeds were pooled, else the base seed's
            for r in rows:
                if r["loss"] == loss and r[key] is not None and (r["seeds"] > 1 or r["seed"] == BASE_SEED):
                    if r["labels"] not in best or r["seeds"] > best[r["labels"]]["seeds"]:
                        best[r["labels"]] = r
            pts = sorted((n, r[key]) for n, r in best.items())
            if pts:
                ax.plot(*zip(*pts), "o-", color=f"C{j}", label=f"EPR ({loss})")
        ax.set(xscale="log", xlabel="LM-labelled training examples", ylabel=label)
        ax.legend(fontsize=7)
    axes[0].set_title("dense metric, every point")
    axes[1].set_title("exact match, deciding rows")
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
