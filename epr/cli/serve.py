"""``epr serve``: a packaged LM behind llama.cpp's OpenAI-compatible server (``epr.lm.llamacpp_server.serve``)."""

from __future__ import annotations

import argparse
import logging

from epr.lm import llamacpp_server

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="epr serve", description=llamacpp_server.__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="a packaged LM (smollm2, gemma3-270m) or a .gguf file")
    ap.add_argument("--alias", default=None, help="the model name clients ask for (default: --model)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--n-ctx", type=int, default=2048, help="context window in tokens")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    llamacpp_server.serve(a.model, a.alias, a.host, a.port, a.n_ctx, a.threads)
    return 0
