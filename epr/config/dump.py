"""A resolved config printed as commented YAML (``epr config``) that loads back."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import yaml

from epr.config.names import range_text
from epr.config.sections import (
    ExperimentConfig,
)


def _yaml_value(value: Any) -> str:
    """``value`` as one line of YAML (quoted where plain text would read back as something else)."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump([value], default_flow_style=True, width=float("inf"), allow_unicode=True).strip()
    return text[1:-1]  # the flow list's brackets


def _comment(f: dataclasses.Field) -> str:
    choices = f.metadata.get("choices")
    if not choices:
        bounds = f.metadata.get("range")
        return f.metadata.get("help", "") + (f" [{range_text(bounds)}]" if bounds else "")
    each = "each of" if isinstance(f.default, tuple) else "choices"
    return f"{f.metadata.get('help', '')} [{each}: {', '.join(map(str, choices))}]"


def _dump(obj: Any, indent: str, lines: list[str]) -> None:
    for f in fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            doc = inspect.cleandoc(type(value).__doc__ or "")
            lines += ["", *(f"{indent}# {line}".rstrip() for line in doc.splitlines()), f"{indent}{f.name}:"]
            _dump(value, indent + "  ", lines)
        else:
            default = f.default if f.default is not dataclasses.MISSING else None
            changed = f.default is not dataclasses.MISSING and value != default
            note = f" (default: {_yaml_value(default)})" if changed else ""
            lines.append(f"{indent}{f.name}: {_yaml_value(value)}  # {_comment(f)}{note}".rstrip())


def dump_config(cfg: ExperimentConfig, sources: Sequence[str] = ()) -> str:
    """``cfg`` as YAML: every key with its value, its help and its choices as comments, grouped by section under
    the section's docstring. :func:`load_config` reads it back to an equal config."""
    lines = [
        "# The resolved epr configuration"
        + (f" ({', '.join(sources)})" if sources else " (the defaults)")
        + ".",
        "# Every key with its value; after it, its help, [choices] and, where the value is not the default, the "
        "default. `epr run -c THIS.yaml` loads it back.",
        *(f"# {line}" for line in inspect.cleandoc(ExperimentConfig.__doc__ or "").splitlines()),
    ]
    _dump(cfg, "", lines)
    return "\n".join(lines) + "\n"
