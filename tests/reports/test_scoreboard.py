"""The scoreboard's choices on tiny hand-made curves: which reference a row is held against, which rows it shows,
and when a difference counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from epr.reports.scoreboard import entries, load_curves, markdown, verdict

ROOT = Path(__file__).resolve().parents[2]


def _ref(name, em, lp):
    return {"retriever": name, "loss": None, "labels": None, "split": "locked", "seeds": 1, "n": 10, "em": em,
            "gold_logprob": lp}  # fmt: skip


def _learned(seed, seeds, em, lp, **extra):
    return {"retriever": "epr", "loss": "distill", "labels": 100, "split": "locked", "seed": seed, "seeds": seeds,
            "n": 10, "em": em, "gold_logprob": lp, **extra}  # fmt: skip


def _curve():
    rows = [
        _ref("bm25", 20.0, -10.0),  # better log-prob
        _ref("sbert", 30.0, -12.0),  # better exact match
        _learned(42, 1, 31.0, -9.0),
        _learned(1, 1, 32.0, -9.5),
        _learned(None, 2, 31.5, -9.25, p_vs_bm25=1e-4, p_vs_sbert=0.4, logprob_gain_vs_bm25=0.75,
                 logprob_p_vs_bm25=0.01, logprob_gain_vs_sbert=2.75, logprob_p_vs_sbert=1e-6,
                 oracle_gap_captured={"gold_logprob": 0.2}, oracle_gap_captured_ci={"gold_logprob": [0.1, 0.3]}),
    ]  # fmt: skip
    return {
        "info": {"command": "learning_curve.py --split locked --set candidates.miner=retriever"},
        "rows": rows,
    }


def test_a_pooled_row_stands_for_its_seeds_and_each_metric_meets_its_better_reference():
    (e,) = entries({"mtop-curve-x": _curve()})
    assert e["row"] == "epr distill @100" and e["seeds"] == 2 and e["dataset"] == "mtop"
    assert e["em"]["ref"] == "sbert" and abs(e["em"]["gain"] - 1.5) < 1e-9 and e["em"]["p"] == 0.4
    assert e["gold_logprob"] == {"ref": "bm25", "ref_value": -10.0, "gain": 0.75, "p": 0.01}
    assert (e["gap"], e["gap_ci"]) == (0.2, [0.1, 0.3])
    assert e["recipe"] == "re-mined (round 2)"
    assert (verdict(e["em"]), verdict(e["gold_logprob"])) == ("tie", "win")


def test_single_seed_rows_are_shown_where_no_pooled_row_exists_and_unmeasured_metrics_say_so():
    curve = _curve()
    curve["rows"] = [r for r in curve["rows"] if r["seeds"] == 1]
    curve["rows"][2]["em"] = None
    es = entries({"x": curve})
    assert [e["row"] for e in es] == ["epr distill @100 seed 42", "epr distill @100 seed 1"]
    assert es[0]["em"] is None and verdict(es[0]["em"]) == "-"
    assert (
        es[0]["gold_logprob"]["p"] is None and verdict(es[0]["gold_logprob"]) == "-"
    )  # no p recorded: no verdict
    assert abs(es[0]["gold_logprob"]["gain"] - 1.0) < 1e-9


def test_verdict_needs_p_below_alpha_and_signs_the_difference():
    assert verdict({"gain": -0.1, "p": 0.001}) == "loss"
    assert verdict({"gain": 5.0, "p": 0.05}) == "tie"
    assert verdict({"gain": 5.0, "p": 0.049}) == "win"


def test_locked_rows_come_first_and_the_script_checks_the_committed_file(tmp_path):
    dev = _curve()
    for r in dev["rows"]:
        r["split"] = "dev"
    for name, c in {"a-dev": dev, "b-locked": _curve()}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "curve.json").write_text(json.dumps(c))
    md = markdown(entries(load_curves(tmp_path)))
    body = [line for line in md.splitlines() if line.startswith("| locked") or line.startswith("| dev")]
    assert [line.split(" | ")[1] for line in body] == ["[b-locked](b-locked/)", "[a-dev](a-dev/)"]
    # python -m scripts.scoreboard from the repository root: this checkout's epr (no sys.path edit in the script)
    script = [sys.executable, "-m", "scripts.scoreboard", "--results", str(tmp_path)]
    assert (
        subprocess.run([*script, "--check"], capture_output=True, cwd=ROOT).returncode == 1
    )  # not written yet
    assert subprocess.run(script, capture_output=True, cwd=ROOT).returncode == 0
    assert (tmp_path / "SCOREBOARD.md").read_text() == md
    assert subprocess.run([*script, "--check"], capture_output=True, cwd=ROOT).returncode == 0
    # as the docs run it, python scripts/scoreboard.py (against the installed epr)
    path_run = [
        sys.executable,
        str(ROOT / "scripts" / "scoreboard.py"),
        "--results",
        str(tmp_path),
        "--check",
    ]
    assert subprocess.run(path_run, capture_output=True).returncode == 0


def test_the_recipe_names_what_the_run_changed_and_how_exact_match_was_counted():
    from epr.reports.scoreboard import _recipe

    assert _recipe("learning_curve.py --split locked") == "-"
    cmd = "learning_curve.py --set models.inference_lm=gemma3-270m --em-method greedy"
    assert _recipe(cmd) == "inference LM gemma3-270m, EM read off the gold pass"
    assert "gold pass" not in _recipe("learning_curve.py --em-method generate")
    cmd = "learning_curve.py --set models.lm=gemma3-270m --set models.inference_lm=smollm2"
    assert _recipe(cmd) == "labels by gemma3-270m, inference LM smollm2"
    assert _recipe("x --set candidates.miner=mixed") == "re-mined, half BM25 (round 2)"
