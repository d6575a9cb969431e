"""What each stage's fingerprint reads: the config values and identities its output depends on (``keys``) and
the stages it reads (``deps``), for the stages whose keys need no other stage's fingerprint."""

from __future__ import annotations

from pathlib import Path

from epr.cache import cached_digest
from epr.config import parse_retriever_name
from epr.context import Context
from epr.lm.factory import label_key, scoring_key

# Options added after runs were made whose default reproduces what the code did before them: left out of a stage's
# keys while at that default, so that adding an option does not orphan every trained encoder and cached row.
# (train.init / warm_epochs / mixed_precision / length_buckets: keyed as they act, by _encoder_keys)
ADDED_DEFAULTS: dict[str, dict[str, object]] = {
    "train": {"demo_fields": "input_output", "teacher": "lm"},
    "select": {"weigh": "logprob"},
}


def section_keys(ctx: Context, name: str) -> dict:
    """Config section ``name`` as a stage's keys: every field, except added options at their neutral default."""
    neutral = ADDED_DEFAULTS.get(name, {})
    return {k: v for k, v in ctx.cfg.section(name).items() if k not in neutral or neutral[k] != v}


def prompt_key(ctx: Context, keys: dict, inference: bool = False) -> dict:
    """``keys`` with the run's prompt format (``ctx.prompt``) where it is not the task's own: the stages from
    ``scores`` on render prompts, so a changed template re-keys them (``candidates`` renders none); the default
    format adds nothing, so every run made before the ``prompt`` section keeps its keys."""
    k = ctx.prompt(inference).key()
    return keys if k is None else {**keys, "prompt": k}


def _const(*deps: str):
    return lambda ctx: deps


def _examples_keys(ctx: Context) -> dict:
    # the whole eval split is kept: the compared part (eval_limit, eval_part) is the retrieve stage's key
    data = {
        k: v for k, v in ctx.cfg.section("data").items() if k not in ("eval_limit", "eval_part", "eval_cut")
    }
    if data.get("hub_revision") is None:  # unpinned (or no hub): keys stay as they were before the option
        data.pop("hub_revision", None)
    keys: dict = {"data": data}
    # data files may be edited or replaced in place: their content is part of the key (hashed once per change)
    # (every file the task reads, and data.path / data.eval_path even where a task reads its own files instead;
    # named as given, so the keys of runs whose task reads exactly those files stay as they were)
    files = [p for p in (ctx.cfg.data.path, ctx.cfg.data.eval_path) if p]
    files += [str(f) for f in ctx.task.data_files() if Path(f) not in {Path(p) for p in files}]
    if files:
        keys["files"] = {p: cached_digest(p) for p in files}
    if ctx.cfg.data.task == "jsonl" and any(
        not Path(p).name.lower().removesuffix(".gz").endswith((".csv", ".tsv")) for p in files
    ):
        # JSON numbers have been kept as written ("3.50", not 3.5) since this key: older examples may differ
        keys["json_numbers"] = "as-written"
    if ctx.task.columns:  # the data's other columns the prompt templates name, kept in the rows
        keys["columns"] = list(ctx.task.columns)
    return keys


def _select_keys(ctx: Context) -> dict:
    cfg = ctx.cfg
    return {
        "select": section_keys(ctx, "select"),
        "slice_of": {"num_queries": cfg.candidates.num_queries, "query_seed": cfg.candidates.query_seed},
        "k": cfg.retrieve.k,
        "bm25_backend": cfg.candidates.backend,
        "prompts": _prompts_keys(ctx),
        "lm": scoring_key(cfg, inference=True),
        **({"reward_top_k": cfg.reward.top_k} if selects_by_reward(ctx) else {}),
    }


def selects_by_reward(ctx: Context) -> bool:
    """Whether ``select`` compares a ``+rm`` retriever (the reward model is then upstream of it)."""
    return any(parse_retriever_name(n).rm for n in ctx.cfg.select.retrievers)


def _select_deps(ctx: Context) -> tuple[str, ...]:
    return ("examples", "encoder", "reward") if selects_by_reward(ctx) else ("examples", "encoder")


def selects(ctx: Context) -> bool:
    """Whether this run chooses its served retriever (``select.size`` > 0, an EPR-pipeline run)."""
    return ctx.cfg.select.size > 0 and ctx.cfg.data.task != "truthfulqa"


def _evaluate_deps(ctx: Context) -> tuple[str, ...]:
    return ("predict", "select") if selects(ctx) else ("predict",)


def _retrieve_deps(ctx: Context) -> tuple[str, ...]:
    firsts = {parse_retriever_name(n).base for n in ctx.cfg.retrieve.retrievers}
    uses = (
        ("encoder", ("epr", "hybrid")),
        ("dr-bm25", ("dr-bm25",)),
    )  # the runs a first stage's encoder is from
    return ("examples",) + tuple(d for d, rs in uses if firsts & set(rs))


def _retrieve_keys(ctx: Context) -> dict:
    cfg, rc = ctx.cfg, ctx.cfg.retrieve
    firsts = list(dict.fromkeys(parse_retriever_name(n).base for n in rc.retrievers))
    keys = {
        "first_stages": firsts,
        "k": rc.k,
        "index_factory": rc.index_factory,
        "eval_limit": rc.eval_limit,
        "eval_part": [cfg.data.eval_limit, cfg.data.eval_part, cfg.data.split_seed]
        + ([cfg.data.eval_cut] if cfg.data.eval_cut != "rows" else []),  # "rows": the keys before the cut
        "seed": cfg.seed,
        "bm25_backend": cfg.candidates.backend,
    }
    if "sbert" in firsts:
        keys["sbert"] = cfg.models.encoder
    if "lm-oracle" in firsts:
        keys["lm_oracle"] = prompt_key(ctx, {"L": rc.oracle_candidates or cfg.candidates.L, **label_key(cfg)})
    return keys


def _rerank_keys(ctx: Context) -> dict:

    cfg = ctx.cfg
    names = cfg.retrieve.retrievers
    keys: dict = {"retrievers": list(names), "max_demos": cfg.retrieve.max_demos}
    if any("+" in n for n in names):
        keys["ragsys"] = {"lambda_d": cfg.ragsys.lambda_d, "lambda_b": cfg.ragsys.lambda_b}
    if any(parse_retriever_name(n)[2] for n in names):
        keys["quality_lm"] = prompt_key(ctx, scoring_key(cfg, inference=True), inference=True)
    if reranks_by_reward(
        ctx
    ):  # the reward model itself is an upstream stage (its fingerprint is in this one's)
        keys["reward_top_k"] = cfg.reward.top_k
    return keys


def reranks_by_reward(ctx: Context) -> bool:
    return any(parse_retriever_name(n).rm for n in ctx.cfg.retrieve.retrievers)


def _rerank_deps(ctx: Context) -> tuple[str, ...]:
    return ("retrieve", "reward") if reranks_by_reward(ctx) else ("retrieve",)


def _prompts_keys(ctx: Context) -> dict:
    from epr.lm.factory import lm_name, model_identity

    rc = ctx.cfg.retrieve
    keys = {
        "prompt_budget": rc.prompt_budget,
        "answer_reserve": rc.answer_reserve,
        "max_demos": rc.max_demos,
        "tokenizer": model_identity(lm_name(ctx.cfg.models, inference=True)),
    }
    return prompt_key(ctx, keys, inference=True)


def _predict_keys(ctx: Context) -> dict:
    from epr.lm.factory import generate_settings, lm_key

    cfg = ctx.cfg
    keys = {
        "generate": generate_settings(cfg),
        "lm": lm_key(cfg, inference=True),
        "gold_logprob": scoring_key(cfg, inference=True),
    }
    return prompt_key(ctx, keys, inference=True)


def _scoring_keys(ctx: Context) -> dict:
    return prompt_key(ctx, label_key(ctx.cfg))


def _encoder_deps(ctx: Context) -> tuple[str, ...]:
    """The labels; with ``train.teacher: reward`` also the ``teacher`` stage, whose rows the encoder learns."""
    return ("labels", "teacher") if ctx.cfg.train.teacher == "reward" else ("labels",)


def _encoder_keys(ctx: Context) -> dict:
    """The training settings as they act on this round: mixed precision resolved on this machine (``auto`` keys as
    what it runs, so a machine that trains in fp32 keeps the keys from before the option), and the warm start only
    where there is an earlier encoder to start from (round 1 trains from ``models.encoder`` whatever ``init`` says)."""
    from epr.encoder.settings import effective_train
    from epr.stages.encoder import warm_start_dir

    warm = warm_start_dir(ctx) is not None
    tc = effective_train(ctx.cfg.train, warm)
    train = {
        k: v
        for k, v in section_keys(ctx, "train").items()
        if k not in ("init", "warm_epochs", "length_buckets")
    }
    train["mixed_precision"] = tc.mixed_precision
    if tc.length_buckets != 1 and not (tc.chunk_size and tc.chunk_size < tc.batch_size):
        train["length_buckets"] = (
            tc.length_buckets
        )  # where it acts (no GradCache); 1 keys as before the option
    train["epochs"] = tc.epochs
    if warm:
        train["init"] = "previous"
        train["keeps"] = "a trained epoch"  # never the starting encoder (epr.encoder.dev_metric.best_epoch)
    return {"train": train, "encoder": ctx.cfg.models.encoder}


def _reward_keys(ctx: Context) -> dict:
    """What the reward model's training reads: its section (less ``top_k``, which acts at re-ranking time)."""
    return {"reward": {k: v for k, v in ctx.cfg.section("reward").items() if k not in ("top_k", "teach_k")}}
