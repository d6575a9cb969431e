"""The prompt section and its one renderer (epr.prompt): checked at load, rows inserted literally, the task's own
format (and every shipped config's fingerprints) unchanged by default, chat prompts counted token-exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from epr import pipeline
from epr.config import load_config
from epr.context import Context
from epr.prompt import PromptFormat
from epr.retrieval.prompt_budget import build_prompt
from epr.tasks import get_task
from epr.types import ConfigError, Example

ROOT = Path(__file__).resolve().parents[1]
FINGERPRINTS = Path(__file__).parent / "data" / "stage_fingerprints_fp32.json"


def kv(field: str, value: str) -> str:
    """``--set prompt.<field>=<value>`` with the value as a YAML double-quoted string (escapes as in JSON)."""
    return f"prompt.{field}={json.dumps(value)}"


def fmt_for(*sets: str, tok=None) -> PromptFormat:
    cfg = load_config([], ["data.task=demo", *sets])
    return PromptFormat(get_task(cfg.data), cfg.prompt, tok)


@pytest.fixture(scope="module")
def chat_tok(tiny_chat_lm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_chat_lm_dir)


@pytest.mark.parametrize(
    "sets, says",
    [
        (["prompt.demo_template=x"], "unknown key(s) ['demo_template']"),  # an unknown field
        (["prompt.query='Q: {question}'"], "has no {input}"),
        (["prompt.demo='{input} then'"], "has no {output}"),
        (["prompt.target='{input} {output}'"], "names {input}"),
        (["prompt.query='{input} {'"], "not a template"),
        (["prompt.query='{input!r}'"], "not a field"),
        (["prompt.query='{input[0]}'"], "not a field"),
        (["prompt.system=be brief"], "needs a chat model"),
    ],
)
def test_a_bad_prompt_section_is_an_error_naming_the_key(sets, says):
    with pytest.raises(ConfigError, match="prompt") as e:
        load_config([], sets)
    assert says in str(e.value)


def test_the_default_format_is_the_tasks_own():
    f = fmt_for()
    task = f.task
    pool = [Example(i, f"in {i}", f"out {i}") for i in range(3)]
    assert f.render(pool[:2], pool[2]) == task.format_demo(pool[0]) + task.format_demo(pool[1]) + "in 2\t"
    assert f.target(pool[2]) == "out 2\n" and f.stop == "\n"
    assert f.is_default and f.key() is None
    # negative control: the same text written as a template is the same format, keyed apart only by its fields
    g = fmt_for(kv("demo", "{input}\t{output}\n"))
    assert g.render(pool[:2], pool[2]) == f.render(pool[:2], pool[2]) and g.key() is not None


PIECES = [*"ab {}\n\t\\", "{output}", "{input}", "{{", "}}", "<|im_end|>", "[SEP]", "[CLS]user\n"]
TEXT = (
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=8)
    .map("".join)
    .map(lambda s: s if s.strip() else "x" + s)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(TEXT, TEXT), min_size=2, max_size=4))
def test_row_text_is_inserted_literally(rows, chat_tok):
    """Braces, ``{output}``, newlines and chat markup in a row never act as a template: each row's text appears
    verbatim where its field stands, and the template's own text is unchanged around it."""
    ex = [Example(i, a, b) for i, (a, b) in enumerate(rows)]
    raw = fmt_for(kv("instruction", "Parse {this}:\n"), kv("demo", "Q: {input}\nA: {output}\n\n"),
                  kv("query", "Q: {input}\nA:"), kv("target", " {output}\n"))  # fmt: skip
    want = (
        "Parse {this}:\n"
        + "".join(f"Q: {e.input}\nA: {e.output}\n\n" for e in ex[:-1])
        + f"Q: {ex[-1].input}\nA:"
    )
    assert raw.render(ex[:-1], ex[-1]) == want
    assert raw.target(ex[-1]) == f" {ex[-1].output}\n"
    chat = fmt_for("prompt.chat=true", "prompt.system=''", tok=chat_tok)
    msgs = chat.messages(ex[:-1], ex[-1])
    assert [m["content"] for m in msgs] == [
        "",
        *[t for e in ex[:-1] for t in (e.input, e.output)],
        ex[-1].input,
    ]
    body = "".join(f"[CLS]user\n{e.input}[SEP]\n[CLS]assistant\n{e.output}[SEP]\n" for e in ex[:-1])
    assert (
        chat.render(ex[:-1], ex[-1])
        == f"[CLS]system\n[SEP]\n{body}[CLS]user\n{ex[-1].input}[SEP]\n[CLS]assistant\n"
    )
    assert chat.target(ex[-1]) == ex[-1].output + "[SEP]" and chat.stop == "[SEP]"


def test_chat_mode_uses_the_templates_default_system_message_and_one_turn_on_request(chat_tok):
    ex = [Example(0, "a", "b"), Example(1, "c", "d")]
    f = fmt_for("prompt.chat=true", tok=chat_tok)
    assert f.render(ex[:1], ex[1]).startswith("[CLS]system\nyou parse commands[SEP]\n[CLS]user\na[SEP]")
    one = fmt_for("prompt.chat=true", "prompt.multiturn=false", kv("instruction", "Parse.\n"), tok=chat_tok)
    assert one.messages(ex[:1], ex[1]) == [{"role": "user", "content": "Parse.\na\tb\nc\t"}]
    with pytest.raises(ConfigError, match="no chat template"):
        fmt_for("prompt.chat=true")  # a tokenizer without a template (none given)


def test_own_data_columns_are_template_fields(tmp_path):
    f = fmt_for(kv("demo", "[{lang}] {input} => {output}\n"), kv("query", "[{lang}] {input} =>"))
    assert f.columns == ("lang",)
    ex = Example(0, "hi", "salut", {"lang": "fr", "source": "rows.csv:2"})
    assert f.demo_text(ex) == "[fr] hi => salut\n"
    with pytest.raises(Exception, match=r"rows.csv:3.*\{lang\}"):
        f.demo_text(Example(1, "hi", "x", {"source": "rows.csv:3"}))


def test_chat_budget_packing_is_token_exact(chat_tok):
    f = fmt_for("prompt.chat=true", tok=chat_tok)
    pool = [Example(i, f"turn the light {i} on please", f"[IN:ON {i} ]") for i in range(12)]
    q = Example(99, "turn the den light on", "")

    def count(s):
        return len(chat_tok(s, add_special_tokens=False)["input_ids"])

    for budget in (30, 60, 90, 140):
        p = build_prompt(f, q, list(range(12)), pool, count, budget, 8, 16)
        assert p.text == f.render([pool[i] for i in reversed(p.demo_ids)], q)
        assert p.n_tokens == count(p.text) + 8 <= budget or p.status == "query_too_long"
        if p.status == "ok" and len(p.demo_ids) < 12:  # the next demonstration would not have fit
            nxt = [pool[i] for i in reversed([*p.demo_ids, len(p.demo_ids)])]
            assert count(f.render(nxt, q)) + 8 > budget


# the keys' machine-dependent settings fixed (fp32 LM, bf16 training), so any machine computes the same keys; the
# demo config is left out: its examples key names the packaged data file by where the package is installed
FIXED = ["models.dtype=fp32", "train.mixed_precision=bf16"]


# stages added after the fingerprints were committed (issue 74: the reward model and its teacher stage)
NEW_STAGES = {"reward", "teacher"}


def shipped_fingerprints() -> dict:
    out = {}
    for c in sorted((ROOT / "configs").glob("*.yaml")):
        if c.name == "demo.yaml":
            continue
        extra = ["data.data_dir=../shared/data"]
        cfg = load_config([str(c)], [*FIXED, *extra])
        out[c.name] = {n: pipeline.stage_fingerprint(Context(cfg), n) for n in pipeline.STAGES}
    return out


def test_every_shipped_config_keeps_its_fingerprints(monkeypatch):
    """Each stage fingerprint of every shipped config (with :data:`FIXED`, as any machine computes it) is the one it
    had before the prompt section existed (``tests/data/stage_fingerprints_fp32.json``, computed by 5c556a8's code);
    the demo config's pipeline stage keys hold no prompt entry."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    got, want = shipped_fingerprints(), json.loads(FINGERPRINTS.read_text())
    assert set(got) == set(want)
    for c in want:  # every stage that existed keeps its fingerprint; a stage added since is named here
        assert set(got[c]) - set(want[c]) == NEW_STAGES, c
        assert {n: got[c][n] for n in want[c]} == want[c], c
    demo = Context(load_config([str(ROOT / "configs/demo.yaml")], FIXED))
    keys = {n: json.dumps(pipeline.STAGES[n].keys(demo)) for n in pipeline.STAGES if not n.startswith("tqa_")}
    assert not [n for n, k in keys.items() if '"prompt":' in k]  # (TruthfulQA's stages key their own format)


def test_a_changed_template_rekeys_from_scores_on_but_not_the_candidates(chat_tok, tiny_chat_lm_dir):
    sets = ["data.task=demo", "models.dtype=fp32", f"models.lm={tiny_chat_lm_dir}"]
    base = Context(load_config([], sets))
    for change in (kv("query", "Q: {input}\tA:"), "prompt.chat=true", "prompt.instruction=Parse."):
        other = Context(load_config([], [*sets, change]))
        same = {
            n
            for n in pipeline.STAGES
            if pipeline.stage_fingerprint(base, n) == pipeline.stage_fingerprint(other, n)
        }
        assert {
            "scores",
            "labels",
            "encoder",
            "retrieve",
            "prompts",
            "predict",
            "select",
            "evaluate",
        }.isdisjoint(same)
        assert {"examples", "dr-bm25"} <= same  # no prompt is rendered there
        first, first_other = base.rounds()[0], other.rounds()[0]
        assert pipeline.stage_fingerprint(first, "candidates") == pipeline.stage_fingerprint(
            first_other, "candidates"
        )
        assert pipeline.stage_fingerprint(first, "scores") != pipeline.stage_fingerprint(
            first_other, "scores"
        )


def test_truthfulqa_refuses_a_prompt_section():
    with pytest.raises(ConfigError, match="TruthfulQA"):
        Context(load_config([str(ROOT / "configs/truthfulqa.yaml")], ["prompt.chat=true"]))
    Context(
        load_config([str(ROOT / "configs/truthfulqa.yaml")], [])
    )  # negative control: no section, no error


def test_own_data_keeps_the_columns_its_templates_name(tmp_path):
    from .test_own_data import write_csv

    rows = [(f"question {i}", f"ANSWER({i})", "fr" if i % 2 else "en") for i in range(20)]
    path = write_csv(tmp_path / "rows.csv", rows, header=("question", "answer", "lang"))
    sets = ["data.task=jsonl", f"data.path={path}", "data.input_field=question", "data.output_field=answer"]
    ctx = Context(load_config([], [*sets, kv("query", "({lang}) {input} =>")]))
    pool, _ = ctx.task.load()
    assert all(e.meta["lang"] in ("en", "fr") for e in pool)
    assert ctx.prompt().render([], pool[0]) == f"({pool[0].meta['lang']}) {pool[0].input} =>"
    plain = Context(load_config([], sets))
    assert (
        "lang" not in plain.task.load()[0][0].meta
    )  # negative control: a column no template names is not kept
    keys = pipeline.STAGES["examples"].keys
    assert keys(ctx)["columns"] == ["lang"] and "columns" not in keys(plain)
