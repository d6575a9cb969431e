"""Prompts that fill the inference LM's budget, counted in its own tokens (SPEC 2.5).

The prompt is ``[e_L'; ...; e_2; e_1; x_test]``: the most similar demonstration sits right before the input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epr.types import Example

__all__ = ["Budget", "Prompt", "build_prompt"]


@dataclass(frozen=True)
class Prompt:
    text: str
    demo_ids: tuple[int, ...]  # best first
    n_tokens: int
    status: str = "ok"  # ok | no_demo_fits | query_too_long


def build_prompt(
    task,
    query: Example,
    ranked: Sequence[int],
    pool: Sequence[Example],
    count: Callable[[str], int],
    budget: int,
    reserve: int,
    max_demos: int,
) -> Prompt:
    """Largest L' with sum |e_i| + |x| + reserve <= budget. ``ranked`` is best first."""
    q = task.format_query(query.input)
    used = count(q) + reserve
    if used > budget:
        return Prompt(q, (), used, "query_too_long")
    demos: list[tuple[int, str]] = []
    for i in ranked[:max_demos]:
        d = task.format_demo(pool[i])
        n = count(d)
        if used + n > budget:
            break
        demos.append((i, d))
        used += n
    text = "".join(d for _, d in reversed(demos)) + q
    # pieces are counted apart; re-count the joined text so tokenizer merges at the seams never break the budget
    while demos and count(text) + reserve > budget:
        demos.pop()
        text = "".join(d for _, d in reversed(demos)) + q
    return Prompt(text, tuple(i for i, _ in demos), count(text) + reserve, "ok" if demos else "no_demo_fits")


@dataclass(frozen=True)
class Budget:
    """The prompt rules of a run: tokens of the inference LM, room for the answer, most demonstrations."""

    prompt_budget: int
    answer_reserve: int
    max_demos: int
    tokenizer: str  # the inference LM whose tokens are counted
    k: int = 50  # ids retrieved before fitting (the run's retrieve.k; its default)
