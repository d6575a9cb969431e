"""The dspy adapters with the real dspy and its DummyLM: every call gets the demonstrations the retriever picks
for that call's input, as the LM sees them (the prompt's demonstration turns), sync and async."""

import asyncio

from tests.extras import need

dspy = need("dspy")

from dspy.utils.dummies import DummyLM  # noqa: E402

from epr.api import PromptRetriever  # noqa: E402
from epr.integrations.dspy import EPRFewShot, EPRPredict  # noqa: E402


def demo_turns(lm) -> list[tuple[str, str]]:
    """(user, assistant) contents of the demonstration turns of the LM's last prompt (system first, query last)."""
    msgs = lm.history[-1]["messages"]
    turns = msgs[1:-1]
    assert len(turns) % 2 == 0
    return [(turns[j]["content"], turns[j + 1]["content"]) for j in range(0, len(turns), 2)]


def assert_demos(lm, r, ids):
    turns = demo_turns(lm)
    assert len(turns) == len(ids)
    for (user, assistant), i in zip(turns, ids):
        assert r.pool[i].input in user and r.pool[i].output in assistant


def test_every_call_gets_its_own_demonstrations(shipped):
    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    parse = EPRPredict("input -> output", r, k=3)
    lm = DummyLM([{"output": "x"}] * 8)
    seen = []
    with dspy.context(lm=lm):
        for q in queries[:3]:
            assert parse(input=q).output == "x"
            want = r.select(q, 3)[::-1]  # the best last, right before the input
            assert_demos(lm, r, want)
            seen.append(want)
        parse(input=queries[0], demos=[])  # the caller's demos win
        assert demo_turns(lm) == []
    assert len({tuple(s) for s in seen}) > 1  # the demonstrations follow the input


def test_demonstrations_reach_the_lm(shipped):
    """DummyLM(follow_examples=True) answers with the output of a demonstration whose input equals the query: a
    demonstration added to the pool (no retraining) is picked for its own input and its output comes back."""
    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    q = "switch the hallway lamp to purple at dusk"
    r.add(q, "MAGIC-OUTPUT")
    parse = EPRPredict("input -> output", r, k=2)
    with dspy.context(lm=DummyLM([{"output": "wrong"}], follow_examples=True)):
        assert parse(input=q).output == "MAGIC-OUTPUT"


def test_ragsys_lambdas_pass_through(shipped):
    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    parse = EPRPredict("input -> output", r, k=4, lambda_d=0.3, lambda_b=0.5, shortlist=len(r.pool))
    lm = DummyLM([{"output": "x"}])
    with dspy.context(lm=lm):
        parse(input=queries[0])
    want = r.select(queries[0], 4, 0.3, 0.5, len(r.pool))
    assert want != r.select(queries[0], 4)
    assert_demos(lm, r, want[::-1])


class TwoStep(dspy.Module):
    def __init__(self):
        super().__init__()
        self.draft = dspy.Predict("input -> output")
        self.check = dspy.Predict("draft, input -> verdict")

    def forward(self, input):
        d = self.draft(input=input).output
        return self.check(draft=d, input=input)

    async def aforward(self, input):
        d = (await self.draft.acall(input=input)).output
        return await self.check.acall(draft=d, input=input)


def test_optimizer_gives_every_predictor_per_call_demos(shipped):
    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    student = TwoStep()
    program = EPRFewShot(r, k=2, fields={"check": ("input", "verdict")}).compile(student)
    lm = DummyLM([{"output": "y"}, {"verdict": "ok"}] * 4)
    with dspy.context(lm=lm):
        assert program(input=queries[1]).verdict == "ok"
        # the second predictor's demonstrations: the retriever's, under its own field names
        turns = demo_turns(lm)
        want = r.select(queries[1], 2)[::-1]
        assert [r.pool[i].input in u and r.pool[i].output in a for (u, a), i in zip(turns, want)] == [
            True,
            True,
        ]
        assert "[[ ## verdict ## ]]" in turns[0][1]
        student(input=queries[1])  # the student itself is unchanged: no demonstrations
        assert demo_turns(lm) == []

        async def go():
            return await program.acall(input=queries[2])

        assert asyncio.run(go()).verdict == "ok"
        want = r.select(queries[2], 2)[::-1]
        assert_demos_fields = demo_turns(lm)
        assert [r.pool[i].input in u for (u, _), i in zip(assert_demos_fields, want)] == [True, True]


def test_readme_dspy_snippet_runs(shipped, monkeypatch):
    """docs/serving.md's dspy snippet, as written, on the shipped retriever (DummyLM stands in for the LM)."""
    import re
    from pathlib import Path

    path, _ = shipped
    readme = (Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    code = re.search(r"```python\n(# dspy\n.*?)```", readme, re.S).group(1)
    code = code.replace('"my-retriever"', repr(str(path)))
    with dspy.context(lm=DummyLM([{"parse": "[IN:CREATE_ALARM ]"}] * 4)):
        ns: dict = {}
        exec(code, ns)
    assert ns["result"].parse == "[IN:CREATE_ALARM ]"


def test_copies_of_a_compiled_program_are_their_own_and_a_trainset_is_added_once(shipped):
    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    n = len(r.pool)
    train = [dspy.Example(input="dim the porch light", output="[dim porch]").with_inputs("input")]
    opt = EPRFewShot(r, k=2)
    program = opt.compile(TwoStep(), trainset=train)
    opt.compile(TwoStep(), trainset=train)
    assert len(r.pool) == n + 1  # once, though two predictors and two compiles saw it
    twin = program.deepcopy()  # what dspy's optimizers do with programs
    twin.draft.signature = twin.draft.signature.with_instructions("TWIN-INSTRUCTIONS")
    lm = DummyLM([{"output": "y"}, {"verdict": "ok"}])
    with dspy.context(lm=lm):
        twin(input=queries[0])
    first = lm.history[0]["messages"]
    assert "TWIN-INSTRUCTIONS" in first[0]["content"]  # the copy's own predictor ran
    assert len(first) == 2 + 2 * 2  # with its per-call demonstrations


def test_demonstrations_follow_the_served_mode(shipped):
    """A retriever serving BM25 (its run's select stage chose it) gives dspy BM25's picks, best last."""
    from epr.retrieval.retrievers import BM25Retriever
    from epr.types import Example

    path, queries = shipped
    r = PromptRetriever.from_pretrained(path)
    r.mode = "bm25"
    bm25 = BM25Retriever(r.pool, "input", "bm25s")
    parse = EPRPredict("input -> output", r, k=3)
    lm = DummyLM([{"output": "x"}] * 4)
    with dspy.context(lm=lm):
        for q in queries[:3]:
            parse(input=q)
            assert_demos(lm, r, bm25.retrieve([Example(-1, q, "", {})], 3).ids[0][::-1].tolist())
