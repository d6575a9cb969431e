"""Values given per kind of machine: ``{cpu: A, gpu: B}`` wherever a config takes a value.

A recipe's best setting can cost what one kind of machine affords and another does not: MTOP's 8,000 labels take
minutes on one GPU and hours on two CPU cores. A config file may then give both, and the loader keeps the one for
this machine (a GPU: CUDA visible), before any other check, so every key, manifest and ``epr config`` sees a plain
value, the one that ran. The choice is logged with the value the other kind would take.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from epr.types import ConfigError

__all__ = ["KINDS", "visible_device", "machine_kind", "is_per_device", "resolve_per_device"]

log = logging.getLogger(__name__)

KINDS = ("cpu", "gpu")


def visible_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``. Without an NVIDIA driver torch is not imported to find out."""
    if "torch" not in sys.modules and not (
        Path("/proc/driver/nvidia/gpus").exists() or Path("/dev/nvidia0").exists()
    ):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def machine_kind() -> str:
    """``gpu`` where CUDA is visible (:func:`visible_device`), else ``cpu``."""
    return "gpu" if visible_device().startswith("cuda") else "cpu"


def is_per_device(value: Any) -> bool:
    """Whether a config value is a per-device mapping (a field's value; one inside a list is not resolved)."""
    return isinstance(value, dict) and bool(value) and set(value) <= set(KINDS)


def resolve_per_device(data: dict[str, Any], kind: str | None = None, where: str = "") -> dict[str, Any]:
    """``data`` (a merged config, sections as mappings) with each ``{cpu: A, gpu: B}`` value replaced by its
    ``kind``'s (default: :func:`machine_kind`); a mapping that names only some of the kinds is an error naming the
    key, not a value that exists on one machine only."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{where}.{k}" if where else str(k)
        if is_per_device(v):
            missing = [x for x in KINDS if x not in v]
            if missing:
                raise ConfigError(
                    f"config {key}: a per-device value names {sorted(v)} but not {missing}; give every kind "
                    f"({', '.join(f'{x}: ...' for x in KINDS)}) or one plain value"
                )
            kind = kind or machine_kind()
            out[k] = v[kind]
            others = "; ".join(f"a {x.upper()} takes {v[x]!r}" for x in KINDS if x != kind)
            log.info("config %s: %r on this machine (a %s; %s)", key, v[kind], kind.upper(), others)
        elif (
            isinstance(v, dict) and key.count(".") < 8
        ):  # sections nest a few deep: deeper is an unknown key,
            out[k] = resolve_per_device(v, kind, key)  # which the loader names (no recursion to its end)
        else:
            out[k] = v
    return out
