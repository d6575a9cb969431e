"""The EPR dual encoder: E_X for inputs, E_P for demonstrations, inner-product similarity.

Both towers start from the same pretrained encoder (any ``AutoModel``: the packaged MiniLM, a hub id, a
local folder); ``tie=True`` shares one. Embeddings are mean-pooled last hidden states. ``similarity="dot"``
(EPR) leaves them as they are: the raw inner product scores; ``"cosine"`` normalises them to unit length (the
sentence-transformers / E5 convention for encoders such as MiniLM, trained with a temperature), so the inner
product of the faiss index is the cosine. Saved as ``<dir>/query_encoder`` and ``<dir>/prompt_encoder`` with
``dual_encoder.json`` (tied, max_length, similarity).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = ["DualEncoder", "mean_pool"]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)


class DualEncoder(nn.Module):
    def __init__(
        self,
        q_model: nn.Module,
        p_model: nn.Module | None,
        tokenizer,
        max_length: int = 64,
        similarity: str = "dot",
        demo_fields: str = "input_output",
    ):
        super().__init__()
        if similarity not in ("dot", "cosine"):
            raise ValueError(f"similarity must be 'dot' or 'cosine', not {similarity!r}")
        self.similarity = similarity
        self.q_model = q_model
        self.p_model = p_model if p_model is not None else q_model
        self.tied = p_model is None
        self.tok = tokenizer
        self.max_length = max_length
        # what of a demonstration the prompt tower reads (encoder.data.demo_text)
        self.demo_fields = demo_fields

    @classmethod
    def from_pretrained(
        cls,
        name_or_dir: str,
        tie: bool = False,
        max_length: int = 64,
        cache: str | None = None,
        similarity: str = "dot",
        demo_fields: str = "input_output",
    ) -> DualEncoder:
        """From a base encoder (packaged name, hub id, folder) or from a saved dual encoder folder (whose own
        ``similarity`` wins)."""
        from transformers import AutoModel, AutoTokenizer

        from epr.lm.models import resolve_encoder

        d = Path(name_or_dir)
        if (d / "dual_encoder.json").exists():
            meta = json.loads((d / "dual_encoder.json").read_text())
            tok = AutoTokenizer.from_pretrained(d / "query_encoder")
            q = AutoModel.from_pretrained(d / "query_encoder")
            p = None if meta["tied"] else AutoModel.from_pretrained(d / "prompt_encoder")
            # (folders written before the setting read input and output)
            fields = meta.get("demo_fields", "input_output")
            return cls(q, p, tok, meta["max_length"], meta.get("similarity", "dot"), fields)
        path = resolve_encoder(name_or_dir, cache)
        tok = AutoTokenizer.from_pretrained(path)
        q = AutoModel.from_pretrained(path)
        p = None if tie else AutoModel.from_pretrained(path)
        return cls(q, p, tok, max_length, similarity, demo_fields)

    def demo(self, task, ex) -> str:
        """The text the prompt tower encodes for demonstration ``ex``."""
        from epr.encoder.data import demo_text

        return demo_text(task, ex, self.demo_fields)

    def tokenize(self, texts: Sequence[str]) -> dict:
        return dict(
            self.tok(
                list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
        )

    def _embed(self, model: nn.Module, batch: dict) -> torch.Tensor:
        dev = next(model.parameters()).device
        batch = {k: v.to(dev) for k, v in batch.items()}
        out = model(**batch).last_hidden_state
        e = mean_pool(out, batch["attention_mask"]).float()
        return torch.nn.functional.normalize(e, dim=-1) if self.similarity == "cosine" else e

    def embed_queries(self, batch: dict) -> torch.Tensor:
        return self._embed(self.q_model, batch)

    def embed_prompts(self, batch: dict) -> torch.Tensor:
        return self._embed(self.p_model, batch)

    def forward(self, batch: dict, side: str = "query") -> torch.Tensor:
        return self.embed_queries(batch) if side == "query" else self.embed_prompts(batch)

    def embed_buckets(self, texts: Sequence[str], side: str, buckets: int = 1) -> torch.Tensor:
        """``(n, H)`` embeddings of ``texts`` in their order, with gradient: the texts length-sorted into
        ``buckets`` sub-batches, each padded to its own longest instead of the whole batch's (``train.length_buckets``).
        Each row's embedding is computed from its own tokens only (the mask keeps the pads out), so this is the one
        padded batch's value and gradient within float rounding (tested), for fewer padded tokens."""
        texts = list(texts)
        if buckets <= 1 or len(texts) < 2:
            return self(self.tokenize(texts), side)
        ids = self.tok(texts, truncation=True, max_length=self.max_length)["input_ids"]
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        size = -(-len(texts) // buckets)
        parts = [order[s : s + size] for s in range(0, len(order), size)]
        embs = torch.cat([self(self.tokenize([texts[i] for i in p]), side) for p in parts])
        back = torch.empty(len(texts), dtype=torch.long)
        back[torch.tensor(order)] = torch.arange(len(texts))
        return embs[back.to(embs.device)]

    @torch.inference_mode()
    def encode(
        self, texts: Sequence[str], side: str, batch_size: int = 128, progress: bool = False
    ) -> np.ndarray:
        """``(n, H) float32`` embeddings; texts are length-sorted into batches and returned in input order."""
        from tqdm.auto import tqdm

        self.eval()
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), self.q_model.config.hidden_size), dtype=np.float32)
        for s in tqdm(range(0, len(order), batch_size), desc=f"encode {side}", disable=not progress):
            idx = order[s : s + batch_size]
            out[idx] = self(self.tokenize([texts[i] for i in idx]), side).cpu().numpy()
        return out

    def save_pretrained(self, out: str | Path) -> None:
        out = Path(out)
        self.q_model.save_pretrained(out / "query_encoder")
        self.tok.save_pretrained(out / "query_encoder")
        if not self.tied:
            self.p_model.save_pretrained(out / "prompt_encoder")
            self.tok.save_pretrained(out / "prompt_encoder")
        (out / "dual_encoder.json").write_text(
            json.dumps(
                {
                    "tied": self.tied,
                    "max_length": self.max_length,
                    "similarity": self.similarity,
                    "demo_fields": self.demo_fields,
                }
            )
        )
        from epr.artifacts import apply_umask

        apply_umask(out)  # transformers writes its weight shards 0600
