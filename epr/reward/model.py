"""The cross-encoder: a pretrained encoder (MiniLM, mpnet, any ``AutoModel``) reads ``[query; demonstration]`` as one
pair of segments, and a linear head on the mean-pooled output gives the pair's score. A saved folder holds the
encoder, its tokenizer, the head and ``reward_model.json`` (what it reads, how long)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from epr.encoder.model import mean_pool

__all__ = ["CrossEncoder", "rerank", "META"]

META = "reward_model.json"


class CrossEncoder(nn.Module):
    def __init__(
        self, encoder: nn.Module, tokenizer, max_length: int = 160, demo_fields: str = "input_output"
    ):
        super().__init__()
        self.encoder, self.tok, self.max_length, self.demo_fields = (
            encoder,
            tokenizer,
            max_length,
            demo_fields,
        )
        self.head = nn.Linear(encoder.config.hidden_size, 1)

    @classmethod
    def from_pretrained(
        cls, name_or_dir: str, max_length: int = 160, cache: str | None = None, seed: int = 0
    ) -> CrossEncoder:
        """From a base encoder (packaged name, hub id, folder: a fresh head, seeded) or a saved reward model."""
        from transformers import AutoModel, AutoTokenizer

        from epr.lm.models import resolve_encoder

        d = Path(name_or_dir)
        if (d / META).exists():
            meta = json.loads((d / META).read_text())
            m = cls(AutoModel.from_pretrained(d / "encoder"), AutoTokenizer.from_pretrained(d / "encoder"),
                    meta["max_length"], meta.get("demo_fields", "input_output"))  # fmt: skip
            m.head.load_state_dict(torch.load(d / "head.pt", map_location="cpu", weights_only=True))
            return m
        path = resolve_encoder(name_or_dir, cache)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return cls(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), max_length)

    def save(self, dest: Path) -> None:
        dest = Path(dest)
        self.encoder.save_pretrained(dest / "encoder")
        self.tok.save_pretrained(dest / "encoder")
        torch.save(self.head.state_dict(), dest / "head.pt")
        meta = {"max_length": self.max_length, "demo_fields": self.demo_fields, "kind": "cross-encoder"}
        (dest / META).write_text(json.dumps(meta, indent=1) + "\n")

    def demo(self, task, ex) -> str:
        from epr.encoder.data import demo_text

        return demo_text(task, ex, self.demo_fields)

    def tokenize(self, queries: Sequence[str], demos: Sequence[str]) -> dict:
        device = next(self.parameters()).device
        b = self.tok(list(queries), list(demos), padding=True, truncation="longest_first",
                     max_length=self.max_length, return_tensors="pt")  # fmt: skip
        return {k: v.to(device) for k, v in b.items()}

    def forward(self, batch: dict) -> torch.Tensor:
        out = self.encoder(**batch).last_hidden_state
        return self.head(mean_pool(out, batch["attention_mask"])).squeeze(-1)

    def cut(self, queries: Sequence[str], demos: Sequence[str]) -> int:
        """How many of these pairs are longer than ``max_length`` tokens (and so cut)."""
        n = self.tok(list(queries), list(demos), truncation=False)["input_ids"]
        return sum(len(x) > self.max_length for x in n)

    @torch.no_grad()
    def score(self, queries: Sequence[str], demos: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """The score of each (query, demonstration) pair, in eval mode, fp32 out."""
        was = self.training
        self.eval()
        out = [self(self.tokenize(queries[i : i + batch_size], demos[i : i + batch_size])).float().cpu()
               for i in range(0, len(queries), batch_size)]  # fmt: skip
        self.train(was)
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.float32)


def rerank(
    model: CrossEncoder, query: str, candidates: Sequence[int], texts: Sequence[str], k: int | None = None
) -> tuple[list[int], list[float]]:
    """``candidates`` (pool ids, a first stage's top K, with their demonstration ``texts``) ordered by the reward
    model's score of (query, text), best first (ties: the first stage's order); the top ``k`` of them."""
    scores = model.score([query] * len(candidates), list(texts))
    order = sorted(range(len(candidates)), key=lambda j: (-float(scores[j]), j))[: k or len(candidates)]
    return [int(candidates[j]) for j in order], [float(scores[j]) for j in order]
