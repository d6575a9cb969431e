"""The one prompt renderer: demonstrations and a query as the text the LM reads, and the answer it is scored on.

Every prompt of a run goes through :class:`PromptFormat`: the labels (``scores``: context and target), the LM
oracle, RAGSys's quality bias, ``select``, the ``prompts`` stage's budget packing, generation and the gold
log-prob, ``PromptRetriever.retrieve()``, an exported retriever and the LangChain and dspy integrations. A run's
format is its ``prompt`` section (:class:`epr.config.prompt.PromptConfig`) over its task:

- **raw** (default): ``instruction + demo(e_L') + ... + demo(e_1) + query(x)``, the answer ``target(y)`` ending at the
  task's stop. With every field null this is the task's own ``format_demo`` / ``format_query`` / ``format_target``
  (the EPR paper's ``input<TAB>output<NEWLINE>``), so such a run keys and renders as before the section existed.
- **chat**: the messages ``[system?] + (user: query(e), assistant: target(e)) per demonstration + (user: query(x))``
  (or every demonstration and the query in one user turn) through the LM's own chat template with the generation
  prompt (transformers' ``apply_chat_template``); the answer is ``target(y)`` followed by the template's end of
  turn, which is also where generation stops.

A row's text is inserted literally: braces, ``{output}`` or chat markup inside a row never act as a template.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from os.path import commonprefix
from typing import Any

from epr.config.prompt import PromptConfig, parse_template
from epr.types import ConfigError, Example, InputError

__all__ = ["PromptFormat", "end_of_turn", "as_format", "config_from_spec"]

_REPLY = (
    "\u2063EPR-REPLY\u2063"  # a text no chat template writes: marks where an assistant turn's content sits
)
_QUERY = "\u2063EPR-QUERY\u2063"


def end_of_turn(tok) -> str:
    """The text a chat template writes right after an assistant turn's content (``<|im_end|>`` for ChatML): where a
    reply ends, so the scored answer ends with it and generation stops there. The tokenizer's end-of-sequence token
    where the template writes nothing there."""
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _REPLY}]
    after = tok.apply_chat_template(msgs, tokenize=False).split(_REPLY, 1)[1].strip()
    eot = after.split()[0] if after else (tok.eos_token or "")
    if not eot:
        raise ConfigError(
            "config prompt.chat: the LM's chat template writes nothing after an assistant turn and the tokenizer "
            "has no end-of-sequence token, so a reply has no end; use a chat model's tokenizer or prompt.chat=false"
        )
    return eot


class PromptFormat:
    """A run's prompt format (see the module's docstring). ``tokenizer``: the LM's, whose chat template renders
    chat mode (needed only there)."""

    def __init__(self, task, cfg: PromptConfig | None = None, tokenizer=None):
        self.task, self.cfg = task, cfg or PromptConfig()
        c = self.cfg
        self.chat, self.columns = c.chat, c.columns()
        self._tpl = {
            k: parse_template(getattr(c, k), f"prompt.{k}")
            for k in ("demo", "query", "target")
            if getattr(c, k) is not None
        }
        if self.chat and self.cfg.multiturn:
            self._tpl.setdefault("query", parse_template("{input}", "prompt.query"))
        if self.chat:
            self._tpl.setdefault("target", parse_template("{output}", "prompt.target"))
            if tokenizer is None or not getattr(tokenizer, "chat_template", None):
                raise ConfigError(
                    "config prompt.chat=true: the LM's tokenizer has no chat template (a base model's, or none "
                    "given); use a chat model, or prompt.chat=false with your own prompt.demo / query / target"
                )
            self.tok = tokenizer
            self.template = tokenizer.chat_template
            self.stop = end_of_turn(tokenizer)
        else:
            self.tok, self.template, self.stop = None, None, task.stop

    # ---- the pieces ----------------------------------------------------------------------------
    def _fields(self, ex: Example) -> dict[str, str]:
        vals = {"input": ex.input, "output": ex.output}
        for col in self.columns:
            if col not in ex.meta:
                raise InputError(
                    f"{ex.meta.get('source', f'row {ex.idx}')}: the prompt templates name {{{col}}}, which this "
                    f"row does not have (its fields: input, output{''.join(', ' + k for k in ex.meta if k != 'source')})"
                )
            v = ex.meta[col]  # as the data file held it: a text as it is, anything else as JSON writes it
            vals[col] = v if isinstance(v, str) else "" if v is None else json.dumps(v, ensure_ascii=False)
        return vals

    def _fill(self, name: str, ex: Example) -> str:
        vals = self._fields(ex)
        return "".join(lit + (vals[f] if f else "") for lit, f in self._tpl[name])

    def demo_text(self, ex: Example) -> str:
        """A demonstration as one piece of text (raw mode; chat mode where one user turn holds them all)."""
        return self._fill("demo", ex) if "demo" in self._tpl else self.task.format_demo(ex)

    def query_text(self, ex: Example) -> str:
        """The query's text: right before the answer (raw), or its user turn's content (chat)."""
        if "query" in self._tpl:
            return self._fill("query", ex)
        return self.task.format_query(ex.input)

    def reply_text(self, ex: Example) -> str:
        """The answer's text: with its stop (raw), or an assistant turn's content (chat)."""
        return self._fill("target", ex) if "target" in self._tpl else self.task.format_target(ex.output)

    def target(self, ex: Example) -> str:
        """What is scored (and what greedy generation should reproduce) after the prompt: the answer, then the
        stop (raw: the task's, part of the target template) or the chat template's end of turn."""
        return self.reply_text(ex) + (self.stop if self.chat else "")

    # ---- whole prompts -------------------------------------------------------------------------
    def messages(self, demos: Sequence[Example], query: Example) -> list[dict[str, str]]:
        """The chat messages (role, content) of a prompt, demonstrations in prompt order (the best last)."""
        if not self.chat:
            return [{"role": "user", "content": self.render(demos, query)}]
        instr = self.cfg.instruction or ""
        msgs = [] if self.cfg.system is None else [{"role": "system", "content": self.cfg.system}]
        if not self.cfg.multiturn:
            text = instr + "".join(self.demo_text(d) for d in demos) + self.query_text(query)
            return [*msgs, {"role": "user", "content": text}]
        for i, d in enumerate(demos):
            msgs.append({"role": "user", "content": (instr if i == 0 else "") + self.query_text(d)})
            msgs.append({"role": "assistant", "content": self.reply_text(d)})
        msgs.append({"role": "user", "content": (instr if not demos else "") + self.query_text(query)})
        return msgs

    def render(self, demos: Sequence[Example], query: Example | str) -> str:
        """The prompt's text: everything the LM reads before the answer (demonstrations in prompt order)."""
        query = self.as_query(query)
        if not self.chat:
            return (
                (self.cfg.instruction or "")
                + "".join(self.demo_text(d) for d in demos)
                + self.query_text(query)
            )
        return self.tok.apply_chat_template(
            self.messages(demos, query), tokenize=False, add_generation_prompt=True
        )

    def shared_prefix(self, demo: Example, query: Example) -> str:
        """The start of ``render([demo], query)`` that does not depend on the query (label scoring computes it
        once for every query it precedes): the demonstration's own text in the default format."""
        if not self.chat and not self.cfg.instruction:
            return self.demo_text(demo)
        full = self.render([demo], query)
        other = self.render([demo], Example(query.idx, _QUERY, query.output, query.meta))
        return commonprefix([full, other])

    @staticmethod
    def as_query(query: Example | str) -> Example:
        return query if isinstance(query, Example) else Example(-1, query, "")

    # ---- identity ------------------------------------------------------------------------------
    @property
    def is_default(self) -> bool:
        """Whether this is the task's own format (then stages key as before the prompt section existed)."""
        return self.cfg == PromptConfig()

    def spec(self) -> dict[str, Any]:
        """The format as plain data: the ``prompt`` section, and in chat mode the chat template and its end of turn
        (what an exported retriever stores, so it renders exactly what the run scored)."""
        out: dict[str, Any] = {k: getattr(self.cfg, k) for k in PromptConfig.__dataclass_fields__}
        if self.chat:
            out["chat_template_sha256"] = hashlib.sha256(self.template.encode()).hexdigest()
            out["end_of_turn"] = self.stop
        return out

    def key(self) -> dict[str, Any] | None:
        """What a stage's fingerprint adds for this format: ``None`` for the task's own format."""
        return None if self.is_default else self.spec()


def config_from_spec(spec: dict | None) -> PromptConfig:
    """The ``prompt`` section a :meth:`PromptFormat.spec` (or a stage key's ``prompt`` entry) was made from; the
    task's own format for ``None``."""
    fields = PromptConfig.__dataclass_fields__
    return PromptConfig(**{k: v for k, v in (spec or {}).items() if k in fields})


def as_format(fmt) -> PromptFormat:
    """``fmt`` as a :class:`PromptFormat`: a task stands for its own (default) format."""
    return fmt if isinstance(fmt, PromptFormat) else PromptFormat(fmt)
