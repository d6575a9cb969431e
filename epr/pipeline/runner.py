"""Running stages: one stage when it is not fresh (its upstream must be), or everything up to a stage, in order;
a stage's folder counts as absent from the moment it starts until its manifest is written again."""

from __future__ import annotations

import logging
import time

from epr.artifacts import remove_stale_temps
from epr.cache import stage_state, write_manifest
from epr.context import Context
from epr.pipeline.graph import ALIASES, STAGES, SubRun, final_stage, stage_fingerprint, upstream
from epr.pipeline.status import stage_label
from epr.stages import candidates
from epr.types import ConfigError, UpstreamError

__all__ = ["run", "run_stage", "check_task_stage"]

log = logging.getLogger(__name__)


def check_task_stage(ctx: Context, name: str) -> None:
    """A stage that belongs to one task (``Stage.task``: TruthfulQA's ``tqa_*`` read its questions and answers) is
    refused, before any folder is made, for a config of another task; so is ``select`` with selection off."""
    stage = STAGES.get(ALIASES.get(name, name))
    if stage is not None and (task := stage.task) is not None and ctx.cfg.data.task != task:
        raise ConfigError(
            f"{name}: a {task} stage, and this config's task is {ctx.cfg.data.task!r} (its last stage is "
            f"{final_stage(ctx)}); it runs with -c configs/{task}.yaml"
        )
    if (
        name == "select" and ctx.cfg.select.size <= 0
    ):  # refused before its folder (a finished choice) is touched
        raise ConfigError(
            "select: select.size=0 turns selection off (the run serves epr; `epr run` leaves this stage out), so "
            "there is nothing to run and nothing was changed; to choose the served retriever, set select.size to "
            "the held-out pool examples it compares on (e.g. 300)"
        )


def run_stage(ctx: Context, name: str, force: bool = False) -> bool:
    """Run one stage if it is not fresh (its upstream must be fresh). Returns True when it ran."""
    check_task_stage(ctx, name)
    fp = stage_fingerprint(ctx, name)
    out = ctx.stage_dir(name)
    ctx.dist.barrier()  # every process judges freshness after the main one finished the stage before
    if not force and stage_state(out, fp) == "fresh":
        log.info("%s: fresh, skipped", stage_label(ctx, name))
        return False
    for d in STAGES[name].deps(ctx):
        if stage_state(ctx.stage_dir(d), stage_fingerprint(ctx, d)) != "fresh":
            raise UpstreamError(
                f"stage {name!r} needs stage {d!r} ({ctx.stage_dir(d)}), which is "
                f"{stage_state(ctx.stage_dir(d), stage_fingerprint(ctx, d))}: run `epr run --until {name}` "
                "(with the same -c/--set) to run it and what it needs first"
            )
    stage = STAGES[name]
    if not (stage.distributed or ctx.dist.is_main):
        ctx.dist.barrier()
        return True
    if ctx.dist.is_main and (out / "manifest.json").exists():
        (out / "manifest.json").unlink()  # from now on the folder counts as absent until it is finished again
    out.mkdir(parents=True, exist_ok=True)
    if ctx.dist.is_main:
        remove_stale_temps(out)  # left by a kill between a temp write and its rename
    t0 = time.time()
    log.info("%s: running", stage_label(ctx, name))
    if isinstance(stage.fn, SubRun):  # the pipeline for another context (earlier rounds, DR-BM25)
        sub = stage.fn.context(ctx)
        ran = [] if sub is None else run(sub, until=stage.fn.until)
        res = {
            "rows": {"stages_run": len(ran)},
            "extra": {stage.fn.label: sub and str(sub.cfg.run_dir), "ran": ran},
        }
    else:
        res = stage.fn(ctx, out, fp) or {}
    if ctx.dist.is_main:
        write_manifest(
            out,
            stage=name,
            fp=fp,
            config=stage.keys(ctx),
            rows=res.get("rows", {}),
            extra={
                "upstream": {d: stage_fingerprint(ctx, d) for d in stage.deps(ctx)},
                "seconds": round(time.time() - t0, 1),
                **res.get("extra", {}),
            },
        )
    ctx.dist.barrier()
    return True


def run(ctx: Context, until: str = "labels", force: tuple[str, ...] = ()) -> list[str]:
    """Run every stale or missing stage up to ``until``; returns the stages that ran."""
    until = ALIASES.get(until, until)
    force = tuple(ALIASES.get(f, f) for f in force)
    check_task_stage(ctx, until)
    order = upstream(ctx, until)
    outside = [f for f in force if f not in order]
    if (
        outside
    ):  # a forced rerun that would silently not happen (a stage this config does not need, or past `until`)
        raise ConfigError(
            f"--force {', '.join(outside)}: not a stage of this run (up to {until}, with this config: "
            f"{', '.join(order)})"
        )
    ran = []
    for name in order:
        trains = tuple(t for t in ("encoder", "reward") if t in order)
        if name == "scores" and trains:  # a training setting known to fail: said before the LM work
            candidates.check_dev_size(ctx, trains)
        if run_stage(ctx, name, force=name in force):
            ran.append(name)
    return ran
