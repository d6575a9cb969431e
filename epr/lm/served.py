"""Any LM behind an OpenAI-compatible server (vLLM, llama.cpp's server, a provider's API) for scoring, the quality
bias, TruthfulQA and generation. Needs ``httpx`` (``pip install "epr[server]"``).

Scoring sends ``context + target`` with ``echo: true, logprobs: 1, max_tokens: 1`` and sums the echoed
log-probabilities of the target's tokens, checked to be the tokens the in-process :class:`epr.lm.scoring.LMScorer`
scores (the local tokenizer of the same model counts and spells them). A server that returns no prompt
log-probabilities is an error that says how to start one that does. Requests run ``server.concurrency`` at a time;
429 / 5xx answers and refused or dropped connections are retried with exponential backoff (a ``Retry-After``
header wins); what still fails raises :class:`ServerError` naming the server. The stages above keep what they
finished (``epr.cache.ChunkStore`` chunks, the score cache), so the same command resumes once the server is
back.

    server:
      base_url: http://localhost:8000/v1     # vLLM: vllm serve HuggingFaceTB/SmolLM2-135M-Instruct
      model: HuggingFaceTB/SmolLM2-135M-Instruct
      api_key_env: OPENAI_API_KEY            # read from the environment, never written anywhere
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from epr.lm.scoring import SequenceTooLong, TokenScorer
from epr.types import UserError

__all__ = [
    "OpenAIServer",
    "ServerError",
    "ServerCannotScore",
    "ServerScorer",
    "ServerGenerator",
    "server_for",
    "scorer_for_config",
    "generator_for_config",
    "served_model",
]

log = logging.getLogger(__name__)

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)
RESUME_HINT = "what finished is kept: start the server again and rerun the same command to resume"
# what servers say when they cannot return log-probabilities (llama-cpp-python started without logits_all)
NO_LOGPROBS = ("logprobs is not supported", "logits_all")
CANNOT_SCORE = (
    "this server cannot score prompts. It must echo prompt log-probabilities (completions with echo=true and "
    "logprobs): `epr serve` (llama.cpp) and vLLM do; chat-only provider APIs (OpenAI's current models) do not"
)


class ServerError(UserError, RuntimeError):
    """A request to the LM server failed for good (after the retries, or with an answer that retrying cannot fix)."""


class ServerCannotScore(ServerError):
    """The server answered but returned no log-probabilities for the prompt's tokens."""


class OpenAIServer:
    """A small client of an OpenAI-compatible HTTP API: bounded concurrency, retries with backoff."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        concurrency: int = 4,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 300.0,
    ):
        import httpx

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
        self.base_url = base_url.rstrip("/")
        self.concurrency, self.max_retries, self.backoff_s = concurrency, max_retries, backoff_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.Client(headers=headers, timeout=timeout_s, limits=limits)
        self._httpx = httpx
        self._sleep = time.sleep  # tests make the waits instant

    def close(self) -> None:
        self._http.close()

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        if retry_after:
            try:
                return min(max(float(retry_after), 0.0), 60.0)
            except ValueError:
                pass
        return self.backoff_s * (2**attempt) * (0.5 + random.random() / 2)

    def request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One JSON request, retried on 429 / 5xx / connection errors; anything else raises at once."""
        url = f"{self.base_url}{path}"
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                r = self._http.request(method, url, json=payload)
            except self._httpx.TransportError as e:  # refused, reset, timed out
                last, retry_after = f"{type(e).__name__}: {e}", None
            else:
                if r.status_code < 400:
                    try:
                        return r.json()
                    except ValueError:
                        raise ServerError(
                            f"{url}: answered {r.status_code} with non-JSON: {r.text[:200]!r}"
                        ) from None
                last, retry_after = f"HTTP {r.status_code}: {r.text[:300]}", r.headers.get("retry-after")
                if any(p in r.text.lower() for p in NO_LOGPROBS):  # retrying cannot fix this one
                    raise ServerCannotScore(f"{url}: {last}; {CANNOT_SCORE}")
                if r.status_code not in RETRY_STATUS:
                    raise ServerError(f"{url}: {last}")
            if attempt < self.max_retries:
                wait = self._wait(attempt, retry_after)
                log.warning("%s: %s; retry %d/%d in %.1f s", url, last, attempt + 1, self.max_retries, wait)
                self._sleep(wait)
        raise ServerError(f"{url}: {last} (gave up after {self.max_retries + 1} attempts); {RESUME_HINT}")

    def post(self, path: str, payload: dict) -> dict:
        return self.request("POST", path, payload)

    def map(
        self, path: str, payloads: Sequence[dict], on_done: Callable[[], None] | None = None
    ) -> list[dict]:
        """POST every payload, ``concurrency`` at a time; answers in the order of ``payloads``. The first failure
        stops the rest (requests already sent finish) and is raised."""
        if not payloads:
            return []
        stop = threading.Event()

        def one(p: dict) -> dict | None:
            if stop.is_set():
                return None
            try:
                out = self.post(path, p)
            except BaseException:
                stop.set()
                raise
            if on_done is not None:
                on_done()
            return out

        if self.concurrency == 1 or len(payloads) == 1:
            return [one(p) for p in payloads]
        pool = ThreadPoolExecutor(self.concurrency)
        try:
            futures = [pool.submit(one, p) for p in payloads]
            return [f.result() for f in futures]
        finally:  # on a failure or Ctrl-C, requests not yet sent are not sent
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)

    def models(self) -> list[dict]:
        return list(self.request("GET", "/models").get("data", []))


def served_model(server: OpenAIServer, name: str | None) -> tuple[str, dict]:
    """The model to ask for (``name``, or the only one the server lists) and what the server says of it."""
    listed = server.models()
    if name is None:
        if len(listed) != 1:
            ids = [m.get("id") for m in listed]
            raise ServerError(
                f"{server.base_url} serves {len(listed)} models {ids}: name one in server.model"
            )
        return listed[0]["id"], listed[0]
    return name, next((m for m in listed if m.get("id") == name), {})


def _echo(resp: dict, url: str) -> tuple[list[float | None], list[str], list[int]]:
    """The echoed tokens' log-probabilities, texts and character offsets of one completion answer."""
    try:
        choice = resp["choices"][0]
    except (KeyError, IndexError, TypeError):
        raise ServerError(f"{url}: a completion answer without choices: {str(resp)[:300]}") from None
    info = choice.get("logprobs") or {}
    lp, toks = info.get("token_logprobs"), info.get("tokens")
    if not lp or not toks or len(lp) != len(toks) or all(v is None for v in lp[1:]):
        raise ServerCannotScore(
            f"{url}: the answer has no log-probabilities for the prompt's tokens: {CANNOT_SCORE}"
        )
    return lp, toks, list(info.get("text_offset") or [])


def target_span(toks: list[str], offsets: list[int], text: str, target: str, n: int) -> int | None:
    """Where the ``n`` target tokens start among the echoed tokens of ``text`` (= context + target): they end at
    the last prompt token, which is the last echoed token or the one before it (servers differ on whether the
    generated token is echoed too), and must spell ``target``. None: no such run of tokens."""
    fits = [
        e
        for e in (len(toks) - 1, len(toks) - 2)
        if e - n + 1 >= 1 and "".join(toks[e - n + 1 : e + 1]) == target
    ]
    if len(fits) > 1 and len(offsets) == len(toks):
        # both spell it: the one that starts where the target does
        fits = [e for e in fits if offsets[e - n + 1] == len(text) - len(target)] or fits[-1:]
    return fits[0] - n + 1 if fits else None


class ServerScorer(TokenScorer):
    """:class:`epr.lm.scoring.TokenScorer` through an OpenAI-compatible server: one completion request per sequence
    (``echo: true, logprobs: 1, max_tokens: 1``), ``server.concurrency`` in flight. The text ``context + target``
    is sent (every OpenAI-compatible server takes text; not all take token ids) and the target's log-prob is the
    sum over the last ``len(target tokens)`` echoed prompt tokens, the count our tokenizer gives; the echoed
    tokens must spell the target, or the server tokenises differently and the pair is an error (name the served
    model's tokenizer in ``server.tokenizer``). The server shares the work of common prefixes itself where it
    caches them (vLLM's prefix caching, llama.cpp's prompt cache)."""

    prefix_share = False

    def __init__(self, server: OpenAIServer, model: str, tokenizer, max_length: int):
        self.server, self.model_name, self.tok, self.max_length = server, model, tokenizer, max_length
        self.model = None  # no weights here (callers that need an in-process LM check this)
        # an empty context is the start token (as in-process), written out where the tokenizer adds none itself
        start = self._start_token()
        self._empty = "" if tokenizer("", add_special_tokens=True)["input_ids"] else tokenizer.decode([start])
        # special tokens (a chat template's markup) are echoed by llama.cpp as empty texts: compare without them
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._specials = sorted({t.content for t in decoder.values() if t.special}, key=len, reverse=True)

    def spelled(self, text: str) -> str:
        """``text`` as a server that echoes special tokens as empty texts spells it."""
        for sp in self._specials:
            text = text.replace(sp, "")
        return text

    def payload(self, text: str) -> dict:
        return {
            "model": self.model_name,
            "prompt": text,
            "max_tokens": 1,
            "echo": True,
            "logprobs": 1,
            "temperature": 0.0,
        }

    def too_long(self, pairs) -> list[int]:
        # the server also makes room for the one token it generates after the prompt
        return [i for i, (c, t) in enumerate(pairs) if len(c) + len(t) + 1 > self.max_length]

    def score_ids(self, pairs):
        raise TypeError("a server scores texts: use score(contexts, targets) or score_pairs(...)")

    def score_pairs(
        self, contexts: Sequence[str], targets: Sequence[str], pairs: Sequence[tuple[list[int], list[int]]]
    ) -> np.ndarray:
        self._check_fits(pairs)
        url = f"{self.server.base_url}/completions"
        texts = [(c or self._empty) + t for c, t in zip(contexts, targets)]
        # sent in text order: sequences that share a demonstration go one after another, so a server that caches
        # the previous prompt's prefix (llama.cpp keeps one per slot) computes it once for all of them
        order = sorted(range(len(texts)), key=texts.__getitem__)
        try:
            sent = self.server.map("/completions", [self.payload(texts[i]) for i in order])
        except ServerError as e:
            if "HTTP 400" in str(e) and ("context" in str(e).lower() or "token" in str(e).lower()):
                raise SequenceTooLong(f"{e} (set server.max_length to the served context window)") from e
            raise
        resps: list[dict] = [{}] * len(texts)
        for i, r in zip(order, sent):
            resps[i] = r
        out = np.empty(len(pairs), dtype=np.float64)
        for i, ((_c, t), r) in enumerate(zip(pairs, resps)):
            lp, toks, offsets = _echo(r, url)
            n = len(t)
            j = target_span(toks, offsets, texts[i], targets[i], n)
            if j is None and self._specials:  # the special tokens echoed as empty texts
                j = target_span(toks, offsets, self.spelled(texts[i]), self.spelled(targets[i]), n)
            if j is None or any(v is None for v in lp[j : j + n]):
                raise ServerError(
                    f"{url}: pair {i}: the server's echoed tokens {toks[-n - 1 :]!r} do not end in the {n} tokens "
                    f"our tokenizer splits the target {targets[i]!r} into: the served model tokenises differently "
                    "(name its tokenizer in server.tokenizer)"
                )
            out[i] = float(np.sum(np.asarray(lp[j : j + n], dtype=np.float64)))
        return out


class ServerGenerator:
    """Greedy generation through the server's completions endpoint, cut at the first ``stop``."""

    def __init__(self, server: OpenAIServer, model: str, max_new_tokens: int = 96, stop: str = "\n"):
        self.server, self.model_name = server, model
        self.max_new_tokens, self.stop = max_new_tokens, stop

    def generate(self, prompts: Sequence[str]) -> list[str]:
        payloads = [
            {
                "model": self.model_name,
                "prompt": x,
                "max_tokens": self.max_new_tokens,
                "temperature": 0.0,
                "repeat_penalty": 1.0,  # llama.cpp's server defaults to 1.1: not the greedy decoding we compare
                "stop": [self.stop],
            }
            for x in prompts
        ]
        out = []
        for r in self.server.map("/completions", payloads):
            text = r["choices"][0].get("text") or ""
            out.append(text.split(self.stop, 1)[0].strip())
        return out


def server_for(sc) -> OpenAIServer:
    """The client for a run's ``server`` config (the API key from ``sc.api_key_env``, if set)."""
    if not sc.base_url:
        raise ValueError("config server.base_url is not set")
    try:
        import httpx  # noqa: F401
    except ImportError:
        raise ImportError('an LM behind a server needs httpx: pip install "epr[server]"') from None
    return OpenAIServer(
        sc.base_url,
        os.environ.get(sc.api_key_env),
        sc.concurrency,
        sc.max_retries,
        sc.backoff_s,
        sc.timeout_s,
    )


def _tokenizer_for(cfg, inference: bool):
    from transformers import AutoTokenizer

    from epr.lm.models import load_tokenizer_for, quiet_length_warning, resolve_lm

    if cfg.server.tokenizer:
        tok = quiet_length_warning(
            AutoTokenizer.from_pretrained(resolve_lm(cfg.server.tokenizer, cfg.models.cache_dir))
        )
    else:
        tok = load_tokenizer_for(cfg.models, inference)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _max_length(cfg, info: dict, tok) -> int:
    if cfg.server.max_length:
        return cfg.server.max_length
    if info.get("max_model_len"):  # vLLM lists it
        return int(info["max_model_len"])
    from transformers import AutoConfig

    from epr.lm.identity import lm_name
    from epr.lm.models import resolve_lm

    try:
        mc = AutoConfig.from_pretrained(
            resolve_lm(cfg.server.tokenizer or lm_name(cfg.models), cfg.models.cache_dir)
        )
        return int(getattr(mc, "max_position_embeddings", 2048))
    except (OSError, ValueError):
        return 2048


def served_name(cfg, inference: bool = False) -> str | None:
    sc = cfg.server
    return (sc.inference_model or sc.model) if inference else sc.model


def scorer_for_config(cfg, inference: bool = False) -> ServerScorer:
    server = server_for(cfg.server)
    name, info = served_model(server, served_name(cfg, inference))
    tok = _tokenizer_for(cfg, inference)
    scorer = ServerScorer(server, name, tok, _max_length(cfg, info, tok))
    log.info("scoring through %s (model %s, %d in flight)", server.base_url, name, server.concurrency)
    return scorer


def generator_for_config(cfg, stop: str) -> ServerGenerator:
    server = server_for(cfg.server)
    name, _ = served_model(server, served_name(cfg, inference=True))
    return ServerGenerator(server, name, cfg.generate.max_new_tokens, stop)
