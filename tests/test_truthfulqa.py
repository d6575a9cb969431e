import math

import numpy as np
import pytest

from epr.prefix_scoring import score_shared_prefix
from epr.scoring import LMScorer
from epr.truthfulqa import build_sets, evaluate_variant, select_context
from epr.types import InputError
from ragsys.metrics import dpo_triplet, mc1, mc_fraction_beating, mc_mass, question_metrics

ROWS = [
    {
        "question": f"Question {i}?",
        "correct_answers": [f"right {i}", f"also right {i}"],
        "incorrect_answers": [f"wrong {i}"],
        "mc1_targets": {"choices": [f"right {i}.", f"wrong {i}."], "labels": [1, 0]},
        "mc2_targets": {"choices": [f"right {i}.", f"also right {i}.", f"wrong {i}."], "labels": [1, 1, 0]},
    }
    for i in range(4)
]


def test_metrics_on_hand_set_probabilities():
    lp = np.log([0.5, 0.2, 0.3])
    assert mc1(lp, [1, 0, 0]) == 1.0 and mc1(lp, [0, 0, 1]) == 0.0
    assert mc_fraction_beating(lp, [1, 1, 0]) == 0.5  # 0.5 beats 0.3, 0.2 does not
    assert mc_mass(lp, [1, 1, 0]) == pytest.approx(0.7)
    m = question_metrics(lp[:2], [1, 0], lp, [1, 1, 0])
    assert m["paper_mc2"] == m["official_mc3"] == 0.5 and m["paper_mc3"] == m[
        "official_mc2"
    ] == pytest.approx(0.7)
    # the context doubles p(a) and leaves p(ā): log sigma(log 2)
    assert dpo_triplet(math.log(0.4), math.log(0.2), math.log(0.1), math.log(0.1)) == pytest.approx(
        math.log(2 / 3)
    )
    with pytest.raises(ValueError, match="exactly one true"):
        mc1(lp, [1, 1, 0])


def test_sets_and_leave_one_out():
    data = build_sets(ROWS + [ROWS[0]])  # a duplicated question adds no duplicate pairs
    assert len(data.icl) == 8 and len(data.dpo) == 8
    icl_q = np.array([qi for qi, _, _ in data.icl])
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(8, 4))
    for variant in ("rel", "rel+div+bias", "bias"):
        for qi in range(4):
            sel = select_context(variant, qi, emb[2 * qi], emb, icl_q, rng.normal(size=8), 4, 0.75, 0.95)
            assert all(icl_q[j] != qi for j in sel), (variant, qi)  # never the question's own answers
    with pytest.raises(ValueError, match="larger than the candidate pool"):
        select_context("rel", 0, emb[0], emb, icl_q, np.zeros(8), 7, 0.75, 0.95)


def test_no_incorrect_answers_is_an_error(tmp_path):
    import json

    from epr.truthfulqa import load_tqa

    (tmp_path / "truthfulqa").mkdir()
    bad = dict(ROWS[0], incorrect_answers=[])
    (tmp_path / "truthfulqa" / "truthfulqa.2021-10.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(InputError, match="no incorrect answers"):
        load_tqa(str(tmp_path))


def test_shared_prefix_equals_from_scratch_and_eval_runs(tiny_lm, tmp_path):
    model, tok = tiny_lm
    s = LMScorer(model, tok)
    targets = [" right 1.", " wrong 1.", " x"]
    np.testing.assert_allclose(
        score_shared_prefix(s, "Q: a?\nA: b\n\nQ: c?\nA:", targets),
        s.score(["Q: a?\nA: b\n\nQ: c?\nA:"] * 3, targets),
        rtol=1e-4,
        atol=1e-4,
    )
    data = build_sets(ROWS)
    from epr.truthfulqa import empty_scores

    empty = empty_scores(s, data, tmp_path / "empty.jsonl")
    summ, rows = evaluate_variant(s, data, [""] * 4, empty, tmp_path / "v.jsonl")
    assert summ["dpo"] == pytest.approx(math.log(0.5), abs=1e-4)  # empty context vs empty context: z = 0
    again, _ = evaluate_variant(s, data, [""] * 4, empty, tmp_path / "v.jsonl")  # resumed from the file
    assert again == summ and summ["questions"] == 4 and summ["dpo_triplets"] == 8


def test_cli_six_variants_and_sweep_end_to_end(tmp_path, tiny_lm_dir, minilm_dir):
    """`epr truthfulqa` on a tiny data folder with a tiny LM: the table, intervals, the sweep and its plot; a rerun
    reuses every per-question row (the sweep's lambda_d = 0.75 and 1 reuse the rel+div+bias and rel+bias rows)."""
    import json

    from epr.cli import main

    (tmp_path / "truthfulqa").mkdir()
    with open(tmp_path / "truthfulqa" / "truthfulqa.2021-10.jsonl", "w") as f:
        for r in ROWS:
            f.write(json.dumps(r) + "\n")
    args = [
        "truthfulqa",
        "--data-dir",
        str(tmp_path),
        "--lm",
        tiny_lm_dir,
        "--encoder",
        minilm_dir,
        "--k",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--sweep",
        "0.5,0.75,1.0",
    ]
    assert main(args) == 0
    out = tmp_path / "out"
    res = json.loads((out / "results.json").read_text())
    assert list(res) == ["fix", "bias", "rel", "rel+bias", "rel+div", "rel+div+bias"]
    assert all(0 <= v["mc1"] <= 1 and v["questions"] == 4 and len(v["mc1_ci"]) == 2 for v in res.values())
    assert "MC1 - Fix" in (out / "results.md").read_text()
    sweep = json.loads((out / "sweep.json").read_text())
    assert [s["lambda_d"] for s in sweep] == [0.5, 0.75, 1.0]
    assert sweep[1]["mc1"] == res["rel+div+bias"]["mc1"] and sweep[2]["mc1"] == res["rel+bias"]["mc1"]
    assert (out / "sweep.png").stat().st_size > 0
    assert not (out / "sweep_0.75_n4.jsonl").exists() and (out / "sweep_0.5_n4.jsonl").exists()
