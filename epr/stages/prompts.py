"""Stage ``prompts``: each retriever's ranking fitted into the inference LM's budget (SPEC 2.5), counted in its
own tokens. Writes ``<name>.jsonl`` rows ``{idx, text, demo_ids, demo_scores, n_tokens, status}`` for every
retriever name: ``demo_scores`` are the retriever's (or the re-ranking's) scores of the demonstrations in the prompt,
so "why was this demonstration chosen" is answered here (null where a retriever has no scores, e.g. random)."""

from __future__ import annotations

from pathlib import Path

from epr.artifacts import prune_outputs, read_jsonl, write_jsonl
from epr.context import Context
from epr.retrieval.prompt_budget import Prompt, build_prompt
from epr.stages.retrieve import eval_examples


def prompt_maker(ctx: Context, tok=None):
    """``make(example, ranked_ids) -> Prompt`` with the run's budget and the inference LM's tokenizer: the one way
    compare, ``epr inspect`` and the Python API turn a ranking into the prompt the LM sees."""
    from epr.lm.models import load_tokenizer_for

    cfg, fmt, pool = ctx.cfg, ctx.prompt(inference=True), ctx.examples("pool")
    tok = tok or load_tokenizer_for(cfg.models, inference=True)
    rc = cfg.retrieve

    def count(s: str) -> int:
        return len(tok(s, add_special_tokens=False)["input_ids"])

    def make(example, ranked) -> Prompt:
        return build_prompt(
            fmt, example, list(ranked), pool, count, rc.prompt_budget, rc.answer_reserve, rc.max_demos
        )

    return make


def prompt_row(idx: int, p: Prompt, scores: dict[int, float] | None = None) -> dict:
    scores = scores or {}
    return {
        "idx": idx,
        "text": p.text,
        "demo_ids": list(p.demo_ids),
        "demo_scores": [scores.get(i) for i in p.demo_ids],
        "n_tokens": p.n_tokens,
        "status": p.status,
    }


def run_prompts(ctx: Context, out: Path, fp: str) -> dict:
    ev = {e.idx: e for e in eval_examples(ctx)}
    make = prompt_maker(ctx)
    bad = 0
    for name in ctx.cfg.retrieve.retrievers:
        rows = []
        for r in read_jsonl(ctx.stage_dir("rerank") / f"{name}.jsonl"):
            p = make(ev[r["idx"]], r["ids"])
            bad += p.status != "ok"
            rows.append(prompt_row(r["idx"], p, dict(zip(r["ids"], r.get("scores") or []))))
        write_jsonl(out / f"{name}.jsonl", rows)
    prune_outputs(out, [f"{name}.jsonl" for name in ctx.cfg.retrieve.retrievers])
    return {"rows": {"eval": len(ev), "retrievers": len(ctx.cfg.retrieve.retrievers), "prompt_problems": bad}}
