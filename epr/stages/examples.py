"""Stage ``examples``: load the task's pool and evaluation split into ``examples/{pool,eval}.jsonl``."""

from __future__ import annotations

import logging

from epr.artifacts import write_jsonl
from epr.context import Context
from epr.types import InputError

log = logging.getLogger(__name__)


def min_pool(cfg) -> int:
    """The fewest pool rows a run can label: a query's ``labels.k_pos`` positives and ``labels.k_neg`` hard
    negatives come from the other pool rows."""
    return cfg.labels.k_pos + cfg.labels.k_neg + 1


def run_examples(ctx: Context, out, fp: str) -> dict:
    pool, ev = ctx.task.load()
    need = min_pool(ctx.cfg)
    if len(pool) < need:
        raise InputError(
            f"{ctx.task.where()}: {len(pool)} demonstration(s) in the pool, at least {need} needed "
            f"(labels.k_pos + labels.k_neg + 1 = {ctx.cfg.labels.k_pos} + {ctx.cfg.labels.k_neg} + 1); add rows "
            "or lower labels.k_pos / labels.k_neg"
            + (
                f" (data.eval_size={ctx.cfg.data.eval_size} rows are held out)"
                if not ctx.cfg.data.eval_path
                else ""
            )
        )
    write_jsonl(out / "pool.jsonl", pool)
    write_jsonl(out / "eval.jsonl", ev)
    log.info("examples: %d pool, %d eval (%d rows skipped)", len(pool), len(ev), len(ctx.task.report.skipped))
    return {"rows": {"pool": len(pool), "eval": len(ev)}, "extra": {"load_report": ctx.task.report.to_json()}}
