"""The served choices of a results folder, recomputed from its rows: every ``select-report*.json`` that
``epr experiment record`` committed beside a select stage's rows (``rows/select-*.jsonl.gz``), and every
``epr experiment reselect`` answer that names its ``source`` rows. ``epr experiment check`` runs this, so a
folder's claim of which mode a run served (or would have served among fewer modes) is held to its rows like
its numbers are."""

from __future__ import annotations

import json
import math
from pathlib import Path

from epr.artifacts import read_jsonl
from epr.stages.select import BASELINE, choose_rows, committed_report

__all__ = ["recheck", "weigh_of"]

_FIELDS = ("gold_logprob", "gain", "p", "em")


def weigh_of(report: dict) -> str:
    """The ``select.weigh`` a report was chosen under: its own ``weigh`` (reselect writes it), else
    ``logprob+em`` where its rows carry exact match (the select stage writes EM only then)."""
    return report.get("weigh") or ("logprob+em" if "em" in report["rows"][BASELINE] else "logprob")


def _differs(said: dict, got: dict) -> list[str]:
    out = (
        []
        if said["selected"] == got["selected"]
        else [f"selected {said['selected']} but its rows choose {got['selected']}"]
    )
    for name, row in said["rows"].items():
        mine = got["rows"].get(name, {})
        for k in _FIELDS:
            if isinstance(row.get(k), (int, float)) and not (
                isinstance(mine.get(k), float) and math.isclose(row[k], mine[k], rel_tol=1e-9, abs_tol=1e-12)
            ):
                out.append(f"{name}.{k} {row[k]} but its rows give {mine.get(k)}")
    return out


def recheck(folder: Path) -> list[str]:
    """Where a folder's committed choices disagree with what its rows choose (empty: they agree). A report or
    reselect answer whose rows are missing is named too; a report with no rows committed at all (a folder that
    keeps only the report, as ``demo-default``) is not a claim this can check."""
    folder = Path(folder)
    problems: list[str] = []
    cache: dict[Path, list[dict]] = {}

    def rows(f: Path) -> list[dict]:
        if f not in cache:
            cache[f] = list(read_jsonl(f))
        return cache[f]

    for f in sorted(folder.glob("rows/select-*.jsonl.gz")):
        rep = committed_report(f)
        if not rep.exists():
            problems.append(f"{f.relative_to(folder)}: no {rep.name} beside these rows")
            continue
        said = json.loads(rep.read_text())
        learned = [n for n in said["rows"] if n != BASELINE]
        got = choose_rows(rows(f), learned, weigh_of(said), said["alpha"], str(f))
        problems += [f"{rep.name}: {p}" for p in _differs(said, got)]
    for rep in sorted(folder.glob("select-*.json")):
        said = json.loads(rep.read_text())
        if rep.name.startswith("select-report") or "source" not in said:
            continue
        f = folder / said["source"]
        if not f.exists():
            problems.append(f"{rep.name}: its source {said['source']} is not in the folder")
            continue
        got = choose_rows(rows(f), said["retrievers"], said["weigh"], said["alpha"], str(f))
        problems += [f"{rep.name}: {p}" for p in _differs(said, got)]
    return problems
