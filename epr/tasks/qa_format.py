"""The TruthfulQA paper's QA prompt format, shared by the ``truthfulqa`` task (the retrieval pipeline's prompts) and
the RAGSys evaluation (``epr.truthfulqa``, which re-exports it from ``epr.truthfulqa.sets``), so both judge the same
prompts. Every TruthfulQA prompt is built here."""

from __future__ import annotations

__all__ = ["demo_text", "query_text", "answer_text"]


def demo_text(q: str, a: str) -> str:
    """A demonstration in the prompt (the TruthfulQA paper's QA format)."""
    return f"Q: {q}\nA: {a}\n\n"


def query_text(q: str) -> str:
    """The question right before the scored answer."""
    return f"Q: {q}\nA:"


def answer_text(a: str) -> str:
    """A scored answer, as it follows ``query_text``."""
    return f" {a}"
