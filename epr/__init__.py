"""epr: learned prompt retrieval (EPR) for in-context learning, with RAGSys re-ranking.

Where things live (each package's docstring says what it owns):

- ground: ``types`` (errors, records), ``config`` (typed settings; ``epr config`` prints them with their help),
  ``artifacts`` (atomic files, formats), ``cache`` (the cache rule: fingerprints, manifests, resumable chunks),
  ``run_lock`` (one writer per run folder);
- library, bottom up: ``lm/`` (models, label scoring, score cache, generation, servers), ``encoder/`` (dual
  encoder, losses, training loop), ``retrieval/`` (BM25, faiss, retrievers, RAGSys, prompts), ``reports/``
  (statistics, tables, machine line), ``tasks/`` (each dataset's quirks), ``truthfulqa/`` (the RAGSys evaluation);
- the run: ``context`` (config + folders), ``pipeline`` (the stage graph: what each stage's fingerprint hashes),
  ``stages/`` (one module per pipeline stage, and the learning curve's ``dense_metric``);
- faces: ``api`` (``PromptRetriever``), ``shipping`` (save / load / hub), ``model_card``, ``cli/`` (the ``epr``
  command; ``cli.inspect``, ``cli.truthfulqa``), ``integrations/``.

A module imports only its own layer or those below (tests/test_layers.py).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
