"""The README's demo block is what ``make demo`` printed (issue 78): the comparison table of the committed demo run
(``results/demo-default/results.md``) and its served line, formatted by the same function the command ends with from
the run's ``select`` report. A changed number, a changed formatter or a stale README fails."""

from __future__ import annotations

import json
from pathlib import Path

from epr.cli.ending import served_line

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "results" / "demo-default"
START = "<!-- demo output: results/demo-default/ (tests/test_readme_demo.py keeps it equal) -->"
END = "<!-- end demo output -->"


def expected_block() -> str:
    table = [x for x in (DEMO / "results.md").read_text().splitlines() if x.startswith("|")]
    served = served_line(json.loads((DEMO / "select-report.json").read_text()))
    return "\n".join([*table, "", f"`{served}`"])


def readme_block(text: str) -> str:
    assert START in text and END in text, "README.md: the demo block's markers are missing"
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def test_the_readme_shows_what_the_demo_printed():
    printed = (DEMO / "demo-output.txt").read_text()
    want = expected_block()
    for line in want.splitlines():  # the command printed every line the README quotes
        assert line.strip("`") in printed, line
    assert readme_block((ROOT / "README.md").read_text()) == want


def test_a_changed_number_fails():
    text = (ROOT / "README.md").read_text()
    block = readme_block(text)
    first = next(x for x in block.splitlines() if x.startswith("| ") and not x.startswith("| retriever"))
    em = first.split(" | ")[1]
    changed = block.replace(first, first.replace(f"| {em} |", f"| {float(em) + 1:.1f} |", 1))
    assert changed != block and changed != expected_block()
