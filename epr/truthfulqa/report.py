"""The ``tqa_report`` stage: TruthfulQA metrics with 95% bootstrap intervals over questions, paired differences
against Fix and against Rel, a verdict on each of the paper's three findings, the lambda_d sweep and its plot.

Writes ``results.{md,json,csv}``, ``paired.{md,json}``, ``sweep.{md,json,png}``, ``variants.png``, ``report.html``
and ``per_question.jsonl`` (every number above can be recomputed from it). Metrics: ``epr.truthfulqa.sets``;
intervals and findings: ``epr.truthfulqa.stats``; rendering: ``epr.reports.tables``.
"""

from __future__ import annotations

import json
from pathlib import Path

from epr.artifacts import atomic_write_text, read_jsonl, write_jsonl
from epr.cache import fingerprint, read_manifest
from epr.truthfulqa import sets as tqa
from epr.truthfulqa import stats as ts

__all__ = ["report_keys", "run_report", "NAMES"]

N_BOOT, BOOT_SEED = 2000, 0

# how each metric is labelled, so a reader can put it next to the paper and next to lm-evaluation-harness
NAMES = {
    "dpo": "DPO (nats/triplet)",
    "mc1": "MC1 (= lm-eval truthfulqa_mc1)",
    "paper_mc2": "paper-MC2 (= official MC3)",
    "paper_mc3": "paper-MC3 (= official MC2 = lm-eval truthfulqa_mc2)",
}
SHORT = ts.SHORT


def report_keys(ctx) -> dict:
    return {"bootstrap": {"n_boot": N_BOOT, "seed": BOOT_SEED}, "paper": fingerprint(tqa.PAPER), "v": 5}


def _fmt(v, digits: int = 3) -> str:
    return ts.fmt_ci(v, digits)


def _diff(v, digits: int = 3) -> str:
    return ts.fmt_ci(v, digits, signed=True)


def _paper(v: str) -> list[str]:
    return [", ".join(f"{x:g}" for x in tqa.PAPER[m][v]) if v in tqa.PAPER[m] else "" for m in tqa.PAPER]


def _head(info: dict) -> str:
    return f"TruthfulQA {info['version']}, {info['questions']} questions, LM `{info['lm']}` ({info['dtype']})"


def _notes(info: dict) -> list[str]:
    return [
        f"Data version **{info['version']}**; LM `{info['lm']}` scored in **{info['dtype']}** on {info['device']}; "
        f"k={info['k']}, lambda_d={info['lambda_d']}, lambda_b={info['lambda_b']}; relevance: `{info['encoder']}` "
        f"cosine. D_ICL {info['icl_pairs']} pairs, D_DPO {info['dpo_triplets']} triplets ({info['dpo_here']} for "
        "these questions), leave-one-out by question. Machine: " + info["machine"] + ".",
        "Naming: paper-MC2 = official MC3 (fraction of true answers above every false one); paper-MC3 = official "
        "MC2 (normalised true-answer probability mass), the number lm-evaluation-harness reports as "
        "truthfulqa_mc2; MC1 is its truthfulqa_mc1. DPO: mean over triplets of log sigma(log-ratio of the correct "
        "answer minus that of the incorrect one, context vs no context), in nats, as SPEC 3.5 defines it; no "
        f"context at all scores log sigma(0) = -0.693. DPO per question: each question's sum over its triplets, "
        f"averaged over questions ({info['dpo_here'] / max(info['questions'], 1):.1f} triplets per question here, "
        f"so no context scores {-0.6931 * info['dpo_here'] / max(info['questions'], 1):.2f}): the scale the "
        "paper's DPO column appears to use (-12 to -34); we could not confirm its aggregation from its text. "
        "Compare orderings with the paper, not values.",
        "Mean pairwise cos: the chosen demonstrations' mean pairwise cosine in the frozen relevance encoder's "
        "space for every variant (the learned `epr` rows included, so the column compares like with like).",
        f"95% bootstrap intervals over questions ({N_BOOT} resamples) in brackets. Paper: SPEC 3.6 (DPO, MC1, "
        "paper-MC2, paper-MC3).",
    ]


def results_table(res: dict, info: dict):
    from epr.reports.tables import Table

    rows, csv_rows = [], []
    for v, s in res.items():
        cos = "" if s["mean_pairwise_cosine"] is None else f"{s['mean_pairwise_cosine']:.3f}"
        rows.append([v, *(_fmt(s[m], 4 if m == "dpo" else 3) for m in ts.METRICS), _fmt(s["dpo_q"], 2), cos,
                     *_paper(v)])  # fmt: skip
        csv_rows.append([v, *(f"{x:.6f}" for m in (*ts.METRICS, "dpo_q") for x in s[m]), s["questions"],
                         s["dpo_triplets"], cos])  # fmt: skip
    return Table(
        title=f"{_head(info)}: the six RAGSys variants",
        notes=_notes(info),
        columns=["variant", *(NAMES[m] for m in ts.METRICS), "DPO per question (paper scale?)", "mean pairwise cos",
                 *(f"paper {m}" for m in tqa.PAPER)],
        rows=rows,
        csv_columns=["variant", *(f"{m}{s}" for m in (*ts.METRICS, "dpo_q") for s in ("", "_ci_low", "_ci_high")),
                     "questions", "dpo_triplets", "mean_pairwise_cosine"],
        csv_rows=csv_rows,
    )  # fmt: skip


def paired_table(paired: list[dict], info: dict):
    from epr.reports.tables import Table

    return Table(
        title=f"{_head(info)}: paired differences (a - b, same questions)",
        notes=[
            "95% paired bootstrap intervals over questions; an interval that excludes 0 separates the two."
        ],
        columns=["a", "b", *(f"Δ {SHORT[m]}" for m in ts.METRICS)],
        rows=[
            [p["a"], p["b"], *(_diff(p["diff"][m], 4 if m == "dpo" else 3) for m in ts.METRICS)]
            for p in paired
        ],
    )


def findings_table(found: list[dict], info: dict):
    from epr.reports.tables import Table

    return Table(
        title=f"{_head(info)}: the paper's findings",
        notes=[
            "Each comparison as a paired difference (a - b) with its 95% interval and the verdict: reproduces / "
            "reversed (the interval excludes 0, in / against the paper's direction) or not separable; for the "
            "quality bias, whose direction the paper finds LM-dependent: helps / hurts / not separable. Whether it "
            "helps one LM and hurts the other: results/truthfulqa/README.md, across LMs."
        ],
        columns=["finding", "a - b", *(f"{SHORT[m]}" for m in ts.METRICS)],
        rows=[
            [f["finding"], f"{f['a']} - {f['b']}",
             *(f"{_diff(f['diff'][m], 4 if m == 'dpo' else 3)} **{f['verdict'][m]}**" for m in ts.METRICS)]
            for f in found
        ],
    )  # fmt: skip


def sweep_table(sweep: list[dict], info: dict):
    from epr.reports.tables import Table

    return Table(
        title=f"{_head(info)}: lambda_d sweep (rel+div+bias, lambda_b={info['lambda_b']}, k={info['k']})",
        notes=["lambda_d = 1 is rel+bias (no diversity); 95% bootstrap intervals over questions. Last column: "
               "this row's DPO minus the next row's, paired by question (an interval excluding 0: a real step)."],
        columns=["lambda_d", "mean pairwise cosine", *(SHORT[m] for m in ts.METRICS), "Δ DPO vs next lambda_d"],
        rows=[
            [f"{s['lambda_d']:g}", "" if s["cosine"] is None else f"{s['cosine']:.3f}",
             *(_fmt(s[m], 4 if m == "dpo" else 3) for m in ts.METRICS),
             "" if s["dpo_minus_next"] is None else _diff(s["dpo_minus_next"], 4)]
            for s in sweep
        ],
    )  # fmt: skip


def _plots(out: Path, variants: dict, sweep: list[dict], info: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    names = list(variants)
    for ax, m in zip(axes, ("dpo", "mc1", "paper_mc3")):
        v = [variants[n][m] for n in names]
        ax.bar(names, [x[0] for x in v], yerr=[[x[0] - x[1] for x in v], [x[2] - x[0] for x in v]], capsize=3,
               color="#3b7dd8")  # fmt: skip
        ax.set_title(SHORT[m] if m != "paper_mc3" else "paper-MC3 (= lm-eval mc2)")
        ax.tick_params(axis="x", rotation=35)
        if m == "dpo":
            ax.set_ylim(min(x[1] for x in v) - 0.1, max(0.0, max(x[2] for x in v)) + 0.05)
    fig.suptitle(_head(info) + " (95% intervals)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "variants.png", dpi=110)
    plt.close(fig)
    paths.append(out / "variants.png")
    pts = [s for s in sweep if s["cosine"] is not None]  # k = 1: no pairs
    if pts:
        fig, ax = plt.subplots(figsize=(5, 3.8))
        x = [s["cosine"] for s in pts]
        y = [s["dpo"][0] for s in pts]
        ax.errorbar(x, y, yerr=[[s["dpo"][0] - s["dpo"][1] for s in pts], [s["dpo"][2] - s["dpo"][0] for s in pts]],
                    fmt="o-", capsize=3)  # fmt: skip
        for s in pts:
            ax.annotate(f"λd={s['lambda_d']:g}", (s["cosine"], s["dpo"][0]), fontsize=8, xytext=(4, 4),
                        textcoords="offset points")  # fmt: skip
        ax.set(xlabel="mean pairwise cosine of the retrieved set", ylabel="DPO (nats/triplet)",
               title=f"{info['lm']}, {info['version']}, {info['dtype']}: diversity vs DPO")  # fmt: skip
        fig.tight_layout()
        fig.savefig(out / "sweep.png", dpi=120)
        plt.close(fig)
        paths.append(out / "sweep.png")
    return paths


def run_report(ctx, out: Path, fp: str) -> dict:
    from epr.lm.factory import lm_name
    from epr.reports.machine import describe, machine
    from epr.reports.tables import markdown, to_html, write_csv

    cfg, rc = ctx.cfg, ctx.cfg.ragsys
    meta = json.loads((ctx.stage_dir("tqa_contexts") / "contexts.json").read_text(encoding="utf-8"))
    score_manifest = read_manifest(ctx.stage_dir("tqa_score"))
    lm = score_manifest["config"]["lm"]
    rows = tqa.load_tqa(cfg.data.data_dir, meta["version"])
    triplets = tqa.triplets_by_question(tqa.build_sets(rows))

    def lps(name: str) -> dict[int, dict]:
        return {r["qi"]: r["lp"] for r in read_jsonl(ctx.stage_dir("tqa_score") / f"{name}.lp.jsonl")}

    empty = lps("empty")
    idx = ts.boot_indices(len(meta["subset"]), N_BOOT, BOOT_SEED)
    per_q: dict[str, list[dict]] = {}
    summaries: dict[str, dict] = {}
    for s in meta["sets"]:
        lp, demos = lps(s["name"]), s["demos"] or [None] * len(meta["subset"])
        per_q[s["name"]] = [
            {"set": s["name"], "qi": qi, "id": rows[qi].get("id"), "question": rows[qi]["question"], "demos": d,
             **tqa.question_row(rows[qi], lp[qi], empty[qi], triplets.get(qi, []))}
            for qi, d in zip(meta["subset"], demos)
        ]  # fmt: skip
        summ = {m: list(ts.metric_ci(per_q[s["name"]], m, idx)) for m in (*ts.METRICS, "dpo_q")}
        plain = tqa.summarise(per_q[s["name"]])  # the point values, and the official names
        summ.update({k: plain[k] for k in ("official_mc2", "official_mc3")})
        summ.update(questions=plain["questions"], dpo_triplets=plain["dpo_triplets"],
                    mean_pairwise_cosine=s["mean_pairwise_cosine"])  # fmt: skip
        summaries[s["name"]] = summ
    seconds = {st: read_manifest(ctx.stage_dir(st)).get("seconds") for st in ("tqa_contexts", "tqa_score")}
    info = {
        "version": meta["version"], "questions": len(meta["subset"]), "lm": lm_name(cfg.models) if "server" not in lm else f"{lm['served_model']} (served)",
        "dtype": lm.get("dtype", "the server's arithmetic"), "device": lm.get("device", lm.get("server")), "encoder": cfg.models.encoder, "k": rc.k, "lambda_d": rc.lambda_d,
        "lambda_b": rc.lambda_b, "icl_pairs": meta["icl_pairs"], "dpo_triplets": meta["dpo_triplets"],
        "dpo_here": sum(len(triplets.get(qi, [])) for qi in meta["subset"]), "machine": describe(machine()),
        "seconds": seconds, "prompts_scored": score_manifest.get("rows", {}),
    }  # fmt: skip
    variants = {s["name"]: summaries[s["name"]] for s in meta["sets"] if s["kind"] == "variant"}
    sweep_sets = sorted((s for s in meta["sets"] if s["kind"] == "sweep"), key=lambda s: s["lambda_d"])
    sweep = [
        {"lambda_d": s["lambda_d"], "cosine": s["mean_pairwise_cosine"], **summaries[s["name"]],
         # paired with the next larger lambda_d: is the curve's every step separable from 0?
         "dpo_minus_next": list(ts.paired_ci(per_q[s["name"]], per_q[n["name"]], "dpo", idx)) if n else None}
        for s, n in zip(sweep_sets, [*sweep_sets[1:], None])
    ]  # fmt: skip
    vnames = list(variants)
    paired = [
        {"a": a, "b": b, "diff": {m: list(ts.paired_ci(per_q[a], per_q[b], m, idx)) for m in ts.METRICS}}
        for b in ("fix", "rel")
        if b in per_q
        for a in vnames
        if a not in (b, "fix")
    ]
    found = ts.findings({n: per_q[n] for n in vnames}, idx)
    write_jsonl(out / "per_question.jsonl", [r for rs in per_q.values() for r in rs])
    doc = {"info": info, "variants": variants, "paired": paired, "findings": found}
    atomic_write_text(out / "results.json", json.dumps(doc, indent=2) + "\n")
    t = results_table(variants, info)
    write_csv(out / "results.csv", t.csv_columns, t.csv_rows)
    md = markdown(t)
    if paired:
        md += "\n" + markdown(paired_table(paired, info), level=2)
    if found:
        md += "\n" + markdown(findings_table(found, info), level=2)
    for f in out.glob("sweep.*"):  # an earlier configuration's sweep
        f.unlink()
    if sweep:
        st = sweep_table(sweep, info)
        atomic_write_text(out / "sweep.json", json.dumps({"info": info, "sweep": sweep}, indent=2) + "\n")
        atomic_write_text(out / "sweep.md", markdown(st))
        md += "\n" + markdown(st, level=2)
    atomic_write_text(out / "results.md", md)
    images = _plots(out, variants, sweep, info)
    atomic_write_text(out / "report.html", to_html(md, _head(info), images))
    return {"rows": {"variants": len(variants), "sweep": len(sweep), "questions": info["questions"]}}
