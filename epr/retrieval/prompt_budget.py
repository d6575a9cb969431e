"""Prompts that fill the inference LM's budget, counted in its own tokens (SPEC 2.5).

The prompt is ``[e_L'; ...; e_2; e_1; x_test]``: the most similar demonstration sits right before the input,
rendered by the run's prompt format (:class:`epr.prompt.PromptFormat`; chat markup counts like any token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epr.prompt import as_format
from epr.types import Example

__all__ = ["Budget", "Prompt", "build_prompt"]


@dataclass(frozen=True)
class Prompt:
    text: str
    demo_ids: tuple[int, ...]  # best first
    n_tokens: int
    status: str = "ok"  # ok | no_demo_fits | query_too_long


def build_prompt(
    fmt,
    query: Example,
    ranked: Sequence[int],
    pool: Sequence[Example],
    count: Callable[[str], int],
    budget: int,
    reserve: int,
    max_demos: int,
) -> Prompt:
    """Largest L' with |prompt(e_L', ..., e_1, x)| + reserve <= budget. ``ranked`` is best first; ``fmt`` the run's
    prompt format (a task stands for its own). Raw text is counted piece by piece, then as joined; a chat prompt is
    counted as rendered, markup included, each time a demonstration is added."""
    fmt = as_format(fmt)
    if fmt.chat:
        return _build_chat(fmt, query, ranked, pool, count, budget, reserve, max_demos)
    head = fmt.cfg.instruction or ""
    q = fmt.query_text(query)
    used = count(q) + (count(head) if head else 0) + reserve
    if used > budget:
        return Prompt(head + q, (), used, "query_too_long")
    demos: list[tuple[int, str]] = []
    for i in ranked[:max_demos]:
        d = fmt.demo_text(pool[i])
        n = count(d)
        if used + n > budget:
            break
        demos.append((i, d))
        used += n
    text = head + "".join(d for _, d in reversed(demos)) + q
    # pieces are counted apart; re-count the joined text so tokenizer merges at the seams never break the budget
    while demos and count(text) + reserve > budget:
        demos.pop()
        text = head + "".join(d for _, d in reversed(demos)) + q
    return Prompt(text, tuple(i for i, _ in demos), count(text) + reserve, "ok" if demos else "no_demo_fits")


def _build_chat(fmt, query, ranked, pool, count, budget, reserve, max_demos) -> Prompt:
    """:func:`build_prompt` for a chat format: the whole rendered prompt counted for each added demonstration (a
    chat template need not render turn by turn), so the budget is token-exact."""
    text = fmt.render([], query)
    used = count(text) + reserve
    if used > budget:
        return Prompt(text, (), used, "query_too_long")
    chosen: list[int] = []
    for i in ranked[:max_demos]:
        trial = fmt.render([pool[j] for j in reversed([*chosen, i])], query)
        n = count(trial) + reserve
        if n > budget:
            break
        chosen.append(i)
        text, used = trial, n
    return Prompt(text, tuple(chosen), used, "ok" if chosen else "no_demo_fits")


@dataclass(frozen=True)
class Budget:
    """The prompt rules of a run: tokens of the inference LM, room for the answer, most demonstrations."""

    prompt_budget: int
    answer_reserve: int
    max_demos: int
    tokenizer: str  # the inference LM whose tokens are counted
    k: int = 50  # ids retrieved before fitting (the run's retrieve.k; its default)
