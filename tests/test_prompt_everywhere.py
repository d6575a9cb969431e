"""One prompt, both modes: for the same query and demonstrations, the prompt the labels scored, the prompt select
scores, the prompt evaluated, ``PromptRetriever.retrieve().prompt``, the exported retriever's and LangChain's are
byte-identical, raw (own templates) and chat (the LM's chat template); a changed template changes every one of
them and re-keys the stages from ``scores`` on, not the candidates (negative control)."""

from __future__ import annotations

import json

import pytest

from epr import pipeline
from epr.api import PromptRetriever
from epr.cli import main
from epr.context import Context
from epr.lm.factory import score_cache
from epr.stages.prompts import prompt_maker
from epr.stages.scores import scored_pairs

from .test_own_data import own_config

pytest.importorskip("langchain_core")

RAW = [  # a user's own raw template
    f"prompt.{k}={json.dumps(v)}"
    for k, v in {
        "instruction": "Map each question to its call {verb(object)}.\n",  # plain text: braces as they are
        "demo": "Q: {input}\nA: {output}\n\n",
        "query": "Q: {input}\nA:",
        "target": " {output}\n",
    }.items()
]
CHAT = ["prompt.chat=true"]  # few-shot as multi-turn, the template's default system message


def build(tmp_path, minilm_dir, lm, name, sets) -> Context:
    ctx = Context(
        own_config(
            tmp_path,
            minilm_dir,
            f"models.lm={lm}",
            "models.dtype=fp32",
            "labels.source=lm",
            "retrieve.retrievers=[epr]",
            "retrieve.k=3",
            "retrieve.max_demos=3",
            "retrieve.prompt_budget=400",  # every retrieved demonstration fits: LangChain's k are the prompt's
            "retrieve.answer_reserve=8",
            "generate.max_new_tokens=3",
            f"name={name}",
            *sets,
        )
    )
    pipeline.run(ctx, until="evaluate")
    return ctx


def as_dicts(messages) -> list[dict]:
    roles = {"system": "system", "human": "user", "ai": "assistant"}
    return [{"role": roles[m.type], "content": m.content} for m in messages]


def prompts_everywhere(ctx: Context, tmp_path) -> list[str]:
    """The evaluated prompts of the run's ``epr`` rows, after checking that every other path renders each the same."""
    from epr.integrations.langchain import few_shot_prompt

    fmt = ctx.prompt(inference=True)
    pool, ev = ctx.examples("pool"), {e.idx: e for e in ctx.examples("eval")}
    # the labels: every scored (demonstration, query) pair is the format's rendering, and the score store holds it
    ranks = ctx.rankings("candidates", "candidates.jsonl")
    _, contexts, targets, _ = scored_pairs(ctx.prompt(), pool, ranks)
    r0 = ranks[0]
    assert contexts[0] == fmt.render([pool[r0.ids[0]]], pool[r0.qid]) and targets[0] == fmt.target(
        pool[r0.qid]
    )
    assert None not in score_cache(ctx.cfg).get(contexts, targets)
    run = ctx.cfg.run_dir
    api = PromptRetriever.from_run(run)
    out = tmp_path / f"exported-{ctx.cfg.prompt.chat}"
    assert (
        main(["export", "--set", f"run_root={ctx.cfg.run_root}", "--set", f"name={ctx.cfg.name}", str(out)])
        == 0
    )
    shipped = PromptRetriever.from_pretrained(out)
    assert ("Prompt format: chat" if fmt.chat else "Prompt format: raw text") in (
        out / "README.md"
    ).read_text()
    make = prompt_maker(ctx)  # what select and the prompts stage build prompts with
    texts = []
    for row in map(json.loads, (ctx.stage_dir("prompts") / "epr.jsonl").open()):
        e, demos = ev[row["idx"]], [pool[i] for i in reversed(row["demo_ids"])]
        text = row["text"]
        assert len(demos) == 3 and text == fmt.render(demos, e) == make(e, row["demo_ids"]).text
        for r in (api, shipped):
            res = r.retrieve(e.input)
            assert res.prompt == text and res.prompt_demos == 3
            if fmt.chat:
                assert (
                    fmt.tok.apply_chat_template(res.messages, tokenize=False, add_generation_prompt=True)
                    == text
                )
        lc = few_shot_prompt(shipped, k=3)
        if fmt.chat:
            msgs = as_dicts(lc.format_messages(input=e.input))
            assert msgs == shipped.retrieve(e.input).messages
            assert fmt.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == text
        else:
            assert lc.format(input=e.input) == text
        texts.append(text)
    return texts


def test_one_prompt_from_the_labels_to_langchain(tmp_path, minilm_dir, tiny_chat_lm_dir):
    runs = tmp_path / "runs"  # the run root; the exports go beside it (never into a run root)
    runs.mkdir()
    raw = build(runs, minilm_dir, tiny_chat_lm_dir, "raw", RAW)
    chat = build(runs, minilm_dir, tiny_chat_lm_dir, "chat", CHAT)
    t_raw, t_chat = prompts_everywhere(raw, tmp_path), prompts_everywhere(chat, tmp_path)
    assert all(t.startswith("Map each question to its call {verb(object)}.\nQ: ") for t in t_raw)
    assert all(t.startswith("[CLS]system\nyou parse commands[SEP]\n[CLS]user\n") for t in t_chat)
    # the negative control: the other template changes every prompt, and the keys from scores on, not the candidates
    assert not set(t_raw) & set(t_chat)
    fp = {
        n: (pipeline.stage_fingerprint(raw, n), pipeline.stage_fingerprint(chat, n)) for n in pipeline.STAGES
    }
    for n in ("scores", "labels", "encoder", "retrieve", "prompts", "predict", "evaluate"):
        assert fp[n][0] != fp[n][1], n
    assert fp["candidates"][0] == fp["candidates"][1] and fp["examples"][0] == fp["examples"][1]
    # chat generation stops at the template's end of turn: no prediction holds the marker
    preds = [json.loads(x)["prediction"] for x in (chat.stage_dir("predict") / "epr.jsonl").open()]
    assert preds and not any("[SEP]" in p or "[CLS]" in p for p in preds)
    # arm X of results/mtop-chat-prompt: the raw-label encoder serving the chat run's prompts (the script's compare)
    from epr.stages.dense_metric import DenseMetric
    from scripts.cross_format_rows import compare, serving_with

    fmt, pool = chat.prompt(inference=True), chat.examples("pool")
    ev = {e.idx: e for e in chat.examples("eval")}
    raw_rows = [json.loads(x) for x in (raw.stage_dir("prompts") / "epr.jsonl").open()]
    crossed = DenseMetric(chat).prompts(serving_with(chat, raw.cfg.run_dir), "epr")
    assert crossed == [fmt.render([pool[i] for i in reversed(r["demo_ids"])], ev[r["idx"]]) for r in raw_rows]
    x = compare(chat, raw.cfg.run_dir, ["epr"])
    same = compare(chat, chat.cfg.run_dir, ["epr"])  # negative control: the run's own encoder on both sides
    assert same["rows"]["own:epr"] == same["rows"]["cross:epr"] == x["rows"]["own:epr"]
    assert (
        same["tests"]["cross:epr vs own:epr"]["gain"] == 0.0
        and x["encoders"]["own"] != x["encoders"]["cross"]
    )
    # its per-example rows, as `epr experiment check` reads them, are the summary's values
    from epr.experiments.compare_rows import load_per_query
    from scripts.cross_format_rows import write_rows

    files = write_rows(x, chat.cfg.run_dir / "x-rows")
    for f, side in zip(files, ("cross", "own")):
        back = load_per_query(f, "epr")
        assert (
            back["idx"] == x["idx"]
            and back["per_query_logprob"] == x["rows"][f"{side}:epr"]["per_query_logprob"]
        )
        assert back["correct"] == [float(c) for c in x["rows"][f"{side}:epr"]["correct"]]
