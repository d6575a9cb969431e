"""Loading a config: YAML files (``inherit:``, per-device values) merged with ``--set a.b=v`` overrides, each value
coerced to its field's type and checked against its choices and range (a ``ConfigError`` naming the key)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from epr.config.checks import validate
from epr.config.names import out_of_range, path_problem, range_text
from epr.config.per_device import is_per_device, resolve_per_device
from epr.config.sections import (
    ExperimentConfig,
    TrainConfig,
)
from epr.types import ConfigError


def train_temperature(tc: TrainConfig) -> float:
    """The similarity temperature in force: the configured one, or 1 (dot) / 0.05 (cosine)."""
    return tc.temperature if tc.temperature is not None else (1.0 if tc.similarity == "dot" else 0.05)


def train_loss_weight(tc: TrainConfig) -> float:
    """Weight of the in-batch contrastive term of the listwise / distill losses (UDR: 1, LLM-R: 0.2)."""
    return tc.loss_weight if tc.loss_weight is not None else (0.2 if tc.loss == "distill" else 1.0)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = getattr(tp, "__origin__", None)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config {where}: expected a mapping, got {value!r}")
        return config_from_dict(tp, value, where)
    if origin is tuple:
        if value is None:
            raise ConfigError(f"config {where}: may not be null; write [] for an empty list")
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif not isinstance(value, (list, tuple)):
            value = [value]  # a single value (``--set truthfulqa.sweep=0.5``)
        return tuple(value)
    if value is None:
        if "None" in str(tp):
            return None
        raise ConfigError(
            f"config {where}: may not be null (empty); give it a value (--set {where}=<value>, or in the YAML "
            f"{where.rsplit('.', 1)[-1]}: <value>)"
        )
    for base in (bool, int, float, str):
        if (
            tp is base
            or (isinstance(tp, str) and tp.startswith(base.__name__))
            or str(tp).startswith(base.__name__)
        ):
            if base is bool and not isinstance(value, bool):
                raise ConfigError(f"config {where}: expected true/false, got {value!r}")
            if base is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"config {where}: expected an integer, got {value!r}")
            if base is float and isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
                try:
                    value = float(value)
                except ValueError:
                    raise ConfigError(f"config {where}: expected a number, got {value!r}") from None
            if base is float and not isinstance(value, (int, float)):
                raise ConfigError(f"config {where}: expected a number, got {value!r}")
            return float(value) if base is float else value
    return value


def _did_you_mean(word: Any, options: Sequence[Any]) -> str:
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_YAML_BOOLS = {True: ("yes", "true", "on"), False: ("no", "false", "off")}


def _unbool(f: dataclasses.Field, value: Any) -> Any:
    """An unquoted ``no`` / ``on`` that YAML read as a bool, back to the one choice of ``f`` it spells (if any)."""
    if not isinstance(value, bool):
        return value
    spelled = [c for c in f.metadata.get("choices", ()) if str(c).lower() in _YAML_BOOLS[value]]
    return spelled[0] if len(spelled) == 1 else value


def check_choices(f: dataclasses.Field, value: Any, key: str) -> None:
    """Raise ``ConfigError`` naming ``key`` if ``value`` (each element, for a tuple) is outside ``f``'s choices."""
    choices = f.metadata.get("choices")
    if not choices:
        return
    for v in value if isinstance(value, tuple) else (value,):
        if isinstance(v, bool) or v not in choices:
            hint = (
                " (YAML reads unquoted on/off/yes/no as true/false: quote it)" if isinstance(v, bool) else ""
            )
            each = "an element " if isinstance(value, tuple) else ""
            raise ConfigError(
                f"config {key}: {each}{v!r} is not one of {', '.join(map(str, choices))}"
                f"{_did_you_mean(v, choices)}{hint}"
            )


def _check_text(tp: Any, value: Any, key: str) -> None:
    """A text field (or each element of a tuple of texts) holds text, not what YAML made of an unquoted ``2024``
    (a number), ``[a]`` (a list) or ``yes`` (a bool)."""
    if getattr(tp, "__origin__", None) is tuple:
        values = value if getattr(tp, "__args__", (None,))[0] is str else ()
    else:
        values = (value,) if tp is str or str(tp) in ("str", "str | None", "typing.Optional[str]") else ()
    for v in values:
        if v is None and isinstance(value, tuple):
            raise ConfigError(f"config {key}: an element is null; a list of names holds texts")
        if v is not None and not isinstance(v, str):
            each = "an element " if isinstance(value, tuple) else ""
            raise ConfigError(
                f"config {key}: {each}{v!r} is a {type(v).__name__}, not a text; quote it in YAML ('{v}')"
            )


def check_range(f: dataclasses.Field, value: Any, key: str) -> None:
    """Raise ``ConfigError`` naming ``key`` if ``value`` (each element, for a tuple) is outside ``f``'s declared
    range (``opt(..., ge=, gt=, le=)``) or is not a path of its kind (``opt(..., path=)``)."""
    bounds, kind = f.metadata.get("range"), f.metadata.get("path")
    if kind is not None:
        problem = path_problem(value, kind)
        if problem:
            raise ConfigError(f"config {key}={value!r}: {problem}")
    if not bounds:
        return
    for v in value if isinstance(value, tuple) else (value,):
        x = v
        if isinstance(v, str):  # a tuple's elements from --set a=0.5,0.7 are text
            try:
                x = float(v)
            except ValueError:
                x = None
        if v is not None and (isinstance(v, bool) or not isinstance(x, (int, float))):
            raise ConfigError(f"config {key}: {v!r} is not a number (must be {range_text(bounds)})")
        if out_of_range(x, bounds):
            shown = f"{key}={v!r}" if not isinstance(value, tuple) else f"{key}: an element {v!r}"
            help = f.metadata.get("help", "")
            raise ConfigError(f"config {shown} must be {range_text(bounds)}" + (f" ({help})" if help else ""))


def config_from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys, wrong types and values outside a field's choices or
    range raise ``ConfigError`` naming the key."""
    hints = get_type_hints(cls)
    by_name = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(by_name), key=str)
    if unknown:
        raise ConfigError(
            f"config {where or '<root>'}: unknown key(s) {unknown}{_did_you_mean(unknown[0], list(by_name))}; "
            f"allowed: {sorted(by_name)}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{where}.{name}" if where else name
        kwargs[name] = _coerce(_unbool(by_name[name], value), hints[name], key)
        check_choices(by_name[name], kwargs[name], key)
        _check_text(hints[name], kwargs[name], key)
        check_range(by_name[name], kwargs[name], key)
    return cls(**kwargs)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        sections = isinstance(v, dict) and isinstance(out.get(k), dict)  # a per-device value is one value
        out[k] = _deep_merge(out[k], v) if sections and not is_per_device(v) | is_per_device(out[k]) else v
    return out


def _own_keys(path: Path) -> set[str]:
    """The top-level keys a config file writes itself (not those of the files it inherits); read after
    :func:`_read_yaml` has checked the file."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return set(data) if isinstance(data, dict) else set()


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    try:
        path = path.resolve()
        if path in seen:
            raise ConfigError(f"config {path}: inherit cycle")
        if not path.is_file():
            what = "a folder" if path.is_dir() else "no such file"
            raise ConfigError(
                f"config {path}: {what}; pass a YAML file with -c (for example configs/demo.yaml)"
            )
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config {path}: not UTF-8 (byte offset {e.start}); re-save it as UTF-8") from None
    except OSError as e:  # a name too long, a folder that cannot be read: the file's own problem, named
        raise ConfigError(f"config {str(path)[:300]}: {e.strerror or e}; pass a readable YAML file") from None
    try:
        data = yaml.safe_load(text) or {}
    except (yaml.YAMLError, RecursionError) as e:  # RecursionError: brackets nested a thousand deep
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"config {where}: not valid YAML ({problem}); fix the file (a `key: value` mapping)"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: top level must be a mapping")
    parent = data.pop("inherit", None)
    problem = path_problem(parent, "path")
    if problem:
        raise ConfigError(f"config {path}: inherit: {parent!r}: {problem}; expected the path of a YAML file")
    if parent:
        data = _deep_merge(_read_yaml(path.parent / parent, (*seen, path)), data)
    return data


def load_config(paths: Sequence[str | Path] = (), overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Merge YAML files in order, then ``a.b=value`` overrides (values parsed as YAML)."""
    data: dict[str, Any] = {}
    for p in paths:
        data = _deep_merge(data, _read_yaml(Path(p)))
    if paths and not any("name" in _own_keys(Path(p)) for p in paths):
        # a config of one's own that names no run is named by its file: not by a file it inherits (`inherit:
        # mtop.yaml` would write into MTOP's run), nor by the demo's default
        data["name"] = Path(paths[0]).stem
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override --set {item!r}: expected key.path=value (e.g. candidates.L=20)")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override --set {item!r}: {key!r} is not a key path (e.g. candidates.L=20)")
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"override --set {item!r}: {'.'.join(parts[: i + 1])} is a value ({node!r}), not a section "
                    "with keys; set it directly (e.g. candidates.L=20)"
                )
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except (yaml.YAMLError, RecursionError) as e:
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(
                f"override --set {item!r}: the value {raw!r} is not valid YAML ({problem}); "
                "quote it or close its brackets (e.g. retrieve.retrievers=[bm25,epr])"
            ) from None
    cfg = config_from_dict(ExperimentConfig, resolve_per_device(data))
    validate(cfg)
    return cfg
