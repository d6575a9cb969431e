"""Stage ``predict``: the inference LM on every prompt. For each retriever name, greedy generation (in resumable
chunks keyed by the generation settings and the LM's identity, dtype and device: never served for another LM or
setting) and log p(gold answer | prompt); and once, log p(gold answer | no demonstrations). Writes ``<name>.jsonl``
rows ``{idx, prediction, gold_logprob}`` and ``empty.jsonl``.

With the lean decoder the gold log-prob is read off the generation's own prefill (``Generator.generate_with_gold``:
the prompt runs once for both; equal to the scorer's within float rounding, tested) and kept with the predictions in
the same resumable chunks; otherwise (transformers' generate, a served LM) the scorer computes it, through the
shared score cache."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from epr.artifacts import read_jsonl, write_jsonl
from epr.cache import ChunkStore
from epr.context import Context
from epr.lm.score_cache import cached_greedy, cached_scores
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


def run_predict(ctx: Context, out: Path, fp: str) -> dict:
    from epr.lm.factory import generate_settings, inference_lm, lm_key, score_cache

    cfg, fmt = ctx.cfg, ctx.prompt(inference=True)
    ev = eval_examples(ctx)
    gen, scorer = inference_lm(cfg, fmt.stop)
    cache = score_cache(cfg, inference=True)
    lp_empty = gold_logprob(scorer, cache, fmt, [fmt.render([], e) for e in ev], ev)
    write_jsonl(out / "empty.jsonl", [{"idx": e.idx, "gold_logprob": _num(v)} for e, v in zip(ev, lp_empty)])
    same_pass = getattr(gen, "engine", None) == "lean"
    settings = generate_settings(cfg)
    key = {"generate": settings, "stop": fmt.stop, **lm_key(cfg, inference=True)}
    if same_pass:
        key["gold_in_generation"] = True  # chunks hold [prediction, gold log-prob]
    by_idx = {e.idx: e for e in ev}
    for name in cfg.retrieve.retrievers:
        prompts = list(read_jsonl(ctx.stage_dir("prompts") / f"{name}.jsonl"))
        texts = [p["text"] for p in prompts]
        store = ChunkStore(out / "parts" / name, key)
        if same_pass:
            items = [[t, fmt.target(by_idx[p["idx"]])] for t, p in zip(texts, prompts)]

            def both(part):
                ys, lps = gen.generate_with_gold([t for t, _ in part], [g for _, g in part])
                return [[y, _num(v)] for y, v in zip(ys, lps)]

            got = store.map(items, settings["chunk_size"], both, desc=f"generate [{name}]", unit="prompt")
            preds = [y for y, _ in got]
            lp = np.array([np.nan if v is None else v for _, v in got])
        else:
            lp = gold_logprob(scorer, cache, fmt, texts, [by_idx[p["idx"]] for p in prompts])
            preds = store.map(
                texts, settings["chunk_size"], gen.generate, desc=f"generate [{name}]", unit="prompt"
            )
        rows = [
            {"idx": p["idx"], "prediction": y, "gold_logprob": _num(v)} for p, y, v in zip(prompts, preds, lp)
        ]
        write_jsonl(out / f"{name}.jsonl", rows)
    return {"rows": {"eval": len(ev), "retrievers": len(cfg.retrieve.retrievers)}}
