"""The ``prompt`` section: how demonstrations and the query become the text the LM reads (``epr.prompt`` renders
it, for every stage from ``scores`` on). Every field's default keeps the task's own format (the EPR paper's
``input<TAB>output<NEWLINE>``), so a config without the section keys and runs as before it existed.

Templates name the row's fields in braces (``{input}``, ``{output}``, and for your own data any other column of the
file by name); ``{{`` and ``}}`` are literal braces. A row's text is inserted as it is: braces or ``{output}`` inside
a row never act as a template.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Formatter

from epr.config.names import opt
from epr.types import ConfigError

__all__ = ["PromptConfig", "parse_template", "template_fields"]

TEMPLATE = (
    "a template over the row's fields in braces ({input}, {output}, your data's columns), checked at load"
)
TEXT = "any text, inserted as it is"

# what each template must name: the query's and the answer's texts must reach the prompt
REQUIRED = {"demo": ("input", "output"), "query": ("input",), "target": ("output",)}


def parse_template(template: str, key: str) -> tuple[tuple[str, str | None], ...]:
    """``template`` as ``(literal text, field name or None)`` pieces, or a ``ConfigError`` naming ``key``: a lone
    brace, an empty or positional field (``{}``, ``{0}``), a conversion or format spec (``{input!r}``,
    ``{input:>5}``) or an attribute or index (``{input.x}``, ``{input[0]}``) is not a template this renders."""
    pieces: list[tuple[str, str | None]] = []
    try:
        parsed = list(Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(
            f"config {key}: {template!r} is not a template ({e}); write a literal brace as {{{{ or }}}}"
        ) from None
    for literal, name, spec, conv in parsed:
        if name is None:
            pieces.append((literal, None))
            continue
        if not name.isidentifier() or spec or conv:
            raise ConfigError(
                f"config {key}: {{{name}{'!' + conv if conv else ''}{':' + spec if spec else ''}}} in {template!r} "
                "is not a field: name a field plainly, e.g. {input} or {output} (a literal brace is {{ or }})"
            )
        pieces.append((literal, name))
    return tuple(pieces)


def template_fields(template: str, key: str) -> tuple[str, ...]:
    """The field names ``template`` uses, in order of first use."""
    return tuple(dict.fromkeys(n for _, n in parse_template(template, key) if n))


@dataclass(frozen=True)
class PromptConfig:
    """How demonstrations and the query become the LM's prompt: one renderer for the labels, select, the
    evaluated prompts and every served retriever (null fields: the task's own format, input<TAB>output)."""

    instruction: str | None = opt(
        None,
        "text before the demonstrations (raw: the prompt's start; chat: the start of the first user turn); null: none",
        free=TEXT,
    )
    demo: str | None = opt(
        None,
        "a demonstration's template over {input} and {output}; null: the task's (raw: input<TAB>output<NEWLINE>); "
        "in chat mode used where all demonstrations share one user turn (prompt.multiturn=false)",
        free=TEMPLATE,
    )
    query: str | None = opt(
        None,
        "the query's template over {input}; null: the task's (raw: input<TAB>, right before the answer; chat: "
        "{input}, a user turn)",
        free=TEMPLATE,
    )
    target: str | None = opt(
        None,
        "the answer's template over {output}; null: the task's (raw: output<NEWLINE>, ending at the stop; chat: "
        "{output}, the assistant's turn, its end-of-turn marker added by the chat template)",
        free=TEMPLATE,
    )
    chat: bool = opt(
        False,
        "prompt the LM as a chat model through its own chat template (transformers' apply_chat_template, "
        "add_generation_prompt); generation stops at the template's end of turn",
    )
    multiturn: bool = opt(
        True,
        "chat: each demonstration as a user turn and an assistant turn (lm-evaluation-harness's "
        "--fewshot_as_multiturn); false: the demonstrations and the query in one user turn",
    )
    system: str | None = opt(
        None,
        "chat: the system message (lm-evaluation-harness's --system_instruction); null: the chat template's own "
        'default; "": an empty system message',
        free=TEXT,
    )

    def __post_init__(self):
        for name, needs in REQUIRED.items():
            tpl = getattr(self, name)
            if tpl is None:
                continue
            used = template_fields(tpl, f"prompt.{name}")
            missing = [f for f in needs if f not in used]
            if missing:
                raise ConfigError(
                    f"config prompt.{name}: {tpl!r} has no {', '.join('{' + f + '}' for f in missing)}; "
                    f"the {name} template must name {' and '.join('{' + f + '}' for f in needs)}"
                )
            if name != "demo" and ("output" if name == "query" else "input") in used:
                other = "output" if name == "query" else "input"
                raise ConfigError(
                    f"config prompt.{name}: {tpl!r} names {{{other}}}; the {name} template is filled with the "
                    f"{'query' if name == 'query' else 'answer'} alone (the query's gold output is never in its prompt)"
                )
        if self.system is not None and not self.chat:
            raise ConfigError(
                "config prompt.system: a system message needs a chat model's template; set prompt.chat=true, or "
                "put the text in prompt.instruction"
            )

    def columns(self) -> tuple[str, ...]:
        """The row fields the templates name besides ``input`` and ``output`` (your data's other columns)."""
        names = [
            f
            for k in REQUIRED
            if getattr(self, k) is not None
            for f in template_fields(getattr(self, k), f"prompt.{k}")
        ]
        return tuple(dict.fromkeys(f for f in names if f not in ("input", "output")))
