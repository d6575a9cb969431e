"""An experiment as data: ``results/<folder>/experiment.yaml`` says what the folder is (dataset, split, seeds,
status, the commands that made it, its pre-registration) and which headline numbers it stands for, with their
tolerances. ``epr experiment check`` recomputes those numbers from the folder's committed rows.

    title: MTOP, round 2 re-mined (distill), 3 seeds, locked
    dataset: mtop                 # mtop | break | smcalflow | truthfulqa | demo
    split: locked                 # dev | locked | dialogue-dev | dialogue-locked | test | none
    status: decisive              # decisive | supporting | superseded | diagnostic | planned (not run yet)
    date: 2026-11-25
    kind: curve                   # curve (rows/ + curve.json) | run (an epr run's rows) | slices | other
    seeds: [42, 1, 2]
    preregistration: ../mtop-curve-round2/PREREGISTRATION.md   # or null
    commands: [python scripts/learning_curve.py ...]
    after_look: [abc1234 amendment 3 ...]   # each change to the pre-registration committed after the look (git checks)
    files: {rows/bm25.json: <sha256>, ...}   # every data file pinned (`epr experiment digest`; check compares)
    comparisons:                  # rows of two folders paired; recomputed as row cmp:<name>, so a test can name it
      listwise-vs-distill: {a: ../mtop-curve-round2-locked/rows/epr@2000-distill.json, b: rows/epr@2000-listwise.json}
    outcome: one line, what it showed (a loss included)
    expected:                     # recomputed from rows/ by `epr experiment check`
      - {row: epr@2000-distill-pooled, field: em, value: 37.62, tol: 0.05}
    tests:                        # the locked tests it reports: Holm over the dataset's locked family
      - {row: epr@2000-distill-pooled, field: p_vs_sbert, says: EM vs SBERT}
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epr.types import InputError

__all__ = ["Expect", "Test", "Experiment", "load", "FILE", "DATASETS", "SPLITS", "STATUSES", "KINDS"]

FILE = "experiment.yaml"
DATASETS = ("mtop", "break", "smcalflow", "truthfulqa", "demo")
SPLITS = ("dev", "locked", "dialogue-dev", "dialogue-locked", "test", "none")
STATUSES = (
    "decisive",
    "supporting",
    "superseded",
    "diagnostic",
    "planned",
)  # planned: pre-registered, not run
KINDS = ("curve", "run", "slices", "other")
LOCKED = ("locked", "dialogue-locked", "test")  # splits where every look is counted
# from here on, a look at a locked split is made once, after a pre-registration committed before it runs
PREREGISTERED_FROM = "2026-11-26 22:00"


@dataclass(frozen=True)
class Expect:
    """A headline number: ``row``'s ``field`` (a dotted path into the recomputed row, e.g.
    ``oracle_gap_captured.gold_logprob``) is ``value`` within ``tol`` (absolute) or ``rtol`` (relative: p-values)."""

    row: str
    field: str
    value: float | None
    tol: float = 0.0
    rtol: float = 0.0

    def problem(self, got: Any) -> str | None:
        if self.value is None or got is None:
            return None if self.value is None and got is None else f"expected {self.value}, recomputed {got}"
        bound = max(self.tol, self.rtol * abs(self.value), 1e-9 * max(1.0, abs(self.value)))
        if abs(float(got) - float(self.value)) > bound:
            return f"expected {self.value} (± {bound:.3g}), recomputed {got}"
        return None


@dataclass(frozen=True)
class Test:
    """A locked test the folder reports: ``row``'s p-value ``field``; ``says`` what it tests."""

    row: str
    field: str
    says: str


@dataclass(frozen=True)
class Experiment:
    folder: Path
    title: str
    dataset: str
    split: str
    status: str
    date: str
    kind: str
    seeds: tuple[int, ...] = ()
    preregistration: str | None = None
    commands: tuple[str, ...] = ()
    outcome: str = ""
    superseded_by: str | None = None
    expected: tuple[Expect, ...] = ()
    tests: tuple[Test, ...] = ()
    notes: str = ""
    extra: dict = field(default_factory=dict)
    after_look: tuple[
        str, ...
    ] = ()  # each change to the pre-registration after the look, one line naming its commit
    files: dict | None = None  # every data file's sha256 (epr/experiments/digests.py); None: not pinned
    comparisons: dict = field(default_factory=dict)  # name -> {a, b, metric}: rows of two folders paired

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def locked(self) -> bool:
        return self.split in LOCKED


def _need(d: dict, key: str, where: str, choices: tuple[str, ...] | None = None) -> Any:
    if key not in d or d[key] in (None, ""):
        raise InputError(f"{where}: missing {key!r}")
    v = d[key]
    if choices is not None and v not in choices:
        raise InputError(f"{where}: {key}: {v!r} is not one of {', '.join(choices)}")
    return v


def _items(d: dict, key: str, cls: type, where: str, allowed: set[str]) -> tuple:
    out = []
    for i, item in enumerate(d.get(key) or ()):
        if not isinstance(item, dict) or not {"row", "field"} <= set(item) or set(item) - allowed:
            raise InputError(
                f"{where}: {key}[{i}]: expected a mapping with row, field and only {sorted(allowed)}; got {item!r}"
            )
        out.append(cls(**item))
    return tuple(out)


def _comparisons(d: dict, where: str) -> dict:
    """``comparisons``: name -> {a, b[, metric]}: two sides of a paired comparison, each a row file relative to the
    folder (``../other/rows/x.json``) or several seeds' joined by commas; ``metric``: gold_logprob (default where
    both sides hold it) or exact_match. Recomputed by check as the row ``cmp:<name>``, so a test may name it."""
    out = {}
    for name, c in (d.get("comparisons") or {}).items():
        if not isinstance(c, dict) or not {"a", "b"} <= set(c) or set(c) - {"a", "b", "metric"}:
            raise InputError(
                f"{where}: comparisons.{name}: expected a mapping with a, b and optionally metric"
            )
        if c.get("metric") not in (None, "gold_logprob", "exact_match"):
            raise InputError(
                f"{where}: comparisons.{name}.metric: {c['metric']!r} is not gold_logprob or exact_match"
            )
        out[str(name)] = {k: str(v) for k, v in c.items()}
    return out


def load(folder: Path) -> Experiment:
    """The folder's declaration, checked: a missing or misspelt key names the file and the key."""
    folder = Path(folder)
    path = folder / FILE
    where = str(path)
    if not path.exists():
        raise InputError(f"{folder}: no {FILE} (every results folder declares what it is)")
    try:
        d = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise InputError(f"{where}: not YAML: {e}") from None
    if not isinstance(d, dict):
        raise InputError(f"{where}: expected a mapping at the top")
    known = {
        "title", "dataset", "split", "status", "date", "kind", "seeds", "preregistration", "commands",
        "outcome", "superseded_by", "expected", "tests", "notes", "extra", "after_look", "files", "comparisons",
    }  # fmt: skip
    if unknown := sorted(set(d) - known):
        raise InputError(f"{where}: unknown keys {unknown} (known: {sorted(known)})")
    date = _need(d, "date", where)
    if isinstance(date, _dt.date):
        date = date.isoformat()
    exp = Experiment(
        folder=folder,
        title=str(_need(d, "title", where)),
        dataset=_need(d, "dataset", where, DATASETS),
        split=_need(d, "split", where, SPLITS),
        status=_need(d, "status", where, STATUSES),
        date=str(date),
        kind=_need(d, "kind", where, KINDS),
        seeds=tuple(int(s) for s in d.get("seeds") or ()),
        preregistration=d.get("preregistration"),
        commands=tuple(str(c) for c in d.get("commands") or ()),
        outcome=str(d.get("outcome") or ""),
        superseded_by=d.get("superseded_by"),
        expected=_items(d, "expected", Expect, where, {"row", "field", "value", "tol", "rtol"}),
        tests=_items(d, "tests", Test, where, {"row", "field", "says"}),
        notes=str(d.get("notes") or ""),
        extra=dict(d.get("extra") or {}),
        after_look=tuple(str(a) for a in d.get("after_look") or ()),
        files=None if d.get("files") is None else {str(k): str(v) for k, v in d["files"].items()},
        comparisons=_comparisons(d, where),
    )
    if exp.preregistration and not (folder / exp.preregistration).exists():
        raise InputError(f"{where}: preregistration {exp.preregistration!r} does not exist beside it")
    if exp.status == "superseded" and not exp.superseded_by:
        raise InputError(f"{where}: status superseded needs superseded_by (the folder that replaces it)")
    if exp.locked and exp.date >= PREREGISTERED_FROM and not exp.preregistration:
        raise InputError(
            f"{where}: a look at the {exp.split} split dated {exp.date} needs its preregistration (every look from "
            f"{PREREGISTERED_FROM} on is pre-registered, committed before it runs)"
        )
    if exp.status == "planned" and not exp.preregistration:
        raise InputError(f"{where}: status planned needs its preregistration (committed before the run)")
    if exp.locked and exp.kind != "other" and not exp.outcome:
        raise InputError(
            f"{where}: a look at the {exp.split} split needs its outcome (one line, a loss included)"
        )
    return exp
