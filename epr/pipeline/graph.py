"""The stage graph: each stage's upstream, the config values it reads and the function that runs it; a stage's
fingerprint hashes those values plus its upstream fingerprints, so changing a setting reruns that stage and
everything downstream, and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from epr.cache import fingerprint
from epr.context import Context
from epr.pipeline import rounds
from epr.pipeline.keys import (
    _const,
    _encoder_deps,
    _encoder_keys,
    _evaluate_deps,
    _examples_keys,
    _predict_keys,
    _prompts_keys,
    _rerank_deps,
    _rerank_keys,
    _retrieve_deps,
    _retrieve_keys,
    _reward_keys,
    _scoring_keys,
    _select_deps,
    _select_keys,
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
    reward,
    scores,
    select,
    teacher,
)
from epr.truthfulqa import stage as tqa

__all__ = [
    "Stage",
    "SubRun",
    "STAGES",
    "ALIASES",
    "stage_fingerprint",
    "upstream",
    "final_stage",
    "ROUND_STAGES",
]


@dataclass(frozen=True)
class SubRun:
    """A stage that runs the pipeline, up to ``until``, for another context: the earlier rounds of this run, the
    DR-BM25 sub-run. ``context`` gives that context (None: nothing to run); the runner records it under
    ``label`` in the stage's manifest."""

    context: Callable[[Context], Context | None]
    until: str
    label: str


@dataclass(frozen=True)
class Stage:
    name: str
    deps: Callable[[Context], tuple[str, ...]]
    keys: Callable[[Context], dict]  # the config values (and identities) the stage's output depends on
    fn: (
        Callable[[Context, Path, str], dict | None] | SubRun
    )  # run_<stage> of an epr.stages module, or a sub-run
    distributed: bool = False  # every process runs it (else: the main process only)
    task: str | None = None  # the one task whose data it reads (TruthfulQA's stages); None: every EPR task


def _encoder_fp(ctx: Context) -> str:
    return stage_fingerprint(ctx, "encoder")


STAGES: dict[str, Stage] = {
    s.name: s
    for s in [
        Stage("examples", _const(), _examples_keys, examples.run_examples),
        # earlier rounds (candidates.rounds > 1): sub-runs up to their encoders, in <run_dir>/rounds/round-r/
        Stage(
            "rounds",
            _const(),
            lambda c: rounds.rounds_keys(c, _encoder_fp),
            SubRun(rounds.previous_round, "encoder", "round_run"),
            distributed=True,
        ),
        Stage(
            "candidates",
            rounds.candidates_deps,
            lambda c: rounds.candidates_keys(c, _encoder_fp),
            candidates.run_candidates,
        ),
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
            _encoder_deps,  # with train.teacher: reward, the teacher stage too
            _encoder_keys,
            encoder.run_encoder,
            distributed=True,
        ),
        # the reward model (issue 74): a cross-encoder trained on the same labels, run when asked for
        Stage("reward", _const("labels"), _reward_keys, reward.run_reward, distributed=True),
        # LLM-R's distillation target (train.teacher: reward): the reward model's scores of wider mined candidates
        Stage(
            "teacher",
            _const("candidates", "labels", "reward"),
            lambda c: {"teach_k": c.cfg.reward.teach_k},
            teacher.run_teacher,
        ),
        # a sub-run: this run with BM25-ranked labels
        Stage(
            "dr-bm25",
            _const(),
            lambda c: {"encoder": _encoder_fp(rounds.dr_bm25(c))},
            SubRun(rounds.dr_bm25, "encoder", "sub_run"),
        ),
        Stage("retrieve", _retrieve_deps, _retrieve_keys, retrieve.run_retrieve),
        Stage("rerank", _rerank_deps, _rerank_keys, rerank.run_rerank),
        Stage("prompts", _const("rerank"), _prompts_keys, prompts.run_prompts),
        Stage("predict", _const("prompts"), _predict_keys, predict.run_predict),
        # the served retriever, chosen on a held-out slice of the pool (never the evaluation examples)
        Stage("select", _select_deps, _select_keys, select.run_select),
        Stage("evaluate", _evaluate_deps, lambda c: {"task": c.cfg.data.task}, evaluate.run_evaluate),
        # TruthfulQA (RAGSys, SPEC 3): demonstration sets -> log-probabilities -> tables (``epr truthfulqa``)
        *[
            Stage(n, d if callable(d) else _const(*d), k, f, *rest, task="truthfulqa")
            for n, d, k, f, *rest in tqa.STAGE_SPECS
        ],
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
    task = ctx.cfg.data.task
    own = [
        n for n, st in STAGES.items() if st.task == task
    ]  # a task with stages of its own ends with its last
    return own[-1] if own else "evaluate"


ROUND_STAGES = (
    "candidates",
    "scores",
    "labels",
    "encoder",
)  # what each round runs anew (and, asked for, reward, teacher)
