"""The OpenAI-compatible client (epr.lm.served) against a scripted HTTP server: retries, backoff, clear errors.

The real server (llama.cpp's, serving the packaged SmolLM2) is in tests/lm/test_served_llamacpp.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tests.extras import need

need("httpx")

from epr.lm.served import OpenAIServer, ServerCannotScore, ServerError, ServerScorer  # noqa: E402


class Scripted:
    """A local HTTP server that answers each request with the next scripted (status, body, headers), or with
    ``script(body)`` when the script is a function."""

    def __init__(self, script):
        self.script = script if callable(script) else list(script)
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, body_in):
                outer.requests.append((self.command, self.path, body_in))
                if callable(outer.script):
                    status, body, headers = outer.script(body_in)
                else:
                    status, body, headers = outer.script.pop(0) if outer.script else (200, {}, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                self._answer(json.loads(self.rfile.read(n)))

            def do_GET(self):
                self._answer(None)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def waits():
    return []


def client(url, waits, **kw):
    c = OpenAIServer(url, api_key="sk-test", concurrency=kw.pop("concurrency", 1), backoff_s=0.5, **kw)
    c._sleep = waits.append  # record the backoff instead of sleeping
    return c


def echo(lps, text=None):
    """A completion answer echoing ``text`` one character per token (and one generated token "!")."""
    toks = list(text) + ["!"] if text is not None else ["?"] * len(lps)
    return {"choices": [{"text": (text or "") + "!", "logprobs": {"token_logprobs": lps, "tokens": toks}}]}


def test_retries_5xx_and_429_with_backoff_then_succeeds(waits):
    s = Scripted(
        [
            (503, {"error": "busy"}, {}),
            (429, {"error": "slow down"}, {"Retry-After": "7"}),
            (200, {"ok": 1}, {}),
        ]
    )
    try:
        out = client(s.url, waits, max_retries=3).post("/completions", {"a": 1})
    finally:
        s.close()
    assert out == {"ok": 1}
    assert len(s.requests) == 3
    assert 0.25 <= waits[0] <= 0.5 and waits[1] == 7.0  # exponential backoff, then the server's Retry-After


def test_client_error_is_not_retried_and_names_the_server(waits):
    s = Scripted([(401, {"error": "bad key"}, {})])
    try:
        with pytest.raises(ServerError, match=r"/v1/completions: HTTP 401.*bad key"):
            client(s.url, waits, max_retries=3).post("/completions", {})
    finally:
        s.close()
    assert len(s.requests) == 1 and waits == []


def test_gives_up_after_the_retries_and_says_how_to_resume(waits):
    s = Scripted([(502, {}, {})] * 3)
    try:
        with pytest.raises(ServerError, match=r"HTTP 502.*gave up after 3 attempts.*rerun the same command"):
            client(s.url, waits, max_retries=2).post("/completions", {})
    finally:
        s.close()
    assert len(waits) == 2 and waits[1] > waits[0] / 2


def test_refused_connection_is_retried_then_a_clear_error(waits):
    s = Scripted([])
    url = s.url
    s.close()
    s.httpd.server_close()  # nothing listens there any more
    with pytest.raises(ServerError, match=r"ConnectError.*gave up after 2 attempts"):
        client(url, waits, max_retries=1).post("/completions", {})
    assert len(waits) == 1


def test_api_key_from_the_environment_is_sent(waits):
    s = Scripted([(200, {}, {})])
    seen = {}

    import httpx

    c = client(s.url, waits)
    c._http = httpx.Client(
        headers=c._http.headers,
        event_hooks={"request": [lambda r: seen.update(auth=r.headers.get("authorization"))]},
    )
    try:
        c.post("/x", {})
    finally:
        s.close()
    assert seen["auth"] == "Bearer sk-test"


class WordTok:
    """A tokenizer stand-in: one id per character."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __call__(self, texts, add_special_tokens=True):
        if isinstance(texts, str):
            return {"input_ids": [ord(ch) for ch in texts]}
        return {"input_ids": [[ord(ch) for ch in t] for t in texts]}

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_scorer_sums_the_target_tokens_of_the_echo_and_keeps_order(waits):
    # context "ab" + target "cd": 4 prompt tokens (+1 generated); the target's are positions 2 and 3. Requests go
    # in text order ("abcd" < "xyz"); answers come back in the caller's order ("xyz" asked first)
    s = Scripted(
        [
            (200, echo([None, -1.0, -0.5, -0.25, -9.0], "abcd"), {}),
            (200, echo([None, -2.0, -3.0, -9.0], "xyz"), {}),
        ]
    )
    try:
        sc = ServerScorer(client(s.url, waits), "m", WordTok(), 100)
        out = sc.score(["x", "ab"], ["yz", "cd"])
    finally:
        s.close()
    np.testing.assert_allclose(out, [-5.0, -0.75])
    sent = [body for _, _, body in s.requests]
    assert sent[0]["prompt"] == "abcd" and sent[0]["echo"] is True and sent[0]["logprobs"] == 1
    assert sent[0]["model"] == "m" and sent[0]["max_tokens"] == 1


def test_a_server_without_prompt_logprobs_is_a_clear_error(waits):
    s = Scripted([(200, {"choices": [{"text": "x", "logprobs": None}]}, {})])
    try:
        with pytest.raises(ServerCannotScore, match=r"cannot score prompts.*`epr serve`"):
            ServerScorer(client(s.url, waits), "m", WordTok(), 100).score(["ab"], ["c"])
    finally:
        s.close()


def test_concurrent_requests_keep_their_order(waits):
    # each answer's target log-prob is minus the prompt's last token id: the order is checkable
    s = Scripted(
        lambda body: (
            200,
            echo(
                [None] * (len(body["prompt"]) - 1) + [-float(ord(body["prompt"][-1])), -9.0], body["prompt"]
            ),
            {},
        )
    )
    try:
        sc = ServerScorer(client(s.url, waits, concurrency=4), "m", WordTok(), 100)
        targets = [chr(ord("a") + i % 26) for i in range(40)]
        out = sc.score(["q"] * 40, targets)
    finally:
        s.close()
    assert len(s.requests) == 40
    np.testing.assert_allclose(out, [-float(ord(t)) for t in targets])


def test_a_server_that_tokenises_differently_is_an_error(waits):
    # the echo splits "cd" as one token where our tokenizer has two: the scores would be of other tokens
    bad = {
        "choices": [
            {
                "text": "abcd!",
                "logprobs": {"token_logprobs": [None, -1.0, -0.5, -9.0], "tokens": ["a", "b", "cd", "!"]},
            }
        ]
    }
    s = Scripted([(200, bad, {})])
    try:
        with pytest.raises(ServerError, match=r"pair 0: .* tokenises differently"):
            ServerScorer(client(s.url, waits), "m", WordTok(), 100).score(["ab"], ["cd"])
    finally:
        s.close()
