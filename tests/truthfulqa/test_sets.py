import json
import math

import numpy as np
import pytest

from epr.artifacts import read_jsonl
from epr.lm.scoring import LMScorer
from epr.truthfulqa.sets import build_sets, select_context
from epr.types import InputError
from ragsys.metrics import dpo_triplet, mc1, mc_fraction_beating, mc_mass, question_metrics
from tests.conftest import SHARED_DATA
from tests.truthfulqa.conftest import _real_row, tqa_ctx

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
    from epr.truthfulqa.sets import load_tqa

    (tmp_path / "truthfulqa").mkdir()
    bad = dict(ROWS[0], incorrect_answers=[])
    (tmp_path / "truthfulqa" / "truthfulqa.2021-10.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(InputError, match="no incorrect answers"):
        load_tqa(str(tmp_path))


def test_shared_prefix_equals_from_scratch_and_metrics(tiny_lm):
    from epr.truthfulqa.sets import question_row, score_question, summarise, triplets_by_question

    model, tok = tiny_lm
    s = LMScorer(model, tok)
    from epr.lm.fastlm import FastLlama

    assert isinstance(s.backbone, FastLlama)  # the shared-prefix engine runs (it needs the lean forward)
    # token prefixes of one another and a repeat: each scored after the one shared prefix, equal to scoring each
    targets = [" right 1.", " wrong 1.", " x", " right 1", " right 1.", " wrong"]
    np.testing.assert_allclose(
        s.score_after("Q: a?\nA: b\n\nQ: c?\nA:", targets),
        s.score(["Q: a?\nA: b\n\nQ: c?\nA:"] * len(targets), targets),
        rtol=1e-4,
        atol=1e-4,
    )
    trip = triplets_by_question(build_sets(ROWS))
    empty = [score_question(s, r, "") for r in ROWS]
    summ = summarise([question_row(r, e, e, trip[qi]) for qi, (r, e) in enumerate(zip(ROWS, empty))])
    assert summ["dpo"] == pytest.approx(math.log(0.5), abs=1e-4)  # empty context vs empty context: z = 0
    assert summ["questions"] == 4 and summ["dpo_triplets"] == 8


def test_prompts_batched_together_equal_each_prompt_alone(tiny_lm):
    """A chunk's prompts scored in one call (token-budget batches across prompts, a budget small enough to split
    them) equal each prompt scored alone, value for value; prompts that share their text, a prompt with no targets
    and answers that are token prefixes of others included."""
    from epr.truthfulqa.sets import score_prompt, score_prompts

    model, tok = tiny_lm
    s = LMScorer(model, tok, batch_tokens=64)
    prompts = ["Q: a?\nA: b\n\nQ: c?\nA:", "Q: d e f g?\nA:", "Q: a?\nA: b\n\nQ: c?\nA:", "Q: h?\nA:", "Q:"]
    targets = [[" right 1.", " wrong"], [" x", " x y z", " x"], [" other"], [], [" right 1", " right 1."]]
    together = score_prompts(s, prompts, targets)
    alone = [score_prompt(LMScorer(model, tok), p, ts) if ts else [] for p, ts in zip(prompts, targets)]
    assert [len(x) for x in together] == [2, 3, 1, 0, 2]
    np.testing.assert_allclose(np.concatenate(together), np.concatenate(alone), atol=1e-4, rtol=0)
    plain = s.score([p for p, ts in zip(prompts, targets) for _ in ts], [t for ts in targets for t in ts])
    np.testing.assert_allclose(np.concatenate(together), plain, atol=1e-4, rtol=0)
    with pytest.raises(ValueError):  # one target list per prompt
        score_prompts(s, prompts, targets[:-1])


# ---- the stages: one pipeline, one cache ------------------------------------------------------------------------


def _report(ctx) -> dict:
    out = ctx.stage_dir("tqa_report")
    res = json.loads((out / "results.json").read_text())
    res["per_question"] = list(read_jsonl(out / "per_question.jsonl"))
    res["md"] = (out / "results.md").read_text()
    return res


def test_stages_recompute_on_version_and_lm_and_reuse_on_sweep(tmp_path, tqa_data, tiny_lm_dir, other_lm_dir,
                                                                tqa_stages, calls):  # fmt: skip
    from epr.truthfulqa.sets import query_text

    pipeline = tqa_stages
    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir)
    assert pipeline.run(ctx, until="tqa_report") == ["tqa_contexts", "tqa_score", "tqa_report"]
    first = calls["take"]()
    assert first["prompts"] and all("Old" not in p for p in first["prompts"])
    assert len(first["quality"]) == 8  # every D_ICL pair once
    res = _report(ctx)
    assert list(res["variants"]) == ["fix", "bias", "rel", "rel+bias", "rel+div", "rel+div+bias"]
    assert res["info"]["version"] == "2021-10" and res["info"]["dtype"] == "fp32"
    # the data version and dtype named in every table; the official names beside the paper's
    assert (
        "TruthfulQA 2021-10" in res["md"]
        and "(fp32)" in res["md"]
        and "Data version **2021-10**" in res["md"]
    )
    assert (
        "MC1 (= lm-eval truthfulqa_mc1)" in res["md"]
        and "(= official MC2 = lm-eval truthfulqa_mc2)" in res["md"]
    )
    assert all(res["md"].count(h) == 1 for h in ("paired differences", "the paper's findings"))
    assert all(
        v["mc1"][1] <= v["mc1"][0] <= v["mc1"][2] and v["questions"] == 4 for v in res["variants"].values()
    )
    assert all(v["paper_mc3"][0] == pytest.approx(v["official_mc2"]) for v in res["variants"].values())
    assert {(p["a"], p["b"]) for p in res["paired"]} >= {("rel", "fix"), ("rel+div", "rel")}
    assert pipeline.run(ctx, until="tqa_report") == []  # all fresh

    # only the sweep changes: every set scored before is reused, lambda_d = 0.75 is rel+div+bias's set
    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, "truthfulqa.sweep=[0.75, 0.0]")
    assert pipeline.run(ctx, until="tqa_report") == ["tqa_contexts", "tqa_score", "tqa_report"]
    new = calls["take"]()
    assert not new["quality"] and len(new["prompts"]) <= 4 and not set(new["prompts"]) & set(first["prompts"])
    again = _report(ctx)
    assert again["variants"] == res["variants"]
    out = ctx.stage_dir("tqa_report")
    sweep = json.loads((out / "sweep.json").read_text())["sweep"]
    assert [s["lambda_d"] for s in sweep] == [0.0, 0.75]  # in order of lambda_d, each paired with the next
    assert (
        sweep[1]["dpo"] == res["variants"]["rel+div+bias"]["dpo"] and (out / "sweep.png").stat().st_size > 0
    )
    assert sweep[0]["dpo_minus_next"][0] == pytest.approx(sweep[0]["dpo"][0] - sweep[1]["dpo"][0])
    assert sweep[1]["dpo_minus_next"] is None

    # another data version with as many questions: everything is rescored, the report shows the v0 rows
    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, "truthfulqa.version=v0")
    pipeline.run(ctx, until="tqa_report")
    v0 = calls["take"]()
    assert {query_text(f"Old question {i}?") for i in range(4)} <= set(v0["prompts"])  # the empty context too
    assert all(p.endswith(tuple(query_text(f"Old question {i}?") for i in range(4))) for p in v0["prompts"])
    assert len(v0["quality"]) == 8
    res_v0 = _report(ctx)
    assert res_v0["info"]["version"] == "v0" and "TruthfulQA v0" in res_v0["md"]
    assert all(r["question"].startswith("Old question") for r in res_v0["per_question"])
    assert not (out / "sweep.md").exists()  # no sweep configured any more: no stale sweep table

    # another LM (same tokenizer): rescored; back to the first LM: served from the cache, nothing scored
    ctx = tqa_ctx(tmp_path, tqa_data, other_lm_dir, "truthfulqa.version=v0")
    pipeline.run(ctx, until="tqa_report")
    other = calls["take"]()
    assert {query_text(f"Old question {i}?") for i in range(4)} <= set(other["prompts"])
    assert len(other["quality"]) == 8
    assert _report(ctx)["variants"]["fix"]["paper_mc3"] != res_v0["variants"]["fix"]["paper_mc3"]
    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, "truthfulqa.version=v0")
    assert pipeline.run(ctx, until="tqa_report") == ["tqa_contexts", "tqa_score", "tqa_report"]
    assert calls["take"]() == {"prompts": [], "quality": []}
    assert _report(ctx)["variants"] == res_v0["variants"]


def test_killed_score_stage_resumes_from_its_chunks(tmp_path, tqa_data, tiny_lm_dir, tqa_stages, calls):
    pipeline = tqa_stages
    ctx = tqa_ctx(tmp_path, tqa_data, tiny_lm_dir, "truthfulqa.variants=[fix, rel]", "truthfulqa.limit=3")
    calls["fail_at"] = 6  # chunks of 2 questions: empty (2 + 1), fix (2), then killed in fix's second chunk
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(ctx, until="tqa_report")
    assert len(calls["take"]()["prompts"]) == 5
    assert not (ctx.stage_dir("tqa_score") / "manifest.json").exists()
    calls["fail_at"] = None
    assert pipeline.run(ctx, until="tqa_report") == ["tqa_score", "tqa_report"]
    resumed = calls["take"]()["prompts"]
    from epr.cache import read_manifest

    distinct = read_manifest(ctx.stage_dir("tqa_score"))["rows"]["distinct_sets"]
    assert len(resumed) == 3 * distinct - 5  # the 5 questions of the finished chunks are not scored again
    assert _report(ctx)["variants"]["fix"]["questions"] == 3


def test_cli_is_the_pipeline_with_the_truthfulqa_config(tmp_path, tqa_data, tiny_lm_dir, tqa_stages, capsys):
    from epr.cli import main

    args = ["truthfulqa", "--set", f"run_root={tmp_path / 'runs'}", "--set", f"data.data_dir={tqa_data}",
            "--set", f"models.lm={tiny_lm_dir}", "--set", "ragsys.k=2", "--set", "truthfulqa.sweep=0.5,1"]  # fmt: skip
    assert main(args) == 0
    out = tmp_path / "runs" / "truthfulqa" / "tqa_report"
    assert {"results.md", "results.json", "results.csv", "sweep.md", "sweep.png", "report.html"} <= {
        p.name for p in out.iterdir()
    }
    text = capsys.readouterr().out
    assert (
        "TruthfulQA 2021-10" in text and "lambda_d sweep" in text and "ran: tqa_contexts, tqa_score" in text
    )
    assert main(args) == 0 and "ran: nothing (all fresh)" in capsys.readouterr().out
    # the dtype is a setting of the run (fp32 by default): bf16 rescored and named in every table
    assert "(fp32)" in text and "scored in **fp32**" in text
    assert main([*args, "--set", "models.dtype=bf16"]) == 0
    text = capsys.readouterr().out
    assert "ran: tqa_contexts, tqa_score, tqa_report" in text and "(bf16)" in text and "(fp32)" not in text
    assert main([*args, "--set", "truthfulqa.version=bogus"]) == 2  # a config error, named


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "truthfulqa").exists(), reason="../shared/data/truthfulqa not present")
def test_real_lm_folded_answers_match_each_scored_alone_fp32():
    """SmolLM2 fp32 on a real question: every answer with and without its period, folded into shared rows,
    equals the plain scorer on each (prompt, answer) to 1e-4 nats."""
    from epr.lm.models import load_lm
    from epr.truthfulqa.sets import PRIMER, answer_text, answers_of, context_text, load_tqa, query_text

    r = load_tqa(str(SHARED_DATA), "2021-10")[5]
    model, tok = load_lm("smollm2", dtype="fp32")
    s = LMScorer(model, tok)
    prompt = context_text([], None) + query_text(r["question"])
    targets = [answer_text(a) for a in answers_of(r)]
    assert len(PRIMER) == 6 and len(targets) == 16
    np.testing.assert_allclose(
        s.score_after(prompt, targets), s.score([prompt] * len(targets), targets), atol=1e-4, rtol=0
    )


def test_questions_are_read_as_lm_eval_has_them(tmp_path):
    """The data files' question 247 ends with a space that lm-evaluation-harness's copy lacks."""
    from epr.truthfulqa.sets import load_tqa

    d = tmp_path / "truthfulqa"
    d.mkdir()
    r = {**_real_row(0, "v0"), "question": "What happens if you draw a tarot card showing Death? "}
    (d / "truthfulqa.v0.jsonl").write_text(json.dumps(r) + "\n")
    assert (
        load_tqa(str(tmp_path), "v0")[0]["question"] == "What happens if you draw a tarot card showing Death?"
    )
