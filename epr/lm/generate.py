"""Batched greedy generation with the inference LM, stopping at the end of the program (a newline).

``engine="auto"`` uses the lean decoder (:mod:`epr.lm.decode`) for the models the lean forward covers and
``transformers``' ``generate`` for the rest; ``"hf"`` always the latter (the reference the lean one is tested
against), ``"lean"`` refuses a model it does not cover."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

__all__ = ["Generator"]

log = logging.getLogger(__name__)


ENGINES = ("auto", "lean", "hf")


class Generator:
    def __init__(
        self,
        model,
        tokenizer,
        max_new_tokens: int = 96,
        batch_size: int = 8,
        stop: str = "\n",
        engine: str = "auto",
        decode_rows: int = 64,
        prefill_tokens: int = 8192,
    ):
        if engine not in ENGINES:
            raise ValueError(f"generate.engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        self.model, self.tok = model, tokenizer
        self.max_new_tokens, self.batch_size, self.stop = max_new_tokens, batch_size, stop
        self._stop_in_vocab: bool | None = None  # found out on the first batch
        self.lean = None
        if engine != "hf":
            from epr.lm.decode import LeanDecoder, plain_greedy
            from epr.lm.fastlm import fast_backbone

            fast = fast_backbone(model)
            if fast is None and engine == "lean":
                raise ValueError(
                    f"generate.engine=lean: the lean decoder does not cover {type(model).__name__}; use auto or hf"
                )
            processors = plain_greedy(model)
            if processors:
                if engine == "lean":
                    raise ValueError(
                        f"generate.engine=lean: the model's generation config sets {', '.join(processors)}, "
                        "which the lean decoder does not apply; use auto or hf"
                    )
                log.info("generation config sets %s: using transformers' generate", ", ".join(processors))
                fast = None
            if fast is not None:
                self.lean = LeanDecoder(
                    model, fast, tokenizer, max_new_tokens, stop, decode_rows, prefill_tokens
                )
        self.engine = "lean" if self.lean is not None else "hf"

    def _cut(self, text: str) -> str:
        return text.split(self.stop, 1)[0].strip() if self.stop else text.strip()

    def generate(self, prompts: Sequence[str]) -> list[str]:
        """Greedy continuations, cut at the first ``stop``."""
        if self.lean is None:
            return self.generate_hf(prompts)
        ids = self.tok(list(prompts))["input_ids"] if prompts else []
        gen = self.lean.generate_ids(ids)
        return [self._cut(self.tok.decode(g, skip_special_tokens=True)) for g in gen]

    def generate_with_gold(
        self, prompts: Sequence[str], golds: Sequence[str]
    ) -> tuple[list[str], list[float]]:
        """:meth:`generate`, and ``log p(gold | prompt)`` of each gold answer from the same prefill (the lean decoder
        only: ``self.engine == "lean"``). Equal to ``LMScorer.score(prompts, golds)`` within float rounding."""
        if self.lean is None:
            raise ValueError(
                "the gold log-prob in the generation pass needs the lean decoder (engine lean/auto)"
            )
        if not prompts:
            return [], []
        ids = self.tok(list(prompts))["input_ids"]
        gold = self.tok(list(golds), add_special_tokens=False)["input_ids"]
        gen, lps = self.lean.generate_and_score(ids, gold)
        return [self._cut(self.tok.decode(g, skip_special_tokens=True)) for g in gen], lps.tolist()

    @torch.inference_mode()
    def generate_hf(self, prompts: Sequence[str]) -> list[str]:
        """``transformers``' greedy ``generate``: prompts length-sorted into left-padded batches."""
        tok = self.tok
        tok.padding_side = "left"
        try:
            order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
            out: list[str] = [""] * len(prompts)
            for s in range(0, len(order), self.batch_size):
                idx = order[s : s + self.batch_size]
                enc = tok([prompts[i] for i in idx], return_tensors="pt", padding=True).to(self.model.device)
                # only ids and mask: BERT-style tokenizers add token_type_ids, which causal LMs reject
                enc = {k: enc[k] for k in ("input_ids", "attention_mask")}
                gen = self._generate(enc)
                texts = tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
                for i, t in zip(idx, texts):
                    out[i] = self._cut(t)
            return out
        finally:
            tok.padding_side = "right"

    def _generate(self, enc: dict) -> torch.Tensor:
        kw = dict(max_new_tokens=self.max_new_tokens, do_sample=False, pad_token_id=self.tok.pad_token_id)
        if self._stop_in_vocab is not False:
            try:
                out = self.model.generate(**enc, **kw, stop_strings=[self.stop], tokenizer=self.tok)
                self._stop_in_vocab = True
                return out
            except ValueError as e:  # a vocabulary without the stop string (BERT-style): cut after decoding
                if "stop string" not in str(e).lower():
                    raise
                log.warning(
                    "stop string %r is not in the tokenizer's vocabulary: generating %d tokens and cutting",
                    self.stop,
                    self.max_new_tokens,
                )
                self._stop_in_vocab = False
        return self.model.generate(**enc, **kw)
