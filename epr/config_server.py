"""The ``server`` section: an LM behind an OpenAI-compatible server instead of in-process."""

from __future__ import annotations

from dataclasses import dataclass

from epr.config_names import opt
from epr.types import ConfigError

__all__ = ["ServerConfig"]


@dataclass(frozen=True)
class ServerConfig:
    """An LM behind an OpenAI-compatible server (vLLM, llama.cpp, a provider's API: ``epr/lm/served.py``). With
    ``base_url`` set, scoring, the quality bias, TruthfulQA and generation go to the server; the local tokenizer of
    ``models.lm`` / ``models.inference_lm`` (or ``tokenizer``) turns texts into the token ids that are sent, so the
    scored tokens are exactly those of the in-process scorer."""

    base_url: str | None = opt(None, "e.g. http://localhost:8000/v1; null: the LM runs in-process")
    model: str | None = opt(None, "the served scoring LM's name; null: the only model the server lists")
    inference_model: str | None = opt(None, "the served inference LM; null: server.model")
    tokenizer: str | None = opt(
        None, "local tokenizer matching the served model; null: models.lm's (inference_lm's)"
    )
    api_key_env: str = opt(
        "OPENAI_API_KEY", "the environment variable that holds the API key (unset: no key sent)"
    )
    concurrency: int = opt(4, "requests in flight at once (>= 1)")
    max_retries: int = opt(
        5, "per request, on 429 / 5xx / a refused or dropped connection, with exponential backoff (>= 0)"
    )
    backoff_s: float = opt(
        1.0, "first retry's wait in seconds; doubles each retry (a Retry-After header wins)"
    )
    timeout_s: float = opt(300.0, "per request, in seconds (> 0)")
    max_length: int | None = opt(
        None, "the served context window in tokens; null: the server's, else the model config's"
    )

    def __post_init__(self):
        if self.concurrency < 1 or self.max_retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ConfigError(
                "config server: concurrency must be >= 1, max_retries >= 0, backoff_s >= 0, timeout_s > 0"
            )
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"config server.base_url={self.base_url!r}: expected http(s)://host:port/v1")
