"""The learning curve: what the learned retriever gains as it gets more LM-labelled training examples (MTOP by
default; any dataset with a curve config: ``-c configs/smcalflow_curve.yaml``, ``-c configs/break_curve.yaml``).

    epr experiment curve                                        # the committed curve (results/mtop-curve/)
    epr experiment curve -c configs/break_curve.yaml            # BREAK's (results/break-curve/)
    epr experiment curve --sizes 250,500 --losses distill --em none     # a quick partial curve
    epr experiment curve --set models.dtype=auto                # any config key (here: bf16 where fast)
    epr experiment curve --from-rows --out results/mtop-curve-locked   # redraw a results folder from rows/

(``python scripts/learning_curve.py ...``, the command recorded in the results folders, runs this same code.)

Every step is resumable (stages, the run root's score cache, per-row files): rerun the same command after a kill.
A row file is served while its key (what it was computed from: a learned row's encoder, a reference row's examples,
the retrieve and prompt settings, the inference LM) matches, and a training seed whose learned rows are all served is not trained
again: copy committed ``rows/`` into ``--out`` to add seeds to a committed run without retraining its seeds.

1. Labels for the largest size (``configs/mtop_curve.yaml``: nested seeded label sets, so each smaller set is a
   prefix of the largest and reuses its scores from the score cache).
2. For each size x loss: train (``runs/<name>/<size>-<loss>/``, ``name`` from the config), then the dense metric on the evaluation examples:
   the gold answer's log-probability under the inference LM given the retrieved demonstrations (one forward pass
   per example; RAGSys's way of judging a retriever) and its DPO form against the empty context.
3. Reference rows, with the same metric: BM25, SBERT, the untrained dual encoder, BM25-Oracle, LM-Oracle; on
   request (``--refs ...,untrained-hybrid``) the untrained dual encoder fused with BM25 as ``hybrid`` fuses the
   trained one: the control that says whether a ``hybrid`` row's gain comes from the labels or from the fusion.
4. Exact match (generation) for the rows that decide the bar (``--em``: the references and the largest size of
   each loss, by default), with paired exact McNemar tests against BM25 and SBERT on the same examples.
   ``--em-method greedy`` reads it off the gold pass instead (no generation: an example counts when every gold
   token is the LM's greedy choice; a lower bound of generated exact match, in a folder of its own).

Writes ``curve.json`` (rows ``{retriever, loss, labels, n, em, p_vs_bm25, p_vs_sbert, gold_logprob, dpo}``),
``curve.md`` and ``curve.png`` into ``--out``, naming the machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import time
from pathlib import Path

from epr import pipeline
from epr.cache import cached_row, keyed_row, read_manifest
from epr.config import load_config
from epr.context import Context
from epr.reports.curve import (  # the rows' math and files; re-exported for scripts/curve_diagnose.py
    BASE_SEED,
    add_pooled,
    attach_em,
    pooled,
    save_em,
    seeded,
    write_curve,
)
from epr.reports.curve_rows import rows_from_dir
from epr.stages.dense_metric import DenseMetric
from epr.stages.evaluate import label_cost

ROOT = Path(__file__).resolve().parents[2]  # the repository (configs/, results/)

log = logging.getLogger("learning_curve")

LOSS_SETTINGS = {  # the similarity each loss is trained with (EPR: the paper's raw inner product)
    "epr": ["train.loss=epr", "train.similarity=dot"],
    "listwise": ["train.loss=listwise", "train.similarity=cosine"],
    "distill": ["train.loss=distill", "train.similarity=cosine"],
}
REFERENCES = ("bm25", "sbert", "untrained", "bm25-oracle", "lm-oracle")
UNTRAINED = {"untrained": "epr", "untrained-hybrid": "hybrid"}  # reference rows of the untrained dual encoder


SPLIT_SETTINGS = {  # dev: the seeded evaluation subset every choice is made on; locked: the rest, once at the end
    "dev": [],
    "locked": ["data.eval_part=locked", "retrieve.eval_limit=null"],
}


def ctx_for(args, name: str, *extra: str) -> Context:
    sets = [f"run_root={args.run_root}", *args.set, f"name={name}", *SPLIT_SETTINGS[args.split], *extra]
    return Context(load_config([args.config], sets))


def row_key(ctx: Context, retriever: str, fp: str, n: int) -> dict:
    """What a dense-metric row was computed from, by the stages' own fingerprint rules: ``fp`` (a learned row's
    encoder; a reference row's ``reference_fp``), the retrieve stage's keys for this one retriever (``retrieve.k``, the eval subset, the SBERT encoder,
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


def reference_fp(ctx: Context, ref: str) -> str:
    """The upstream a reference row depends on, by the pipeline's own rule (``retrieve``'s deps): the untrained
    encoder for the untrained rows; the examples alone for BM25, SBERT, BM25-Oracle and LM-Oracle, whose settings
    ``row_key`` adds. Not the training labels: a reference row is served across label sets, re-mining rounds and
    losses on the same examples, and recomputed when they (or its own settings) change."""
    return pipeline.stage_fingerprint(ctx, "encoder" if ref in UNTRAINED else "examples")


def generated_em(ctx: Context, retrievers: list[str]) -> dict[str, dict]:
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


def curve_args(a, t0: float) -> dict:
    """``write_curve``'s explicit arguments from this script's options."""
    return {
        "name": a.name,
        "split": a.split,
        "lms": a.lms,
        "t0": t0,
        "labels_info": getattr(a, "labels_info", None),
    }


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "mtop_curve.yaml"))
    ap.add_argument("--sizes", default="250,500,1000,2000")
    ap.add_argument("--losses", default="distill,listwise,epr")
    ap.add_argument(
        "--em", default="largest", help="which learned rows get exact match: largest | all | none"
    )
    ap.add_argument(
        "--em-method",
        choices=("generate", "greedy"),
        default="generate",
        help="exact match by greedy generation (the pipeline's predict stage), or read off the gold log-prob's "
        "pass (greedy: every gold token is the LM's greedy choice; a lower bound of generated EM, ~no extra cost)",
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
        "--learned",
        default="epr",
        help="the rows measured with each trained encoder: epr (the dual encoder alone), hybrid (fused with BM25 "
        "by reciprocal rank); exact match for each of them",
    )
    ap.add_argument(
        "--from-rows",
        action="store_true",
        help="redraw curve.json / .md / .png in --out from its rows/ alone (committed per-example rows; no model, "
        "no run root): the tables' figures and paired tests recomputed from the repository",
    )
    ap.add_argument(
        "--import-scores",
        action="append",
        default=[],
        metavar="FILE",
        help="add an `epr cache export` file (e.g. committed labels) to the run root's score cache first",
    )
    a = ap.parse_args(argv)
    was = None
    if (
        a.from_rows
    ):  # the folder's own run: its config, --set and split, read back from the command it recorded
        if a.out is None or not (Path(a.out) / "rows").is_dir():
            ap.error(f"--from-rows needs --out FOLDER holding rows/ (got {a.out})")
        prev = Path(a.out) / "curve.json"
        was = json.loads(prev.read_text()) if prev.exists() else {"info": {}, "rows": []}
        if cmd := was["info"].get("command"):
            rec, _ = ap.parse_known_args(shlex.split(cmd)[1:])
            here = ROOT / "configs" / Path(rec.config).name  # a path recorded on another machine
            a.config, a.set = rec.config if Path(rec.config).exists() else str(here), rec.set
        a.split = was["rows"][0]["split"] if was["rows"] else a.split
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
    asked = {s for s in a.learned.split(",") if s}
    if not asked <= {"epr", "hybrid"}:
        ap.error(f"--learned {a.learned}: expected epr and/or hybrid")
    learned = [r for r in ("epr", "hybrid") if r in asked]  # one order: the compare stages' key holds it
    out = Path(a.out)
    rows_dir = out / "rows"
    t0 = time.time()
    if was is not None:  # --from-rows: where and by what the rows were computed is kept
        rows, em = rows_from_dir(rows_dir, a.split)
        attach_em(rows, em)
        was["info"].pop("redrawn_from_rows", None)
        write_curve(out, rows, redraw_of=was["info"] or None, **curve_args(a, t0))
        log.info("redrew %s from %d row files", out, len(list(rows_dir.glob("*.json"))))
        return 0

    # one writer per run (epr.run_lock): every run of the curve lives under <run_root>/<name>/; held until the end
    from epr.run_lock import run_lock

    held = run_lock(Path(cfg0.run_root) / a.name, "this learning curve's runs")
    held.__enter__()
    for f in a.import_scores:  # scores of the same computation key are served, never scored again
        from epr.lm.score_cache import import_scores

        for store, c in import_scores(Path(cfg0.run_root) / ".cache" / "scores", f).items():
            log.info("imported %s into %s: %s", f, store, c)

    # 1. labels for the largest set (smaller sets reuse its scores)
    base = ctx_for(a, a.name, f"candidates.num_queries={sizes[-1]}")
    pipeline.run(base, until="labels")
    log.info("labels for %d training examples ready (%.0f s)", sizes[-1], time.time() - t0)
    sm = read_manifest(base.stage_dir("scores"))
    a.labels_info = {"sequences": sm["rows"]["sequences"], "speed": sm.get("scoring_speed")}

    metric = DenseMetric(base, greedy=a.em_method == "greedy" and a.em != "none")
    rows: list[dict] = []

    def add(
        retriever: str, loss: str | None, labels: int | None, ctx: Context, name: str, fp: str, seed=None
    ) -> dict:
        key = row_key(ctx, retriever, fp, len(metric.ev))
        best = None
        if loss is not None and (m := read_manifest(ctx.stage_dir("encoder"))) is not None:
            best = m.get("best_epoch")  # a learned row: which epoch its encoder is (best_by may keep epoch 0)

        def compute() -> dict:
            cost = label_cost(ctx) if loss is not None else None  # its labels' LM-scored sequences (issue 48)
            extra = {} if cost is None else {"scored_sequences": cost["scored_sequences"]}
            return {**metric(ctx, retriever), "best_epoch": best, **extra}

        r = cached_row(rows_dir / f"{name}.json", key, compute)
        best = best if best is not None else r.get("best_epoch")  # a reused row carries its encoder's epoch
        row = {
            "name": name,
            "retriever": name.split("@")[0],
            "loss": loss,
            "labels": labels,
            "seed": seed,
            "seeds": 1,
            "split": a.split,
            "best_epoch": best,
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
        c = untrained if r in UNTRAINED else ref_ctx
        add(UNTRAINED.get(r, r), None, None, c, r, reference_fp(c, r))

    # 3. the curve: train each (size, loss), dense metric
    runs: dict[tuple[int, str], Context] = {}
    for n in sizes:
        for loss in losses:
            for seed in seeds:
                c = curve_ctx(a, n, loss, seed)
                fp = pipeline.stage_fingerprint(c, "encoder")
                needs_em = a.em == "all" or (a.em != "none" and n == sizes[-1])
                files = [(rows_dir / f"{seeded(f'{r}@{n}-{loss}', seed)}.json", r) for r in learned]
                if not needs_em and all(keyed_row(f, row_key(c, r, fp, len(metric.ev))) for f, r in files):
                    # every row of this encoder is on disk (e.g. committed): adding seeds does not retrain it
                    log.info("%d-%s seed %d: rows reused from %s, not trained again", n, loss, seed, rows_dir)
                else:
                    t = time.time()
                    pipeline.run(c, until="encoder")
                    log.info("trained %d-%s seed %d (%.0f s)", n, loss, seed, time.time() - t)
                    runs[(n, loss, seed)] = c
                for r in learned:
                    add(r, loss, n, c, seeded(f"{r}@{n}-{loss}", seed), fp, seed)
            for r in learned:
                add_pooled(rows, n, loss, seeds, r)
            write_curve(out, rows, **curve_args(a, t0))

    # 4. exact match for the rows that decide the bar
    em: dict[str, dict] = {}
    refs = [r for r in a.refs_em.split(",") if r]
    if a.em_method == "greedy":  # read off the gold pass: no generation (DenseMetric.greedy_em)
        em_rows = lambda c, rs: {r: metric.greedy_em(c, r) for r in rs}  # noqa: E731
    else:
        em_rows = generated_em
    if a.em != "none":
        plain = [r for r in refs if r not in UNTRAINED]
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
                # every learned row of this encoder (epr, hybrid) in one run: one compare stage generates them all
                c2 = curve_ctx(a, n, loss, seed, f"retrieve.retrievers=[{','.join(learned)}]")
                for r, e in em_rows(c2, learned).items():
                    em[seeded(f"{r}@{n}-{loss}", seed)] = e
                    if len(seeds) > 1 and all(seeded(f"{r}@{n}-{loss}", s) in em for s in seeds):
                        em[f"{r}@{n}-{loss}-pooled"] = pooled(
                            [em[seeded(f"{r}@{n}-{loss}", s)] for s in seeds]
                        )
                attach_em(rows, em)
                write_curve(out, rows, **curve_args(a, t0))
    attach_em(rows, em)
    for name, e in em.items():
        if not name.endswith("-pooled"):
            save_em(rows_dir, name, e)
    write_curve(out, rows, **curve_args(a, t0))
    log.info("done in %.0f s: %s", time.time() - t0, out)
    return 0


def curve_ctx(a, n: int, loss: str, seed: int, *extra: str) -> Context:
    """The training run of one curve point: ``n`` labels, ``loss``, training seed ``seed``."""
    settings = [f"candidates.num_queries={n}", *LOSS_SETTINGS[loss], f"train.seed={seed}", *extra]
    return ctx_for(a, seeded(f"{a.name}/{n}-{loss}", seed), *settings)


if __name__ == "__main__":
    sys.exit(main())
