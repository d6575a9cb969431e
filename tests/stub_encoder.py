"""A PromptRetriever over a keyword one-hot encoder (exact, instant, no weights): for tests of the API's argument
checks and prompt building where a trained dual encoder would only cost time."""

from __future__ import annotations

import numpy as np

from epr.types import Example

WORDS = ("reset", "change", "delete", "export", "password", "email", "account", "photos")


class KeywordEncoder:
    """``encode(texts, side) -> (n, len(WORDS) + 1) float32``: word counts plus a constant (no zero vector)."""

    def demo(self, task, ex: Example) -> str:
        return f"{ex.input} {ex.output}"

    def encode(self, texts, side: str, batch_size: int = 128, progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), len(WORDS) + 1), dtype=np.float32)
        for i, t in enumerate(texts):
            words = t.lower().split()
            out[i, :-1] = [words.count(w) for w in WORDS]
            out[i, -1] = 0.01
        return out


def stub_retriever(tokenizer: str, count=None):
    """A retriever over 16 demonstrations; its prompt budget counts in ``tokenizer``'s tokens (a model folder)."""
    from epr.api import Budget, PromptRetriever
    from epr.config import DataConfig
    from epr.tasks import get_task

    pool = [
        Example(i, f"how do I {v} my {o}", f"{v.upper()}({o})", {})
        for i, (v, o) in enumerate((v, o) for v in WORDS[:4] for o in WORDS[4:])
    ]
    task = get_task(DataConfig(task="jsonl", path="unused.jsonl"))
    return PromptRetriever(KeywordEncoder(), pool, task, budget=Budget(256, 32, 4, tokenizer, 8), count=count)
