"""``epr experiment record RUN FOLDER``: a finished ``epr run``'s evaluation kept as a results folder that
``epr experiment check`` can recompute: its per-example rows (``rows/per_query-<part>.jsonl.gz``), the selection it
served by (``select-report.json``, ``rows/select-per_example.jsonl.gz``), the run's own tables, the served
retriever's report (``<part>.md`` / ``.json``: ``epr.reports.served``) and the declaration's numbers. What a person
wrote in the folder's ``experiment.yaml`` (title, status, outcome, pre-registration, commands) is kept; the
expected numbers and the tests are (re)read from the rows."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import yaml

from epr.experiments.declaration import FILE
from epr.experiments.declare import dump, expect
from epr.reports.served import served_report
from epr.tasks import TASKS

__all__ = ["record", "paper_metric"]


def paper_metric(run: Path) -> tuple[str, str]:
    """The run's task and the per-example key of its paper metric (``correct``: exact match)."""
    task = json.loads((run / "examples" / "manifest.json").read_text())["config"]["data"]["task"]
    m = TASKS[task].paper_metric
    return task, ("correct" if m == "em" else m)


def record(run: Path, folder: Path, part: str = "locked") -> Path:
    run, folder = Path(run), Path(folder)
    ev = run / ("locked/evaluate" if part == "locked" else "evaluate")
    if not (ev / "manifest.json").exists():
        raise FileNotFoundError(f"{ev}: no finished evaluation (manifest.json missing)")
    sel_dir = run / "select"
    if not (sel_dir / "report.json").exists():
        raise FileNotFoundError(f"{sel_dir}: no finished select stage")
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
    sel = json.loads((sel_dir / "report.json").read_text())
    md, raw = served_report(rows, sel, part, task, metric)
    (folder / f"{part}.md").write_text(md)
    (folder / f"{part}.json").write_text(json.dumps(raw, indent=2) + "\n")

    decl = folder / FILE
    d = yaml.safe_load(decl.read_text()) if decl.exists() else {}
    d.setdefault("title", f"TODO: what {folder.name} is")
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
    return decl
