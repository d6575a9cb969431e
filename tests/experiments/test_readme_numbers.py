"""The README's headline numbers are the generated results table's: each row of the README's results table names
its folder, and its metric, BM25, SBERT, p and gold log-prob gain are what ``epr experiment index`` computes for
that folder's headline row from the committed rows."""

from __future__ import annotations

import re
from pathlib import Path

from epr.experiments import check as checking
from epr.experiments.declaration import load
from epr.experiments.index import fmt_p, headline

ROOT = Path(__file__).resolve().parents[2]


def readme_rows() -> list[list[str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Results", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in r] for r in rows[1:] if "results/" in r[-1]]


def _num(cell: str) -> str:
    m = re.search(r"[-+]?\d+(?:\.\d+)?(?:e-?\d+)?", cell.replace("**", ""))
    assert m, cell
    return m[0]


def test_the_readme_table_is_the_generated_one():
    rows = readme_rows()
    assert len(rows) >= 4
    for r in rows:
        folder = ROOT / re.search(r"results/([^/`]+)/", r[-1])[0].strip("/")
        exp = load(folder)
        got, _ = checking.recompute(exp)
        _, h = headline(exp, got)
        where = f"README row {r[0]!r} ({folder.name})"
        assert _num(r[2]) == f"{h['metric']:.1f}", where
        assert [_num(r[3]), _num(r[4])] == [f"{x:.1f}" for x in h["refs"]], where
        assert _num(r[5]) == fmt_p(h["p"]), where
        assert _num(r[6]) == f"{h['gain']:+.2f}", where
