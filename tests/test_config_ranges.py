"""A range on every setting: each field of the configuration declares what values are valid where it is declared
(``opt(..., ge=, gt=, le=)`` for a number, ``path=`` for a path, ``choices`` for a finite set, a bool's two
values) or says why any value of its type is valid (``free=``); the loader refuses a value outside, naming the
key."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import get_type_hints

import pytest

from epr.cli import main
from epr.config import ExperimentConfig, config_from_dict, dump_config, load_config
from epr.config.names import PATH_KINDS, opt
from epr.types import ConfigError


def walk(cls: type, prefix: str = ""):
    """(key, field, type, section class) of every setting under ``cls``, sections descended into."""
    hints = get_type_hints(cls)
    for f in fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from walk(hints[f.name], key + ".")
        else:
            yield key, f, hints[f.name], cls


def numeric(tp) -> bool:
    return any(t in str(tp) for t in ("int", "float")) and "str" not in str(tp)


def undeclared(cls: type) -> list[str]:
    """The settings of ``cls`` that declare no range and give no reason: a number without ``ge``/``gt``/``le``
    (or ``free``), any other field that is not a bool and has neither choices, a path kind nor ``free``."""
    missing = []
    for key, f, tp, _ in walk(cls):
        m = f.metadata
        if tp is bool:
            continue  # two values: its range is its type
        if numeric(tp):
            ok = "range" in m or bool(m.get("free"))
        else:
            ok = "choices" in m or "path" in m or bool(m.get("free"))
        if not ok:
            missing.append(key)
    return missing


ALL = list(walk(ExperimentConfig))
RANGED = [(k, f, tp, c) for k, f, tp, c in ALL if "range" in f.metadata]


def test_every_field_has_a_range_or_a_reason():
    assert undeclared(ExperimentConfig) == [], (
        "declare a range (opt(..., ge=/gt=/le=), path=, choices) or say why none is needed (free=...)"
    )
    assert len(ALL) > 80 and len(RANGED) > 40  # the walk reaches every section
    for _, f, _tp, _ in ALL:  # a number's reason for no range is never the empty string
        assert f.metadata.get("free", "x").strip(), f


@dataclass(frozen=True)
class Section:  # for the negative control: a bare number, a bare text and an empty reason
    n: int = opt(1, "a count")
    text: str = opt("x", "a name")
    why: str = opt("x", "a name", free="")
    ok: float = opt(0.5, "a weight", ge=0.0, le=1.0)
    flag: bool = opt(False, "a switch")


@dataclass(frozen=True)
class Root:
    s: Section = dataclasses.field(default_factory=Section)


def test_the_walk_finds_an_undeclared_field():
    """Negative control: a section with a bare number, a bare text and an empty reason fails the walk."""
    assert undeclared(Root) == ["s.n", "s.text", "s.why"]


def _outside(bounds: dict, tp) -> list:
    is_int = "int" in str(tp)
    step = 1 if is_int else 0.5
    out = []
    if "ge" in bounds:
        out.append(bounds["ge"] - step)
    if "gt" in bounds:
        out.append(bounds["gt"])
    if "le" in bounds:
        out.append(bounds["le"] + step)
    if not is_int:
        out.append(math.nan)
    return out


@pytest.mark.parametrize("key", [k for k, *_ in RANGED])
def test_each_range_is_checked_at_load(key):
    _, f, tp, cls = next(r for r in RANGED if r[0] == key)
    name = key.rsplit(".", 1)[-1]
    tuple_field = isinstance(f.default, tuple)
    for bad in _outside(f.metadata["range"], tp):
        value = [bad] if tuple_field else bad
        with pytest.raises(ConfigError) as e:
            load_config(
                [], [f"{key}={'.nan' if value != value else value}" if not tuple_field else f"{key}={value}"]
            )
        assert key in str(e.value) and "must be" in str(e.value), str(e.value)
        with pytest.raises(ConfigError, match=name):  # and through the section's own loader
            config_from_dict(cls, {name: value})
    for edge in (f.metadata["range"].get("ge"), f.metadata["range"].get("le")):
        if edge is not None:  # the bounds themselves are valid
            config_from_dict(cls, {name: [edge] if tuple_field else edge})


@pytest.mark.parametrize("key", [k for k, f, *_ in ALL if "path" in f.metadata])
def test_each_path_is_checked_at_load(key):
    _, f, tp, cls = next(r for r in ALL if r[0] == key)
    name = key.rsplit(".", 1)[-1]
    assert f.metadata["path"] in PATH_KINDS
    for bad in ("", "   ", "a\x00b", 7):
        with pytest.raises(ConfigError, match=name):
            config_from_dict(cls, {name: bad})
    config_from_dict(cls, {name: "some/folder"})
    if "None" in str(tp):
        config_from_dict(cls, {name: None})


@pytest.mark.parametrize("name", ["..", "../elsewhere", "/abs/run", "a/./b", "a//b", "mine/", ""])
def test_run_name_stays_under_the_run_root(name, tmp_path):
    with pytest.raises(ConfigError, match="config name="):
        load_config([], [f"run_root={tmp_path}", f"name='{name}'"])
    assert load_config([], ["name=mine/dr-bm25"]).run_dir.as_posix().endswith("runs/mine/dr-bm25")


def test_max_new_tokens_negative_refused_at_load(tmp_path, capsys):
    """The reported regression: generate.max_new_tokens=-5 ran to exit 0 with every prediction empty."""
    with pytest.raises(ConfigError, match=r"generate.max_new_tokens=-5 must be >= 1"):
        load_config([], ["generate.max_new_tokens=-5"])
    capsys.readouterr()
    rc = main(
        ["run", "--until", "evaluate", "--set", f"run_root={tmp_path}", "--set", "generate.max_new_tokens=-5"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "generate.max_new_tokens=-5 must be >= 1" in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # refused before anything was written
    assert load_config([], ["generate.max_new_tokens=1"]).generate.max_new_tokens == 1


def test_text_fields_refuse_what_yaml_made_of_unquoted_values():
    with pytest.raises(ConfigError, match=r"models.lm: 2024 is a int, not a text; quote it"):
        load_config([], ["models.lm=2024"])
    with pytest.raises(ConfigError, match=r"retrieve.retrievers: an element 3 is a int"):
        load_config([], ["retrieve.retrievers=[bm25, 3]"])
    with pytest.raises(ConfigError, match=r"train.temperature: expected a number, got 'warm'"):
        load_config([], ["train.temperature=warm"])
    assert load_config([], ["models.lm='2024'"]).models.lm == "2024"


def test_epr_config_prints_each_range():
    text = dump_config(load_config())
    assert "max_new_tokens: 96  # tokens generated per answer at most [>= 1]" in text
    assert "lambda_d: 0.75  # weight of relevance against diversity (1: no diversity) [in [0, 1]]" in text
    assert load_config([], []) == load_config(
        [], []
    )  # and it still loads back (tests/test_config.py checks all)
