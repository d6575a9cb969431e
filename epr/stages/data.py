"""Stage ``examples``: load the task's pool and evaluation split into ``examples/{pool,eval}.jsonl``."""

from __future__ import annotations

import logging

from epr.artifacts import write_jsonl
from epr.context import Context

log = logging.getLogger(__name__)


def run_examples(ctx: Context, out, fp: str) -> dict:
    pool, ev = ctx.task.load()
    write_jsonl(out / "pool.jsonl", pool)
    write_jsonl(out / "eval.jsonl", ev)
    log.info("examples: %d pool, %d eval (%d rows skipped)", len(pool), len(ev), len(ctx.task.report.skipped))
    return {"rows": {"pool": len(pool), "eval": len(ev)}, "extra": {"load_report": ctx.task.report.to_json()}}
