"""epr: learned prompt retrieval (EPR) for in-context learning, with RAGSys re-ranking."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
