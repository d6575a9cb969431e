"""Stage ``predict``: the inference LM on every prompt. For each retriever name, greedy generation and
log p(gold answer | prompt); and once, log p(gold answer | no demonstrations). Writes ``<name>.jsonl`` rows
``{idx, prediction, gold_logprob}`` and ``empty.jsonl``.

Generations live in the run root's shared store (``ScoreCache`` with ``"quantity": "generation"``), keyed by the
generation settings, the stop and the LM's identity, dtype and device (never served for another LM or setting), one
entry per (prompt, gold answer): a prompt any run under the same run root already generated for is served, not
generated again (BM25's and the LM-Oracle's prompts are the same in every run of a dataset), and a kill loses at
most the chunk being generated. ``epr cache export`` carries them to another machine like scores.

With the lean decoder the gold log-prob is read off the generation's own prefill (``Generator.generate_with_gold``:
the prompt runs once for both; equal to the scorer's within float rounding, tested) and kept with the prediction;
otherwise (transformers' generate, a served LM) the scorer computes it, through the shared score cache."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from epr.artifacts import read_jsonl, write_jsonl
from epr.context import Context
from epr.lm.score_cache import GENERATION, ScoreCache, cached_greedy, cached_scores
from epr.prompt import as_format
from epr.stages.retrieve import eval_examples

log = logging.getLogger(__name__)


def gold_logprob(scorer, cache, fmt, contexts: list[str], ev: list) -> np.ndarray:
    """``log p(gold answer | context)`` under the inference LM for each example (RAGSys's way of judging a
    retriever: one forward pass each, no generation), reusing and filling the score cache; NaN where too long.
    ``fmt``: the run's prompt format (its ``target``; a task stands for its own)."""
    fmt = as_format(fmt)
    return cached_scores(scorer, cache, list(contexts), [fmt.target(e) for e in ev], "gold")


def greedy_exact(
    scorer, cache, fmt, contexts: list[str], ev: list, max_new_tokens: int
) -> tuple[list, np.ndarray]:
    """Exact match read off the gold log-prob's forward pass, without generating: an example counts as correct when
    every token of its formatted gold answer is the LM's greedy choice after the prompt (so greedy decoding
    reproduces it token for token, up to the stop), the gold fits ``max_new_tokens``, and the text the decoder would
    keep (cut at the task's stop) passes the task's metric. A lower bound of generated exact match: a generation
    that reaches an equal answer through other tokens (another tokenisation, extra spaces) counts there, not here;
    near-ties can flip between the two passes' float rounding. Returns the per-example rows ``{correct, metrics}``
    (the task's other exact-match metrics of the kept text) and ``log p(gold | prompt)``."""
    fmt = as_format(fmt)
    task, stop = fmt.task, fmt.stop
    golds = [fmt.target(e) for e in ev]
    lp, match = cached_greedy(scorer, cache, list(contexts), golds, "gold")
    lengths = [len(t) for t in scorer.tok(golds, add_special_tokens=False)["input_ids"]]
    rows = []
    for e, g, m, n in zip(ev, golds, match, lengths):
        kept = (g.split(stop, 1)[0] if stop else g).strip()
        hit = bool(m == 1.0) and n <= max_new_tokens
        rows.append(
            {
                "correct": hit and task.is_correct(kept, e.output),
                "metrics": {k: hit and v for k, v in task.metrics(kept, e.output).items()},
            }
        )
    return rows, lp


def _num(v: float) -> float | None:
    return None if np.isnan(v) else float(v)


def generation_key(cfg, stop: str, same_pass: bool = False) -> dict:
    """What changes a generation besides its prompt: the generation settings, the stop and the inference LM's key;
    ``same_pass``: the entries also hold the gold log-prob read off the same forward (the lean decoder)."""
    from epr.lm.factory import generate_settings, lm_key

    key = {
        "generate": generate_settings(cfg),
        "stop": stop,
        **lm_key(cfg, inference=True),
        "quantity": GENERATION,
    }
    return key | {"gold_in_generation": True} if same_pass else key


def cached_generations(
    store: ScoreCache, prompts: list[str], golds: list[str], chunk: int, fn, name: str
) -> list:
    """``[prediction, gold log-prob or None]`` per (prompt, gold): from ``store`` where it holds them, else from
    ``fn(prompts, golds)`` in chunks of ``chunk`` (each written to the store when done, so a kill loses at most
    one); a prompt repeated within the call is generated once."""
    from tqdm.auto import tqdm

    got = store.get(prompts, golds)
    todo: dict[tuple[str, str], list[int]] = {}
    for i, v in enumerate(got):
        if v is None:
            todo.setdefault((prompts[i], golds[i]), []).append(i)
    pairs, chunk = list(todo), max(1, chunk)
    with tqdm(total=len(prompts), initial=len(prompts) - sum(map(len, todo.values())),
              desc=f"generate [{name}]", unit="prompt") as bar:  # fmt: skip
        for a in range(0, len(pairs), chunk):
            part = pairs[a : a + chunk]
            rows = list(fn([p for p, _ in part], [g for _, g in part]))
            if len(rows) != len(part):
                raise RuntimeError(f"generate [{name}]: {len(rows)} rows for {len(part)} prompts")
            store.put([p for p, _ in part], [g for _, g in part], rows, name)
            for pair, row in zip(part, rows):
                for i in todo[pair]:
                    got[i] = list(row)
                bar.update(len(todo[pair]))
    return got


def run_predict(ctx: Context, out: Path, fp: str) -> dict:
    from epr.lm.factory import generate_settings, inference_lm, score_cache

    cfg, fmt = ctx.cfg, ctx.prompt(inference=True)
    ev = eval_examples(ctx)
    gen, scorer = inference_lm(cfg, fmt.stop)
    cache = score_cache(cfg, inference=True)
    lp_empty = gold_logprob(scorer, cache, fmt, [fmt.render([], e) for e in ev], ev)
    write_jsonl(out / "empty.jsonl", [{"idx": e.idx, "gold_logprob": _num(v)} for e, v in zip(ev, lp_empty)])
    same_pass = getattr(gen, "engine", None) == "lean"
    settings = generate_settings(cfg)
    store = ScoreCache(Path(cfg.run_root) / ".cache" / "scores", generation_key(cfg, fmt.stop, same_pass))
    held = len(store)

    def both(prompts, golds):
        if same_pass:
            ys, lps = gen.generate_with_gold(prompts, golds)
            return [[y, _num(v)] for y, v in zip(ys, lps)]
        return [[y, None] for y in gen.generate(prompts)]  # the gold log-prob from the scorer, below

    by_idx = {e.idx: e for e in ev}
    for name in cfg.retrieve.retrievers:
        prompts = list(read_jsonl(ctx.stage_dir("prompts") / f"{name}.jsonl"))
        texts, golds = [p["text"] for p in prompts], [fmt.target(by_idx[p["idx"]]) for p in prompts]
        got = cached_generations(store, texts, golds, settings["chunk_size"], both, name)
        preds = [y for y, _ in got]
        if same_pass:
            lp = np.array([np.nan if v is None else v for _, v in got])
        else:
            lp = gold_logprob(scorer, cache, fmt, texts, [by_idx[p["idx"]] for p in prompts])
        rows = [
            {"idx": p["idx"], "prediction": y, "gold_logprob": _num(v)} for p, y, v in zip(prompts, preds, lp)
        ]
        write_jsonl(out / f"{name}.jsonl", rows)
    return {
        "rows": {"eval": len(ev), "retrievers": len(cfg.retrieve.retrievers)},
        "extra": {
            "generations": {"store": store.dir.name, "held_before": held, "generated": len(store) - held}
        },
    }
