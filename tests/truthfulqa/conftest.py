"""Fixtures of the TruthfulQA stage tests: a tiny data set in the real files' layout, the stage graph, the LM calls."""

import json

import pytest


def _real_row(i: int, version: str) -> dict:
    """A question in the layout of ../shared/data/truthfulqa/truthfulqa.<version>.jsonl; v0 asks other questions."""
    q = f"{'Old question' if version == 'v0' else 'Question'} {i}?"
    right, also, wrong, wrong2 = f"right {i}", f"also right {i}", f"wrong {i}", f"bad {i}"
    return {
        "id": f"tqa-{i:03d}",
        "question": q,
        "correct_answers": [right, also],
        "incorrect_answers": [wrong, wrong2],
        "best_answer": right,
        "category": "Misconceptions",
        "type": "Adversarial",
        "source": "https://example.org",
        "mc1_targets": {"choices": [f"{right}.", f"{wrong}.", f"{wrong2}."], "labels": [1, 0, 0]},
        "mc2_targets": {
            "choices": [f"{right}.", f"{also}.", f"{wrong}.", f"{wrong2}."],
            "labels": [1, 1, 0, 0],
        },
    }


@pytest.fixture
def tqa_data(tmp_path):
    d = tmp_path / "data"
    (d / "truthfulqa").mkdir(parents=True)
    for version in ("2021-10", "v0"):
        rows = [_real_row(i, version) for i in range(4)]
        (d / "truthfulqa" / f"truthfulqa.{version}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )
    return d


@pytest.fixture(scope="module")
def other_lm_dir(tiny_lm_dir, tmp_path_factory):
    """Another tiny LM with the same tokenizer (the weights perturbed): a different model to every cache."""
    import shutil
    from pathlib import Path

    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tiny_lm_dir)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("other_lm")
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(Path(tiny_lm_dir) / name, out / name)
    return str(out)


@pytest.fixture
def tqa_stages(monkeypatch):
    """The TruthfulQA entries of the stage graph, as ``epr.truthfulqa.stage.STAGE_SPECS`` declares them."""
    from epr import pipeline
    from epr.truthfulqa.stage import STAGE_SPECS

    for name, deps, keys, fn, *rest in STAGE_SPECS:
        d = deps if callable(deps) else (lambda c, d=deps: d)
        monkeypatch.setitem(pipeline.STAGES, name, pipeline.Stage(name, d, keys, fn, *rest))
    return pipeline


@pytest.fixture
def calls(monkeypatch):
    """Every prompt the LM scores answers after, and every D_ICL pair whose quality bias it computes."""
    import epr.truthfulqa.sets as tqa

    seen = {"prompts": [], "quality": [], "fail_at": None}
    score, quality = tqa.score_prompts, tqa.quality_bias

    def score_prompts(scorer, prompts, targets):
        for prompt in prompts:  # a kill lands inside a chunk, at prompt fail_at
            if seen["fail_at"] is not None and len(seen["prompts"]) + 1 >= seen["fail_at"]:
                raise KeyboardInterrupt("killed")
            seen["prompts"].append(prompt)
        return score(scorer, prompts, targets)

    def quality_bias(scorer, pairs):
        seen["quality"].extend(tuple(p) for p in pairs)
        return quality(scorer, pairs)

    monkeypatch.setattr(tqa, "score_prompts", score_prompts)
    monkeypatch.setattr(tqa, "quality_bias", quality_bias)

    def take():
        out = {k: seen[k] for k in ("prompts", "quality")}
        seen["prompts"], seen["quality"] = [], []
        return out

    seen["take"] = take
    return seen


def tqa_ctx(tmp_path, data_dir, lm, *sets):
    from epr.cli.truthfulqa import CONFIG
    from epr.config import load_config
    from epr.context import Context

    base = [f"run_root={tmp_path / 'runs'}", f"data.data_dir={data_dir}", f"models.lm={lm}", "models.encoder=minilm",
            "ragsys.k=2", "truthfulqa.chunk_size=2"]  # fmt: skip
    return Context(load_config([CONFIG], [*base, *sets]))
