"""``epr truthfulqa``: the six RAGSys variants on TruthfulQA, and the lambda_d calibration sweep.

epr truthfulqa --data-dir ../shared/data                       # all 817 questions, six variants
epr truthfulqa --data-dir ../shared/data --limit 200 --sweep 0,0.25,0.5,0.75,1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from epr.truthfulqa import (
    PRIMER,
    build_sets,
    demo_text,
    empty_scores,
    evaluate_variant,
    load_tqa,
    mean_pairwise_cosine,
    quality_bias,
    select_context,
)

VARIANTS = ["fix", "bias", "rel", "rel+bias", "rel+div", "rel+div+bias"]
# SPEC 3.6: (DPO, MC1, paper-MC2, paper-MC3)
PAPER = {
    "Mistral-7B": {
        "fix": (-20.40, 0.2815, 0.2086, 0.4285),
        "bias": (-33.56, 0.2411, 0.1652, 0.3596),
        "rel": (-12.71, 0.4455, 0.3664, 0.5925),
        "rel+bias": (-13.63, 0.4602, 0.3663, 0.5969),
        "rel+div": (-12.37, 0.5177, 0.3930, 0.6616),
        "rel+div+bias": (-14.54, 0.4676, 0.3592, 0.6255),
    },
    "Llama-3-8B": {
        "fix": (-22.12, 0.3623, 0.2709, 0.5195),
        "bias": (-17.55, 0.3831, 0.2876, 0.5729),
        "rel": (-17.20, 0.4920, 0.4046, 0.6518),
        "rel+bias": (-17.14, 0.5043, 0.4083, 0.6570),
        "rel+div": (-16.14, 0.5520, 0.4173, 0.7009),
        "rel+div+bias": (-15.80, 0.5177, 0.4007, 0.6841),
    },
}


def add_parser(sub) -> None:
    p = sub.add_parser("truthfulqa", help="RAGSys variants on TruthfulQA (MC1/MC2/MC3, DPO)")
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--version", default="2021-10", choices=["2021-10", "v0"])
    p.add_argument("--lm", default="smollm2")
    p.add_argument("--encoder", default="minilm")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--k", type=int, default=6)
    p.add_argument("--lambda-d", type=float, default=0.75)
    p.add_argument("--lambda-b", type=float, default=0.95)
    p.add_argument(
        "--limit", type=int, default=None, help="evaluate a seeded subset of questions (pool stays whole)"
    )
    p.add_argument("--sweep", default="", help="comma-separated lambda_d values for the calibration figure")
    p.add_argument("--out", default=None)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--log-level", default="INFO")


def run(a: argparse.Namespace) -> int:
    from epr.models import load_encoder, load_lm
    from epr.scoring import LMScorer

    rows = load_tqa(a.data_dir, a.version)
    full = build_sets(rows)
    out = Path(a.out or f"runs/truthfulqa-{a.lm.replace('/', '_')}")
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_lm(a.lm)
    scorer = LMScorer(model, tok, batch_tokens=a.batch_tokens)
    st = load_encoder(a.encoder)
    q_emb = st.encode([r["question"] for r in rows], batch_size=128, normalize_embeddings=True)
    icl_emb = st.encode([q for _, q, _ in full.icl], batch_size=128, normalize_embeddings=True)
    icl_q = np.array([qi for qi, _, _ in full.icl])
    bias = quality_bias(scorer, full.icl, out / "quality_bias.npy")

    subset = np.arange(len(rows))
    if a.limit is not None and a.limit < len(rows):
        subset = np.sort(np.random.default_rng(0).choice(len(rows), a.limit, replace=False))
    keep = set(subset.tolist())
    data = type(full)(
        [rows[i] for i in subset],
        full.icl,
        [(int(np.searchsorted(subset, qi)), x, y) for qi, x, y in full.dpo if qi in keep],
    )
    empty = empty_scores(scorer, data, out / f"empty_n{len(subset)}.jsonl")

    def contexts(variant: str, ld: float) -> tuple[list[str], list[list[int]]]:
        if variant == "fix":
            return ["".join(demo_text(q, a_) for q, a_ in PRIMER)] * len(subset), []
        sets = [
            select_context(variant, int(qi), q_emb[qi], icl_emb, icl_q, bias, a.k, ld, a.lambda_b)
            for qi in subset
        ]
        # most relevant demonstration right before the question
        return ["".join(demo_text(full.icl[j][1], full.icl[j][2]) for j in reversed(s)) for s in sets], sets

    results, rows_by = {}, {}
    for v in [x for x in a.variants.split(",") if x]:
        ctxs, sets = contexts(v, a.lambda_d)
        summ, rows_v = evaluate_variant(scorer, data, ctxs, empty, out / f"{v}_n{len(subset)}.jsonl", desc=v)
        summ["mean_pairwise_cosine"] = mean_pairwise_cosine(icl_emb, sets) if sets else None
        summ.update(_intervals(rows_v, rows_by.get("fix")))
        rows_by[v] = rows_v
        results[v] = summ
    if results:
        _write_results(out, results, a, len(subset), len(full.icl), len(full.dpo))
    if a.sweep:
        sweep = []
        for ld in [float(x) for x in a.sweep.split(",")]:
            ctxs, sets = contexts("rel+div+bias", ld)
            # lambda_d = the run's own value is the rel+div+bias variant, and 1 is rel+bias: reuse their rows
            name = {a.lambda_d: "rel+div+bias", 1.0: "rel+bias"}.get(ld, f"sweep_{ld:g}")
            summ, _ = evaluate_variant(
                scorer, data, ctxs, empty, out / f"{name}_n{len(subset)}.jsonl", desc=f"lambda_d={ld:g}"
            )
            sweep.append({"lambda_d": ld, "cosine": mean_pairwise_cosine(icl_emb, sets), **summ})
        _write_sweep(out, sweep, a, len(subset))
    return 0


def _intervals(rows: list[dict], fix_rows: list[dict] | None) -> dict:
    """95% bootstrap intervals over questions: MC1, paper-MC3, and (paired, same questions) MC1 minus Fix's."""
    from epr.evaluation import mean_ci

    out = {f"{m}_ci": mean_ci([r[m] for r in rows])[1:] for m in ("mc1", "paper_mc3")}
    if fix_rows is not None:
        out["mc1_minus_fix_ci"] = mean_ci([r["mc1"] - f["mc1"] for r, f in zip(rows, fix_rows)])[1:]
    return out


def _write_results(out: Path, res: dict, a, n: int, n_icl: int, n_dpo: int) -> None:
    (out / "results.json").write_text(json.dumps(res, indent=2) + "\n")
    lines = [
        f"# TruthfulQA ({a.version}), {n} questions, LM `{a.lm}`, k={a.k}, lambda_d={a.lambda_d}, lambda_b={a.lambda_b}",
        "",
        f"D_ICL {n_icl} pairs, D_DPO {n_dpo} triplets, leave-one-out by question. Relevance: `{a.encoder}` cosine.",
        "",
        "Naming: paper-MC2 = official MC3 (fraction of true answers above every false one); paper-MC3 = official MC2 "
        "(normalised true-answer probability mass). DPO is averaged over triplets (x100 would be the paper's scale? see note).",
        "",
        "95% bootstrap intervals over questions in brackets; 'MC1 - Fix' is paired on the same questions.",
        "",
        "| variant | DPO | MC1 | MC1 - Fix | paper-MC2 (=official MC3) | paper-MC3 (=official MC2) | mean pairwise cos | paper Mistral-7B (DPO, MC1, MC2, MC3) | paper Llama-3-8B |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def ci(s: dict, key: str) -> str:
        lo, hi = s.get(key, (float("nan"), float("nan")))
        return f"[{lo:.2f}, {hi:.2f}]"

    for v, s in res.items():
        cos = "" if s["mean_pairwise_cosine"] is None else f"{s['mean_pairwise_cosine']:.3f}"
        d = (
            ""
            if "mc1_minus_fix_ci" not in s or v == "fix"
            else f"{s['mc1'] - res['fix']['mc1']:+.2f} {ci(s, 'mc1_minus_fix_ci')}"
        )
        lines.append(
            f"| {v} | {s['dpo']:.4f} | {s['mc1']:.3f} {ci(s, 'mc1_ci')} | {d} | {s['paper_mc2']:.4f} | "
            f"{s['paper_mc3']:.3f} {ci(s, 'paper_mc3_ci')} | {cos} | {PAPER['Mistral-7B'].get(v)} | {PAPER['Llama-3-8B'].get(v)} |"
        )
    (out / "results.md").write_text("\n".join(lines) + "\n")


def _write_sweep(out: Path, sweep: list, a, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
    lines = [
        f"# lambda_d sweep (lambda_b={a.lambda_b}, k={a.k}, {n} questions, LM `{a.lm}`)",
        "",
        "| lambda_d | mean pairwise cosine | DPO | MC1 | paper-MC2 | paper-MC3 |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {s['lambda_d']:g} | {s['cosine']:.3f} | {s['dpo']:.4f} | {s['mc1']:.4f} | {s['paper_mc2']:.4f} | {s['paper_mc3']:.4f} |"
        for s in sweep
    ]
    (out / "sweep.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.plot([s["cosine"] for s in sweep], [s["dpo"] for s in sweep], "o-")
    for s in sweep:
        ax.annotate(
            f"λd={s['lambda_d']:g}",
            (s["cosine"], s["dpo"]),
            fontsize=8,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set(
        xlabel="mean pairwise cosine of the retrieved set",
        ylabel="DPO metric",
        title="calibration: diversity vs DPO",
    )
    fig.tight_layout()
    fig.savefig(out / "sweep.png", dpi=120)
    plt.close(fig)
