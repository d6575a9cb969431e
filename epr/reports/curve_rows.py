"""A learning curve rebuilt from a results folder's ``rows/`` alone (``epr experiment curve --from-rows``): no
model, no run root. Each row file is one row, named as the script names it; seeds are pooled as the script pools
them; ``em-<name>.json.gz`` are the exact-match rows. ``epr.reports.curve.write_curve`` then redraws the folder's
``curve.json`` / ``.md`` / ``.png``."""

from __future__ import annotations

import json
import re
from pathlib import Path

from epr.artifacts import read_json
from epr.reports.curve import BASE_SEED, add_pooled, pooled

__all__ = ["REFERENCE_ORDER", "load_em", "rows_from_dir"]

REFERENCE_ORDER = ("bm25", "sbert", "untrained", "untrained-hybrid", "bm25-oracle", "lm-oracle")
_LEARNED = re.compile(r"^(?P<retriever>[a-z]+)@(?P<labels>\d+)-(?P<loss>[a-z]+)(?:-s(?P<seed>\d+))?$")


def load_em(rows_dir: Path) -> dict[str, dict]:
    """A results folder's exact-match rows (``em-<name>.json.gz``, as ``save_em`` writes them) by row name."""
    import gzip

    return {
        f.name[len("em-") : -len(".json.gz")]: json.loads(gzip.decompress(f.read_bytes()))
        for f in sorted(Path(rows_dir).glob("em-*.json.gz"))
    }


def rows_from_dir(rows_dir: Path, split: str) -> tuple[list[dict], dict[str, dict]]:
    """The curve's rows and exact-match rows rebuilt from a results folder's ``rows/`` alone (no model, no run root):
    each dense row file (``bm25.json``, ``epr@2000-distill-s1.json``, ...) is one row, named as the script names
    it; seeds of one point are pooled as the script pools them; ``em-<name>.json.gz`` are its exact-match rows.
    ``write_curve`` on the result redraws ``curve.json`` / ``.md`` / ``.png`` from committed files."""

    refs, learned = [], []
    for f in sorted(rows_dir.glob("*.json")):
        r = read_json(f)
        r.pop("key", None)
        base = {"name": f.stem, "seeds": 1, "split": split, **r, "best_epoch": r.get("best_epoch")}
        if (m := _LEARNED.match(f.stem)) is not None:
            seed = int(m["seed"]) if m["seed"] else BASE_SEED
            learned.append(
                {
                    **base,
                    "retriever": m["retriever"],
                    "loss": m["loss"],
                    "labels": int(m["labels"]),
                    "seed": seed,
                }
            )
        elif f.stem in REFERENCE_ORDER:
            refs.append({**base, "retriever": f.stem, "loss": None, "labels": None, "seed": None})
        else:
            raise ValueError(
                f"{f}: not a row file of the learning curve (a reference or RETRIEVER@N-LOSS[-sSEED])"
            )
    refs.sort(key=lambda r: REFERENCE_ORDER.index(r["retriever"]))
    rows = list(refs)
    points = sorted({(r["labels"], r["loss"]) for r in learned})
    for n, loss in points:
        mine = [r for r in learned if (r["labels"], r["loss"]) == (n, loss)]
        seeds = sorted({r["seed"] for r in mine}, key=lambda s: (s != BASE_SEED, s))
        mine.sort(key=lambda r: (seeds.index(r["seed"]), r["retriever"]))
        rows += mine
        for retriever in sorted({r["retriever"] for r in mine}):
            add_pooled(rows, n, loss, [r["seed"] for r in mine if r["retriever"] == retriever], retriever)
    em = load_em(rows_dir)
    for n, loss in points:  # the seeds' EM rows of each learned retriever pooled as the script pools them
        for retriever in sorted({r["retriever"] for r in learned}):
            names = [
                r["name"]
                for r in rows
                if (r["labels"], r["loss"], r["seeds"], r["retriever"]) == (n, loss, 1, retriever)
            ]
            if len(names) > 1 and all(x in em for x in names):
                em[f"{retriever}@{n}-{loss}-pooled"] = pooled([em[x] for x in names])
    return rows, em
