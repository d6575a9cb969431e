"""Why does a learned row's gold log-prob differ from BM25's? Per example, the prompts both retrievers build, joined with
the curve's per-example gold log-probs (and exact match where the row has it).

    python scripts/curve_diagnose.py --split locked --row epr@2000-distill --seed 42
    python scripts/curve_diagnose.py -c configs/break_curve.yaml --row epr@2000-distill

Rebuilds each compared example's prompt for the reference (``--ref``, BM25 by default) and the learned row with the
curve's own contexts (the same trained encoder, budget and tokenizer; no LM is run), then reports the paired
differences in gold log-prob: mean, median and quantiles (a mean over examples is dominated by a few examples whose
log-prob moves by tens of nats), and the mean difference by stratum: how many demonstrations fit, whether a
demonstration with the gold's exact output or its skeleton (``Task.skeleton``: the parse without its slot text) is in the
prompt, and the gold's length. Writes ``diagnose-<row>.{json,md}`` next to the curve's results.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

from epr.config import load_config
from epr.experiments import curve
from epr.reports.machine import describe, machine

ROOT = Path(__file__).resolve().parents[1]


def features(ctx, retriever: str, tok) -> list[dict]:
    from epr import pipeline
    from epr.retrieval.retrievers import make_retriever
    from epr.stages.prompts import prompt_maker
    from epr.stages.retrieve import eval_examples

    pipeline.run(ctx, until="examples")  # (cheap; the curve has run it where the row was measured)
    pool, ev = ctx.examples("pool"), eval_examples(ctx)
    r = make_retriever(retriever, pool, ctx.task, ctx.cfg, ctx.encoder_dir(retriever))
    make = prompt_maker(ctx, tok)
    skeleton = ctx.task.skeleton  # the dataset's own notion of a parse's structure (None: it has none)
    out = []
    for e, ids in zip(ev, r.retrieve(ev, ctx.cfg.retrieve.k).ids):
        p = make(e, ids)
        demos = [pool[i] for i in p.demo_ids]
        gold_sk = skeleton(e.output)
        out.append(
            {
                "idx": e.idx,
                "n_demos": len(demos),
                "n_tokens": p.n_tokens,
                "exact": any(d.output == e.output for d in demos),
                "skeleton": None if gold_sk is None else any(skeleton(d.output) == gold_sk for d in demos),
                "gold_tokens": len(tok(e.output, add_special_tokens=False)["input_ids"]),
            }
        )
    return out


def strata(d: np.ndarray, keys: list, name: str) -> list[dict]:
    rows = []
    for k in sorted(set(keys), key=str):
        m = np.array([x == k for x in keys])
        rows.append({"by": name, "stratum": str(k), "n": int(m.sum()), "mean_diff": float(np.mean(d[m]))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", default=str(ROOT / "configs" / "mtop_curve.yaml"))
    ap.add_argument("--split", choices=sorted(curve.SPLIT_SETTINGS), default="dev")
    ap.add_argument("--row", default="epr@2000-distill", help="the learned row: epr@<labels>-<loss>")
    ap.add_argument("--seed", type=int, default=curve.BASE_SEED)
    ap.add_argument("--ref", default="bm25")
    ap.add_argument("--run-root", default="runs")
    ap.add_argument(
        "--out", default=None, help="the curve's results folder (default: as epr experiment curve)"
    )
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args(argv)
    from epr.lm.models import load_tokenizer_for
    from epr.reports.curve import paired_logprob

    cfg0 = load_config([a.config], [f"run_root={a.run_root}", *a.set])
    a.name = cfg0.name
    out = Path(a.out or ROOT / "results" / (a.name + ("-locked" if a.split == "locked" else "")))
    top = f"candidates.num_queries={cfg0.candidates.num_queries}"
    tok = load_tokenizer_for(cfg0.models, inference=True)
    ref_ctx = curve.ctx_for(a, f"{a.name}/ref", top)
    ref = features(ref_ctx, a.ref, tok)
    if "@" in a.row:  # a learned row: epr@<labels>-<loss>, one training seed
        n, loss = int(a.row.split("@")[1].split("-")[0]), a.row.split("-", 1)[1]
        mine = features(curve.curve_ctx(a, n, loss, a.seed), "epr", tok)
        row_name = curve.seeded(a.row, a.seed)
    else:  # another reference row (sbert, bm25-oracle, ...)
        mine, row_name = features(ref_ctx, a.row, tok), a.row
    lp = {
        k: np.array(
            [
                np.nan if v is None else v
                for v in json.loads((out / "rows" / f"{k}.json").read_text())["per_query_logprob"]
            ]
        )
        for k in (a.ref, row_name)
    }
    if not len(ref) == len(mine) == len(lp[a.ref]) == len(lp[row_name]):
        raise SystemExit(
            f"the rebuilt examples ({len(ref)}) and the rows' per-example log-probs differ in length"
        )
    ok = ~np.isnan(lp[a.ref]) & ~np.isnan(lp[row_name])
    d = (lp[row_name] - lp[a.ref])[ok]
    R = [x for x, o in zip(ref, ok) if o]
    M = [x for x, o in zip(mine, ok) if o]
    has_sk = all(x["skeleton"] is not None for x in R + M)  # False: the task knows no skeleton
    em = {}
    for k in (a.ref, row_name):
        f = out / "rows" / f"em-{k}.json.gz"
        if f.exists():
            em[k] = json.loads(gzip.open(f, "rt").read())["correct"]
    gold = np.array([x["gold_tokens"] for x in R])
    terc = np.quantile(gold, [1 / 3, 2 / 3])
    mean, p, median, wins = paired_logprob(lp[row_name][ok].tolist(), lp[a.ref][ok].tolist())
    report = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "split": a.split,
        "ref": a.ref,
        "row": row_name,
        "n": int(ok.sum()),
        "diff": {
            "mean": mean,
            "median": median,
            "quantiles_10_25_75_90": [float(q) for q in np.quantile(d, [0.1, 0.25, 0.75, 0.9])],
            "wins": wins,
            "wilcoxon_p": p,
            "mean_without_top_and_bottom_5pct": float(
                np.mean(np.sort(d)[len(d) // 20 : len(d) - len(d) // 20])
            ),
        },
        "prompts": {
            who: {
                "n_demos": float(np.mean([x["n_demos"] for x in X])),
                "n_tokens": float(np.mean([x["n_tokens"] for x in X])),
                "exact_output_in_prompt": float(np.mean([x["exact"] for x in X])),
                "skeleton_in_prompt": None if not has_sk else float(np.mean([x["skeleton"] for x in X])),
            }
            for who, X in ((a.ref, R), (row_name, M))
        },
        "em": {k: 100.0 * float(np.mean(v)) for k, v in em.items()},
        "strata": [
            *strata(
                d, [int(np.sign(m["n_demos"] - r["n_demos"])) for m, r in zip(M, R)], "n_demos (row - ref)"
            ),
            *(
                strata(
                    d,
                    [f"{int(r['skeleton'])}{int(m['skeleton'])}" for m, r in zip(M, R)],
                    "skeleton in ref, row",
                )
                if has_sk
                else []
            ),
            *strata(
                d, [f"{int(r['exact'])}{int(m['exact'])}" for m, r in zip(M, R)], "exact output in ref, row"
            ),
            *strata(d, [int(np.searchsorted(terc, g)) for g in gold], "gold length tercile"),
        ],
    }
    stem = f"diagnose-{row_name}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    dd = report["diff"]
    lines = [
        f"# {row_name} vs {a.ref}: where the gold log-prob moves ({a.name}, split {a.split})",
        "",
        f"Machine: {describe(report['machine'])}. Command: `{report['command']}`. {report['n']} examples.",
        "",
        f"Per-example difference (row - {a.ref}, nats): mean {dd['mean']:+.3f}, median {dd['median']:+.3f}, "
        f"10/25/75/90% {', '.join(f'{q:+.2f}' for q in dd['quantiles_10_25_75_90'])}; the row is higher on "
        f"{100 * dd['wins']:.1f}% of examples (Wilcoxon p = {dd['wilcoxon_p']:.2g}); mean without the top and "
        f"bottom 5%: {dd['mean_without_top_and_bottom_5pct']:+.3f}. EM: "
        + (", ".join(f"{k} {v:.1f}" for k, v in report["em"].items()) or "not measured"),
        "",
        "| prompts | demos | tokens | exact gold output in prompt | gold skeleton in prompt |",
        "|---|---|---|---|---|",
        *(
            f"| {k} | {v['n_demos']:.2f} | {v['n_tokens']:.0f} | {100 * v['exact_output_in_prompt']:.1f}% | "
            + (
                "n/a (the task knows no skeleton)"
                if v["skeleton_in_prompt"] is None
                else f"{100 * v['skeleton_in_prompt']:.1f}%"
            )
            + " |"
            for k, v in report["prompts"].items()
        ),
        "",
        "| stratum | value | n | mean difference |",
        "|---|---|---|---|",
        *(f"| {s['by']} | {s['stratum']} | {s['n']} | {s['mean_diff']:+.3f} |" for s in report["strata"]),
    ]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
