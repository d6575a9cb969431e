"""Stage ``compare``: every retriever on the same eval examples, LM, and prompt budget; one table.

For each retriever: retrieve k ids, (optionally) re-rank with RAGSys (``<name>+div``: MMR diversity;
``<name>+div+bias``: Algorithm 1 with the inference LM's quality bias, see ``epr.rerank``), build prompts
within the budget, generate greedily (resumable by chunk), score with the task's metric. Writes
``results.{md,csv,json}``, ``em.png`` and ``per_query.jsonl`` (which demonstrations each retriever chose).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from epr.artifacts import read_jsonl, write_jsonl
from epr.evaluation import PAPER, mean_ci, paired_rows
from epr.prompts import build_prompt
from epr.rerank import parse_retriever_name, pool_quality, rerank
from epr.retrievers import ORACLES, DenseRetriever, make_retriever
from epr.stages.context import Context

log = logging.getLogger(__name__)


def eval_examples(ctx: Context) -> list:
    """The compared examples: the eval split, or its seeded subset of ``retrieve.eval_limit`` (ids kept)."""
    ev, rc = ctx.examples("eval"), ctx.cfg.retrieve
    if rc.eval_limit is not None and rc.eval_limit < len(ev):
        keep = np.sort(np.random.default_rng(ctx.cfg.seed).choice(len(ev), rc.eval_limit, replace=False))
        ev = [ev[i] for i in keep]
    return ev


class PromptMaker:
    """Retrieve (and re-rank) for one retriever name, then fit the prompts into the inference LM's budget.

    Holds what several retrievers share: built first stages, loaded encoders, the pool's quality bias."""

    def __init__(self, ctx: Context, model, tok, out: Path):
        self.ctx, self.model, self.tok, self.out = ctx, model, tok, out
        self.pool = ctx.examples("pool")
        self.encoders: dict = {}
        self.built: dict = {}
        self.quality = None

    def count(self, s: str) -> int:
        return len(self.tok(s, add_special_tokens=False)["input_ids"])

    def __call__(self, name: str, ev: list) -> list:
        cfg, rc, task = self.ctx.cfg, self.ctx.cfg.retrieve, self.ctx.task
        base_name, div, bias = parse_retriever_name(name)
        if base_name not in self.built:
            self.built[base_name] = make_retriever(
                base_name, self.pool, task, cfg, cfg.run_dir, self.encoders
            )
        r = self.built[base_name]
        ids = r.retrieve(ev, rc.k)
        if div or bias:
            if not isinstance(r, DenseRetriever):
                raise ValueError(f"{name}: RAGSys re-ranking needs a dense first stage (epr, sbert, dr-bm25)")
            if bias and self.quality is None:
                self.quality = pool_quality(self.model, self.tok, task, self.pool, cfg, self.out)
            ids = rerank(
                r.query_embeddings(ev),
                r.pool_emb,
                ids,
                rc.max_demos,
                cfg.ragsys.lambda_d if div else 1.0,
                cfg.ragsys.lambda_b,
                self.quality if bias else None,
            )
        return [
            build_prompt(
                task,
                e,
                ids[i].tolist(),
                self.pool,
                self.count,
                rc.prompt_budget,
                rc.answer_reserve,
                rc.max_demos,
            )
            for i, e in enumerate(ev)
        ]


def gold_logprob(scorer, cache, task, contexts: list[str], ev: list) -> np.ndarray:
    """``log p(gold answer | context)`` under the inference LM for each example (RAGSys's way of judging a
    retriever: one forward pass each, no generation), reusing and filling the score cache."""
    tgts = [task.format_target(e.output) for e in ev]
    known = cache.get(contexts, tgts)
    todo = [i for i, v in enumerate(known) if v is None]
    out = np.array([np.nan if v is None else v for v in known], dtype=np.float64)
    if todo:
        pairs = scorer.encode([contexts[i] for i in todo], [tgts[i] for i in todo])
        long = set(scorer.too_long(pairs))
        ok = [j for j in range(len(todo)) if j not in long]
        vals = np.round(scorer.score_ids([pairs[j] for j in ok]), 4) if ok else []
        for j, v in zip(ok, vals):
            out[todo[j]] = v
        cache.put([contexts[todo[j]] for j in ok], [tgts[todo[j]] for j in ok], list(vals), "gold")
    return out


def logprob_metrics(lp: np.ndarray, lp_empty: np.ndarray) -> dict:
    """Mean gold log-prob (nats, with a bootstrap interval) and its DPO form against the empty context: the mean of
    ``log sigmoid(lp - lp_empty)`` (0 is best: the demonstrations always make the gold answer more likely)."""
    ok = ~np.isnan(lp) & ~np.isnan(lp_empty)
    m, lo, hi = mean_ci(lp[ok].tolist())
    dpo = -np.logaddexp(0.0, -(lp[ok] - lp_empty[ok]))
    dm, dlo, dhi = mean_ci(dpo.tolist())
    return {
        "gold_logprob": {"value": m, "ci_low": lo, "ci_high": hi},
        "dpo": {"value": dm, "ci_low": dlo, "ci_high": dhi},
        "gold_logprob_n": int(ok.sum()),
    }


def logprob_scorer(ctx: Context, model, tok):
    """A scorer over the inference LM and its score cache (the score cache key of that LM)."""
    from epr.scoring import LMScorer
    from epr.stages.scores import score_cache

    cfg = ctx.cfg
    sc = LMScorer(model, tok, batch_tokens=cfg.scoring.batch_tokens, forward=cfg.scoring.forward)
    return sc, score_cache(cfg, cfg.models.inference_lm or cfg.models.lm)


def run_compare(ctx: Context, out: Path, fp: str) -> dict:
    from epr.generate import Generator
    from epr.models import load_lm_for

    cfg, rc = ctx.cfg, ctx.cfg.retrieve
    task, pool = ctx.task, ctx.examples("pool")
    ev = eval_examples(ctx)
    model, tok = load_lm_for(cfg.models, inference=True)
    gen = Generator(model, tok, cfg.generate.max_new_tokens, cfg.generate.batch_size, task.stop)
    make_prompts = PromptMaker(ctx, model, tok, out)
    scorer, cache = logprob_scorer(ctx, model, tok)
    lp_empty = gold_logprob(scorer, cache, task, [task.format_query(e.input) for e in ev], ev)
    results, per_query = {}, [{"idx": e.idx, "input": e.input, "gold": e.output} for e in ev]
    for row, v in zip(per_query, lp_empty):
        row["gold_logprob_empty"] = None if np.isnan(v) else float(v)
    for name in rc.retrievers:
        base_name, div, bias = parse_retriever_name(name)
        prompts = make_prompts(name, ev)
        lp = gold_logprob(scorer, cache, task, [p.text for p in prompts], ev)
        preds = _generate_resumable(
            gen, [p.text for p in prompts], out / "parts" / name, cfg.generate.chunk_size, name
        )
        correct = [task.is_correct(p, e.output) for p, e in zip(preds, ev)]
        extra = [task.metrics(p, e.output) for p, e in zip(preds, ev)]
        m, lo, hi = mean_ci([100.0 * c for c in correct])
        stat = {s: sum(p.status == s for p in prompts) for s in ("ok", "no_demo_fits", "query_too_long")}
        results[name] = {
            "em": m,
            "ci_low": lo,
            "ci_high": hi,
            "oracle": base_name in ORACLES,
            "mean_demos": float(np.mean([len(p.demo_ids) for p in prompts])),
            "mean_prompt_tokens": float(np.mean([p.n_tokens for p in prompts])),
            "prompt_status": stat,
            "paper": PAPER.get(task.name, {}).get(base_name) if not (div or bias) else None,
            **logprob_metrics(lp, lp_empty),
        }
        for k in task.extra_metrics:
            km, klo, khi = mean_ci([100.0 * x[k] for x in extra])
            results[name][k] = {"value": km, "ci_low": klo, "ci_high": khi}
            log.info("%s: %s %.1f [%.1f, %.1f]", name, k, km, klo, khi)
        log.info(
            "%s: EM %.1f [%.1f, %.1f], gold log-prob %.2f",
            name,
            m,
            lo,
            hi,
            results[name]["gold_logprob"]["value"],
        )
        for row, p, y, c, x, v in zip(per_query, prompts, preds, correct, extra, lp):
            row[name] = {
                "demos": list(p.demo_ids),
                "demo_inputs": [pool[i].input for i in p.demo_ids[:3]],
                "prediction": y,
                "correct": c,
                "gold_logprob": None if np.isnan(v) else float(v),
                **x,
            }
    write_jsonl(out / "per_query.jsonl", per_query)
    _write_tables(out, task.name, results, len(ev), cfg, tuple(task.extra_metrics), task.paper_metric)
    _write_paired(out, per_query, list(results), ("correct", *task.extra_metrics))
    return {"rows": {"eval": len(ev), "retrievers": len(results)}, "extra": {"results": results}}


def _generate_resumable(gen, prompts: list[str], parts: Path, chunk: int, name: str) -> list[str]:
    parts.mkdir(parents=True, exist_ok=True)
    out: list[str] = []
    for c, s in enumerate(tqdm(range(0, len(prompts), chunk), desc=f"generate [{name}]", unit="chunk")):
        f = parts / f"chunk-{c:05d}.jsonl"
        if f.exists():
            rows = list(read_jsonl(f))
            if [r["prompt"] for r in rows] == prompts[s : s + chunk]:
                out.extend(r["prediction"] for r in rows)
                continue
        preds = gen.generate(prompts[s : s + chunk])
        write_jsonl(f, [{"prompt": p, "prediction": y} for p, y in zip(prompts[s : s + chunk], preds)])
        out.extend(preds)
    return out


def _label(metric: str) -> str:
    """A metric's name in tables: ``lf_em`` -> ``LF-EM``."""
    return "EM" if metric in ("em", "correct") else metric.upper().replace("_", "-")


def _write_tables(
    out: Path, task: str, results: dict, n: int, cfg, extra: tuple[str, ...] = (), paper_metric: str = "em"
) -> None:
    rows = sorted(results.items(), key=lambda kv: (kv[1]["oracle"], kv[1]["em"]))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["retriever", "em", "ci_low", "ci_high"]
            + [f"{m}{s}" for m in extra for s in ("", "_ci_low", "_ci_high")]
            + ["paper", "oracle", "mean_demos", "mean_prompt_tokens"]
        )
        for k, v in rows:
            w.writerow(
                [k, f"{v['em']:.2f}", f"{v['ci_low']:.2f}", f"{v['ci_high']:.2f}"]
                + [f"{v[m][s]:.2f}" for m in extra for s in ("value", "ci_low", "ci_high")]
                + [v["paper"], v["oracle"], f"{v['mean_demos']:.2f}", f"{v['mean_prompt_tokens']:.0f}"]
            )
    extra_head = "".join(f" {_label(m)} (ours) | 95% CI |" for m in extra)
    lines = [
        f"# {task}: exact match{''.join(' and ' + _label(m) for m in extra)} on {n} evaluation examples",
        "",
        f"Inference LM `{cfg.models.inference_lm or cfg.models.lm}`, prompt budget {cfg.retrieve.prompt_budget} tokens "
        f"({cfg.retrieve.answer_reserve} reserved for the answer), at most {cfg.retrieve.max_demos} demos. "
        "95% bootstrap intervals. Gold log-prob: log p(gold answer | prompt) under the inference LM, summed over "
        "the answer's tokens; DPO: mean log sigmoid(that - the same without demonstrations). "
        "Paper: GPT-Neo 2.7B (SPEC 2.8).",
        "",
        f"| retriever | EM (ours) | 95% CI |{extra_head} gold log-prob (nats) | DPO vs empty context | "
        f"paper {_label(paper_metric)} | demos/prompt | prompt problems |",
        "|---|---|---|" + "---|---|" * len(extra) + "---|---|---|---|---|",
    ]
    for k, v in rows:
        bad = v["prompt_status"]["no_demo_fits"] + v["prompt_status"]["query_too_long"]
        cells = "".join(f" {v[m]['value']:.1f} | {v[m]['ci_low']:.1f}-{v[m]['ci_high']:.1f} |" for m in extra)
        lines.append(
            f"| {k}{' (oracle)' if v['oracle'] else ''} | {v['em']:.1f} | {v['ci_low']:.1f}-{v['ci_high']:.1f} |"
            f"{cells} {_lp(v, 'gold_logprob')} | {_lp(v, 'dpo')} | {'' if v['paper'] is None else v['paper']} | "
            f"{v['mean_demos']:.1f} | {bad} |"
        )
    (out / "results.md").write_text("\n".join(lines) + "\n")
    _plot(out, task, rows)
    _html(out, lines)


def _lp(v: dict, key: str) -> str:
    if key not in v:
        return ""
    m = v[key]
    return f"{m['value']:.2f} ({m['ci_low']:.2f} to {m['ci_high']:.2f})"


def _write_paired(out: Path, per_query: list[dict], names: list[str], keys: tuple[str, ...]) -> None:
    """Paired comparison of every two retrievers on the same examples (``paired.md``, ``paired.json``)."""
    tables = {k: paired_rows(per_query, names, k) for k in keys}
    (out / "paired.json").write_text(json.dumps(tables, indent=2) + "\n")
    lines = [
        f"# Paired comparison on the same {len(per_query)} examples",
        "",
        "a-only / b-only: examples one retriever gets right and the other wrong; p: exact McNemar test on those "
        "(small p: the difference is unlikely to be chance); demo overlap: share of b's demonstrations also in a's "
        "prompt.",
    ]
    for k, rows in tables.items():
        lines += [
            "",
            f"## {'exact match' if k == 'correct' else _label(k)}",
            "",
            "| a | b | a-only | b-only | both | p (McNemar) | demo overlap |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['a']} | {r['b']} | {r['a_only']} | {r['b_only']} | {r['both']} | {r['p_mcnemar']:.3g} | "
            f"{r['demo_overlap']:.2f} |"
            for r in rows
        ]
    (out / "paired.md").write_text("\n".join(lines) + "\n")


def _html(out: Path, md_lines: list[str]) -> None:
    """A self-contained HTML report: the table and the bar plot (embedded), to open from a file."""
    import base64
    import html

    body, table = [], []
    for line in md_lines:
        if line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            if not set("".join(cells)) <= set("-"):
                tag = "th" if not table else "td"
                table.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    img = base64.b64encode((out / "em.png").read_bytes()).decode()
    (out / "report.html").write_text(
        "<!doctype html><meta charset=utf-8><title>epr comparison</title><style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style>"
        + "".join(body)
        + "<table>"
        + "".join(table)
        + f"</table><p><img src='data:image/png;base64,{img}'></p>"
    )


def _plot(out: Path, task: str, rows) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * len(rows) + 2, 3.2))
    names = [k for k, _ in rows]
    ems = [v["em"] for _, v in rows]
    err = [[v["em"] - v["ci_low"] for _, v in rows], [v["ci_high"] - v["em"] for _, v in rows]]
    ax.bar(names, ems, yerr=err, color=["#999" if v["oracle"] else "#3b7dd8" for _, v in rows], capsize=3)
    ax.set(ylabel="exact match (%)", title=f"{task}: retrievers (grey: oracles)")
    fig.tight_layout()
    fig.savefig(out / "em.png", dpi=120)
    plt.close(fig)
