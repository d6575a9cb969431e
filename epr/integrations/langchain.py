"""LangChain drop-ins backed by a trained (or shipped) EPR retriever. Needs ``pip install "epr[langchain]"``.

- :class:`EPRExampleSelector`: a ``BaseExampleSelector`` for ``FewShotPromptTemplate``: the retriever's served mode
  (``epr``: the query tower; ``hybrid``: it fused with BM25; ``bm25``) finds the demonstrations, optionally
  re-ranked by RAGSys (Algorithm 1: ``lambda_d`` diversity, ``lambda_b`` quality bias,
  passed through, unlike LangChain's own MMR selector). ``add_example`` encodes and indexes a new demonstration
  without retraining.
- :func:`few_shot_prompt`: the whole LangChain prompt in the retriever's own format, so LangChain sends what the
  labels scored: a ``FewShotPromptTemplate`` (raw text) or a ``ChatPromptTemplate`` holding a
  ``FewShotChatMessagePromptTemplate`` (chat: each demonstration a human and an AI message), both around an
  :class:`EPRExampleSelector`.
- :class:`EPREmbeddings`: ``Embeddings`` whose ``embed_query`` is the query tower and ``embed_documents`` the
  demonstration tower, so any LangChain vector store can serve the trained dual encoder (the dense encoder
  whatever the retriever's mode: a vector store has no BM25).

    from langchain_core.prompts import FewShotPromptTemplate, PromptTemplate
    from epr.api import PromptRetriever, Selection
    from epr.integrations.langchain import EPRExampleSelector

    selector = EPRExampleSelector(PromptRetriever.from_pretrained("my-retriever"), k=4, lambda_d=0.75)
    prompt = few_shot_prompt(PromptRetriever.from_pretrained("my-retriever"), k=4)
    prompt.format(input="wake me up at 7")   # a chat retriever: prompt.format_messages(input=...)
"""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings
from langchain_core.example_selectors import BaseExampleSelector

from epr.api import PromptRetriever, Selection
from epr.types import Example

__all__ = ["EPRExampleSelector", "EPREmbeddings", "few_shot_prompt"]


def _escape(text: str) -> str:
    """``text`` as a LangChain f-string template that renders it literally."""
    return text.replace("{", "{{").replace("}", "}}")


class EPRExampleSelector(BaseExampleSelector):
    """Select few-shot examples with a trained EPR retriever (and RAGSys re-ranking).

    ``lambda_d`` = ``lambda_b`` = 1 (the default) is the top-k of the retriever's served mode
    (:attr:`epr.api.PromptRetriever.mode`: ``epr``, ``hybrid`` or ``bm25``, as its run's ``select`` stage chose).
    Otherwise that mode's ``shortlist`` best are re-ranked by Algorithm 1 (SPEC 3.1) with the pool's quality bias (``lambda_b`` < 1
    needs one: a retriever exported from a run that computed it). Examples come back in prompt order: the best
    last, right before the query, as EPR builds and evaluates its prompts (``order="best_first"`` reverses).
    """

    def __init__(
        self,
        retriever: PromptRetriever,
        input_keys: tuple[str, ...] = ("input",),
        output_key: str = "output",
        order: str = "best_last",
        escape: bool = False,
        **selection: float,
    ):
        """``selection``: ``k``, ``lambda_d``, ``lambda_b``, ``shortlist`` (:class:`epr.api.Selection`).
        ``escape``: double the braces of the examples' texts, for a ``FewShotPromptTemplate`` (which formats the
        joined examples once more as a template) so that a row's braces reach the prompt as they are."""
        if order not in ("best_last", "best_first"):
            raise ValueError(f"order={order!r}: best_last or best_first")
        self.retriever, self.selection = retriever, Selection(**selection)
        self.selection.check(retriever)
        self.input_keys, self.output_key, self.order = tuple(input_keys), output_key, order
        self.escape = escape

    def _query(self, input_variables: dict[str, Any]) -> str:
        missing = [k for k in self.input_keys if k not in input_variables]
        if missing:
            raise KeyError(f"input variables lack {missing} (input_keys={list(self.input_keys)})")
        return " ".join(str(input_variables[k]) for k in self.input_keys)

    def select_ids(self, query: str) -> list[int]:
        """Pool ids, best first (:meth:`epr.api.PromptRetriever.select`)."""
        return self.selection.ids(self.retriever, query)

    def select_examples(self, input_variables: dict[str, Any]) -> list[dict]:
        ids = self.select_ids(self._query(input_variables))
        if self.order == "best_last":
            ids = ids[::-1]
        pool, cols, esc = (
            self.retriever.pool,
            self.retriever.prompt_config.columns(),
            _escape if self.escape else str,
        )
        return [
            {
                self.input_keys[0]: esc(pool[i].input),
                self.output_key: esc(pool[i].output),
                **{c: esc(str(pool[i].meta.get(c, ""))) for c in cols},
            }
            for i in ids
        ]

    def add_example(self, example: dict[str, str]) -> str:
        """Encode ``example`` with the demonstration tower and add it to the pool and index (no retraining)."""
        return str(self.retriever.add(example[self.input_keys[0]], example[self.output_key]))


class EPREmbeddings(Embeddings):
    """The trained dual encoder as LangChain ``Embeddings``: queries through the query tower, documents (the
    demonstrations, as :meth:`document` writes them) through the demonstration tower. It embeds with the trained
    towers whatever the retriever's served mode (``hybrid`` and ``bm25`` fuse or replace the dense ranking inside
    :meth:`~epr.api.PromptRetriever.select`; embeddings have no BM25 part): use :class:`EPRExampleSelector` to
    serve the selected retriever."""

    def __init__(self, retriever: PromptRetriever):
        self.retriever = retriever

    def document(self, example: dict[str, str], input_key: str = "input", output_key: str = "output") -> str:
        """A demonstration's text exactly as the demonstration tower saw it in training."""
        return self.retriever.encoder.demo(
            self.retriever.task, Example(-1, example[input_key], example[output_key], {})
        )

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.retriever.encoder.encode(list(texts), "prompt").tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.retriever.encoder.encode([text], "query")[0].tolist()


def few_shot_prompt(retriever: PromptRetriever, **selection: float):
    """The LangChain prompt of ``retriever``'s own format (its run's ``prompt`` section) around an
    :class:`EPRExampleSelector` (``selection``: ``k``, ``lambda_d``, ``lambda_b``, ``shortlist``): raw, a
    ``FewShotPromptTemplate`` whose ``format(input=...)`` is ``retriever.retrieve(...).prompt`` for the same
    demonstrations; chat, a ``ChatPromptTemplate`` (system message where the run set one, the demonstrations as
    human / AI messages, the query) whose ``format_messages(input=...)`` are ``retrieve(...).messages``. A task
    with a format of its own (TruthfulQA's) and a chat format with an instruction or with every demonstration in one
    user turn have no such LangChain template: a ``ValueError`` says so."""
    from langchain_core.prompts import (
        ChatPromptTemplate,
        FewShotChatMessagePromptTemplate,
        FewShotPromptTemplate,
        PromptTemplate,
    )

    from epr.tasks.base import Task

    fmt, cfg = retriever.format, retriever.prompt_config
    own = (
        type(retriever.task).format_demo is Task.format_demo
        and type(retriever.task).format_query is Task.format_query
    )
    if not fmt.chat:
        if not own and (cfg.demo is None or cfg.query is None):
            raise ValueError(
                f"task {retriever.task.name} writes its own prompt format: no LangChain template for it"
            )
        selector = EPRExampleSelector(retriever, escape=True, **selection)
        return FewShotPromptTemplate(
            example_selector=selector,
            example_prompt=PromptTemplate.from_template(cfg.demo or "{input}\t{output}\n"),
            prefix=_escape(cfg.instruction or ""),
            suffix=cfg.query or "{input}\t",
            example_separator="",
            input_variables=["input"],
        )
    if cfg.instruction or not cfg.multiturn:
        raise ValueError(
            "few_shot_prompt: a chat format with prompt.instruction or prompt.multiturn=false has no LangChain "
            "template (LangChain's few-shot chat messages are one human and one AI turn each); use "
            "PromptRetriever.retrieve(...).messages"
        )
    turn = ChatPromptTemplate.from_messages(
        [("human", cfg.query or "{input}"), ("ai", cfg.target or "{output}")]
    )
    few = FewShotChatMessagePromptTemplate(
        example_selector=EPRExampleSelector(retriever, **selection),
        example_prompt=turn,
        input_variables=["input"],
    )
    system = [] if cfg.system is None else [("system", _escape(cfg.system))]
    return ChatPromptTemplate.from_messages([*system, few, ("human", cfg.query or "{input}")])
