"""The stage graph: which stage reads what, how a stage's fingerprint is formed, ``status`` and ``run``.

A stage's fingerprint hashes the config sections it reads plus its upstream fingerprints, so changing a
setting reruns that stage and everything downstream, and nothing else.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from epr.artifacts import fingerprint, stage_state, write_manifest
from epr.stages.context import Context

__all__ = ["Stage", "STAGES", "stage_fingerprint", "status", "run_stage", "run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    deps: Callable[[Context], tuple[str, ...]]
    keys: Callable[[Context], dict]  # the config values the stage reads
    fn: str  # "module:function", imported lazily (heavy imports only when the stage runs)
    distributed: bool = False  # every process runs it (else: the main process only)

    def func(self):
        import importlib

        mod, name = self.fn.split(":")
        return getattr(importlib.import_module(mod), name)


def _scores_keys(ctx: Context) -> dict:
    from epr.stages.scores import scoring_key

    return scoring_key(ctx.cfg)


def _const(*deps: str):
    return lambda ctx: deps


STAGES: dict[str, Stage] = {
    s.name: s
    for s in [
        Stage(
            "examples", _const(), lambda c: {"data": c.cfg.section("data")}, "epr.stages.data:run_examples"
        ),
        Stage(
            "candidates",
            _const("examples"),
            lambda c: {"candidates": c.cfg.section("candidates"), "query_order": "nested-permutation"},
            "epr.stages.candidates:run_candidates",
        ),
        Stage(
            "scores",
            _const("candidates"),
            _scores_keys,  # the resolved dtype; batch layout only where it changes results (bf16)
            "epr.stages.scores:run_scores",
            distributed=True,
        ),
        Stage(
            "labels",
            lambda c: ("scores",) if c.cfg.labels.source == "lm" else ("candidates",),
            lambda c: {"labels": c.cfg.section("labels")},
            "epr.stages.labels:run_labels",
        ),
        Stage(
            "encoder",
            _const("labels"),
            lambda c: {"train": c.cfg.section("train"), "encoder": c.cfg.models.encoder},
            "epr.stages.encoder:run_encoder",
        ),
        Stage(
            "compare",
            lambda c: (
                ("encoder",)
                if any(r.split("+")[0] in ("epr", "dr-bm25") for r in c.cfg.retrieve.retrievers)
                else ("examples",)
            ),
            lambda c: (
                {k: c.cfg.section(k) for k in ("retrieve", "generate", "ragsys")}
                | {
                    "lm": c.cfg.models.inference_lm or c.cfg.models.lm,
                    "encoder": c.cfg.models.encoder,
                    "seed": c.cfg.seed,
                }
            ),
            "epr.stages.compare:run_compare",
        ),
    ]
}


def stage_fingerprint(ctx: Context, name: str, _memo: dict | None = None) -> str:
    memo = {} if _memo is None else _memo
    if name not in memo:
        st = STAGES[name]
        ups = {d: stage_fingerprint(ctx, d, memo) for d in st.deps(ctx)}
        memo[name] = fingerprint({"stage": name, "keys": st.keys(ctx), "upstream": ups})
    return memo[name]


def upstream(ctx: Context, target: str) -> list[str]:
    """``target`` and everything it needs, in run order."""
    order: list[str] = []

    def visit(n: str) -> None:
        for d in STAGES[n].deps(ctx):
            visit(d)
        if n not in order:
            order.append(n)

    visit(target)
    return order


def status(ctx: Context) -> dict[str, str]:
    return {n: stage_state(ctx.stage_dir(n), stage_fingerprint(ctx, n)) for n in STAGES}


def run_stage(ctx: Context, name: str, force: bool = False) -> bool:
    """Run one stage if it is not fresh (its upstream must be fresh). Returns True when it ran."""
    fp = stage_fingerprint(ctx, name)
    out = ctx.stage_dir(name)
    if not force and stage_state(out, fp) == "fresh":
        log.info("%s: fresh, skipped", name)
        return False
    for d in STAGES[name].deps(ctx):
        if stage_state(ctx.stage_dir(d), stage_fingerprint(ctx, d)) != "fresh":
            raise RuntimeError(
                f"stage {name!r} needs {d!r}, which is not fresh: run `epr run --until {name}`"
            )
    st = STAGES[name]
    if not (st.distributed or ctx.dist.is_main):
        ctx.dist.barrier()
        return True
    if ctx.dist.is_main and (out / "manifest.json").exists():
        (out / "manifest.json").unlink()  # from now on the folder counts as absent until it is finished again
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    log.info("%s: running", name)
    res = st.func()(ctx, out, fp) or {}
    if ctx.dist.is_main:
        write_manifest(
            out,
            stage=name,
            fp=fp,
            config=st.keys(ctx),
            rows=res.get("rows", {}),
            extra={
                "upstream": {d: stage_fingerprint(ctx, d) for d in st.deps(ctx)},
                "seconds": round(time.time() - t0, 1),
                **res.get("extra", {}),
            },
        )
    ctx.dist.barrier()
    return True


def run(ctx: Context, until: str = "labels", force: tuple[str, ...] = ()) -> list[str]:
    """Run every stale or missing stage up to ``until``; returns the stages that ran."""
    ran = []
    for name in upstream(ctx, until):
        if run_stage(ctx, name, force=name in force):
            ran.append(name)
    return ran


def clean(ctx: Context, name: str) -> None:
    shutil.rmtree(ctx.stage_dir(name), ignore_errors=True)
