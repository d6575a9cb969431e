"""Stage ``select``: which trained retriever serves this run, chosen on the user's own pool, never on evaluation data.

A seeded slice of the training pool (``select.size`` examples that are never labelled queries:
:func:`epr.stages.candidates.held_out_ids`) plays the part of unseen queries. For each slice example, each retriever
(BM25 over inputs, the baseline, and the learned ones of ``select.retrievers``: ``epr``, ``hybrid``, and with the
reward model's re-ranking ``epr+rm``, ``hybrid+rm``, ``bm25+rm``) retrieves
demonstrations from the pool with the example itself excluded, the prompt is built by the run's prompt rules, and the
inference LM gives ``log p(gold output | prompt)`` (one forward pass each, through the run root's score cache).

The rule (:func:`choose`): among the learned retrievers whose mean gain over BM25 is positive and whose paired
Wilcoxon signed-rank p is below ``select.alpha``, the one with the highest mean gold log-prob; if none, BM25, and the
report says that no learned retriever beat it. ``select.weigh: logprob+em`` weighs the paper's metric too: the same
forward pass says whether greedy decoding reproduces each gold answer (:func:`epr.stages.predict.greedy_exact`), and
of the retrievers that beat BM25 the one with the highest such exact match is served (then the highest log-prob),
for tasks where the mode with the higher log-prob has the lower exact match (issue 74, item 5; not the default). Writes ``report.json`` (the choice, the reason, every retriever's
numbers) and ``per_example.jsonl``; ``PromptRetriever.from_run``, ``epr export`` and the LangChain / dspy adapters
serve the choice.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

from epr.artifacts import atomic_write_text, read_jsonl, write_jsonl
from epr.context import Context
from epr.reports.stats import paired_gain
from epr.stages.candidates import held_out_ids
from epr.types import ConfigError, InputError

__all__ = [
    "BASELINE",
    "choose",
    "choose_rows",
    "committed_report",
    "reselect",
    "run_select",
    "read_selection",
]

log = logging.getLogger(__name__)

BASELINE = "bm25"
RULE = (
    "serve the learned retriever with the highest mean gold log-prob among those whose mean gain over BM25 is "
    "positive and whose paired Wilcoxon p is below select.alpha; if none, serve BM25"
)
RULE_EM = (
    "among the learned retrievers whose mean gold log-prob gain over BM25 is positive and whose paired Wilcoxon p "
    "is below select.alpha, serve the one with the highest greedy exact match on the slice (then the highest mean "
    "gold log-prob); if none, serve BM25"
)


def choose(
    lp: dict[str, np.ndarray], learned: list[str], alpha: float, em: dict[str, np.ndarray] | None = None
) -> dict:
    """The selection from per-example gold log-probs (``lp[name]``: one value per slice example, NaN where the
    prompt did not fit): each retriever's mean and its paired test against BM25, the choice and why. ``em``
    (``select.weigh: logprob+em``): each example's greedy exact match (1 / 0), which orders the retrievers that beat
    BM25 before their log-prob does. Pure."""
    base = lp[BASELINE]
    rows = {BASELINE: {"gold_logprob": float(np.nanmean(base)) if len(base) else math.nan}}
    for name in learned:
        rows[name] = {
            "gold_logprob": float(np.nanmean(lp[name])) if len(base) else math.nan,
            **paired_gain(lp[name], base),
        }
    for name in rows if em is not None else ():
        rows[name]["em"] = float(100 * np.mean(em[name])) if len(base) else math.nan
    winners = [n for n in learned if rows[n]["gain"] > 0 and rows[n]["p"] < alpha]
    if winners:
        first = (
            (lambda n: (rows[n]["em"],)) if em is not None else (lambda n: ())
        )  # logprob+em: EM orders first
        best = max(winners, key=lambda n: (*first(n), rows[n]["gold_logprob"], -learned.index(n)))
        r = rows[best]
        reason = (
            f"{best} beat BM25 on {len(base)} held-out pool examples: {r['gain']:+.2f} nats of gold log-prob "
            f"(Wilcoxon p = {r['p']:.2g})"
        )
        if em is not None:
            reason += (
                f"; the highest greedy exact match of the {len(winners)} that did ({r['em']:.1f} vs BM25's "
                f"{rows[BASELINE]['em']:.1f})"
            )
    else:
        best = BASELINE
        tried = ", ".join(f"{n} {rows[n]['gain']:+.2f} nats (p = {rows[n]['p']:.2g})" for n in learned)
        reason = (
            f"no learned retriever beat BM25 on {len(base)} held-out pool examples ({tried}; needed a positive gain "
            f"with p < {alpha}): serving BM25, the free baseline"
        )
    return {
        "selected": best,
        "reason": reason,
        "baseline": BASELINE,
        "rule": RULE if em is None else RULE_EM,
        "alpha": alpha,
        "rows": rows,
    }


def slice_logprobs(
    ctx: Context, names: list[str], with_em: bool = False
) -> tuple[list[int], dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """The held-out slice's ids, each retriever's per-example ``log p(gold | prompt)`` on it and (``with_em``) its
    greedy exact match read off the same forward pass (:func:`epr.stages.predict.greedy_exact`: 1 / 0)."""
    from epr.config import parse_retriever_name
    from epr.lm.factory import lm_spec, load, score_cache, scorer_for
    from epr.retrieval.retrievers import make_retriever
    from epr.reward.serve import Reranker
    from epr.stages.predict import gold_logprob, greedy_exact
    from epr.stages.prompts import prompt_maker
    from epr.stages.reward import reward_dir

    cfg, task = ctx.cfg, ctx.task
    pool = ctx.examples("pool")
    ids = held_out_ids(cfg, len(pool))
    queries = [pool[int(i)] for i in ids]
    model, tok = load(lm_spec(cfg, inference=True))
    scorer, cache = scorer_for(cfg, model, tok), score_cache(cfg, inference=True)
    make, fmt = prompt_maker(ctx, tok), ctx.prompt(inference=True)
    loaded: dict = {}
    out, first, em = {}, {}, ({} if with_em else None)
    if with_em and not hasattr(scorer, "score_greedy"):
        raise ConfigError(
            f"select.weigh={cfg.select.weigh}: greedy exact match is read off the in-process LM's forward pass, and "
            f"this run scores through {type(scorer).__name__}; use select.weigh=logprob ({cfg.run_dir})"
        )
    for name in names:
        base = parse_retriever_name(name)
        if base.base not in first:
            r = make_retriever(base.base, pool, task, cfg, ctx.encoder_dir(base.base), loaded)
            # an example is never its own demonstration
            first[base.base] = r.retrieve(queries, cfg.retrieve.k, exclude=ids).ids
        rows = first[base.base]
        if base.rm:  # the first stage's top reward.top_k in the reward model's order, as served
            rr = loaded.setdefault("reward", Reranker(reward_dir(ctx), cfg.reward.top_k))
            rows = [
                rr(q.input, [int(i) for i in row if i >= 0], pool, task)[0] for q, row in zip(queries, rows)
            ]
        texts = [make(q, row).text for q, row in zip(queries, rows)]
        if em is not None:
            rows_em, lp = greedy_exact(scorer, cache, fmt, texts, queries, cfg.generate.max_new_tokens)
            em[name] = np.asarray([float(r["correct"]) for r in rows_em])
        else:
            lp = gold_logprob(scorer, cache, fmt, texts, queries)
        out[name] = np.asarray(lp, dtype=np.float64)
        log.info(
            "select: %s, mean gold log-prob %.3f on %d held-out pool examples",
            name,
            np.nanmean(out[name]),
            len(ids),
        )
    return [int(i) for i in ids], out, em


def fewest_servable(alpha: float) -> int:
    """The fewest held-out examples on which a learned retriever can be served at all: the exact two-sided
    Wilcoxon p of n examples is at least 2 / 2**n (every one of them a gain), so fewer can never reach ``alpha``."""
    return next(n for n in range(1, 64) if 2.0 / 2**n < alpha)


def check_slice(cfg, n_pool: int, n: int) -> None:
    """Say when the held-out slice is smaller than ``select.size`` asked (a fifth of a wholly labelled pool at
    most, or the unlabelled examples), and when it is too small for any learned retriever to be served."""
    s = cfg.select
    if n < s.size:
        log.warning(
            "select: %d of the %d held-out pool examples select.size asks for (a pool of %d%s)",
            n,
            s.size,
            n_pool,
            ": at most a fifth of a wholly labelled pool"
            if cfg.candidates.num_queries is None or cfg.candidates.num_queries >= n_pool
            else ", the rest labelled",
        )
    need = fewest_servable(s.alpha)
    if 0 < n < need:
        log.warning(
            "select: on %d held-out examples no learned retriever can be served (a Wilcoxon p < %g needs at least "
            "%d, every one a gain): BM25 will be served whatever the gains; give the run a larger pool or fewer "
            "labelled queries (candidates.num_queries), or set select.size=0 to serve epr without selecting",
            n,
            s.alpha,
            need,
        )


def run_select(ctx: Context, out: Path, fp: str) -> dict:
    s = ctx.cfg.select
    learned = list(dict.fromkeys(s.retrievers))
    n_pool = len(ctx.examples("pool"))
    n_held = len(held_out_ids(ctx.cfg, n_pool))
    check_slice(ctx.cfg, n_pool, n_held)
    if n_held == 0:
        raise ConfigError(
            f"select: no pool example is left to hold out (the pool's every example is a labelled query); lower "
            f"candidates.num_queries or set select.size=0 to skip selection (serves epr) ({ctx.cfg.run_dir})"
        )
    ids, lp, em = slice_logprobs(ctx, [BASELINE, *learned], with_em=s.weigh == "logprob+em")
    report = {**choose(lp, learned, s.alpha, em), "n": len(ids), "backend": ctx.cfg.candidates.backend}
    write_jsonl(
        out / "per_example.jsonl",
        [
            {
                "idx": i,
                **{n: (None if np.isnan(v[j]) else float(v[j])) for n, v in lp.items()},
                **{f"{n}:em": float(v[j]) for n, v in (em or {}).items()},
            }
            for j, i in enumerate(ids)
        ],
    )
    atomic_write_text(out / "report.json", json.dumps(report, indent=2) + "\n")
    log.info("select: serving %s. %s", report["selected"], report["reason"])
    return {"rows": {"held_out": len(ids)}, "extra": {"selected": report["selected"]}}


def read_selection(run_dir: str | Path) -> dict | None:
    """A finished ``select`` stage's report (``None`` where the run has none)."""
    d = Path(run_dir) / "select"
    if not (d / "manifest.json").exists() or not (d / "report.json").exists():
        return None
    return json.loads((d / "report.json").read_text())


def choose_rows(rows: list[dict], retrievers: list[str], weigh: str, alpha: float, where: str) -> dict:
    """:func:`choose` over a select stage's per-example rows (``{name: gold log-prob or None, name:em: 1/0}``, as
    ``per_example.jsonl`` holds them) among ``retrievers`` alone, under ``weigh``. ``where`` names the rows in
    errors. Pure."""
    missing = [n for n in (BASELINE, *retrievers) if rows and n not in rows[0]]
    if missing:
        raise InputError(
            f"{where}: select scored no {', '.join(missing)} (it has {', '.join(k for k in rows[0] if k != 'idx' and ':' not in k)})"
        )
    if weigh == "logprob+em" and rows and f"{BASELINE}:em" not in rows[0]:
        raise InputError(
            f"{where}: weigh=logprob+em needs each example's greedy exact match; this run ran select.weigh=logprob"
        )
    names = [BASELINE, *dict.fromkeys(retrievers)]
    lp = {n: np.array([math.nan if r[n] is None else r[n] for r in rows], dtype=float) for n in names}
    em = (
        {n: np.array([r[f"{n}:em"] for r in rows], dtype=float) for n in names}
        if weigh == "logprob+em"
        else None
    )
    return {**choose(lp, names[1:], alpha, em), "n": len(rows), "retrievers": names[1:], "weigh": weigh}


def committed_report(rows_file: str | Path) -> Path:
    """The ``select-report*.json`` that ``epr experiment record`` committed beside a select stage's rows
    (``rows/select-NAME.jsonl.gz`` -> ``select-report-NAME.json``; ``rows/select-per_example.jsonl.gz`` ->
    ``select-report.json``)."""
    f = Path(rows_file)
    stem = f.name.removesuffix(".gz").removesuffix(".jsonl").removeprefix("select-")
    return f.parent.parent / ("select-report.json" if stem == "per_example" else f"select-report-{stem}.json")


def reselect(
    select_dir: str | Path, retrievers: list[str], weigh: str = "logprob", alpha: float | None = None
) -> dict:
    """What a finished ``select`` stage would have chosen among ``retrievers`` alone (a subset of those it scored)
    under ``weigh``: :func:`choose` over its ``per_example.jsonl``, no LM call. An experiment's arm that serves fewer
    modes than its run scored is judged by the choice it would have made (issue 74, item 6). ``alpha``: the run's.
    ``select_dir`` may also be a results folder's committed rows (``rows/select-NAME.jsonl.gz``, its report beside
    them): the answer then names them as ``source``, and ``epr experiment check`` recomputes it."""
    d = Path(select_dir)
    committed = d.is_file()
    path, report = (d, committed_report(d)) if committed else (d / "per_example.jsonl", d / "report.json")
    if not path.exists() or not report.exists():
        raise InputError(
            f"{d}: no finished select stage here ({path.name} and {report.name})"
            if not committed
            else f"{d}: no {report.name} beside these rows (epr experiment record writes both)"
        )
    a = json.loads(report.read_text())["alpha"] if alpha is None else alpha
    out = choose_rows(list(read_jsonl(path)), retrievers, weigh, a, str(path))
    return {**out, "source": f"rows/{d.name}"} if committed else out
