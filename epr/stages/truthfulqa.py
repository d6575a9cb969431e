"""The TruthfulQA stages (SPEC 3.3-3.6): ``tqa_contexts`` -> ``tqa_score`` -> ``tqa_report``.

- ``tqa_contexts``: the questions of ``truthfulqa.version`` (a seeded subset of ``truthfulqa.limit``), the relevance
  embeddings (``models.encoder``), the quality bias of every D_ICL pair under ``models.lm`` and, for every variant and
  every sweep value of lambda_d, the demonstrations each question gets (``contexts.json``).
- ``tqa_score``: every question's answers scored with no context (for DPO) and after each context (``<set>.lp.jsonl``).
- ``tqa_report``: the metrics, 95% bootstrap intervals, differences paired with Fix, the paper's numbers, the sweep
  table and its plot (``results.{md,json,csv}``, ``sweep.{md,json,png}``, ``report.html``, ``per_question.jsonl``).

Log-probs and quality biases live in resumable :class:`~epr.artifacts.ChunkStore` chunks under
``<run_root>/.cache/truthfulqa/``, keyed by the data version and the LM's identity, resolved dtype and device, with the
exact prompts and answers as each chunk's inputs: another version, LM or dtype recomputes, a changed sweep reuses
every set already scored, and a killed run resumes from its last finished chunk. Pure math: ``epr.truthfulqa``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from epr import truthfulqa as tqa
from epr.artifacts import (
    ChunkStore,
    atomic_write_text,
    file_digest,
    fingerprint,
    read_jsonl,
    read_manifest,
    write_jsonl,
)

__all__ = [
    "STAGE_SPECS",
    "contexts_keys",
    "score_keys",
    "report_keys",
    "run_contexts",
    "run_score",
    "run_report",
]

QUALITY_CHUNK = 256  # D_ICL pairs per resumable chunk of quality bias


# ---- keys: what each stage's output depends on (besides its upstream) ---------------------------------------------


def _data_key(cfg) -> dict:
    path = tqa.data_file(cfg.data.data_dir, cfg.truthfulqa.version) if cfg.data.data_dir else None
    digest = file_digest(path) if path else None
    return {"version": cfg.truthfulqa.version, "file": str(path), "sha256": digest}


def _needs_bias(cfg) -> bool:
    t = cfg.truthfulqa
    return bool(t.sweep) or any("bias" in v for v in t.variants)


def quality_key(cfg) -> dict:
    """The quality bias's LM: identity, resolved dtype, device, and the batch layout where it matters (bf16)."""
    from epr.stages.scores import scoring_key

    fmt = tqa.query_text("q") + tqa.answer_text("a")
    return {"what": "tqa-quality-bias", "version": cfg.truthfulqa.version, "format": fmt, **scoring_key(cfg)}


def lp_key(cfg) -> dict:
    """The answer log-probs' LM (shared-prefix scoring: one question's answers in one batch, so no layout key)."""
    from epr.models import lm_identity

    return {"what": "tqa-logprobs", "version": cfg.truthfulqa.version, **lm_identity(cfg.models)}


def contexts_keys(ctx) -> dict:
    from epr.models import model_identity

    cfg, t, rc = ctx.cfg, ctx.cfg.truthfulqa, ctx.cfg.ragsys
    keys = {
        "data": _data_key(cfg),
        "limit": t.limit,
        "seed": cfg.seed,
        "variants": list(t.variants),
        "sweep": list(t.sweep),
        "ragsys": {"k": rc.k, "lambda_d": rc.lambda_d, "lambda_b": rc.lambda_b},
        "encoder": model_identity(cfg.models.encoder),
    }
    if _needs_bias(cfg):
        keys["quality"] = quality_key(cfg)
    return keys


def score_keys(ctx) -> dict:
    return {
        "lm": lp_key(ctx.cfg),
        "prompt": tqa.demo_text("q", "a") + tqa.query_text("q") + tqa.answer_text("a"),
    }


def report_keys(ctx) -> dict:
    return {"bootstrap": {"n_boot": 1000, "seed": 0}, "paper": fingerprint(tqa.PAPER)}


# ---- tqa_contexts ---------------------------------------------------------------------------------------------------


def _cache(cfg, what: str, key: dict) -> Path:
    return Path(cfg.run_root) / ".cache" / "truthfulqa" / f"{what}-{fingerprint(key)}"


class _LazyScorer:
    """The LM behind an ``LMScorer``, loaded on the first chunk that is not cached (none: no LM load at all)."""

    def __init__(self, ctx):
        self.ctx, self.scorer = ctx, None

    def __call__(self):
        if self.scorer is None:
            from epr.stages.scores import build_scorer

            self.scorer = build_scorer(self.ctx)
        return self.scorer


def icl_quality(ctx, data: tqa.TQA, scorer: _LazyScorer) -> np.ndarray:
    """``(len(D_ICL),) float32`` quality bias (SPEC 3.2) in resumable chunks keyed by the LM."""
    key = quality_key(ctx.cfg)
    store = ChunkStore(_cache(ctx.cfg, "quality", key), key)
    items = [[q, a] for _, q, a in data.icl]
    vals = store.map(
        items, QUALITY_CHUNK, lambda part: tqa.quality_bias(scorer(), part).tolist(), "quality bias"
    )
    return np.asarray(vals, dtype=np.float32)


def context_sets(cfg) -> list[dict]:
    """Every demonstration set to score: the variants, then ``sweep-<lambda_d>`` (rel+div+bias at that lambda_d)."""
    from ragsys import VARIANTS

    ld = cfg.ragsys.lambda_d
    out = []
    for v in cfg.truthfulqa.variants:
        eff = None if v == "fix" else VARIANTS[v][0] if VARIANTS[v][0] is not None else ld
        out.append({"name": v, "kind": "variant", "variant": v, "lambda_d": eff})
    for x in cfg.truthfulqa.sweep:
        out.append({"name": f"sweep-{x:g}", "kind": "sweep", "variant": "rel+div+bias", "lambda_d": x})
    return out


def run_contexts(ctx, out: Path, fp: str) -> dict:
    from epr.evaluation import seeded_subset
    from epr.models import default_device, load_encoder

    cfg, rc = ctx.cfg, ctx.cfg.ragsys
    rows = tqa.load_tqa(cfg.data.data_dir, cfg.truthfulqa.version)
    data = tqa.build_sets(rows)
    subset = seeded_subset(len(rows), cfg.truthfulqa.limit, cfg.seed).tolist()
    sets = context_sets(cfg)
    bias = np.zeros(len(data.icl), dtype=np.float32)
    if _needs_bias(cfg):
        bias = icl_quality(ctx, data, _LazyScorer(ctx))
        np.save(out / "quality_bias.npy", bias)
    if any(s["variant"] != "fix" for s in sets):
        st = load_encoder(cfg.models.encoder, cfg.models.cache_dir, device=default_device())
        q_emb = st.encode([r["question"] for r in rows], batch_size=128, normalize_embeddings=True)
        icl_emb = st.encode([q for _, q, _ in data.icl], batch_size=128, normalize_embeddings=True)
        icl_q = np.array([qi for qi, _, _ in data.icl])
    for s in sets:
        if s["variant"] == "fix":
            s["demos"], s["mean_pairwise_cosine"] = None, None
            continue
        s["demos"] = [
            tqa.select_context(
                s["variant"], qi, q_emb[qi], icl_emb, icl_q, bias, rc.k, s["lambda_d"], rc.lambda_b
            )
            for qi in subset
        ]
        s["mean_pairwise_cosine"] = tqa.mean_pairwise_cosine(icl_emb, s["demos"])
    meta = {
        "version": cfg.truthfulqa.version,
        "questions_total": len(rows),
        "subset": subset,
        "icl_pairs": len(data.icl),
        "dpo_triplets": len(data.dpo),
        "sets": sets,
    }
    atomic_write_text(out / "contexts.json", json.dumps(meta) + "\n")
    return {"rows": {"questions": len(subset), "sets": len(sets), "icl_pairs": len(data.icl)}}


# ---- tqa_score ------------------------------------------------------------------------------------------------------


def run_score(ctx, out: Path, fp: str) -> dict:
    from tqdm.auto import tqdm

    cfg = ctx.cfg
    meta = json.loads((ctx.stage_dir("tqa_contexts") / "contexts.json").read_text(encoding="utf-8"))
    rows = tqa.load_tqa(cfg.data.data_dir, cfg.truthfulqa.version)
    data = tqa.build_sets(rows)
    subset = meta["subset"]
    key = lp_key(cfg)
    base = _cache(cfg, "logprobs", key)
    scorer = _LazyScorer(ctx)
    fresh = [0]

    def compute(part: list[dict]) -> list[list[float]]:
        fresh[0] += len(part)
        return [tqa.score_prompt(scorer(), it["prompt"], it["targets"]) for it in part]

    for f in out.glob("*.lp.jsonl"):  # sets of an earlier configuration
        f.unlink()
    answers = {qi: tqa.answers_of(rows[qi]) for qi in subset}
    queries = {qi: tqa.query_text(rows[qi]["question"]) for qi in subset}
    targets = {qi: [tqa.answer_text(a) for a in answers[qi]] for qi in subset}
    todo = [("empty", [""] * len(subset))]
    for s in meta["sets"]:
        demos = s["demos"] or [None] * len(subset)
        todo.append((s["name"], [tqa.context_text(data.icl, d) for d in demos]))
    # a set whose prompts equal an earlier one's (sweep-0.75 is rel+div+bias) reuses its scores
    work = {}
    for name, contexts in todo:
        items = [{"prompt": c + queries[qi], "targets": targets[qi]} for qi, c in zip(subset, contexts)]
        work.setdefault(ChunkStore.digest(items), (name, items))
    done: dict[str, list] = {}
    bar = tqdm(total=sum(len(items) for _, items in work.values()), desc="tqa_score", unit="q")
    for digest, (name, items) in work.items():
        bar.set_postfix_str(name)
        done[digest] = ChunkStore(base / name, key).map(items, cfg.truthfulqa.chunk_size, compute, bar=bar)
    bar.close()
    for name, contexts in todo:
        items = [{"prompt": c + queries[qi], "targets": targets[qi]} for qi, c in zip(subset, contexts)]
        write_jsonl(
            out / f"{name}.lp.jsonl",
            [
                {"qi": qi, "lp": dict(zip(answers[qi], lp))}
                for qi, lp in zip(subset, done[ChunkStore.digest(items)])
            ],
        )
    return {
        "rows": {"questions": len(subset), "sets": len(todo), "distinct_sets": len(done),
                 "prompts_scored_now": fresh[0]},
        "extra": {"loaded_lm": scorer.scorer is not None},
    }  # fmt: skip


# ---- tqa_report -----------------------------------------------------------------------------------------------------


def _ci(s: dict, key: str) -> str:
    lo, hi = s.get(key, (float("nan"), float("nan")))
    return f"[{lo:.2f}, {hi:.2f}]"


def _paper(v: str) -> list[str]:
    return [", ".join(f"{x:g}" for x in tqa.PAPER[m][v]) if v in tqa.PAPER[m] else "" for m in tqa.PAPER]


COLUMNS = ["variant", "DPO", "MC1", "MC1 - Fix", "paper-MC2 (=official MC3)", "paper-MC3 (=official MC2)",
           "mean pairwise cos"]  # fmt: skip
METRICS = ("dpo", "mc1", "paper_mc2", "paper_mc3", "official_mc2", "official_mc3")
CSV_COLUMNS = ["variant", *METRICS, "mc1_ci_low", "mc1_ci_high", "questions", "dpo_triplets",
               "mean_pairwise_cosine"]  # fmt: skip


def _cos(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def results_table(res: dict, info: dict):
    from epr.report import Table

    fix = res.get("fix")
    rows, csv_rows = [], []
    for v, s in res.items():
        cos = _cos(s["mean_pairwise_cosine"])
        d = "" if fix is None or v == "fix" else f"{s['mc1'] - fix['mc1']:+.2f} {_ci(s, 'mc1_minus_fix_ci')}"
        rows.append(
            [v, f"{s['dpo']:.4f}", f"{s['mc1']:.3f} {_ci(s, 'mc1_ci')}", d, f"{s['paper_mc2']:.4f}",
             f"{s['paper_mc3']:.3f} {_ci(s, 'paper_mc3_ci')}", cos, *_paper(v)]
        )  # fmt: skip
        csv_rows.append(
            [v, *(f"{s[m]:.6f}" for m in METRICS),
             *(f"{x:.6f}" for x in s["mc1_ci"]), s["questions"], s["dpo_triplets"], cos]
        )  # fmt: skip
    return Table(
        title=f"TruthfulQA {info['version']}: RAGSys variants on {info['questions']} questions, "
        f"LM `{info['lm']}` ({info['dtype']})",
        notes=[
            f"Data version {info['version']}; LM `{info['lm']}` scored in {info['dtype']} on {info['device']}; "
            f"k={info['k']}, lambda_d={info['lambda_d']}, lambda_b={info['lambda_b']}; relevance: "
            f"`{info['encoder']}` cosine. D_ICL {info['icl_pairs']} pairs, D_DPO {info['dpo_triplets']} triplets "
            f"({info['dpo_here']} for these questions), leave-one-out by question.",
            "Naming: paper-MC2 = official MC3 (fraction of true answers above every false one); paper-MC3 = "
            "official MC2 (normalised true-answer probability mass). DPO: mean log sigma per triplet in nats (the "
            "paper's values look scaled differently: compare orderings across rows).",
            "95% bootstrap intervals over questions in brackets; 'MC1 - Fix' is paired on the same questions. "
            "Paper: SPEC 3.6 (DPO, MC1, paper-MC2, paper-MC3).",
        ],
        columns=COLUMNS + [f"paper {m}" for m in tqa.PAPER],
        rows=rows,
        csv_columns=CSV_COLUMNS,
        csv_rows=csv_rows,
    )


def sweep_table(sweep: list[dict], info: dict):
    from epr.report import Table

    return Table(
        title=f"TruthfulQA {info['version']}: lambda_d sweep (rel+div+bias, lambda_b={info['lambda_b']}, "
        f"k={info['k']}), {info['questions']} questions, LM `{info['lm']}` ({info['dtype']})",
        notes=[],
        columns=["lambda_d", "mean pairwise cosine", "DPO", "MC1", "paper-MC2", "paper-MC3"],
        rows=[
            [f"{s['lambda_d']:g}", _cos(s["cosine"]), *(f"{s[m]:.4f}" for m in METRICS[:4])] for s in sweep
        ],
    )


def sweep_plot(path: Path, sweep: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    sweep = [s for s in sweep if s["cosine"] is not None]  # k = 1: no pairs
    ax.plot([s["cosine"] for s in sweep], [s["dpo"] for s in sweep], "o-")
    for s in sweep:
        ax.annotate(f"λd={s['lambda_d']:g}", (s["cosine"], s["dpo"]), fontsize=8, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    ax.set(xlabel="mean pairwise cosine of the retrieved set", ylabel="DPO metric", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_report(ctx, out: Path, fp: str) -> dict:
    from epr.evaluation import mean_ci
    from epr.models import lm_name
    from epr.report import markdown, to_html, write_csv

    cfg, rc = ctx.cfg, ctx.cfg.ragsys
    meta = json.loads((ctx.stage_dir("tqa_contexts") / "contexts.json").read_text(encoding="utf-8"))
    lm = read_manifest(ctx.stage_dir("tqa_score"))["config"]["lm"]
    rows = tqa.load_tqa(cfg.data.data_dir, meta["version"])
    triplets = tqa.triplets_by_question(tqa.build_sets(rows))

    def lps(name: str) -> dict[int, dict]:
        return {r["qi"]: r["lp"] for r in read_jsonl(ctx.stage_dir("tqa_score") / f"{name}.lp.jsonl")}

    empty = lps("empty")
    per_q: dict[str, list[dict]] = {}
    summaries: dict[str, dict] = {}
    for s in meta["sets"]:
        lp, demos = lps(s["name"]), s["demos"] or [None] * len(meta["subset"])
        per_q[s["name"]] = [
            {"set": s["name"], "qi": qi, "id": rows[qi].get("id"), "question": rows[qi]["question"], "demos": d,
             **tqa.question_row(rows[qi], lp[qi], empty[qi], triplets.get(qi, []))}
            for qi, d in zip(meta["subset"], demos)
        ]  # fmt: skip
        summ = tqa.summarise(per_q[s["name"]])
        summ["mean_pairwise_cosine"] = s["mean_pairwise_cosine"]
        summ.update(
            {f"{m}_ci": list(mean_ci([r[m] for r in per_q[s["name"]]])[1:]) for m in ("mc1", "paper_mc3")}
        )
        if "fix" in per_q and s["name"] != "fix":
            diff = [r["mc1"] - f["mc1"] for r, f in zip(per_q[s["name"]], per_q["fix"])]
            summ["mc1_minus_fix_ci"] = list(mean_ci(diff)[1:])
        summaries[s["name"]] = summ
    info = {
        "version": meta["version"], "questions": len(meta["subset"]), "lm": lm_name(cfg.models), "dtype": lm["dtype"],
        "device": lm["device"], "encoder": cfg.models.encoder, "k": rc.k, "lambda_d": rc.lambda_d,
        "lambda_b": rc.lambda_b, "icl_pairs": meta["icl_pairs"], "dpo_triplets": meta["dpo_triplets"],
        "dpo_here": sum(len(triplets.get(qi, [])) for qi in meta["subset"]),
    }  # fmt: skip
    variants = {s["name"]: summaries[s["name"]] for s in meta["sets"] if s["kind"] == "variant"}
    sweep = [
        {"lambda_d": s["lambda_d"], "cosine": s["mean_pairwise_cosine"], **summaries[s["name"]]}
        for s in meta["sets"]
        if s["kind"] == "sweep"
    ]
    write_jsonl(out / "per_question.jsonl", [r for rs in per_q.values() for r in rs])
    atomic_write_text(out / "results.json", json.dumps({"info": info, "variants": variants}, indent=2) + "\n")
    t = results_table(variants, info)
    write_csv(out / "results.csv", t.csv_columns, t.csv_rows)
    md = markdown(t)
    atomic_write_text(out / "results.md", md)
    images = []
    for f in out.glob("sweep.*"):  # an earlier configuration's sweep
        f.unlink()
    if sweep:
        st = sweep_table(sweep, info)
        atomic_write_text(out / "sweep.json", json.dumps({"info": info, "sweep": sweep}, indent=2) + "\n")
        atomic_write_text(out / "sweep.md", markdown(st))
        sweep_plot(
            out / "sweep.png", sweep, f"TruthfulQA {info['version']}, {info['dtype']}: diversity vs DPO"
        )
        md += "\n" + markdown(st, level=2)
        images.append(out / "sweep.png")
    atomic_write_text(out / "report.html", to_html(md, f"TruthfulQA {info['version']}", images))
    return {"rows": {"variants": len(variants), "sweep": len(sweep), "questions": info["questions"]}}


# name, deps, keys, fn: the entries of ``epr.pipeline.STAGES``
STAGE_SPECS = (
    ("tqa_contexts", (), contexts_keys, run_contexts),
    ("tqa_score", ("tqa_contexts",), score_keys, run_score),
    ("tqa_report", ("tqa_contexts", "tqa_score"), report_keys, run_report),
)
