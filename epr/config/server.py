"""The ``server`` section: an LM behind an OpenAI-compatible server instead of in-process."""

from __future__ import annotations

from dataclasses import dataclass

from epr.config.names import opt
from epr.types import ConfigError

__all__ = ["ServerConfig"]

SERVED = "a served model's name: the server is asked for it when used (a missing one is named)"


@dataclass(frozen=True)
class ServerConfig:
    """An LM behind an OpenAI-compatible server (vLLM, llama.cpp, a provider's API: ``epr/lm/served.py``). With
    ``base_url`` set, scoring, the quality bias, TruthfulQA and generation go to the server; the local tokenizer of
    ``models.lm`` / ``models.inference_lm`` (or ``tokenizer``) turns texts into the token ids that are sent, so the
    scored tokens are exactly those of the in-process scorer."""

    base_url: str | None = opt(
        None,
        "e.g. http://localhost:8000/v1; null: the LM runs in-process",
        free="a URL: checked at load to start with http:// or https://; the server is reached when used",
    )
    model: str | None = opt(
        None, "the served scoring LM's name; null: the only model the server lists", free=SERVED
    )
    inference_model: str | None = opt(None, "the served inference LM; null: server.model", free=SERVED)
    tokenizer: str | None = opt(
        None,
        "local tokenizer matching the served model; null: models.lm's (inference_lm's)",
        free="a model name or folder, resolved when loaded (the error names it)",
    )
    api_key_env: str = opt(
        "OPENAI_API_KEY",
        "the environment variable that holds the API key (unset: no key sent)",
        free="any variable name: one that is not set sends no key",
    )
    concurrency: int = opt(4, "requests in flight at once", ge=1)
    max_retries: int = opt(
        5, "per request, on 429 / 5xx / a refused or dropped connection, with exponential backoff", ge=0
    )
    backoff_s: float = opt(
        1.0, "first retry's wait in seconds; doubles each retry (a Retry-After header wins)", ge=0.0
    )
    timeout_s: float = opt(300.0, "per request, in seconds", gt=0.0)
    max_length: int | None = opt(
        None, "the served context window in tokens; null: the server's, else the model config's", ge=1
    )

    def __post_init__(self):  # the numbers' ranges are declared with them and checked at load
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"config server.base_url={self.base_url!r}: expected http(s)://host:port/v1")
