"""The one LM factory: a run's ``models`` / ``scoring`` / ``server`` settings resolve once into an :class:`LMSpec`
(name, identity, dtype, device, or the server); the model is loaded from that spec and every key that names what an
LM computed (stage fingerprints, the score cache, generation chunks) is built from the same spec, so a key always
names the model that computed.

Importing this module, and building keys on a CPU machine, does not import torch (``epr status`` stays fast); torch
is asked only where the answer depends on it (a visible NVIDIA device, loading a model, whether ``scoring.int8`` runs
here).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

from epr.lm.identity import default_device, device_size, lm_name, model_identity, resolve_dtype

log = logging.getLogger(__name__)

__all__ = [
    "LMSpec",
    "lm_name",
    "model_identity",
    "default_device",
    "resolve_dtype",
    "lm_spec",
    "lm_key",
    "scoring_key",
    "label_key",
    "key_diff",
    "nearest_key",
    "accepted_stores",
    "score_cache",
    "load",
    "scorer_for",
    "build_scorer",
    "inference_lm",
    "device_for_rank",
    "generate_settings",
]


@dataclass(frozen=True)
class LMSpec:
    """One LM of a run, resolved once. In-process: ``name`` (packaged name, hub id or folder), the resolved
    ``dtype`` (``bf16`` | ``fp32``), ``device``, where converted models live and the linear packing. Served:
    ``server`` holds the base URL, the served model and the tokenizer that makes the token ids."""

    name: str
    inference: bool
    dtype: str | None
    device: str | None
    cache_dir: str | None = None
    pack_linear: str = "auto"
    server: dict | None = None

    def key(self) -> dict:
        """What names the LM's results: the model's identity (full weights for a folder), the dtype and the device
        class; or the server, the served model's name and the local tokenizer's identity."""
        if self.server is not None:
            return {
                "server": self.server["base_url"],
                "served_model": self.server["model"] or "<the only model listed>",
                "tokenizer": model_identity(self.server["tokenizer"]),
            }
        return {**model_identity(self.name), "dtype": self.dtype, "device": self.device.split(":")[0]}


def lm_spec(cfg, inference: bool = False, device: str | None = None) -> LMSpec:
    """The scoring LM (or, with ``inference``, the inference LM) of a run, resolved on this machine."""
    name = lm_name(cfg.models, inference)
    sc = cfg.server
    if sc.base_url:
        served = (sc.inference_model or sc.model) if inference else sc.model
        server = {"base_url": sc.base_url.rstrip("/"), "model": served, "tokenizer": sc.tokenizer or name}
        return LMSpec(name, inference, None, None, cfg.models.cache_dir, cfg.models.pack_linear, server)
    device = device or default_device()
    dtype = resolve_dtype(cfg.models.dtype, device)
    return LMSpec(name, inference, dtype, device, cfg.models.cache_dir, cfg.models.pack_linear)


def lm_key(cfg, inference: bool = False, device: str | None = None) -> dict:
    """``lm_spec(...).key()``: what names the LM a run's scores and generations come from."""
    return lm_spec(cfg, inference, device).key()


def scoring_key(cfg, inference: bool = False) -> dict:
    """Everything that changes a score besides the texts: the stage fingerprint and the score cache use it.

    The LM's key (:meth:`LMSpec.key`) and the forward; in fp32 a score does not depend on the batch it was computed
    in (beyond 1e-4 nats; tested), in bf16 it does (up to ~1 nat), so there the batch layout is part of the key and
    a changed layout rescores. A served LM computes on the server: our forward and batching do not enter."""
    sc = cfg.scoring
    key = lm_key(cfg, inference)
    if cfg.server.base_url:
        return key
    key["forward"] = sc.forward
    if key["dtype"] != "fp32":
        tokens = device_size("scoring.batch_tokens", sc.batch_tokens, key["device"])
        key |= {"batch_tokens": tokens, "prefix_share": sc.prefix_share}
    if sc.int8 and not inference:  # the labels' LM only; keyed where it computes, so a fallback keeps its key
        from epr.lm import int8_scoring

        why = int8_scoring.unavailable(key["device"], sc.forward)
        if why is None:
            key |= int8_scoring.key()
        else:
            _warn_once(f"scoring.int8: not used ({why}); scoring in {key['dtype']}")
    return key


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


# the key fields that only move a bf16 score's rounding: where (device) and how (batch layout) it was computed
LAYOUT_FIELDS = ("device", "batch_tokens", "prefix_share")


def label_key(cfg) -> dict:
    """What the labels' scores depend on: the scoring LM's ``scoring_key``, and the devices whose stores the run
    also accepts (``scoring.accept_devices``, where set: a run that took another device's scores is another
    computation's labels, so its stage and everything downstream is keyed apart)."""
    key = scoring_key(cfg)
    devices = cfg.scoring.accept_devices
    return key | {"accept_devices": sorted(set(devices))} if devices and not cfg.server.base_url else key


def nearest_key(key: dict, keys: list[dict]) -> dict | None:
    """The one of ``keys`` that differs from ``key`` in the fewest fields (None for no keys)."""
    return min(keys, key=lambda k: sum(k.get(f) != key.get(f) for f in set(k) | set(key)), default=None)


def key_diff(key: dict, mine: dict) -> str:
    """The fields two computation keys differ in, as ``field X there, Y here``."""
    return ", ".join(
        f"{f} {key.get(f)!r} there, {mine.get(f)!r} here"
        for f in sorted(set(mine) | set(key))
        if mine.get(f) != key.get(f)
    )


def accepted_stores(cfg) -> list[Path]:
    """The run root's score stores the labels also read (``scoring.accept_devices``): the same scoring LM, dtype
    and forward as this run's (``scoring_key`` except :data:`LAYOUT_FIELDS`), computed on one of those devices in
    any batch layout; this run's own store excluded. In store-name order, so which store serves a pair two of them
    hold does not depend on the order they arrived in."""
    import json

    devices = set(cfg.scoring.accept_devices)
    if not devices or cfg.server.base_url:
        return []
    from epr.cache import fingerprint

    mine = scoring_key(cfg)
    root = Path(cfg.run_root) / ".cache" / "scores"
    out = []
    for kf in sorted(root.glob("*/KEY.json")):
        key = json.loads(kf.read_text(encoding="utf-8"))
        fields = (set(key) | set(mine)) - set(LAYOUT_FIELDS)
        if (
            kf.parent.name != fingerprint(mine)
            and all(key.get(f) == mine.get(f) for f in fields)
            and str(key.get("device")) in devices
        ):
            out.append(kf.parent)
    return out


def score_cache(cfg, inference: bool = False):
    """The run root's shared score store for this computation (``scoring_key``): the scoring LM's, or the inference
    LM's. The scoring LM's serves first the scores of :func:`accepted_stores`, where they hold one (new scores are
    written to its own store only); a run that sets ``scoring.accept_devices`` with no such store is an error
    naming the nearest store's differing fields (an import not done, or another dtype on this machine), not labels
    silently scored here."""
    from epr.lm.score_cache import ScoreCache

    root = Path(cfg.run_root) / ".cache" / "scores"
    cache = ScoreCache(root, scoring_key(cfg, inference))
    if inference or not cfg.scoring.accept_devices or cfg.server.base_url:
        return cache
    stores = accepted_stores(cfg)
    if not stores:
        import json

        from epr.types import InputError

        mine = scoring_key(cfg)
        keys = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(root.glob("*/KEY.json"))]
        keys = [k for k in keys if k != mine]
        near = nearest_key(mine, keys)
        raise InputError(
            f"scoring.accept_devices={list(cfg.scoring.accept_devices)}: no score store under {root} was computed "
            "by this scoring LM, dtype and forward on those devices, so no label would come from one ("
            + (f"the nearest differs in: {key_diff(near, mine)}" if near else "there is no other store")
            + "); import the other device's scores first (epr cache import), or drop the option"
        )
    cache.accept([ScoreCache.open(d) for d in stores])
    return cache


def load(spec: LMSpec):
    """(model, tokenizer) of an in-process spec; the loaded weights' dtype is checked against the spec's (the key's),
    so a model never computes under another dtype's key."""
    import torch

    from epr.lm.models import load_lm

    if spec.server is not None:
        raise ValueError(
            f"{spec.name}: served through {spec.server['base_url']}; there is no local model to load"
        )
    model, tok = load_lm(spec.name, spec.cache_dir, spec.dtype, spec.device, spec.pack_linear)
    want = {"bf16": torch.bfloat16, "fp32": torch.float32}[spec.dtype]
    got = next(model.parameters()).dtype
    if got != want:
        raise RuntimeError(f"{spec.name}: loaded in {got}, but its key says {spec.dtype}")
    return model, tok


def scorer_for(cfg, model, tok, backbone=None):
    """An ``LMScorer`` over a loaded model with the run's ``scoring`` settings (``backbone``: a lean forward of the
    caller's instead of the model's shared one)."""
    from epr.lm.scoring import LMScorer

    sc = cfg.scoring
    return LMScorer(
        model,
        tok,
        batch_tokens=device_size(
            "scoring.batch_tokens", sc.batch_tokens, str(next(model.parameters()).device)
        ),
        forward=sc.forward,
        compile=sc.compile,
        prefix_share=sc.prefix_share,
        backbone=backbone,
    )


def gpu_memory(device: str) -> dict:
    """What the CUDA caching allocator did on ``device`` since the process started, for a stage's manifest: the
    peak memory held and used (GB), the device's total, and how often an allocation failed and the allocator
    freed its cache to retry (``alloc_retries``: each one synchronises; many of them mean the memory was
    fragmented or full). Empty off CUDA."""
    if not str(device).startswith("cuda"):
        return {}
    import torch

    stats = torch.cuda.memory_stats(device)
    gb = 1024**3
    return {
        "max_reserved_gb": round(stats.get("reserved_bytes.all.peak", 0) / gb, 2),
        "max_allocated_gb": round(stats.get("allocated_bytes.all.peak", 0) / gb, 2),
        "total_gb": round(torch.cuda.get_device_properties(device).total_memory / gb, 2),
        "alloc_retries": int(stats.get("num_alloc_retries", 0)),
    }


def device_for_rank(rank: int, world: int) -> str:
    """Each process of a multi-GPU run on its own GPU; otherwise :func:`default_device`."""
    device = default_device()
    return f"cuda:{rank}" if world > 1 and device == "cuda" else device


def build_scorer(cfg, inference: bool = False, device: str | None = None):
    """The scoring LM (or the inference LM) as a scorer: an ``LMScorer`` in-process, or with ``server.base_url`` set
    a ``ServerScorer``."""
    if cfg.server.base_url:
        from epr.lm.served import scorer_for_config

        return scorer_for_config(cfg, inference)
    spec = lm_spec(cfg, inference, device)
    model, tok = load(spec)
    backbone = None
    if not inference and "int8" in scoring_key(cfg) and spec.device.startswith("cpu"):
        from epr.lm.int8_scoring import quantized_backbone

        backbone = quantized_backbone(model, tok)
        if backbone is None:
            raise RuntimeError(
                f"scoring.int8: {spec.name} is not a model the lean forward reproduces (Llama family); "
                "drop the option to score it in its dtype"
            )
    return scorer_for(cfg, model, tok, backbone)


def inference_lm(cfg, stop: str):
    """(generator, scorer) of the inference LM, sharing one loaded model: in-process, or through the server."""
    if cfg.server.base_url:
        from epr.lm.served import generator_for_config, scorer_for_config

        return generator_for_config(cfg, stop), scorer_for_config(cfg, inference=True)
    from epr.lm.generate import Generator

    spec = lm_spec(cfg, inference=True)
    model, tok = load(spec)
    g = generate_settings(cfg, spec.device)
    gen = Generator(
        model,
        tok,
        g["max_new_tokens"],
        g["batch_size"],
        stop,
        g["engine"],
        g["decode_rows"],
        g["prefill_tokens"],
    )
    return gen, scorer_for(cfg, model, tok)


def generate_settings(cfg, device: str | None = None) -> dict:
    """The run's ``generate`` section with its null sizes resolved for the inference LM's device (``device_size``):
    what the predict stage runs and keys (a CPU's key is the same as when the sizes were fixed numbers)."""
    g = dict(cfg.section("generate"))
    if device is None:
        device = lm_spec(cfg, inference=True).device
    for f in ("decode_rows", "chunk_size"):
        g[f] = device_size(f"generate.{f}", g[f], device)
    return g
