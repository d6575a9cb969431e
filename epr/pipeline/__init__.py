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
from pathlib import Path

from epr.artifacts import remove_stale_temps
from epr.cache import fingerprint, stage_state, write_manifest
from epr.context import Context
from epr.pipeline.keys import (  # noqa: F401 (the tests read the private keys through epr.pipeline)
    ADDED_DEFAULTS,
    _const,
    _encoder_keys,
    _evaluate_deps,
    _examples_keys,
    _predict_keys,
    _prompts_keys,
    _rerank_keys,
    _retrieve_deps,
    _retrieve_keys,
    _scoring_keys,
    _select_keys,
    section_keys,
    selects,
)
from epr.stages import (
    candidates,
    encoder,
    evaluate,
    examples,
    labels,
    predict,
    prompts,
    rerank,
    retrieve,
    scores,
    select,
)
from epr.truthfulqa import stage as tqa
from epr.types import ConfigError, UpstreamError

__all__ = ["Stage", "STAGES", "ALIASES", "stage_fingerprint", "status", "run_stage", "run"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    deps: Callable[[Context], tuple[str, ...]]
    keys: Callable[[Context], dict]  # the config values (and identities) the stage's output depends on
    fn: Callable[[Context, Path, str], dict | None]  # run_<stage> of an epr.stages module
    distributed: bool = False  # every process runs it (else: the main process only)


def _candidates_keys(ctx: Context) -> dict:
    sec = ctx.cfg.section("candidates")
    # BM25 (round 1) keys stay as they were before re-mining and in-run rounds: who mines is said by mined_by
    for k in ("miner", "mine_run", "rounds"):
        sec.pop(k)
    keys = {"candidates": sec, "query_order": "nested-permutation"}
    miner, _ = candidates.round_miner(ctx)
    if miner in ("retriever", "mixed"):  # which encoder mined, and the round; not where its run folder lives
        keys["mined_by"] = _mined_by(ctx)
    if miner == "mixed":
        keys["miner"] = miner
    c, sel = ctx.cfg.candidates, ctx.cfg.select
    if sel.size > 0 and c.num_queries is None:  # the select slice is left out of the labelled set
        keys["held_out"] = {"size": sel.size, "seed": sel.seed}
    return keys


def _mined_by(ctx: Context) -> dict:
    """What re-mined candidates come from: the mining encoder's stage fingerprint and this round's number. An
    in-run round's encoder fingerprint is computed (so ``epr status`` knows round r + 1 before round r has trained,
    and round r + 1 goes stale whenever anything round r depends on changes); an outside ``mine_run``'s is read
    from its manifest (``None`` while untrained: the stage then refuses to run)."""
    prev = ctx.prev_round()
    if prev is None:
        return candidates.miner_identity(ctx.cfg)
    return {"encoder": round_encoder_fingerprint(prev), "round": candidates.round_number(ctx)}


def round_encoder_fingerprint(prev: Context) -> str:
    """An earlier round's encoder fingerprint, computed once per round context: both the ``rounds`` stage and the
    re-mined candidates key on it, so without the memo each round doubled the work of the one before (nine rounds:
    minutes for ``epr status``)."""
    if "encoder" not in prev.round_fps:
        prev.round_fps["encoder"] = stage_fingerprint(prev, "encoder")
    return prev.round_fps["encoder"]


def _candidates_deps(ctx: Context) -> tuple[str, ...]:
    return ("examples", "rounds") if ctx.prev_round() is not None else ("examples",)


def run_rounds(ctx: Context, out: Path, fp: str) -> dict:
    """The earlier rounds of this run (``<run_dir>/rounds/round-r/``, each up to its trained encoder): round r + 1's
    candidates are mined by round r's encoder. A round that is fresh is skipped, so a kill in a later round never
    redoes an earlier one."""
    prev = ctx.prev_round()
    ran = [] if prev is None else run(prev, until="encoder")
    return {
        "rows": {"stages_run": len(ran)},
        "extra": {"round_run": prev and str(prev.cfg.run_dir), "ran": ran},
    }


def _rounds_keys(ctx: Context) -> dict:
    prev = ctx.prev_round()
    if prev is None:  # round 1: no earlier round (the stage is not in this run's graph)
        return {"round": 0}
    return {"encoder": round_encoder_fingerprint(prev), "round": prev.round}


def run_dr_bm25(ctx: Context, out: Path, fp: str) -> dict:
    """The DR-BM25 sub-run (``<run_dir>/dr-bm25/``): the same candidates and training, BM25-ranked labels."""
    sub = ctx.sub_run("dr-bm25")
    ran = run(sub, until="encoder")
    return {"rows": {"stages_run": len(ran)}, "extra": {"sub_run": str(sub.cfg.run_dir), "ran": ran}}


def _sub_run_keys(ctx: Context) -> dict:
    sub = ctx.sub_run("dr-bm25")
    return {"encoder": stage_fingerprint(sub, "encoder")}


STAGES: dict[str, Stage] = {
    s.name: s
    for s in [
        Stage("examples", _const(), _examples_keys, examples.run_examples),
        # earlier rounds (candidates.rounds > 1): sub-runs up to their encoders, in <run_dir>/rounds/round-r/
        Stage("rounds", _const(), _rounds_keys, run_rounds, distributed=True),
        Stage("candidates", _candidates_deps, _candidates_keys, candidates.run_candidates),
        Stage(
            "scores",
            _const("candidates"),
            # the LM's identity, resolved dtype and device; batch layout only where it changes results (bf16)
            _scoring_keys,
            scores.run_scores,
            distributed=True,
        ),
        Stage(
            "labels",
            lambda c: ("scores",) if c.cfg.labels.source == "lm" else ("candidates",),
            lambda c: {"labels": c.cfg.section("labels")},
            labels.run_labels,
        ),
        Stage(
            "encoder",
            _const("labels"),
            _encoder_keys,
            encoder.run_encoder,
            distributed=True,
        ),
        Stage("dr-bm25", _const(), _sub_run_keys, run_dr_bm25),  # a sub-run: this run with BM25 labels
        Stage("retrieve", _retrieve_deps, _retrieve_keys, retrieve.run_retrieve),
        Stage("rerank", _const("retrieve"), _rerank_keys, rerank.run_rerank),
        Stage("prompts", _const("rerank"), _prompts_keys, prompts.run_prompts),
        Stage("predict", _const("prompts"), _predict_keys, predict.run_predict),
        # the served retriever, chosen on a held-out slice of the pool (never the evaluation examples)
        Stage("select", _const("examples", "encoder"), _select_keys, select.run_select),
        Stage("evaluate", _evaluate_deps, lambda c: {"task": c.cfg.data.task}, evaluate.run_evaluate),
        # TruthfulQA (RAGSys, SPEC 3): demonstration sets -> log-probabilities -> tables (``epr truthfulqa``)
        *[Stage(n, d if callable(d) else _const(*d), k, f, *rest) for n, d, k, f, *rest in tqa.STAGE_SPECS],
    ]
}
ALIASES = {"compare": "evaluate"}  # the back half's old single stage: ``--until compare`` still works


def stage_fingerprint(ctx: Context, name: str, _memo: dict | None = None) -> str:
    memo = {} if _memo is None else _memo
    if name not in memo:
        stage = STAGES[name]
        ups = {d: stage_fingerprint(ctx, d, memo) for d in stage.deps(ctx)}
        memo[name] = fingerprint({"stage": name, "keys": stage.keys(ctx), "upstream": ups})
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


def final_stage(ctx: Context) -> str:
    """The last stage of this config's run: TruthfulQA's report, or the EPR pipeline's evaluation."""
    return "tqa_report" if ctx.cfg.data.task == "truthfulqa" else "evaluate"


def status(ctx: Context, until: str | None = None) -> dict[str, str]:
    """Each stage's state (fresh / stale / missing): every registered stage, or only ``until`` and what it needs."""
    names = STAGES if until is None else upstream(ctx, ALIASES.get(until, until))
    return {n: stage_state(ctx.stage_dir(n), stage_fingerprint(ctx, n)) for n in names}


def status_rows(ctx: Context, until: str | None = None) -> list[tuple[str, str, Path, str]]:
    """``(label, state, folder, kept)`` of every stage this config runs, the earlier rounds' stages first
    (``round-1/labels``...), so ``epr status`` shows each round; ``kept``: what an unfinished stage holds (:func:`kept`)."""
    rows: list[tuple[str, str, Path, str]] = []
    st = status(ctx, until)
    if "rounds" in st:
        for p in ctx.rounds()[:-1]:
            rows += [
                (f"round-{p.round}/{n}", s, p.stage_dir(n), kept(p, n, s))
                for n, s in status(p, "encoder").items()
            ]
    for n, s in st.items():
        label = f"round-{ctx.round}/{n}" if n in ROUND_STAGES and ctx.round > 1 else n
        rows.append((label, s, ctx.stage_dir(n), kept(ctx, n, s)))
    return rows


def kept(ctx: Context, name: str, state: str) -> str:
    """What stage ``name`` in ``state`` holds for its next run (``epr status``), where it is not fresh: the chunks of
    its ``parts/`` (scores, predictions; each served again only under its own key and inputs) and a training
    checkpoint saved under the stage's fingerprint (resumed from its step); "" where it holds nothing."""
    from epr.encoder.checkpoints import kept_step

    if state == "fresh":
        return ""
    d = ctx.stage_dir(name)
    n = sum(1 for _ in (d / "parts").rglob("chunk-*.json")) if (d / "parts").is_dir() else 0
    said = [f"{n} chunk{'s' * (n != 1)} kept, served again under the same settings and inputs"] if n else []
    if name == "encoder" and (step := kept_step(d / "checkpoints", stage_fingerprint(ctx, name))) is not None:
        said.append(f"training resumes from its checkpoint at step {step}")
    return "; ".join(said)


ROUND_STAGES = ("candidates", "scores", "labels", "encoder")  # what each round runs anew


def stage_label(ctx: Context, name: str) -> str:
    """How logs name a stage: an earlier round's with its round (``round-1/examples``), as ``epr status`` does, so
    a first run's two ``examples`` stages (round 1's and the run's own) are told apart."""
    return f"round-{ctx.round}/{name}" if ctx.top is not None else name


def check_task_stage(ctx: Context, name: str) -> None:
    """TruthfulQA's stages (``tqa_*``) read TruthfulQA's questions and answers: refused, before any folder is made,
    for a config of another task."""
    if name.startswith("tqa_") and ctx.cfg.data.task != "truthfulqa":
        raise ConfigError(
            f"{name}: a TruthfulQA stage, and this config's task is {ctx.cfg.data.task!r} (its last stage is "
            f"{final_stage(ctx)}); TruthfulQA runs with -c configs/truthfulqa.yaml"
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
        if (
            name == "scores" and "encoder" in order
        ):  # a training setting known to fail: said before the LM work
            candidates.check_dev_size(ctx)
        if run_stage(ctx, name, force=name in force):
            ran.append(name)
    return ran


def clean(ctx: Context, name: str) -> None:
    shutil.rmtree(ctx.stage_dir(name), ignore_errors=True)
