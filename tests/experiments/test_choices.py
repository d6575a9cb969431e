"""The served choices of a results folder recompute from its rows (``epr.experiments.choices``): a committed
``select-report*.json`` and a ``reselect`` answer naming its source rows, each against a copy with one claim
changed (the negative controls)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from epr.experiments.check import check
from epr.experiments.choices import recheck, weigh_of
from epr.stages.select import committed_report, reselect
from epr.types import InputError

RESULTS = Path(__file__).resolve().parents[2] / "results"
FOLDER = RESULTS / "mtop-reward-dev"  # a logprob+em select with four learned modes, and reselect answers


@pytest.fixture
def copy(tmp_path):
    d = tmp_path / FOLDER.name
    shutil.copytree(FOLDER, d)
    return d


def test_every_committed_choice_recomputes():
    checked = [d.name for d in sorted(RESULTS.iterdir()) if list(d.glob("rows/select-*.jsonl.gz"))]
    assert len(checked) >= 8
    for name in checked:
        assert recheck(RESULTS / name) == [], name


def test_a_changed_choice_or_number_is_named(copy):
    rep = copy / "select-report-t.json"
    said = json.loads(rep.read_text())
    assert said["selected"] == "epr" and weigh_of(said) == "logprob+em"
    rep.write_text(json.dumps({**said, "selected": "hybrid"}))
    assert recheck(copy) == ["select-report-t.json: selected hybrid but its rows choose epr"]
    said["rows"]["hybrid"]["em"] += 0.01
    rep.write_text(json.dumps(said))
    (p,) = recheck(copy)
    assert p.startswith("select-report-t.json: hybrid.em ")
    assert any("select-report-t.json" in q for q in check(copy))  # check reports it too


def test_the_weigh_rule_is_read_from_the_report(copy):
    # the same rows under logprob choose otherwise: a report whose EM was dropped claims a choice they refute
    rep = copy / "select-report-t.json"
    said = json.loads(rep.read_text())
    for row in said["rows"].values():
        row.pop("em")
    rep.write_text(json.dumps(said))
    assert weigh_of(said) == "logprob"
    assert recheck(copy) == ["select-report-t.json: selected epr but its rows choose hybrid"]


def test_a_reselect_answer_is_held_to_its_source(copy, tmp_path):
    rows = copy / "rows" / "select-t.jsonl.gz"
    assert committed_report(rows) == copy / "select-report-t.json"
    assert committed_report(copy / "rows" / "select-per_example.jsonl.gz") == copy / "select-report.json"
    got = reselect(rows, ["epr", "hybrid"], "logprob")
    assert got["source"] == "rows/select-t.jsonl.gz" and got["selected"] == "hybrid"
    (copy / "select-t-epr-hybrid-logprob.json").write_text(json.dumps({**got, "selected": "epr"}))
    assert recheck(copy) == ["select-t-epr-hybrid-logprob.json: selected epr but its rows choose hybrid"]
    (copy / "select-t-epr-hybrid-logprob.json").write_text(
        json.dumps({**got, "source": "rows/gone.jsonl.gz"})
    )
    assert recheck(copy) == [
        "select-t-epr-hybrid-logprob.json: its source rows/gone.jsonl.gz is not in the folder"
    ]


def test_rows_without_their_report_are_named(copy):
    with gzip.open(copy / "rows" / "select-x.jsonl.gz", "wt") as f:
        f.write('{"idx": 0, "bm25": -1.0, "epr": -0.5}\n')
    assert recheck(copy) == ["rows/select-x.jsonl.gz: no select-report-x.json beside these rows"]
    with pytest.raises(InputError, match="no select-report-x.json beside these rows"):
        reselect(copy / "rows" / "select-x.jsonl.gz", ["epr"])
