"""The committed learning-curve results hold what issue 22 asks of them: every row in the shape ``curve.json``
promises, and every exact-match figure and paired test recomputable from the committed per-example files (the
figures are recomputed here from ``rows/`` alone, no model)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from epr.experiments.curve import curve_args
from epr.reports import curve, curve_rows
from tests.values import assert_same_values

ROOT = Path(__file__).resolve().parents[1]
# curve folders in the current row format (results/mtop-curve/ predates it: one seed, no per-example EM files)
CURVES = sorted(p.parent for p in ROOT.glob("results/*-curve*/curve.json") if p.parent.name != "mtop-curve")
KEYS = ("retriever", "loss", "labels", "split", "seeds", "n", "em", "p_vs_bm25", "p_vs_sbert", "gold_logprob")


def _name(r: dict) -> str:
    if r["loss"] is None:
        return r["retriever"]
    base = f"{r['retriever']}@{r['labels']}-{r['loss']}"  # epr, hybrid
    return f"{base}-pooled" if r["seeds"] > 1 else curve.seeded(base, r["seed"])


def _em(folder: Path, name: str) -> dict | None:
    f = folder / "rows" / f"em-{name}.json.gz"
    return json.loads(gzip.decompress(f.read_bytes())) if f.exists() else None


def test_there_are_curves_to_check():
    assert any(c.name == "mtop-curve-locked" for c in CURVES)


@pytest.mark.parametrize("folder", CURVES, ids=lambda p: p.name)
def test_committed_curve_rows_are_recomputable(folder):
    rows = json.loads((folder / "curve.json").read_text())["rows"]
    refs = {r: _em(folder, r) for r in ("bm25", "sbert")}
    for r in rows:
        assert all(k in r for k in KEYS) and "oracle_gap_captured" in r, r
        assert r["split"] in ("dev", "locked") and r["seeds"] >= 1
        name = _name(r)
        if r["seeds"] == 1:  # per-example gold log-probs, committed
            lp = json.loads((folder / "rows" / f"{name}.json").read_text())["per_query_logprob"]
            assert len(lp) == r["n"]
            assert np.nanmean(np.array(lp, dtype=float)) == pytest.approx(r["gold_logprob"], abs=1e-6)
        if r["em"] is None:
            continue
        if r["seeds"] > 1:
            e = curve.pooled([_em(folder, curve.seeded(name[: -len("-pooled")], s)) for s in _seeds(rows, r)])
        else:
            e = _em(folder, name)
        assert e is not None, f"{folder.name}: no per-example file for {name}"
        assert len(e["correct"]) == r["n"] * r["seeds"]
        assert 100 * np.mean(e["correct"]) == pytest.approx(r["em"])
        for b in ("bm25", "sbert"):
            if refs[b] is not None and name != b:
                assert curve.paired_p(e, refs[b], r["seeds"]) == pytest.approx(r[f"p_vs_{b}"])


def _seeds(rows: list[dict], pooled_row: dict) -> list[int]:
    return [
        r["seed"]
        for r in rows
        if r["seeds"] == 1
        and (r["retriever"], r["loss"], r["labels"])
        == (pooled_row["retriever"], pooled_row["loss"], pooled_row["labels"])
    ]


GAINS = ("logprob_gain_vs_bm25", "logprob_p_vs_bm25", "logprob_gain_vs_sbert", "logprob_p_vs_sbert")


@pytest.mark.parametrize("folder", CURVES, ids=lambda p: p.name)
def test_committed_curve_is_redrawn_from_its_rows_alone(folder, tmp_path):
    """`learning_curve.py --from-rows` rebuilds every committed table from rows/ (no model, no run root): the same
    rows, figures, paired tests and oracle-gap fractions as the curve.json the run wrote."""
    import argparse

    want = json.loads((folder / "curve.json").read_text())["rows"]
    rows, em = curve_rows.rows_from_dir(folder / "rows", want[0]["split"])
    curve.attach_em(rows, em)
    a = argparse.Namespace(split=want[0]["split"], name=folder.name, lms="LMs")
    curve.write_curve(tmp_path, rows, **curve_args(a, 0.0))
    got = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert [_name(r) for r in got] == [_name(r) for r in want]
    for g, w in zip(got, want):
        for k in (*KEYS, *GAINS, "seed"):
            assert_same_values(g.get(k), w.get(k), rel=1e-9, where=(folder.name, _name(w), k))
        assert_same_values(g["oracle_gap_captured"], w["oracle_gap_captured"], where=(folder.name, _name(w)))


def test_rows_from_dir_names_a_file_it_cannot_place(tmp_path):
    (tmp_path / "bm25.json").write_text(
        json.dumps({"n": 1, "gold_logprob": -1.0, "per_query_logprob": [-1.0]})
    )
    (tmp_path / "my-notes.json").write_text("{}")
    with pytest.raises(ValueError, match="my-notes.json"):
        curve_rows.rows_from_dir(tmp_path, "dev")


def test_committed_scoreboard_is_what_the_curves_give():
    """results/SCOREBOARD.md is regenerated from every results/*/curve.json; a curve changed without it is stale."""
    from epr.reports.scoreboard import entries, load_curves, markdown

    committed = (ROOT / "results" / "SCOREBOARD.md").read_text()
    assert committed == markdown(entries(load_curves(ROOT / "results"))), "run python scripts/scoreboard.py"
