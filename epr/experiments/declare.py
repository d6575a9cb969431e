"""``epr experiment declare <folder>``: a draft ``experiment.yaml`` for a results folder, read off what the folder
already holds (``curve.json``'s rows, machine date and commands; an ``epr run`` folder's ``locked.json``). The draft's
expected numbers are the folder's own; its title, status and outcome are for a person to write (they say what the
folder means, which no file does)."""

from __future__ import annotations

from pathlib import Path

import yaml

from epr.artifacts import read_json
from epr.experiments.check import row_name
from epr.experiments.declaration import DATASETS, FILE
from epr.experiments.digests import KEY, block

__all__ = ["draft", "expect", "dump", "TOL"]

# how far a rerun may land from a headline number and still reproduce it (absolute; rtol for p-values)
TOL = {
    "em": 0.05,
    "lf_em": 0.05,
    "metric": 0.05,
    "gold_logprob": 0.005,
    "oracle_gap_captured.gold_logprob": 0.005,
    "gain": 0.005,
    "em_a": 0.05,
    "em_b": 0.05,
}
P_RTOL = 0.05


def expect(row: str, field: str, value) -> dict:
    if value is None:
        return {"row": row, "field": field, "value": None}
    if field in TOL:
        return {"row": row, "field": field, "value": round(float(value), 6), "tol": TOL[field]}
    return {"row": row, "field": field, "value": float(f"{float(value):.6g}"), "rtol": P_RTOL}


def _dataset(name: str) -> str:
    first = name.split("-")[0]
    return first if first in DATASETS else "mtop"


def draft(folder: Path) -> dict:
    folder = Path(folder)
    d: dict = {  # ORDER below is the order a declaration is written in
        "title": f"TODO: what {folder.name} is",
        "dataset": _dataset(folder.name),
        "split": "none",
        "status": "supporting",
        "date": None,
        "kind": "other",
        "outcome": "",
    }
    c = read_json(folder / "curve.json") if (folder / "curve.json").exists() else None
    if (
        c is not None and c["rows"] and "split" not in c["rows"][0]
    ):  # the first curve's format: no rows/ to check
        d.update(split="dev", date=((c["info"].get("machine") or {}).get("date") or "")[:10] or None)
    elif c is not None:
        rows, info = c["rows"], c["info"]
        d.update(kind="curve", split=rows[0]["split"] if rows else "none")
        d["date"] = (info.get("machine") or {}).get("date", "")[:10] or None
        d["commands"] = [
            x for x in (info.get("command"), (info.get("redrawn_from_rows") or {}).get("command")) if x
        ]
        d["seeds"] = sorted({r["seed"] for r in rows if r.get("seed") is not None}) or None
        extra = [m for m in ("lf_em",) if any(m in r for r in rows)]
        exp, tests = [], []
        for r in rows:
            name = row_name(r)
            fields = ["em", *extra, "gold_logprob"]
            if r["loss"] is not None:
                fields += ["p_vs_bm25", "p_vs_sbert", "logprob_p_vs_bm25", "oracle_gap_captured.gold_logprob"]
                fields += [f"{m}_p_vs_{b}" for m in extra for b in ("bm25", "sbert")]
            for f in fields:
                v = r
                for part in f.split("."):
                    v = v.get(part) if isinstance(v, dict) else None
                if v is not None or f in ("em", "gold_logprob"):
                    exp.append(expect(name, f, v))
        d["expected"] = exp
        if d["split"] == "locked":
            metric = extra[0] if extra else "em"
            refs = {r["retriever"]: r.get(metric) for r in rows if r["loss"] is None}
            best = max(("bm25", "sbert"), key=lambda b: refs.get(b) or -1.0)
            pooled = [r for r in rows if r["loss"] is not None and r["seeds"] > 1]
            for r in pooled or [r for r in rows if r["loss"] is not None]:
                p = f"{metric}_p_vs_{best}" if metric != "em" else f"p_vs_{best}"
                if r.get(p) is not None:
                    tests.append({"row": row_name(r), "field": p, "says": f"{metric.upper()} vs {best}"})
                if r.get("logprob_p_vs_bm25") is not None:
                    tests.append(
                        {"row": row_name(r), "field": "logprob_p_vs_bm25", "says": "gold log-prob vs bm25"}
                    )
            d["tests"] = tests
    if (folder / "PREREGISTRATION.md").exists():
        d["preregistration"] = "PREREGISTRATION.md"
    return {k: v for k, v in d.items() if v is not None}


def write_draft(folder: Path, overwrite: bool = False) -> Path:
    out = Path(folder) / FILE
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists (a declaration is hand-edited: pass --overwrite to replace it)")
    out.write_text(dump(draft(folder)))
    return out


ORDER = ("title", "dataset", "split", "status", "superseded_by", "date", "kind", "seeds", "preregistration",
         "commands", "outcome", "notes", "extra", "after_look", "comparisons")  # fmt: skip


def dump(d: dict) -> str:
    """A declaration as YAML a person can edit: one line per expected number and per test."""
    head = {k: d[k] for k in ORDER if k in d}
    text = yaml.safe_dump(head, sort_keys=False, width=120, allow_unicode=True)
    for key in ("expected", "tests"):
        if d.get(key):
            text += f"{key}:\n" + "".join(
                f"  - {yaml.safe_dump(item, default_flow_style=True, sort_keys=False, width=1000).strip()}\n"
                for item in d[key]
            )
    if d.get(KEY) is not None:
        text += block(d[KEY])
    return text
