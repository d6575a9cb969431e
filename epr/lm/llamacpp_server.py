"""``epr serve``: llama.cpp's OpenAI-compatible server (llama-cpp-python) for a packaged GGUF model or a GGUF file,
started so that it returns correct prompt log-probabilities. Needs ``pip install "epr[server]"``.

Why not ``python -m llama_cpp.server`` as it comes: in llama-cpp-python (0.3.36, checked), the echoed log-probability
of prompt token i is read off the logits at position i, which predict token i+1, unless the prompt starts with a
BOS token (the code drops the BOS from the tokens but not from the logits, which aligns them only then). SmolLM2's
GGUF adds no BOS, so every echoed prompt log-prob is another token's: " Paris" after "Q: What is the capital of
France?\\nA:" comes back as -5.26, which is log p(" Paris" | ... " Paris"), where the right value is -2.99 (the
in-process scorer's, and llama.cpp's own logits read at the right position). Here each completion with ``echo``
and ``logprobs`` reads the logits of the position before (no change where a BOS leads), and at start-up the
server checks its echoed log-probs against llama.cpp's own evaluation of the same tokens: it refuses to start
if they disagree (so a future llama-cpp-python that fixes this upstream is detected, not shifted twice).

    epr serve --model smollm2 --port 8000          # then: --set server.base_url=http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import codecs
import logging
import os
import threading

import numpy as np

__all__ = ["gguf_path", "fixed_llama_class", "check_echo", "launch", "free_port", "serve"]

log = logging.getLogger(__name__)

_state = threading.local()  # per request: read the logits one position back (an echo with no leading BOS)


def gguf_path(model: str, cache: str | None = None) -> str:
    """A GGUF file for a packaged model name (``smollm2``, ``gemma3-270m`` with its license accepted) or a path."""
    from epr.lm.models import PACKAGED, _find_file, _join_parts, cache_dir, check_license

    if model in PACKAGED:
        check_license(model)
        spec = PACKAGED[model]
        if spec["kind"] == "gguf":
            return str(_find_file(spec["dists"], spec["file"])[0])
        if spec["kind"] == "gguf-parts":
            dest = cache_dir(cache) / "models" / spec["file"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            return str(_join_parts(spec, dest))
        raise ValueError(f"{model!r} is an encoder, not a GGUF LM")
    if not os.path.isfile(model):
        raise FileNotFoundError(f"{model}: not a packaged model ({', '.join(PACKAGED)}) nor a GGUF file")
    return model


def fixed_llama_class():
    """``llama_cpp.Llama`` whose echoed prompt log-probs are read at the right position (see the module doc)."""
    import llama_cpp
    from llama_cpp import llama as llama_mod

    base = llama_mod.Llama
    if getattr(base, "_epr_fixed", False):
        return base
    plain = base.logits_to_logprobs

    def logits_to_logprobs(logits, axis=-1):
        out = plain(logits, axis=axis)
        if getattr(_state, "shift", False) and np.ndim(out) == 2:
            # row i must be the distribution that predicts token i: the logits of position i - 1
            out = np.concatenate([np.zeros_like(out[:1]), out[:-1]], axis=0)
        return out

    class EchoFixedLlama(base):
        _epr_fixed = True
        _epr_shift = True  # upstream echo path: read one position back (check_echo decides at start-up)
        _epr_fast = True  # scoring requests (echo, logprobs, <= 1 greedy token) take score_echo

        def _create_completion(self, prompt, *args, **kwargs):
            echo = kwargs.get("echo", False) and kwargs.get("logprobs") is not None
            greedy = (kwargs.get("temperature") or 0.0) == 0.0 and kwargs.get("max_tokens") in (0, 1)
            if (
                echo
                and greedy
                and self._epr_fast
                and not kwargs.get("stream")
                and kwargs.get("suffix") is None
            ):
                yield score_echo(self, prompt, kwargs.get("max_tokens"), kwargs.get("model"))
                return
            toks = prompt if isinstance(prompt, list) else self.tokenize(prompt.encode("utf-8"), special=True)
            _state.shift = bool(echo and self._epr_shift and (not toks or toks[0] != self.token_bos()))
            try:
                yield from super()._create_completion(prompt, *args, **kwargs)
            finally:
                _state.shift = False

    base.logits_to_logprobs = staticmethod(logits_to_logprobs)
    llama_cpp.Llama = EchoFixedLlama  # what llama_cpp.server.model instantiates
    return EchoFixedLlama


def _is_eog(llm, token: int) -> bool:
    import llama_cpp

    return bool(llama_cpp.llama_vocab_is_eog(llm._model.vocab, token))


def score_echo(llm, prompt, max_tokens: int | None, model: str | None) -> dict:
    """A completion answer with the prompt's log-probabilities, for scoring requests (echo, logprobs, at most one
    greedy token). The upstream path sorts the whole vocabulary in Python for every echoed token (~2 s for a
    70-token prompt with SmolLM2's 49k vocabulary); this reads the log-prob of each token and the best token per
    position with vectorised numpy, and reuses the key/value cache of the longest prefix shared with the previous
    request (label scoring sends each demonstration's [x][y] candidates one after another)."""
    import time
    import uuid

    text = prompt if isinstance(prompt, str) else llm.detokenize(prompt).decode("utf-8", errors="ignore")
    toks = list(prompt) if isinstance(prompt, list) else llm.tokenize(prompt.encode("utf-8"), special=True)
    if not toks:
        raise ValueError("empty prompt")
    if len(toks) + 1 > llm.n_ctx():
        raise ValueError(f"Requested tokens ({len(toks)}) exceed context window of {llm.n_ctx()}")
    keep = 0
    for a, b in zip(llm.input_ids[: llm.n_tokens], toks):
        if a != b:
            break
        keep += 1
    llm.n_tokens = min(keep, len(toks) - 1)  # the last token runs again: its logits are the live ones
    llm.eval(toks[llm.n_tokens :])
    s = llm.scores[: len(toks)]  # float32 logits, one row per position
    best = s.argmax(axis=1)
    top_logit = s[np.arange(len(toks)), best].astype(np.float64)
    lse = top_logit + np.log(np.exp(s - top_logit[:, None].astype(np.float32)).sum(axis=1, dtype=np.float64))
    ids = toks + ([int(best[-1])] if max_tokens == 1 and not _is_eog(llm, int(best[-1])) else [])
    lp: list[float | None] = [None] + [
        float(np.float64(s[i - 1, ids[i]]) - lse[i - 1]) for i in range(1, len(ids))
    ]
    # a character split over several tokens belongs to the token that completes it (none is lost)
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [dec.decode(llm.detokenize([t], prev_tokens=ids[:i])) for i, t in enumerate(ids)]
    top: list[dict | None] = [None]
    for i in range(1, len(ids)):
        b = int(best[i - 1])
        top.append(
            {
                llm.detokenize([b]).decode("utf-8", errors="ignore"): float(top_logit[i - 1] - lse[i - 1]),
                pieces[i]: lp[i],
            }
        )
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in pieces])[:-1]]).astype(int).tolist()
    gen = "".join(pieces[len(toks) :])
    return {
        "id": f"cmpl-{uuid.uuid4()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model or llm.model_path,
        "choices": [
            {
                "text": text + gen,
                "index": 0,
                "logprobs": {
                    "tokens": pieces,
                    "text_offset": offsets,
                    "token_logprobs": lp,
                    "top_logprobs": top,
                },
                "finish_reason": "length" if gen or max_tokens == 0 else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": len(toks),
            "completion_tokens": len(ids) - len(toks),
            "total_tokens": len(ids),
        },
    }


def _reference(llm, text: str) -> tuple[list[int], np.ndarray]:
    """llama.cpp's own log p(token_i | tokens before i) for ``text``'s tokens (row i - 1, column token i)."""
    toks = llm.tokenize(text.encode("utf-8"), special=True)
    llm.reset()
    llm.eval(toks)
    s = np.asarray(llm.scores[: len(toks)], dtype=np.float64)
    lp = s - np.logaddexp.reduce(s, axis=1, keepdims=True)
    return toks, np.array([lp[i - 1, toks[i]] for i in range(1, len(toks))])


def check_echo(llm, text: str = "Q: What is the capital of France?\nA: Paris") -> dict:
    """Compare the echoed prompt log-probs with llama.cpp's own evaluation. Decides whether the shift is needed
    (the upstream behaviour) and verifies the result; raises if the echo cannot be made to agree."""
    toks, full = _reference(llm, text)
    skip = 1 if toks and toks[0] == llm.token_bos() else 0  # the upstream echo leaves a leading BOS out
    ref = full[skip:] if skip else full

    def echoed(max_tokens: int) -> np.ndarray:
        r = llm.create_completion(text, max_tokens=max_tokens, echo=True, logprobs=1, temperature=0.0)
        lp = r["choices"][0]["logprobs"]["token_logprobs"][
            1 : 1 + len(ref)
        ]  # the prompt's (the first is null)
        return np.array([np.nan if v is None else v for v in lp], dtype=np.float64)

    def agrees(x: np.ndarray) -> bool:
        return x.shape == ref.shape and bool(np.allclose(x, ref, atol=1e-3))

    cls = type(llm)
    cls._epr_fast, cls._epr_shift = False, False
    plain = echoed(2)  # llama-cpp-python's own echo path, as it comes
    cls._epr_shift = True
    shifted = echoed(2)
    cls._epr_shift = not agrees(plain)
    cls._epr_fast = True
    r = llm.create_completion(text, max_tokens=1, echo=True, logprobs=1, temperature=0.0)
    lp = r["choices"][0]["logprobs"]["token_logprobs"][1 : 1 + len(full)]  # the fast path keeps a BOS
    fast = np.array([np.nan if v is None else v for v in lp], dtype=np.float64)
    ref_fast = full
    fast_ok = fast.shape == ref_fast.shape and bool(np.allclose(fast, ref_fast, atol=1e-3))
    if not (agrees(plain) or agrees(shifted)) or not fast_ok:
        raise RuntimeError(
            f"llama.cpp's echoed prompt log-probs (as they come {plain.round(3).tolist()}, fast path "
            f"{fast.round(3).tolist()}) disagree with its own evaluation {full.round(3).tolist()}: refusing to serve"
        )
    return {"shift": not agrees(plain), "max_abs_diff": float(np.max(np.abs(fast - ref_fast)))}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class launch:
    """``with launch("smollm2") as url:`` runs ``epr serve`` in a subprocess until the block ends; ``url`` is its
    ``.../v1`` base URL (for ``server.base_url``). Waits until the server answers (or its process fails).
    ``stop()`` / ``start()`` kill and restart it on the same port (the tests' dying server)."""

    def __init__(
        self,
        model: str = "smollm2",
        port: int | None = None,
        threads: int | None = None,
        n_ctx: int = 2048,
        timeout_s: float = 180.0,
        log_path: str | None = None,
    ):
        self.model, self.port, self.threads, self.n_ctx = model, port or free_port(), threads, n_ctx
        self.timeout_s, self.log_path, self.proc = timeout_s, log_path, None
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> str:
        import subprocess
        import sys
        import tempfile
        import time
        import urllib.request

        cmd = [
            sys.executable,
            "-m",
            "epr.cli",
            "serve",
            "--model",
            self.model,
            "--port",
            str(self.port),
            "--n-ctx",
            str(self.n_ctx),
        ]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        log_path = self.log_path or tempfile.mktemp(prefix="epr-serve-", suffix=".log")
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < self.timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"epr serve exited with {self.proc.returncode}; its log: {log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as r:
                    if r.status == 200:
                        return self.url
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"epr serve did not answer within {self.timeout_s:.0f} s; its log: {log_path}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self._log.close()


def serve(
    model: str = "smollm2",
    alias: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    n_ctx: int = 2048,
    threads: int | None = None,
) -> None:
    """Serve a packaged LM (or a .gguf file) through llama.cpp's OpenAI-compatible server, after checking that its
    echoed prompt log-probabilities agree with llama.cpp's own evaluation (``epr serve``: ``epr.cli.serve``)."""
    try:
        import llama_cpp
        import uvicorn
        from llama_cpp.server.app import create_app
        from llama_cpp.server.settings import ModelSettings, ServerSettings
    except ImportError:
        raise SystemExit(
            'epr serve needs llama.cpp\'s server: pip install "epr[server]" (builds llama-cpp-python from source, '
            "a few minutes; see README)"
        ) from None
    path = gguf_path(model)
    threads = threads or os.cpu_count() or 1
    cls = fixed_llama_class()
    probe = cls(path, logits_all=True, n_ctx=256, n_threads=threads, verbose=False)
    found = check_echo(probe)
    del probe
    log.info(
        "llama-cpp-python %s: echoed prompt log-probs %s; agree with llama.cpp's evaluation to %.1e",
        llama_cpp.__version__,
        "read one position back (the upstream offset)" if found["shift"] else "as they come",
        found["max_abs_diff"],
    )
    ms = ModelSettings(
        model=path,
        model_alias=alias or model,
        logits_all=True,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    ss = ServerSettings(host=host, port=port)
    uvicorn.run(
        create_app(server_settings=ss, model_settings=[ms]), host=host, port=port, log_level="warning"
    )
