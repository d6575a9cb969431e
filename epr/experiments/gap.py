"""The share of the BM25 -> LM-Oracle gap against the labels that bought it, across results folders (issue 48):
the points of ``results/gap-vs-labels.png`` (``gap_points``: every learned curve row and every slices side with a
recorded label cost) and the table of what each counted point's labels cost (``cost_table``), both drawn by
``epr experiment index``."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from epr.artifacts import read_json
from epr.experiments.check import lookup, served_by
from epr.experiments.declaration import Experiment

__all__ = ["GAP_PLOT", "gap_points", "cost_table"]


GAP_PLOT = "gap-vs-labels.png"


def gap_points(exps: list[Experiment], rows: Mapping[str, dict]) -> list[dict]:
    """Every learned curve row (and slices side with a label cost) of a decisive or supporting folder with its share of the BM25 -> LM-Oracle gap
    (gold log-prob): dataset, split, labels, the share and its interval, the LM-scored sequences where counted. A
    point of several seeds stands for its single-seed rows (they are not drawn again)."""
    out = []
    for e in exps:
        if e.kind == "slices" and e.status in ("decisive", "supporting"):
            out += _slices_gap_points(e, rows[e.name])
        if e.kind != "curve" or e.status not in ("decisive", "supporting"):
            continue
        learned = {n: r for n, r in rows[e.name].items() if r.get("loss") and r.get("labels")}
        most = {}
        for r in learned.values():
            k = (r["retriever"], r["loss"], r["labels"])
            most[k] = max(most.get(k, 0), r.get("seeds") or 1)
        for name, r in learned.items():
            gap = lookup(r, "oracle_gap_captured.gold_logprob")
            if gap is None or (r.get("seeds") or 1) < most[(r["retriever"], r["loss"], r["labels"])]:
                continue
            out.append(_point(e, name, r["labels"], r, r.get("seeds") or 1, r.get("scored_sequences")))
    return out


def _slices_gap_points(e: Experiment, rows: Mapping[str, dict]) -> list[dict]:
    """A slices folder's learned sides (``<run>:epr``, ``<run>:hybrid``: ``names.LEARNED``) with a gap share and a
    recorded label cost (``label-cost-<run>.json``: the labels of a round and the sequences scored in all), one point
    each. A run's BM25 or SBERT side (a device control, say) costs no labels and is not drawn. ``<run>:served`` is the
    retriever the run's select served (``select-report-<run>.json``), drawn where the run has no side of that
    retriever already. Seeds pooled (``s42:served,s1:served,s2:served``, one label count) are one point of that many
    seeds, standing for each side or smaller pool within it; its cost is the most any one seed's labels needed."""
    from epr.config.names import LEARNED

    @cache
    def resolve(side: str) -> tuple[str, str]:
        run, _, retriever = side.partition(":")
        if retriever == "served" and (e.folder / f"select-report-{run}.json").exists():
            retriever = served_by(e.folder, run)
        return run, retriever

    @cache
    def cost(run: str) -> dict | None:  # label-cost-<run>.json, read once a run
        f = e.folder / f"label-cost-{run}.json"
        return read_json(f) if f.exists() else None

    drawn = {}
    for name, r in rows.items():
        if lookup(r, "oracle_gap_captured.gold_logprob") is None or "-vs-" in name:
            continue
        sides = [resolve(s) for s in name.split(",")]
        c = [cost(run) for run, _ in sides]
        if None in c or any(t.split("+")[0] not in LEARNED for _, t in sides):
            continue
        if len(sides) == 1 and name.endswith(":served") and f"{sides[0][0]}:{sides[0][1]}" in rows:
            continue  # the run's own row of the retriever it served is drawn
        if len({x["rounds"][0]["examples"] for x in c}) > 1:
            continue  # seeds of different label counts: not one point
        drawn[name] = (frozenset(sides), c)
    out = []
    for name, (sides, c) in drawn.items():
        if any(sides < other for other, _ in drawn.values()):
            continue  # a larger pool of the same seeds stands for it
        most = max(x["scored_sequences"] for x in c)
        out.append(_point(e, name, c[0]["rounds"][0]["examples"], rows[name], len(sides), most))
    return out


def _point(e: Experiment, row: str, labels: int, r: Mapping, seeds: int, scored: int | None) -> dict:
    """One point of the gap plot: a row's share of the gap and its interval, where it sits and what it cost."""
    return {
        "folder": e.name,
        "row": row,
        "dataset": e.dataset,
        "split": e.split,
        "locked": e.locked,  # filled in the plot: dialogue-locked is locked, dialogue-dev is not
        "labels": labels,
        "gap": lookup(r, "oracle_gap_captured.gold_logprob"),
        "ci": lookup(r, "oracle_gap_captured_ci.gold_logprob"),
        "seeds": seeds,
        "scored_sequences": scored,
    }


def cost_table(points: list[dict], datasets: tuple[str, ...] = ()) -> list[str]:
    """What the labels cost beside what they buy (issue 48): every point of the gap plot whose LM-scored sequences
    were counted (the labels of every round; older curve rows did not count them and are left out), by dataset,
    split and label count, with the share of the gap and its interval."""
    counted = [p for p in points if p.get("scored_sequences")]
    if not counted:
        return []
    order = {d: i for i, d in enumerate(datasets)}

    def key(p):
        return (
            order.get(p["dataset"], len(order)),
            p["dataset"],
            p["locked"],
            p["split"],
            p["labels"],
            p["folder"],
        )

    out = [
        "## What the labels cost",
        "",
        "Every point of the plot at the top whose labels' LM cost was counted: the sequences the scoring LM scored to label the",
        "training examples of every round (a cache hit from another run's labels counts, since the row needed it);",
        "for seeds pooled, the most any one seed's labels needed.",
        "",
        "| dataset | split | folder | row | labels | seeds | LM-scored sequences | gap captured (95%) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted(counted, key=key):
        ci = p.get("ci") or (None, None)
        interval = f" ({ci[0]:.2f} to {ci[1]:.2f})" if ci[0] is not None else ""
        out.append(
            f"| {p['dataset']} | {p['split']} | [{p['folder']}]({p['folder']}/) | {p['row']} | {p['labels']:,} | "
            f"{p['seeds']} | {p['scored_sequences']:,} | {p['gap']:.2f}{interval} |"
        )
    return out + [""]
