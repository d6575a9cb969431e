"""Log-probability of target tokens after a context, batched for throughput, and the one shared-prefix engine
(``score_prefixed``).

``LMScorer.score(contexts, targets)`` returns ``sum_t log p(target_t | context, target_<t)`` for each pair.
Pairs are tokenised separately (context with the tokenizer's special tokens, target without), sorted by
length, packed into batches of at most ``batch_tokens`` padded tokens, right-padded, and only the hidden
states that predict target tokens go through the LM head (the vocabulary projection dominates small LMs).
Results do not depend on batch composition beyond float rounding.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["LMScorer", "TokenScorer", "SequenceTooLong", "make_batches", "reference_score", "token_ids"]

log = logging.getLogger(__name__)


class SequenceTooLong(ValueError):
    """A context + target longer than the model's context window."""


@dataclass(frozen=True)
class _Item:
    pos: int
    ids: list[int]
    n_ctx: int


def make_batches(
    lengths: Sequence[int], batch_tokens: int, max_rows: int | None = None, longest_first: bool = True
) -> list[list[int]]:
    """Group positions sorted by length (longest first, or shortest first) so that ``len(batch) * max_len <=
    batch_tokens`` and ``len(batch) <= max_rows`` (at least one each). The one batch packer: the scorer packs
    longest first, the lean decoder (``epr.lm.decode``) shortest first."""
    sign = -1 if longest_first else 1
    order = sorted(range(len(lengths)), key=lambda i: (sign * lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        m = max(cur_max, lengths[i])
        if cur and (m * (len(cur) + 1) > batch_tokens or (max_rows is not None and len(cur) + 1 > max_rows)):
            batches.append(cur)
            cur, m = [], lengths[i]
        cur.append(i)
        cur_max = m
    if cur:
        batches.append(cur)
    return batches


def first_max_index(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` (the first index of the largest value on ties), computed with ``max``, which is faster: the
    greedy choice, as the lean decoder makes it and the scorer's greedy check reads it."""
    return x.max(-1).indices


class TokenScorer:
    """What every scorer shares: the tokenisation of (context, target) pairs and the context-window check. Subclasses
    implement ``score_ids(pairs)``; :class:`LMScorer` runs the LM in-process, ``epr.lm.served.ServerScorer`` asks an
    OpenAI-compatible server. Both score the same token ids."""

    tok = None
    max_length: int = 2048
    prefix_share: bool = False

    def _start_token(self) -> int:
        # a target needs a predecessor token: an empty context gets BOS (or EOS when there is none)
        tok = self.tok
        return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id

    # -- tokenisation ---------------------------------------------------------------------------
    def encode(self, contexts: Sequence[str], targets: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """``(context ids with special tokens, target ids)`` per pair (:func:`token_ids`: pairs with equal texts share
        one id list, so a caller must not change the lists in place)."""
        if len(contexts) != len(targets):
            raise ValueError(f"{len(contexts)} contexts but {len(targets)} targets")
        ctx = token_ids(self.tok, contexts, special=True)
        tgt = token_ids(self.tok, targets, special=False)
        out = []
        start = self._start_token()
        for i, (c, t) in enumerate(zip(ctx, tgt)):
            if not t:
                raise ValueError(f"pair {i}: the target {targets[i]!r} has no tokens")
            out.append((c or [start], t))
        return out

    def too_long(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[int]:
        return [i for i, (c, t) in enumerate(pairs) if len(c) + len(t) > self.max_length]

    def _check_fits(self, pairs: Sequence[tuple[list[int], list[int]]]) -> None:
        long = self.too_long(pairs)
        if long:
            i = long[0]
            raise SequenceTooLong(
                f"{len(long)} sequence(s) exceed the model context of {self.max_length} tokens "
                f"(first: pair {i}, {len(pairs[i][0])}+{len(pairs[i][1])} tokens)"
            )

    def score(self, contexts: Sequence[str], targets: Sequence[str]) -> np.ndarray:
        """``(n,) float64`` summed log-probs of each target's tokens."""
        return self.score_pairs(contexts, targets, self.encode(contexts, targets))

    def score_pairs(
        self, contexts: Sequence[str], targets: Sequence[str], pairs: Sequence[tuple[list[int], list[int]]]
    ) -> np.ndarray:
        """:meth:`score` where the caller has ``pairs = encode(contexts, targets)`` already (an in-process scorer
        runs the ids, a server the texts)."""
        return self.score_ids(pairs)

    def score_ids(self, pairs: Sequence[tuple[list[int], list[int]]]) -> np.ndarray:
        raise NotImplementedError

    def score_after(self, prefix: str, targets: Sequence[str]) -> np.ndarray:
        """Every target after one shared ``prefix`` (TruthfulQA's answers after a prompt); the in-process scorer
        runs the prefix once (``LMScorer.score_prefixed``), a server shares it itself."""
        return self.score([prefix] * len(targets), list(targets))

    def score_prefixed(
        self,
        prefixes: Sequence[str],
        contexts: Sequence[str],
        targets: Sequence[str],
        pairs: Sequence[tuple[list[int], list[int]]] | None = None,
    ) -> np.ndarray:
        """:meth:`score` for contexts that start with ``prefixes`` (a scorer that can share their work overrides
        this)."""
        return self.score_pairs(contexts, targets, self.encode(contexts, targets) if pairs is None else pairs)


class LMScorer(TokenScorer):
    """Score targets after contexts with a causal LM (any ``AutoModelForCausalLM``)."""

    def __init__(
        self,
        model,
        tokenizer,
        batch_tokens: int = 4096,
        max_length: int | None = None,
        forward: str = "fast",
        compile: bool = False,
        prefix_share: bool = False,
        backbone=None,
    ):
        if forward not in ("fast", "hf"):
            raise ValueError(f"forward must be 'fast' or 'hf', not {forward!r}")
        self.model = model
        self.tok = tokenizer
        self.batch_tokens = batch_tokens
        self.prefix_share = prefix_share
        self.max_length = max_length or getattr(model.config, "max_position_embeddings", 2048)
        self.device = next(model.parameters()).device
        self._start = self._start_token()
        # the lean forward of epr.lm.fastlm where it reproduces the model, else the transformers forward
        self.backbone = backbone  # given: a lean forward of the caller's (int8 scoring's own FastLlama)
        if forward == "fast" and backbone is None:
            from epr.lm.fastlm import fast_backbone

            self.backbone = fast_backbone(model)
        if self.backbone is None:
            self.backbone = lambda ids: model.base_model(input_ids=ids).last_hidden_state
        if compile:  # fuses the element-wise work; pays a one-off compile (minutes on 2 cores)
            self.backbone = torch.compile(self.backbone, dynamic=True)

    # -- scoring --------------------------------------------------------------------------------
    def score_after(self, prefix: str, targets: Sequence[str]) -> np.ndarray:
        """Every target after one shared ``prefix``: the prefix's keys and values are computed once
        (:meth:`score_prefixed`, the one shared-prefix engine)."""
        targets = list(targets)
        return self.score_prefixed([prefix] * len(targets), [prefix] * len(targets), targets)

    def score_ids(self, pairs: Sequence[tuple[list[int], list[int]]]) -> np.ndarray:
        return self._score_ids(pairs, greedy=False)[0]

    def score_greedy(self, pairs: Sequence[tuple[list[int], list[int]]]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`score_ids`, and for each pair whether every target token is the LM's greedy choice at its
        position (the first index of the largest logit, as the lean decoder picks): then greedy decoding after the
        context reproduces the target token for token. Read off the same forward pass (the teacher-forced check of
        exact match, :func:`epr.lm.score_cache.cached_greedy`)."""
        return self._score_ids(pairs, greedy=True)

    def _score_ids(self, pairs, greedy: bool) -> tuple[np.ndarray, np.ndarray | None]:
        self._check_fits(pairs)
        items = [_Item(i, c + t, len(c)) for i, (c, t) in enumerate(pairs)]
        results = _Results(len(items), greedy)
        for batch in make_batches([len(it.ids) for it in items], self.batch_tokens):
            results.add([items[j].pos for j in batch], *self._forward([items[j] for j in batch], greedy))
        return results.collect()

    @torch.inference_mode()
    def score_prefixed(
        self,
        prefixes: Sequence[str],
        contexts: Sequence[str],
        targets: Sequence[str],
        pairs: Sequence[tuple[list[int], list[int]]] | None = None,
    ) -> np.ndarray:
        """Like :meth:`TokenScorer.score` for ``contexts[i] = prefixes[i] + ...``, computing each distinct prefix's
        key/value cache once for all the sequences that start with it (EPR's label scoring: a demonstration followed by
        many ``[x][y]``). Token ids are exactly those of the plain scorer: a pair whose tokenisation does not start with
        its prefix's tokens (a merge across the seam) is split after its first token instead; a prefix that is the whole
        context is split before its last token (which predicts the first target token). Equal to the plain scorer
        within float rounding (tested); needs the lean forward (else it scores plainly). ``pairs``: the token ids of
        ``encode(contexts, targets)`` where the caller has them already."""
        pairs = self.encode(contexts, targets) if pairs is None else pairs
        self._check_fits(pairs)
        from epr.lm.fastlm import FastLlama

        if not isinstance(self.backbone, FastLlama):
            return self.score_ids(pairs)
        pre = token_ids(self.tok, prefixes, special=True)
        groups: dict[tuple[int, ...], list[int]] = {}
        plain: list[int] = []
        for i, ((c, _t), p) in enumerate(zip(pairs, pre)):
            n = min(len(p), len(c) - 1) if 0 < len(p) <= len(c) and c[: len(p)] == p else 1
            if len(c) < 2:  # the first target token is predicted inside any prefix: no split
                plain.append(i)
                continue
            groups.setdefault(tuple(c[:n]), []).append(i)
        results = _Results(len(pairs), greedy=False)
        if plain:
            results.add(plain, self.score_ids([pairs[i] for i in plain]), None)
        keys = sorted(groups, key=lambda k: (len(k), k))
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        to = self._to_device
        for gb in _prefix_batches(keys, self.batch_tokens):
            P = max(len(keys[g]) for g in gb)
            pids = _padded([keys[g] for g in gb], P, pad)
            pmask = _padded([[1] * len(keys[g]) for g in gb], P, 0).bool()
            kv = self.backbone.prefix_kv(to(pids))
            pmask = to(pmask)
            # the suffixes of these prefixes, length-sorted into token-budget batches
            rows = [(j, i) for j, g in enumerate(gb) for i in groups[keys[g]]]
            sfx = [pairs[i][0][len(keys[gb[j]]) :] + pairs[i][1] for j, i in rows]
            for b in make_batches([len(x) + P for x in sfx], self.batch_tokens):
                sel = to(torch.tensor([rows[r][0] for r in b]))
                ids = _padded([sfx[r] for r in b], max(len(sfx[r]) for r in b), pad)
                # target token k of a pair is predicted at full position len(c) - 1 + k: suffix index that minus the prefix
                spans = []
                for r in b:
                    c, t = pairs[rows[r][1]]
                    spans.append((len(c) - 1 - len(keys[gb[rows[r][0]]]), t))
                start = torch.tensor([len(keys[gb[rows[r][0]]]) for r in b])
                past = [(k.index_select(0, sel), v.index_select(0, sel)) for k, v in kv]
                hidden = self.backbone.forward_after(to(ids), to(start), past, pmask[sel])
                results.add(
                    [rows[r][1] for r in b], *self._target_sums(hidden, *_target_index(spans), len(b))
                )
        return results.collect()[0]

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the scorer's device. To a GPU through pinned memory without waiting: the host builds the
        next batch while the GPU computes this one (a plain copy from pageable memory waits for the GPU's queue)."""
        if self.device.type != "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    @torch.inference_mode()
    def _forward(self, items: list[_Item], greedy: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        ids = _padded([it.ids for it in items], max(len(it.ids) for it in items), pad)
        # position p predicts token p+1: target tokens sit at n_ctx..L-1, predicted from n_ctx-1..L-2
        spans = [(it.n_ctx - 1, it.ids[it.n_ctx :]) for it in items]
        # Right padding under a causal mask: real tokens never attend to the pads that follow them, so no
        # padding mask is needed and attention takes its fast is_causal path.
        hidden = self.backbone(self._to_device(ids))
        return self._target_sums(hidden, *_target_index(spans), len(items), greedy)

    @torch.inference_mode()
    def _target_sums(
        self, hidden, rows, cols, labels, n: int, greedy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Summed log-probs of the target tokens: the LM head only at the positions ``(rows, cols)`` of ``hidden``
        that predict them, summed per row; with ``greedy``, also whether each row's target tokens are all the first
        index of the largest logit (the greedy decoder's choice, in the head's own dtype). ``rows``, ``cols``,
        ``labels``: flat tensors of :func:`_target_index`. Tensors on the scorer's device, not waited for:
        :class:`_Results` brings a call's batches to the host together."""
        dev, to = self.device, self._to_device
        seg = to(rows)
        h = hidden[seg, to(cols)]  # (n_target_tokens, H)
        raw = self.model.get_output_embeddings()(h)
        lab = to(labels)
        lp = torch.log_softmax(raw.float(), dim=-1).gather(1, lab[:, None])[:, 0]
        sums = torch.zeros(n, dtype=torch.float64, device=dev)
        sums.index_add_(0, seg, lp.double())
        if not greedy:
            return sums, None
        miss = torch.zeros(n, dtype=torch.long, device=dev)
        miss.index_add_(0, seg, (first_max_index(raw) != lab).long())
        return sums, miss == 0


class _Results:
    """A scoring call's per-pair results, batch by batch: each batch's tensors stay where they were computed until
    :meth:`collect` brings all of them to the host at once, so a GPU is waited for once a call, not once a batch."""

    def __init__(self, n: int, greedy: bool):
        self.n, self.greedy = n, greedy
        self.parts: list[tuple[list[int], object, object]] = []

    def add(self, positions: list[int], sums, match) -> None:
        self.parts.append((positions, sums, match))

    def collect(self) -> tuple[np.ndarray, np.ndarray | None]:
        out = np.zeros(self.n, dtype=np.float64)
        match = np.zeros(self.n, dtype=bool) if self.greedy else None
        for pos, sums, m in self.parts:
            out[pos] = sums.cpu().numpy() if isinstance(sums, torch.Tensor) else sums
            if self.greedy:
                match[pos] = m.cpu().numpy()
        return out, match


def token_ids(tok, texts: Sequence[str], special: bool) -> list[list[int]]:
    """``tok(texts, add_special_tokens=special)["input_ids"]``, each distinct text tokenised once (EPR's label pairs
    repeat each target L times and each demonstration in several pairs). A fast tokenizer whose backend has no
    truncation or padding set and splits special tokens as the wrapper would (``encode_special_tokens`` ==
    ``split_special_tokens``) is asked directly (``encode_batch_fast``: the ids alone, without the offsets and masks
    the wrapper builds per text: 30% of the time in a profile); the ids are the wrapper's (tested). Anything else goes
    through the wrapper. The direct path skips the wrapper's switch of a seq2seq tokenizer back to input mode: a
    scorer's tokenizer is a causal LM's. Equal texts share one list: callers must not change it in place."""
    texts = list(texts)
    uniq = list(dict.fromkeys(texts))
    be = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
    direct = (
        be is not None
        and be.truncation is None
        and be.padding is None
        and getattr(be, "encode_special_tokens", None) == bool(getattr(tok, "split_special_tokens", False))
    )
    if not uniq:
        ids: list[list[int]] = []
    elif direct:
        enc = getattr(be, "encode_batch_fast", be.encode_batch)(uniq, add_special_tokens=special)
        ids = [e.ids for e in enc]
    else:
        ids = tok(uniq, add_special_tokens=special)["input_ids"]
    if len(uniq) == len(texts):
        return ids
    at = dict(zip(uniq, ids))
    return [at[t] for t in texts]


def _padded(seqs: Sequence[Sequence[int]], width: int, pad: int) -> torch.Tensor:
    """``(len(seqs), width)`` long tensor of right-padded rows, built in one call."""
    return torch.tensor([list(s) + [pad] * (width - len(s)) for s in seqs], dtype=torch.long)


def _target_index(spans: Sequence[tuple[int, Sequence[int]]]):
    """For row ``b`` with ``(p0, target)``: the hidden states at ``(b, p0 + k)`` predict ``target[k]``. Returns flat
    ``(rows, cols, labels)`` long tensors for :meth:`LMScorer._target_sums`."""
    rows, cols, labels = [], [], []
    for b, (p0, t) in enumerate(spans):
        rows += [b] * len(t)
        cols += range(p0, p0 + len(t))
        labels += t
    return tuple(torch.tensor(x, dtype=torch.long) for x in (rows, cols, labels))


def _prefix_batches(groups: list[tuple[int, ...]], batch_tokens: int) -> list[list[int]]:
    """Consecutive groups whose padded prefixes fit ``batch_tokens`` (at least one each)."""
    out: list[list[int]] = []
    cur: list[int] = []
    m = 0
    for g, p in enumerate(groups):
        nm = max(m, len(p))
        if cur and nm * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, nm = [], len(p)
        cur.append(g)
        m = nm
    if cur:
        out.append(cur)
    return out


@torch.inference_mode()
def reference_score(model, tokenizer, context: str, target: str) -> float:
    """The slow reference (EPR's original way): one sequence, full-vocabulary logits at every position."""
    c = tokenizer(context, add_special_tokens=True)["input_ids"]
    if not c:
        c = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id]
    t = tokenizer(target, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([c + t], device=next(model.parameters()).device)
    logits = model(input_ids=ids).logits.float()[0]
    lp = torch.log_softmax(logits[len(c) - 1 : -1], dim=-1)
    return float(lp.gather(1, torch.tensor(t, device=lp.device)[:, None]).sum())
