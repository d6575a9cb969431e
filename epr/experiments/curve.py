"""The learning curve: what the learned retriever gains as it gets more LM-labelled training examples (MTOP by
default; any dataset with a curve config: ``-c configs/smcalflow_curve.yaml``, ``-c configs/break_curve.yaml``).

    epr experiment curve                                        # the committed curve (results/mtop-curve/)
    epr experiment curve -c configs/break_curve.yaml            # BREAK's (results/break-curve/)
    epr experiment curve --sizes 250,500 --losses distill --em none     # a quick partial curve
    epr experiment curve --set models.dtype=auto                # any config key (here: bf16 where fast)
    epr experiment curve --from-rows --out results/mtop-curve-locked   # redraw a results folder from rows/

(``python scripts/learning_curve.py ...``, the command recorded in the older results folders, is rerun as this same
command by ``epr experiment run``.) The options are parsed by ``epr.cli.curve`` into a :class:`CurveSpec`.

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

import json
import logging
import time
from dataclasses import dataclass, field
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
from epr.types import ConfigError

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
    """``write_curve``'s explicit arguments from a :class:`CurveSpec`."""
    return {
        "name": a.name,
        "split": a.split,
        "lms": a.lms,
        "t0": t0,
        "labels_info": getattr(a, "labels_info", None),
    }


@dataclass
class CurveSpec:
    """What one learning curve is: the options of ``epr experiment curve`` (``epr.cli.curve``), parsed."""

    config: str = str(ROOT / "configs" / "mtop_curve.yaml")
    sizes: list[int] = field(default_factory=lambda: [250, 500, 1000, 2000])
    losses: list[str] = field(default_factory=lambda: ["distill", "listwise", "epr"])
    em: str = "largest"  # which learned rows get exact match: largest | all | none
    em_method: str = "generate"  # generate | greedy (read off the gold pass)
    refs: list[str] = field(default_factory=lambda: list(REFERENCES))
    refs_em: list[str] = field(default_factory=lambda: list(REFERENCES))
    run_root: str = "runs"
    out: str | None = None  # default: results/<config name>[-locked]/
    set: list[str] = field(default_factory=list)
    split: str = "dev"
    seeds: list[int] = field(default_factory=lambda: [BASE_SEED])
    learned: list[str] = field(default_factory=lambda: ["epr"])
    import_scores: list[str] = field(default_factory=list)
    # filled in by resolve(): the config's name and LMs, the labels' cost once scored
    name: str = ""
    lms: str = ""
    labels_info: dict | None = None

    def resolve(self) -> CurveSpec:
        if self.em not in ("largest", "all", "none"):
            raise ConfigError(f"--em {self.em}: expected largest, all or none")
        if self.split not in SPLIT_SETTINGS:
            raise ConfigError(f"--split {self.split}: expected one of {sorted(SPLIT_SETTINGS)}")
        if not set(self.learned) <= {"epr", "hybrid"}:
            raise ConfigError(f"--learned {','.join(self.learned)}: expected epr and/or hybrid")
        self.learned = [
            r for r in ("epr", "hybrid") if r in self.learned
        ]  # one order: the compare stages' key
        self.sizes = sorted(self.sizes)
        cfg0 = load_config([self.config], [f"run_root={self.run_root}", *self.set])
        self.name = cfg0.name  # the runs' and the results' name (mtop-curve, break-curve, ...)
        self.lms = (
            f"scoring LM {cfg0.models.lm}, inference LM {cfg0.models.inference_lm or cfg0.models.lm} "
            f"(models.dtype={cfg0.models.dtype})"
        )
        if self.out is None:
            self.out = str(ROOT / "results" / (self.name + ("-locked" if self.split == "locked" else "")))
        return self


def redraw(spec: CurveSpec, was: dict) -> None:
    """``--from-rows``: curve.json / .md / .png in ``spec.out`` redrawn from its ``rows/`` alone (no model, no run
    root); ``was`` is the folder's curve.json, whose record of where and by what the rows were computed is kept."""
    out = Path(spec.out)
    rows, em = rows_from_dir(out / "rows", spec.split)
    attach_em(rows, em)
    was["info"].pop("redrawn_from_rows", None)
    write_curve(out, rows, redraw_of=was["info"] or None, **curve_args(spec, time.time()))
    log.info("redrew %s from %d row files", out, len(list((out / "rows").glob("*.json"))))


class RowBook:
    """The curve's rows as they are computed: each row served from its file under ``rows/`` while its key matches,
    else computed with the dense metric and written there."""

    def __init__(self, spec: CurveSpec, metric: DenseMetric):
        self.spec, self.metric, self.rows = spec, metric, []
        self.dir = Path(spec.out) / "rows"

    def add(
        self,
        retriever: str,
        loss: str | None,
        labels: int | None,
        ctx: Context,
        name: str,
        fp: str,
        seed=None,
    ):
        key = row_key(ctx, retriever, fp, len(self.metric.ev))
        best = None
        if loss is not None and (m := read_manifest(ctx.stage_dir("encoder"))) is not None:
            best = m.get("best_epoch")  # a learned row: which epoch its encoder is (best_by may keep epoch 0)

        def compute() -> dict:
            cost = label_cost(ctx) if loss is not None else None  # its labels' LM-scored sequences (issue 48)
            extra = {} if cost is None else {"scored_sequences": cost["scored_sequences"]}
            return {**self.metric(ctx, retriever), "best_epoch": best, **extra}

        r = cached_row(self.dir / f"{name}.json", key, compute)
        best = best if best is not None else r.get("best_epoch")  # a reused row carries its encoder's epoch
        row = {
            "name": name,
            "retriever": name.split("@")[0],
            "loss": loss,
            "labels": labels,
            "seed": seed,
            "seeds": 1,
            "split": self.spec.split,
            "best_epoch": best,
            "run": str(ctx.cfg.run_dir),
            **r,
        }
        self.rows.append(row)
        log.info("%s: gold log-prob %.3f (DPO %.3f)", name, row["gold_logprob"], row["dpo"])
        return row

    def write(self, t0: float) -> None:
        write_curve(Path(self.spec.out), self.rows, **curve_args(self.spec, t0))


def run_curve(spec: CurveSpec) -> Path:
    """The learning curve of the module's docstring, resumable at every step; returns its folder."""
    from epr.run_lock import run_lock

    t0 = time.time()
    # one writer per run (epr.run_lock): every run of the curve lives under <run_root>/<name>/; held until the end
    with run_lock(Path(spec.run_root) / spec.name, "this learning curve's runs"):
        for f in spec.import_scores:  # scores of the same computation key are served, never scored again
            from epr.lm.score_cache import import_scores

            for store, c in import_scores(Path(spec.run_root) / ".cache" / "scores", f).items():
                log.info("imported %s into %s: %s", f, store, c)
        # 1. labels for the largest set (smaller sets reuse its scores)
        top = f"candidates.num_queries={spec.sizes[-1]}"
        base = ctx_for(spec, spec.name, top)
        pipeline.run(base, until="labels")
        log.info("labels for %d training examples ready (%.0f s)", spec.sizes[-1], time.time() - t0)
        sm = read_manifest(base.stage_dir("scores"))
        spec.labels_info = {"sequences": sm["rows"]["sequences"], "speed": sm.get("scoring_speed")}
        book = RowBook(spec, DenseMetric(base, greedy=spec.em_method == "greedy" and spec.em != "none"))
        _references(spec, book, top)
        runs = _train_points(spec, book, t0)
        _exact_match(spec, book, runs, top, t0)
    log.info("done in %.0f s: %s", time.time() - t0, spec.out)
    return Path(spec.out)


def _references(spec: CurveSpec, book: RowBook, top: str) -> None:
    """2. The reference rows (dense metric); they depend only on the largest size, so a partial run's rows are
    reused by the full one."""
    ref_ctx = ctx_for(spec, f"{spec.name}/ref", top)
    pipeline.run(ref_ctx, until="labels")
    untrained = ctx_for(spec, f"{spec.name}/untrained", top, "train.epochs=0", *LOSS_SETTINGS["distill"])
    pipeline.run(untrained, until="encoder")
    for r in spec.refs:
        c = untrained if r in UNTRAINED else ref_ctx
        book.add(UNTRAINED.get(r, r), None, None, c, r, reference_fp(c, r))


def _train_points(spec: CurveSpec, book: RowBook, t0: float) -> dict[tuple[int, str, int], Context]:
    """3. Each (size, loss, seed): trained (unless every row of it is served), then its dense-metric rows."""
    runs: dict[tuple[int, str, int], Context] = {}
    for n in spec.sizes:
        for loss in spec.losses:
            for seed in spec.seeds:
                c = curve_ctx(spec, n, loss, seed)
                fp = pipeline.stage_fingerprint(c, "encoder")
                needs_em = spec.em == "all" or (spec.em != "none" and n == spec.sizes[-1])
                names = [(seeded(f"{r}@{n}-{loss}", seed), r) for r in spec.learned]
                keyed = [
                    keyed_row(book.dir / f"{f}.json", row_key(c, r, fp, len(book.metric.ev)))
                    for f, r in names
                ]
                if not needs_em and all(keyed):
                    # every row of this encoder is on disk (e.g. committed): adding seeds does not retrain it
                    log.info("%d-%s seed %d: rows reused from %s, not trained again", n, loss, seed, book.dir)
                else:
                    t = time.time()
                    pipeline.run(c, until="encoder")
                    log.info("trained %d-%s seed %d (%.0f s)", n, loss, seed, time.time() - t)
                    runs[(n, loss, seed)] = c
                for f, r in names:
                    book.add(r, loss, n, c, f, fp, seed)
            for r in spec.learned:
                add_pooled(book.rows, n, loss, spec.seeds, r)
            book.write(t0)
    return runs


def _exact_match(spec: CurveSpec, book: RowBook, runs: dict, top: str, t0: float) -> None:
    """4. Exact match for the rows that decide the bar: generated (the compare stages), or read off the gold pass
    (``--em-method greedy``: DenseMetric.greedy_em, no generation)."""
    em: dict[str, dict] = {}
    if spec.em_method == "greedy":
        em_rows = lambda c, rs: {r: book.metric.greedy_em(c, r) for r in rs}  # noqa: E731
    else:
        em_rows = generated_em
    if spec.em != "none":
        plain = [r for r in spec.refs_em if r not in UNTRAINED]
        em |= em_rows(
            ctx_for(spec, f"{spec.name}/ref", top, f"retrieve.retrievers=[{','.join(plain)}]"), plain
        )
        if "untrained" in spec.refs_em:
            settings = ("train.epochs=0", *LOSS_SETTINGS["distill"], "retrieve.retrievers=[epr]")
            em["untrained"] = em_rows(ctx_for(spec, f"{spec.name}/untrained", top, *settings), ["epr"])["epr"]
        for n, loss, seed in runs:
            if spec.em != "all" and n != spec.sizes[-1]:
                continue
            # every learned row of this encoder (epr, hybrid) in one run: one compare stage generates them all
            c2 = curve_ctx(spec, n, loss, seed, f"retrieve.retrievers=[{','.join(spec.learned)}]")
            for r, e in em_rows(c2, spec.learned).items():
                em[seeded(f"{r}@{n}-{loss}", seed)] = e
                if len(spec.seeds) > 1 and all(seeded(f"{r}@{n}-{loss}", s) in em for s in spec.seeds):
                    em[f"{r}@{n}-{loss}-pooled"] = pooled(
                        [em[seeded(f"{r}@{n}-{loss}", s)] for s in spec.seeds]
                    )
            attach_em(book.rows, em)
            book.write(t0)
    attach_em(book.rows, em)
    for name, e in em.items():
        if not name.endswith("-pooled"):
            save_em(book.dir, name, e)
    book.write(t0)


def curve_ctx(a, n: int, loss: str, seed: int, *extra: str) -> Context:
    """The training run of one curve point: ``n`` labels, ``loss``, training seed ``seed``."""
    settings = [f"candidates.num_queries={n}", *LOSS_SETTINGS[loss], f"train.seed={seed}", *extra]
    return ctx_for(a, seeded(f"{a.name}/{n}-{loss}", seed), *settings)
