"""``epr experiment record RUN FOLDER``: a finished ``epr run``'s evaluation kept as a results folder that
``epr experiment check`` can recompute: its per-example rows (``rows/per_query-<part>.jsonl.gz``), the selection it
served by (``select-report.json``, ``rows/select-per_example.jsonl.gz``), the run's own tables, the served
retriever's report (``<part>.md`` / ``.json``: ``epr.reports.served``) and the declaration's numbers. What a person
wrote in the folder's ``experiment.yaml`` (title, status, outcome, pre-registration, commands) is kept; the
expected numbers and the tests are (re)read from the rows.

``--as NAME`` records the run as one side of a ``kind: slices`` folder instead (several runs side by side, choices
made on dev): ``rows/per_query-NAME.jsonl.gz``, ``rows/select-NAME.jsonl.gz``, ``select-report-NAME.json`` and the
labels' LM cost where the run's evaluation counted it (``label-cost-NAME.json``, with each round's scoring time:
:func:`scoring_time`); the declaration's expected numbers
are then every side, pair and gap share its ``extra`` names, recomputed from the rows."""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
from pathlib import Path

import yaml

from epr.artifacts import read_json
from epr.experiments import digests
from epr.experiments.declaration import FILE
from epr.experiments.declare import dump, expect
from epr.reports.served import served_report
from epr.tasks import TASKS
from epr.types import InputError

__all__ = ["record", "record_side", "paper_metric"]


def paper_metric(run: Path) -> tuple[str, str]:
    """The run's task and the per-example key of its paper metric (``correct``: exact match)."""
    task = read_json(run / "examples" / "manifest.json")["config"]["data"]["task"]
    m = TASKS[task].paper_metric
    return task, ("correct" if m == "em" else m)


def _finished(run: Path, part: str) -> tuple[Path, Path]:
    """The run's evaluation folder of ``part`` and its select folder, both finished."""
    ev = run / ("locked/evaluate" if part == "locked" else "evaluate")
    if not (ev / "manifest.json").exists():
        raise FileNotFoundError(f"{ev}: no finished evaluation (manifest.json missing)")
    sel_dir = run / "select"
    if not (sel_dir / "report.json").exists():
        raise FileNotFoundError(f"{sel_dir}: no finished select stage")
    return ev, sel_dir


@contextlib.contextmanager
def staged(folder: Path):
    """A copy of ``folder`` to write into, which replaces it only when the block ends without an error: a record
    that fails writes nothing (the copy is removed)."""
    tmp = folder.with_name(f".{folder.name}.recording")
    shutil.rmtree(tmp, ignore_errors=True)
    if folder.exists():
        shutil.copytree(folder, tmp)
    else:
        tmp.mkdir(parents=True)
    try:
        yield tmp
        if (tmp / FILE).exists():
            digests.write(tmp)  # every file as recorded, pinned
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = folder.with_name(f".{folder.name}.replaced")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def record(run: Path, folder: Path, part: str = "locked", overwrite: bool = False) -> Path:
    """The run's ``part`` as the ``kind: run`` folder ``folder`` (see the module doc). A folder already recorded (its
    declaration holds numbers and is not ``planned``) is refused unless ``overwrite``; nothing is written when any
    step fails."""
    run, folder = Path(run), Path(folder)
    ev, sel_dir = _finished(run, part)
    decl = folder / FILE
    was = (yaml.safe_load(decl.read_text()) or {}) if decl.exists() else {}
    if was.get("expected") and was.get("status") != "planned" and not overwrite:
        raise InputError(
            f"{folder}: already recorded (its {FILE} declares numbers); pass --overwrite to record {run} over it"
        )
    with staged(folder) as tmp:
        _record(run, folder.name, tmp, ev, sel_dir, part)
    return decl


def _record(run: Path, name: str, folder: Path, ev: Path, sel_dir: Path, part: str) -> None:
    task, metric = paper_metric(run)
    (folder / "rows").mkdir(parents=True, exist_ok=True)
    text = (ev / "per_query.jsonl").read_bytes()
    (folder / "rows" / f"per_query-{part}.jsonl.gz").write_bytes(gzip.compress(text, mtime=0))
    (folder / "rows" / "select-per_example.jsonl.gz").write_bytes(
        gzip.compress((sel_dir / "per_example.jsonl").read_bytes(), mtime=0)
    )
    shutil.copy(sel_dir / "report.json", folder / "select-report.json")
    for name in ("results.md", "paired.md"):
        if (ev / name).exists():
            shutil.copy(ev / name, folder / name.replace(".md", f"-{part}.md"))
    rows = [json.loads(x) for x in text.decode().splitlines()]
    sel = read_json(sel_dir / "report.json")
    md, raw = served_report(rows, sel, part, task, metric)
    (folder / f"{part}.md").write_text(md)
    (folder / f"{part}.json").write_text(json.dumps(raw, indent=2) + "\n")

    decl = folder / FILE
    d = yaml.safe_load(decl.read_text()) if decl.exists() else {}
    d.setdefault("title", f"TODO: what {name} is")
    d.setdefault("dataset", task)
    d["split"] = d.get("split") if d.get("split") not in (None, "none") else part
    d.setdefault("status", "supporting")
    d["kind"] = "run"
    d["extra"] = {**(d.get("extra") or {}), "part": part, "metric": metric}
    expected = []
    for n, v in raw["retrievers"].items():
        expected.append(expect(n, "metric", v["metric"]))
        expected.append(expect(n, "gold_logprob", v["gold_logprob"]))
    served, best = raw["served"], raw["best_unsupervised"]
    label = "EM" if metric == "correct" else metric.upper().replace("_", "-")
    tests = []
    if f"metric_vs_{best}" in raw["tests"]:
        expected.append(expect(served, f"metric_vs_{best}_p", raw["tests"][f"metric_vs_{best}"]["p"]))
        tests.append({"row": served, "field": f"metric_vs_{best}_p", "says": f"{label} vs {best}"})
    if "logprob_vs_bm25" in raw["tests"]:
        g = raw["tests"]["logprob_vs_bm25"]
        expected += [
            expect(served, "logprob_vs_bm25_p", g["p"]),
            expect(served, "logprob_vs_bm25_p_ttest", g["p_ttest"]),
        ]
        tests.append({"row": served, "field": "logprob_vs_bm25_p", "says": "gold log-prob vs bm25"})
    d["expected"], d["tests"] = expected, tests
    decl.write_text(dump(d))


def record_side(run: Path, folder: Path, name: str, part: str = "dev", overwrite: bool = False) -> Path:
    """The run as side ``name`` of a ``kind: slices`` folder (see the module doc). A side the folder already holds
    is refused unless ``overwrite``; nothing is written when any step fails."""
    run, folder = Path(run), Path(folder)
    ev, sel_dir = _finished(run, part)
    if (folder / "rows" / f"per_query-{name}.jsonl.gz").exists() and not overwrite:
        raise InputError(
            f"{folder}: already holds side {name!r}; pass --overwrite to record {run} as it again"
        )
    with staged(folder) as tmp:
        _record_side(run, folder.name, tmp, name, ev, sel_dir, part)
    return folder / FILE


def scoring_time(run: Path) -> list[dict]:
    """Each round's label scoring as its ``scores`` stage measured it (first round first; the last round's stage is
    the run's own ``scores/``): wall seconds, the sequences scored here (a cache hit is not), their rate, the
    machine, and the scoring settings (dtype, int8) that the stage was keyed by. A round whose manifest is gone is
    left out, not guessed."""
    found = sorted(
        run.glob("rounds/round-*/scores/manifest.json"), key=lambda p: int(p.parts[-3].split("-")[1])
    )
    out = []
    for i, path in enumerate([*found, run / "scores" / "manifest.json"], 1):
        if path.exists():
            m = read_json(path)
            speed = m.get("scoring_speed") or {}
            keep = ("scored_here", "scoring_seconds", "sequences_per_s", "machine")
            out.append({"round": i, "seconds": m.get("seconds"), **{k: speed.get(k) for k in keep},
                        "settings": m.get("config")})  # fmt: skip
    return out


def _record_side(run: Path, title: str, folder: Path, name: str, ev: Path, sel_dir: Path, part: str) -> None:
    import dataclasses

    from epr.experiments.check import lookup, recompute
    from epr.experiments.declaration import load

    task, metric = paper_metric(run)
    (folder / "rows").mkdir(parents=True, exist_ok=True)
    for src, dest in (
        (ev / "per_query.jsonl", f"per_query-{name}"),
        (sel_dir / "per_example.jsonl", f"select-{name}"),
    ):
        (folder / "rows" / f"{dest}.jsonl.gz").write_bytes(gzip.compress(src.read_bytes(), mtime=0))
    shutil.copy(sel_dir / "report.json", folder / f"select-report-{name}.json")
    cost = read_json(ev / "manifest.json").get("label_cost")
    if cost is not None:
        cost = {**cost, "scoring": scoring_time(run)}
        (folder / f"label-cost-{name}.json").write_text(json.dumps(cost, indent=2) + "\n")
    decl = folder / FILE
    d = yaml.safe_load(decl.read_text()) if decl.exists() else {}
    d.setdefault("title", f"TODO: what {title} is")
    d.setdefault("dataset", task)
    d.setdefault("split", part)
    d.setdefault("status", "supporting")
    d["kind"] = "slices"
    d["extra"] = {**(d.get("extra") or {}), "metric": metric}
    if part != "locked":
        d.pop("tests", None)  # choices on dev or the pool: no locked test
    planned = d.get("status") == "planned"
    if planned:
        d.pop("expected", None)
    decl.write_text(dump(d))
    got, _ = recompute(dataclasses.replace(load(folder), status="supporting"))
    if planned:  # a pre-registered look: its rows come in one seed at a time
        tests = d.get("tests") or []
        if not tests or any(
            not isinstance(lookup(got.get(t["row"]), t["field"]), (int, float)) for t in tests
        ):
            return  # not every test computes yet: it stays planned, its rows kept, no numbers declared
        d["status"] = "supporting"  # every seed in: its PLAN says what makes it decisive
    d["expected"] = slices_expected(got)
    decl.write_text(dump(d))


def slices_expected(got: dict) -> list[dict]:
    """A slices folder's headline numbers: each side's means and gap share, each pair's gain and p-values."""
    fields = (
        "gold_logprob", "em", "oracle_gap_captured.gold_logprob",  # a side
        "gain", "p_wilcoxon",  # a pair in gold log-prob
        "em_a", "em_b", "p_mcnemar",  # a pair in the paper's metric
    )  # fmt: skip
    out = []
    for row, r in got.items():
        for f in fields:
            v = r
            for part in f.split("."):
                v = v.get(part) if isinstance(v, dict) else None
            if v is not None:
                out.append(expect(row, f, v))
    return out
