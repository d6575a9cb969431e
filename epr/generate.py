"""Batched greedy generation with the inference LM, stopping at the end of the program (a newline)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["Generator"]


class Generator:
    def __init__(self, model, tokenizer, max_new_tokens: int = 96, batch_size: int = 8, stop: str = "\n"):
        self.model, self.tok = model, tokenizer
        self.max_new_tokens, self.batch_size, self.stop = max_new_tokens, batch_size, stop

    @torch.inference_mode()
    def generate(self, prompts: Sequence[str]) -> list[str]:
        """Greedy continuations, cut at the first ``stop``; prompts are length-sorted into left-padded batches."""
        tok = self.tok
        tok.padding_side = "left"
        try:
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
            out: list[str] = [""] * len(prompts)
            for s in range(0, len(order), self.batch_size):
                idx = order[s : s + self.batch_size]
                enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True).to(self.model.device)
                gen = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                          stop_strings=[self.stop], tokenizer=tok, pad_token_id=tok.pad_token_id)
                texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                for i, t in zip(idx, texts):
                    out[i] = t.split(self.stop, 1)[0].strip()
            return out
        finally:
            tok.padding_side = "right"
