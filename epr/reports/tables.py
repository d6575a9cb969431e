"""Rendering: one table (a title, notes, columns and rows of cells) to Markdown, CSV, JSON, a bar plot and a
self-contained HTML page (Markdown rendered by ``markdown-it-py``). Stages compute; this module only writes."""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epr.artifacts import atomic_write_text
from epr.reports.stats import paired_rows

__all__ = ["Table", "markdown", "to_html", "comparison_table", "write_comparison", "write_paired", "label"]


@dataclass
class Table:
    title: str
    notes: list[str]
    columns: list[str]
    rows: list[list[str]]
    csv_columns: list[str] = field(default_factory=list)
    csv_rows: list[list[Any]] = field(default_factory=list)
    data: Any = None  # the JSON form
    bars: list[tuple[str, float, float, float, bool]] = field(
        default_factory=list
    )  # name, value, lo, hi, grey
    bar_label: str = ""


def markdown(t: Table, level: int = 1) -> str:
    lines = [f"{'#' * level} {t.title}", ""]
    for n in t.notes:
        lines += [n, ""]
    lines.append("| " + " | ".join(t.columns) + " |")
    lines.append("|" + "---|" * len(t.columns))
    lines += ["| " + " | ".join(r) + " |" for r in t.rows]
    return "\n".join(lines) + "\n"


def to_html(md: str, title: str, images: Sequence[Path] = ()) -> str:
    """A self-contained page: the Markdown rendered (tables included) and the images embedded."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(md)
    imgs = "".join(
        f"<p><img src='data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}'></p>"
        for p in images
    )
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
    )
    return f"<!doctype html><meta charset=utf-8><title>{title}</title><style>{style}</style>{body}{imgs}\n"


def write_csv(path: Path, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def bar_plot(path: Path, t: Table) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 * len(t.bars) + 2, 3.2))
    names = [b[0] for b in t.bars]
    vals = [b[1] for b in t.bars]
    err = [[b[1] - b[2] for b in t.bars], [b[3] - b[1] for b in t.bars]]
    ax.bar(names, vals, yerr=err, color=["#999" if b[4] else "#3b7dd8" for b in t.bars], capsize=3)
    ax.set(ylabel=t.bar_label, title=t.title.split(":")[0] + ": retrievers (grey: oracles)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def label(metric: str) -> str:
    """A metric's name in tables: ``lf_em`` -> ``LF-EM``."""
    return "EM" if metric in ("em", "correct") else metric.upper().replace("_", "-")


DPO_SHOWN = (
    0.0005  # the DPO column is shown where some row is below -DPO_SHOWN nats (it reads -0.001 or lower)
)


def _ci(v: dict, fmt: str = ".2f") -> str:
    return f"{v['value']:{fmt}} ({v['ci_low']:{fmt}} to {v['ci_high']:{fmt}})"


def comparison_table(task, results: dict, n: int, cfg, label_cost: dict | None = None) -> Table:
    """The retriever comparison: EM (and the task's extra metrics) with intervals, gold log-prob, DPO, paper; notes
    with each row's share of the BM25 -> LM-Oracle gap (where both ran) and the labels' LM cost (``label_cost``)."""
    from epr.lm.factory import lm_name

    extra, paper_metric = tuple(task.extra_metrics), task.paper_metric
    items = sorted(results.items(), key=lambda kv: (kv[1]["oracle"], kv[1]["em"]))
    rc = cfg.retrieve
    cols = ["retriever", "EM (ours)", "95% CI"]
    for m in extra:
        cols += [f"{label(m)} (ours)", "95% CI"]
    paper = any(v["paper"] is not None for v in results.values())  # a task of one's own has no paper numbers
    # DPO (mean log sigmoid of the gain over no demonstrations) saturates at 0 where demonstrations add many nats (a
    # multi-token program: every row about -1e-9 or smaller): left out then, with the reason in the notes
    dpo = any("dpo" in v and v["dpo"]["value"] < -DPO_SHOWN for v in results.values())
    cols += [
        "gold log-prob (nats)",
        *(["DPO vs empty context"] * dpo),
        *([f"paper {label(paper_metric)}"] * paper),
    ]
    cols += ["demos/prompt"]
    cols += ["prompt problems"]
    rows, csv_rows = [], []
    for k, v in items:
        bad = v["prompt_status"]["no_demo_fits"] + v["prompt_status"]["query_too_long"]
        cells = [
            f"{k}{' (oracle)' if v['oracle'] else ''}",
            f"{v['em']:.1f}",
            f"{v['ci_low']:.1f}-{v['ci_high']:.1f}",
        ]
        for m in extra:
            cells += [f"{v[m]['value']:.1f}", f"{v[m]['ci_low']:.1f}-{v[m]['ci_high']:.1f}"]
        lp = [_ci(v[x], f) if x in v else "" for x, f in (("gold_logprob", ".2f"), ("dpo", ".3f"))][: 1 + dpo]
        cells += [
            *lp,
            *(["" if v["paper"] is None else str(v["paper"])] * paper),
            f"{v['mean_demos']:.1f}",
            str(bad),
        ]
        rows.append(cells)
        csv_rows.append(
            [k, f"{v['em']:.2f}", f"{v['ci_low']:.2f}", f"{v['ci_high']:.2f}"]
            + [f"{v[m][s]:.2f}" for m in extra for s in ("value", "ci_low", "ci_high")]
            + [v["paper"], v["oracle"], f"{v['mean_demos']:.2f}", f"{v['mean_prompt_tokens']:.0f}"]
        )
    notes = [
        f"Inference LM `{lm_name(cfg.models, inference=True)}`, prompt budget {rc.prompt_budget} tokens "
        f"({rc.answer_reserve} reserved for the answer), at most {rc.max_demos} demos. "
        "95% bootstrap intervals. Gold log-prob: log p(gold answer | prompt) under the inference LM, summed over "
        "the answer's tokens; "
        + (
            "DPO: mean log sigmoid(that - the same without demonstrations)."
            if dpo or not any("dpo" in v for v in results.values())
            else f"DPO (mean log sigmoid of that minus the same without demonstrations) is left out: every row's is "
            f"above -{DPO_SHOWN} nats, saturated at 0 where demonstrations add many nats of gold log-prob (as they "
            "do on multi-token answers), so the gold log-prob column carries the comparison."
        )
        + (" Paper: GPT-Neo 2.7B (SPEC 2.8)." if paper else "")
    ]
    gaps = [
        (k, {**v["oracle_gap_captured"], "ci": v["oracle_gap_captured_ci"]["gold_logprob"]})
        for k, v in items
        if v.get("oracle_gap_captured")
    ]
    if gaps:
        notes.append(
            "Share of the BM25 -> LM-Oracle gap captured (gold log-prob, 95% paired bootstrap; exact match): "
            + "; ".join(
                f"{k} {g['gold_logprob']:.2f}"
                + (f" [{g['ci'][0]:.2f}, {g['ci'][1]:.2f}]" if g["ci"] else "")
                + (f", EM {g['em']:.2f}" if g["em"] is not None else "")
                for k, g in gaps
                if g["gold_logprob"] is not None
            )
            + "."
        )
    if label_cost:
        per = ", ".join(
            f"round {r['round']}: {r['examples']:,} examples, {r['new']:,} new" for r in label_cost["rounds"]
        )
        notes.append(f"Labels: {label_cost['scored_sequences']:,} LM-scored sequences in all ({per}).")
    return Table(
        title=f"{task.name}: exact match{''.join(' and ' + label(m) for m in extra)} on {n} evaluation examples",
        notes=notes,
        columns=cols,
        rows=rows,
        csv_columns=["retriever", "em", "ci_low", "ci_high"]
        + [f"{m}{s}" for m in extra for s in ("", "_ci_low", "_ci_high")]
        + ["paper", "oracle", "mean_demos", "mean_prompt_tokens"],
        csv_rows=csv_rows,
        data=results,
        bars=[(k, v["em"], v["ci_low"], v["ci_high"], v["oracle"]) for k, v in items],
        bar_label="exact match (%)",
    )


def write_comparison(out: Path, t: Table, stem: str = "results", plot: str = "em.png") -> None:
    """``<stem>.json``, ``<stem>.csv``, ``<stem>.md``, the bar plot and ``report.html``."""
    atomic_write_text(out / f"{stem}.json", json.dumps(t.data, indent=2) + "\n")
    write_csv(out / f"{stem}.csv", t.csv_columns, t.csv_rows)
    md = markdown(t)
    atomic_write_text(out / f"{stem}.md", md)
    images = []
    if t.bars:
        bar_plot(out / plot, t)
        images.append(out / plot)
    atomic_write_text(out / "report.html", to_html(md, "epr comparison", images))


def write_paired(out: Path, per_query: list[dict], names: list[str], keys: tuple[str, ...]) -> None:
    """Paired comparison of every two retrievers on the same examples (``paired.md``, ``paired.json``)."""
    tables = {k: paired_rows(per_query, names, k) for k in keys}
    atomic_write_text(out / "paired.json", json.dumps(tables, indent=2) + "\n")
    parts = [
        f"# Paired comparison on the same {len(per_query)} examples\n\n"
        "a-only / b-only: examples one retriever gets right and the other wrong; p: exact McNemar test on those "
        "(small p: the difference is unlikely to be chance); demo overlap: share of b's demonstrations also in a's "
        "prompt.\n"
    ]
    for k, rows in tables.items():
        t = Table(
            title="exact match" if k == "correct" else label(k),
            notes=[],
            columns=["a", "b", "a-only", "b-only", "both", "p (McNemar)", "demo overlap"],
            rows=[
                [r["a"], r["b"], str(r["a_only"]), str(r["b_only"]), str(r["both"]), f"{r['p_mcnemar']:.3g}",
                 f"{r['demo_overlap']:.2f}"]
                for r in rows
            ],
        )  # fmt: skip
        parts.append(markdown(t, level=2))
    atomic_write_text(out / "paired.md", "\n".join(parts))
