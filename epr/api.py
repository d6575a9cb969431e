"""Use a trained retriever from Python.

from epr.api import PromptRetriever
r = PromptRetriever.from_run("runs/mydata")
res = r.retrieve("turn on the kitchen lights", k=4)
print(res.prompt)          # demonstrations (best last, right before the query) + the query
for ex, score in zip(res.demos, res.scores): print(score, ex.input, "->", ex.output)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from epr.artifacts import read_jsonl
from epr.config import DataConfig, config_from_dict
from epr.encoder import DualEncoder
from epr.index import build_index, load_index, save_index, search
from epr.tasks import get_task
from epr.types import Example

__all__ = ["PromptRetriever", "RetrievalResult"]


@dataclass(frozen=True)
class RetrievalResult:
    demos: list[Example]  # best first
    scores: list[float]  # inner products, best first
    prompt: str  # [e_k; ...; e_1; query], ready for the LM


class PromptRetriever:
    """A trained EPR encoder over a run's demonstration pool, with a cached faiss index."""

    def __init__(self, encoder: DualEncoder, pool: list[Example], task, index=None, factory: str = "Flat"):
        self.encoder, self.pool, self.task = encoder, pool, task
        if index is None:
            emb = encoder.encode([task.format_demo(e).strip() for e in pool], "prompt", progress=True)
            index = build_index(emb, factory)
        self.index = index

    @classmethod
    def from_run(cls, run_dir: str | Path, factory: str = "Flat") -> PromptRetriever:
        run = Path(run_dir)
        model = run / "encoder" / "model"
        if not model.exists():
            raise FileNotFoundError(f"{model}: no trained encoder in this run (train it first: see README)")
        man = json.loads((run / "examples" / "manifest.json").read_text())
        task = get_task(config_from_dict(DataConfig, man["config"]["data"]))
        pool = [Example.from_json(r) for r in read_jsonl(run / "examples" / "pool.jsonl")]
        cached = run / "encoder" / f"pool.{factory.replace(',', '_')}.faiss"
        enc = DualEncoder.from_pretrained(str(model))
        if cached.exists() and cached.stat().st_mtime >= (model / "dual_encoder.json").stat().st_mtime:
            return cls(enc, pool, task, load_index(cached))
        r = cls(enc, pool, task, factory=factory)
        save_index(r.index, cached)
        return r

    def retrieve(self, query: str, k: int = 8) -> RetrievalResult:
        if not query.strip():
            raise ValueError("empty query")
        q = self.encoder.encode([query], "query")
        ids, sc = search(self.index, q, k)
        demos = [self.pool[i] for i in ids[0] if i >= 0]
        prompt = "".join(self.task.format_demo(e) for e in reversed(demos)) + self.task.format_query(query)
        return RetrievalResult(demos, [float(s) for s in sc[0][: len(demos)]], prompt)

    def scores_for(self, query: str, ids) -> np.ndarray:
        q = self.encoder.encode([query], "query")[0]
        p = self.encoder.encode([self.task.format_demo(self.pool[i]).strip() for i in ids], "prompt")
        return p @ q
