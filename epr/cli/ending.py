"""What ``epr run``, ``epr status`` and ``epr demo`` say at their end: the served retriever and why, the labels' LM
cost, which stages are not fresh, and the demo's closing lines."""

from __future__ import annotations

import sys

__all__ = ["served_line", "selection_line", "label_cost_line", "not_fresh", "run_demo"]


def selection_line(ctx) -> str:
    """What ``epr run`` / ``epr status`` say of the served retriever: the select stage's choice and why."""
    from epr.stages.select import read_selection

    rep = read_selection(ctx.cfg.run_dir)
    if rep is None:
        return ""
    stale = not_fresh(ctx, ["select"])
    if stale == ["select not run"]:
        note = "; from an earlier run of this folder: these settings run no select stage (select.size 0)"
    else:
        note = f"; stale: chosen under other settings than these ({stale[0]})" if stale else ""
    return f"{served_line(rep)}; report: {ctx.stage_dir('select') / 'report.json'}{note}\n"


def served_line(report: dict) -> str:
    """The served retriever and why, as ``epr run`` and ``epr demo`` end (``select``'s report): what the README's
    demo section quotes."""
    return f"served retriever: {report['selected']} ({report['reason']})"


def not_fresh(ctx, stages: list[str]) -> list[str]:
    """``"<stage> <state>"`` for each of ``stages`` not fresh under this config: stale (its settings or upstream
    changed since it ran), missing (never finished), or ``not run`` (these settings run no such stage)."""
    from epr import pipeline
    from epr.cache import stage_state

    wanted = pipeline.upstream(ctx, pipeline.final_stage(ctx))
    states = {
        n: stage_state(ctx.stage_dir(n), pipeline.stage_fingerprint(ctx, n)) if n in wanted else "not run"
        for n in stages
    }
    return [f"{n} {s}" for n, s in states.items() if s != "fresh"]


def label_cost_line(ctx) -> str:
    """What ``epr status`` says of the labels' LM cost (every round scored so far; ``epr.stages.evaluate``)."""
    from epr.stages.evaluate import label_cost
    from epr.types import UpstreamError

    try:
        cost = label_cost(ctx)
    except (UpstreamError, OSError):  # a round not scored yet
        return ""
    if not cost:
        return ""
    rounds = "; ".join(
        f"round {r['round']} {r['examples']:,} examples, {r['sequences']:,} sequences"
        + (f" ({r['new']:,} new)" if r["new"] != r["sequences"] else "")
        for r in cost["rounds"]
    )
    return f"labels' LM cost: {rounds}; {cost['scored_sequences']:,} distinct sequences scored\n"


def run_demo(ctx) -> int:
    """Every stage on the packaged demo set, then the comparison table in the terminal."""
    import time

    from epr import pipeline

    t0 = time.time()
    pipeline.run(ctx, until="evaluate")
    out = ctx.stage_dir("evaluate")
    sys.stdout.write("\n" + (out / "results.md").read_text() + "\n")
    sys.stdout.write(
        f"Done in {time.time() - t0:.0f} s. Everything is under {ctx.cfg.run_dir}/:\n"
        f"  labels        {ctx.stage_dir('labels') / 'labels.jsonl'}\n"
        f"  encoder       {ctx.stage_dir('encoder') / 'model'} (training curve: training_curve.png)\n"
        f"  comparison    {out / 'results.md'}, results.csv, em.png, report.html\n"
        f"  per query     {out / 'per_query.jsonl'}\n"
        + selection_line(ctx)
        + 'Next: epr inspect "turn on the garage lights"   (what each retriever picks)\n'
    )
    return 0
