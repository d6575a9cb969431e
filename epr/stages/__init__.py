"""Pipeline stages. Each takes a ``Context``, its output folder and its fingerprint, and writes one artifact folder
that the next stage reads. The functions here are what the stage graph (``epr.pipeline.STAGES``) calls: each
imports its module when it runs, so ``epr status`` does not load torch.

front half: examples -> candidates -> scores -> labels -> encoder      (dr-bm25: a sub-run with BM25 labels)
back half:  retrieve -> rerank -> prompts -> predict -> evaluate       (TruthfulQA: epr.stages.truthfulqa)
"""

from __future__ import annotations

from pathlib import Path


def run_examples(ctx, out: Path, fp: str):
    from epr.stages.data import run_examples

    return run_examples(ctx, out, fp)


def run_candidates(ctx, out: Path, fp: str):
    from epr.stages.candidates import run_candidates

    return run_candidates(ctx, out, fp)


def run_scores(ctx, out: Path, fp: str):
    from epr.stages.scores import run_scores

    return run_scores(ctx, out, fp)


def run_labels(ctx, out: Path, fp: str):
    from epr.stages.labels import run_labels

    return run_labels(ctx, out, fp)


def run_encoder(ctx, out: Path, fp: str):
    from epr.stages.encoder import run_encoder

    return run_encoder(ctx, out, fp)


def run_dr_bm25(ctx, out: Path, fp: str):
    """The DR-BM25 sub-run (``<run_dir>/dr-bm25/``): the same candidates and training, BM25-ranked labels."""
    from epr import pipeline

    sub = ctx.sub_run("dr-bm25")
    ran = pipeline.run(sub, until="encoder")
    return {"rows": {"stages_run": len(ran)}, "extra": {"sub_run": str(sub.cfg.run_dir), "ran": ran}}


def run_retrieve(ctx, out: Path, fp: str):
    from epr.stages.retrieve import run_retrieve

    return run_retrieve(ctx, out, fp)


def run_rerank(ctx, out: Path, fp: str):
    from epr.stages.rerank import run_rerank

    return run_rerank(ctx, out, fp)


def run_prompts(ctx, out: Path, fp: str):
    from epr.stages.prompts import run_prompts

    return run_prompts(ctx, out, fp)


def run_predict(ctx, out: Path, fp: str):
    from epr.stages.predict import run_predict

    return run_predict(ctx, out, fp)


def run_evaluate(ctx, out: Path, fp: str):
    from epr.stages.evaluate import run_evaluate

    return run_evaluate(ctx, out, fp)
