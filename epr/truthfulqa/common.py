"""What the TruthfulQA stages share: the data file's key, the answer log-probs' LM key, the cache folders and the
lazily loaded scorer (``epr.truthfulqa.stage`` and ``epr.truthfulqa.learned``)."""

from __future__ import annotations

from pathlib import Path

from epr.cache import file_digest, fingerprint
from epr.truthfulqa import sets as tqa

__all__ = ["data_key", "lp_key", "cache_dir", "LazyScorer"]


def data_key(cfg) -> dict:
    path = tqa.data_file(cfg.data.data_dir, cfg.truthfulqa.version) if cfg.data.data_dir else None
    digest = file_digest(path) if path else None
    return {"version": cfg.truthfulqa.version, "file": str(path), "sha256": digest}


def lp_key(cfg) -> dict:
    """The answer log-probs' LM (shared-prefix scoring: one question's answers in one batch, so no layout key)."""
    from epr.lm.factory import lm_key

    key = {"what": "tqa-logprobs", "version": cfg.truthfulqa.version, **lm_key(cfg)}
    if (
        not cfg.server.base_url
    ):  # the in-process shared-prefix engine (2: LMScorer.score_prefixed); bf16 sees it
        key["prefix_engine"] = 2
    return key


def cache_dir(cfg, what: str, key: dict) -> Path:
    return Path(cfg.run_root) / ".cache" / "truthfulqa" / f"{what}-{fingerprint(key)}"


class LazyScorer:
    """The LM behind an ``LMScorer``, loaded on the first chunk that is not cached (none: no LM load at all)."""

    def __init__(self, ctx):
        self.ctx, self.scorer = ctx, None

    def __call__(self):
        if self.scorer is None:
            from epr.lm.factory import build_scorer

            self.scorer = build_scorer(self.ctx.cfg)
        return self.scorer
