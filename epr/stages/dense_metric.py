"""The dense metric of a learning-curve row: the gold answer's log-probability under the inference LM given a
retriever's prompts on the evaluation examples (one forward pass each, through the run root's score cache) and its
DPO form against the empty context; and, on request, exact match read off the same pass
(:func:`epr.stages.predict.greedy_exact`). Used by ``epr experiment curve``."""

from __future__ import annotations

import numpy as np

from epr.context import Context

__all__ = ["DenseMetric"]


class DenseMetric:
    """Gold log-prob (and DPO vs the empty context) of one retriever's prompts; the inference LM loaded once. With
    ``greedy``, each row's pass also fills the greedy-match store, so its exact-match row (:meth:`greedy_em`) then
    costs no second pass."""

    def __init__(self, ctx: Context, greedy: bool = False):
        self.greedy = greedy
        from epr.lm.factory import lm_spec, load, score_cache, scorer_for
        from epr.stages.predict import gold_logprob
        from epr.stages.retrieve import eval_examples

        self.model, self.tok = load(lm_spec(ctx.cfg, inference=True))
        self.scorer, self.cache = (
            scorer_for(ctx.cfg, self.model, self.tok),
            score_cache(ctx.cfg, inference=True),
        )
        self.ev = eval_examples(ctx)
        self.fmt = fmt = ctx.prompt(inference=True)
        self.empty = gold_logprob(self.scorer, self.cache, fmt, [fmt.render([], e) for e in self.ev], self.ev)

    def prompts(self, ctx: Context, retriever: str) -> list[str]:
        from epr.retrieval.retrievers import make_retriever
        from epr.stages.prompts import prompt_maker

        r = make_retriever(retriever, ctx.examples("pool"), ctx.task, ctx.cfg, ctx.encoder_dir(retriever))
        make = prompt_maker(ctx, self.tok)
        return [make(e, ids).text for e, ids in zip(self.ev, r.retrieve(self.ev, ctx.cfg.retrieve.k).ids)]

    def greedy_em(self, ctx: Context, retriever: str) -> dict:
        """An exact-match row (``--em-method greedy``) read off the gold pass of the row's own prompts
        (``epr.stages.predict.greedy_exact``): no generation; ``prediction`` is the gold where it matched."""
        from epr.stages.predict import greedy_exact

        texts = self.prompts(ctx, retriever)
        got, _ = greedy_exact(
            self.scorer, self.cache, self.fmt, texts, self.ev, ctx.cfg.generate.max_new_tokens
        )
        extra = list(ctx.task.extra_metrics)
        return {
            "method": "greedy",
            "idx": [e.idx for e in self.ev],
            "correct": [g["correct"] for g in got],
            "prediction": [e.output if g["correct"] else None for e, g in zip(self.ev, got)],
            **({"metrics": {m: [g["metrics"][m] for g in got] for m in extra}} if extra else {}),
        }

    def __call__(self, ctx: Context, retriever: str) -> dict:
        from epr.stages.evaluate import logprob_metrics
        from epr.stages.predict import gold_logprob, greedy_exact

        texts = self.prompts(ctx, retriever)
        if self.greedy:  # the same log-probs (held ones served unchanged), the greedy store filled on the way
            _, lp = greedy_exact(self.scorer, self.cache, self.fmt, texts, self.ev, 0)
        else:
            lp = gold_logprob(self.scorer, self.cache, self.fmt, texts, self.ev)
        m = logprob_metrics(lp, self.empty)
        return {
            "n": len(self.ev),
            "gold_logprob": m["gold_logprob"]["value"],
            "gold_logprob_ci": [m["gold_logprob"]["ci_low"], m["gold_logprob"]["ci_high"]],
            "dpo": m["dpo"]["value"],
            "per_query_logprob": [None if np.isnan(v) else float(v) for v in lp],
        }
