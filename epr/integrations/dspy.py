"""dspy drop-ins backed by a trained (or shipped) EPR retriever. Needs ``pip install "epr[dspy]"``.

dspy passes demonstrations per call (``predictor(..., demos=[...])``); these give every call the demonstrations
our retriever picks for that call's input:

- :class:`EPRPredict`: a ``dspy.Module`` around one ``dspy.Predict`` (any signature).
- :class:`EPRFewShot`: an optimizer in the manner of ``dspy.KNNFewShot``: ``EPRFewShot(retriever, k=4).compile(program)``
  returns a copy of ``program`` whose every predictor gets per-call demonstrations.

Selection is :meth:`epr.api.PromptRetriever.select`: the top-k of the retriever's served mode (``epr``, ``hybrid``
or ``bm25``, as its run's ``select`` stage chose), or RAGSys re-ranking of its shortlist with ``lambda_d`` /
``lambda_b``; demonstrations come in prompt order, the best last (right before the input), as EPR evaluates them.

    import dspy
    from epr.api import PromptRetriever, Selection
    from epr.integrations.dspy import EPRPredict

    parse = EPRPredict("utterance -> parse", PromptRetriever.from_pretrained("my-retriever"), k=4)
    parse(utterance="wake me up at 7").parse
"""

from __future__ import annotations

import copy
import types
from collections.abc import Sequence
from typing import Any

import dspy

from epr.api import PromptRetriever, Selection

__all__ = ["EPRDemos", "EPRPredict", "EPRFewShot"]


class EPRDemos:
    """``demos(query) -> list[dspy.Example]``: the retriever's picks as examples with the signature's field names
    (``input_field`` = the pool's input, ``output_field`` = its output), best last."""

    def __init__(
        self,
        retriever: PromptRetriever,
        **selection: float,
    ):
        """``selection``: ``k``, ``lambda_d``, ``lambda_b``, ``shortlist`` (:class:`epr.api.Selection`)."""
        self.retriever, self.selection = retriever, Selection(**selection)
        self.selection.check(retriever)

    def ids(self, query: str) -> list[int]:
        """Pool ids in prompt order (the best last)."""
        return self.selection.ids(self.retriever, query)[::-1]

    def __call__(self, query: str, input_field: str, output_field: str) -> list[dspy.Example]:
        pool = self.retriever.pool
        return [
            dspy.Example(**{input_field: pool[i].input, output_field: pool[i].output}).with_inputs(
                input_field
            )
            for i in self.ids(query)
        ]


def _fields(signature, input_field: str | None, output_field: str | None) -> tuple[str, str]:
    ins, outs = list(signature.input_fields), list(signature.output_fields)
    i, o = input_field or ins[0], output_field or outs[0]
    if i not in ins or o not in outs:
        raise ValueError(
            f"signature {signature.signature!r} has inputs {ins} and outputs {outs}: not {i!r} -> {o!r}"
        )
    return i, o


class EPRPredict(dspy.Module):
    """``dspy.Predict(signature)`` whose every call gets the retriever's demonstrations for its ``input_field``
    (default: the signature's first input; their outputs fill ``output_field``, default its first output).
    A ``demos=`` passed by the caller wins."""

    def __init__(
        self,
        signature,
        retriever: PromptRetriever,
        input_field: str | None = None,
        output_field: str | None = None,
        selection: Selection | None = None,
        **config: Any,
    ):
        """``k``, ``lambda_d``, ``lambda_b``, ``shortlist`` (or ``selection=Selection(...)``) choose the
        demonstrations; every other keyword goes to ``dspy.Predict``."""
        super().__init__()
        sel, predict_config = Selection.split(config, selection)
        self.predict = dspy.Predict(signature, **predict_config)
        self.input_field, self.output_field = _fields(self.predict.signature, input_field, output_field)
        self.demos = EPRDemos(retriever, **vars(sel))

    def _with_demos(self, kwargs: dict) -> dict:
        if "demos" not in kwargs:
            kwargs["demos"] = self.demos(kwargs[self.input_field], self.input_field, self.output_field)
        return kwargs

    def forward(self, **kwargs):
        return self.predict(**self._with_demos(kwargs))

    async def aforward(self, **kwargs):
        return await self.predict.acall(**self._with_demos(kwargs))


class EPRFewShot(dspy.teleprompt.Teleprompter):
    """An optimizer in the manner of ``dspy.KNNFewShot``, with the trained retriever instead of a frozen
    vectorizer: ``compile(student)`` returns a copy whose every predictor gets, on each call, the demonstrations
    the retriever picks for that call's input. ``fields`` maps a predictor's name to its ``(input, output)`` field
    names (default: its signature's first input and first output). A ``trainset`` given to ``compile`` is added to
    the retriever's pool (encoded, not trained on) as :meth:`epr.api.PromptRetriever.add` does."""

    def __init__(
        self,
        retriever: PromptRetriever,
        fields: dict[str, tuple[str, str]] | None = None,
        **selection: float,
    ):
        self.demos = EPRDemos(retriever, **selection)
        self.fields = dict(fields or {})

    def compile(self, student, *, trainset: Sequence[dspy.Example] | None = None, **_ignored):
        program = copy.deepcopy(student)
        preds = [(name, pred, *_fields(pred.signature, *self.fields.get(name, (None, None))))
                 for name, pred in program.named_predictors()]  # fmt: skip
        r = self.demos.retriever
        have = {(e.input, e.output) for e in r.pool}
        for ex in trainset or ():  # once, whichever predictor's fields it fills, and not twice
            for _, _, i, o in preds:
                if i in ex and o in ex and (str(ex[i]), str(ex[o])) not in have:
                    r.add(ex[i], ex[o])
                    have.add((str(ex[i]), str(ex[o])))
                    break
        for _, pred, i, o in preds:
            _give_demos(pred, self.demos, i, o)
        return program


def _give_demos(pred, demos: EPRDemos, i: str, o: str) -> None:
    """Make every call of ``pred`` (sync or async; one that passes no ``demos=`` of its own) use the retriever's
    picks for that call's input. Bound to ``pred``: a copy of the program (dspy optimizers copy programs) rebinds
    them to the copy."""

    def with_demos(kwargs: dict) -> dict:
        if "demos" not in kwargs and i in kwargs:
            kwargs["demos"] = demos(kwargs[i], i, o)
        return kwargs

    def forward(self, **kwargs):
        return type(self).forward(self, **with_demos(kwargs))

    async def aforward(self, **kwargs):
        return await type(self).aforward(self, **with_demos(kwargs))

    object.__setattr__(pred, "forward", types.MethodType(forward, pred))
    object.__setattr__(pred, "aforward", types.MethodType(aforward, pred))
