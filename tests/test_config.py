import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import get_type_hints

import pytest
import yaml

from epr.config import ExperimentConfig, dump_config, load_config
from epr.config.sections import TQA_VARIANTS
from epr.types import ConfigError


def test_defaults_and_overrides(tmp_path):
    (tmp_path / "base.yaml").write_text("candidates:\n  L: 30\n")
    (tmp_path / "child.yaml").write_text("inherit: base.yaml\nname: x\nlabels:\n  k_pos: 4\n")
    cfg = load_config(
        [tmp_path / "child.yaml"], ["candidates.backend=rank_bm25", "retrieve.retrievers=bm25,epr"]
    )
    assert (cfg.name, cfg.candidates.L, cfg.labels.k_pos) == ("x", 30, 4)
    assert cfg.candidates.backend == "rank_bm25" and cfg.retrieve.retrievers == ("bm25", "epr")


@pytest.mark.parametrize(
    "override,match",
    [
        ("candidates.Lx=3", r"unknown key\(s\) \['Lx'\]"),
        ("candidates.view=title", "not one of"),
        ("candidates.L=abc", "expected an integer"),
        ("ragsys.lambda_d=1.5", r"lambda_d=1.5 must be in \[0, 1\]"),
        ("labels.k_pos=50", "must be <= candidates.L"),
    ],
)
def test_bad_values_are_named(override, match):
    with pytest.raises(ValueError, match=match):
        load_config([], [override])


@pytest.mark.parametrize(
    "bad,msg",
    [
        ("bm26", "unknown retriever 'bm26'"),
        ("epr+diversity", r"'epr\+diversity': unknown suffix \+diversity"),
        ("bm25+div", "needs a dense first stage"),
        ("epr+rm+div", r"\+rm re-ranks a first stage alone"),
        ("random+rm", "the reward model re-ranks a first stage that ranks"),
    ],
)
def test_retriever_names_checked_at_load(bad, msg):
    with pytest.raises(ValueError, match=msg):
        load_config([], [f"retrieve.retrievers=epr,{bad}"])
    ok = load_config(
        [], ["retrieve.retrievers=random,bm25,sbert+div,epr+div+bias,lm-oracle,bm25+rm,hybrid+rm"]
    )
    assert ok.retrieve.retrievers[-2:] == ("bm25+rm", "hybrid+rm")


# --- the config documents itself: help and choices on every field, one validation road, `epr config` ---

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def _fields(cls=ExperimentConfig, where=""):
    """(full key, field) of every field, sections included."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{where}.{f.name}" if where else f.name
        yield key, f
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _fields(hints[f.name], key)


ALL_FIELDS = list(_fields())
CHOICE_FIELDS = [(k, f) for k, f in ALL_FIELDS if f.metadata.get("choices")]


def _as_override(value) -> str:
    return yaml.safe_dump(list(value) if isinstance(value, tuple) else value, default_flow_style=True).strip()


def test_every_field_has_help():
    missing = [k for k, f in ALL_FIELDS if not str(f.metadata.get("help", "")).strip()]
    assert not missing, f"fields without help: {missing}"
    assert len(ALL_FIELDS) > 80
    # the finite sets found in the code base are declared on their fields
    assert {k for k, _ in CHOICE_FIELDS} >= {
        "data.eval_part", "models.dtype", "models.pack_linear", "candidates.view", "candidates.backend",
        "scoring.forward", "labels.source", "train.loss", "train.similarity", "train.best_by",
        "train.mixed_precision", "generate.engine", "truthfulqa.version", "truthfulqa.variants",
    }  # fmt: skip


COMPANIONS = {
    ("candidates.miner", "retriever"): ["candidates.mine_run=runs/round1"],
    ("candidates.miner", "mixed"): ["candidates.mine_run=runs/round1"],
    ("labels.source", "bm25"): ["candidates.rounds=1"],
}  # a choice's required partner


@pytest.mark.parametrize("key,f", CHOICE_FIELDS, ids=[k for k, _ in CHOICE_FIELDS])
def test_choices_are_enforced(key, f):
    choices = f.metadata["choices"]
    is_tuple = isinstance(f.default, tuple)
    for bad in ("not-a-choice", 7, 2.5):
        value = [bad] if is_tuple else bad
        with pytest.raises(ConfigError) as e:
            load_config([], [f"{key}={_as_override(value)}"])
        msg = str(e.value)
        assert key in msg and repr(bad) in msg and all(str(c) in msg for c in choices), msg
    for good in choices:  # and every choice is accepted (as the only element of a tuple field)
        extra = COMPANIONS.get((key, good), [])
        cfg = load_config([], [f"{key}={_as_override([good] if is_tuple else good)}", *extra])
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == ((good,) if is_tuple else good)


def test_tqa_variant_choices_match_ragsys():
    from ragsys import VARIANTS

    assert TQA_VARIANTS == ("fix", *VARIANTS)


def test_near_miss_key_and_yaml_bool_hints():
    with pytest.raises(ConfigError, match=r"\['veiw'\] \(did you mean 'view'\?\)"):
        load_config([], ["candidates.veiw=input"])
    with pytest.raises(ConfigError, match="models.dtype: True is not one of auto, bf16, fp32 .*quote it"):
        load_config([], ["models.dtype=yes"])
    # an unquoted on / off / no that YAML reads as a bool is the one choice it spells
    cfg = load_config([], ["models.pack_linear=on", "train.mixed_precision=no"])
    assert (cfg.models.pack_linear, cfg.train.mixed_precision) == ("on", "no")
    assert load_config([], ["models.pack_linear=off"]).models.pack_linear == "off"


def _round_trip(tmp_path, cfg):
    text = dump_config(cfg)
    out = tmp_path / "resolved.yaml"
    out.write_text(text)
    assert load_config([out]) == cfg, text
    return text


@pytest.mark.parametrize("path", [None, *CONFIGS], ids=["defaults", *(p.name for p in CONFIGS)])
def test_dump_round_trips(tmp_path, path):
    cfg = load_config([path] if path else [])
    text = _round_trip(tmp_path, cfg)
    comments, section = {}, ""
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, rest = line.strip().partition(":")
            section = name if not line.startswith(" ") else section
            comments[f"{section}.{name}" if line.startswith(" ") else name] = rest.partition("  # ")[2]
    for key, f in ALL_FIELDS:  # every key is there, with its help and choices as a comment
        if dataclasses.is_dataclass(f.default_factory):  # a section: headed by its docstring
            assert f"\n# {f.metadata['help']}" in text
            continue
        assert f.metadata["help"] in comments[key]
        assert all(str(c) in comments[key] for c in f.metadata.get("choices", ()))


def test_dump_round_trips_awkward_values(tmp_path):
    cfg = load_config(
        [],
        [
            "models.pack_linear='off'", "train.mixed_precision=no", "truthfulqa.version=v0",
            "truthfulqa.sweep=[0, 0.25, 1]", "truthfulqa.variants=[rel, fix]", "train.lr=1e-4",
            "data.path='a: b # c, [d]'", "name=\"yes\"", "server.base_url=http://127.0.0.1:8000/v1",
            "retrieve.retrievers=[epr+div+bias, lm-oracle]", "data.eval_limit=null", "models.lm='123'",
        ],
    )  # fmt: skip
    assert cfg.train.mixed_precision == "no" and cfg.name == "yes" and cfg.models.lm == "123"
    _round_trip(tmp_path, cfg)


def _epr(*args: str) -> subprocess.CompletedProcess:
    """``epr ARGS`` in a fresh interpreter; fails if it imported torch."""
    code = (
        "import sys\nfrom epr.cli import main\nrc = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules, 'epr config imported torch'\nsys.exit(rc)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_epr_config_cli_round_trips_without_torch(tmp_path):
    r = _epr("config", "configs/mtop_curve.yaml", "--set", "candidates.L=20")
    assert r.returncode == 0, r.stderr
    (tmp_path / "out.yaml").write_text(r.stdout)
    want = load_config([ROOT / "configs/mtop_curve.yaml"], ["candidates.L=20"])
    assert load_config([tmp_path / "out.yaml"]) == want and want.candidates.L == 20
    assert "configs/mtop_curve.yaml" in r.stdout.splitlines()[0]

    bad = _epr("config", "--set", "models.dtype=fp16")
    assert bad.returncode == 2 and "models.dtype: 'fp16' is not one of auto, bf16, fp32" in bad.stderr


def test_epr_config_help(capsys):
    from epr.cli import main

    with pytest.raises(SystemExit) as e:
        main(["config", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: epr config" in out and "CONFIG.yaml" in out and "--set" in out


@pytest.mark.parametrize("miner", ["retriever", "mixed"])
def test_bm25_ranked_labels_refuse_re_mined_candidates(miner):
    """DR-BM25 labels rank the candidates by their miner's scores: BM25's only, not an encoder's inner products."""
    sets = [f"candidates.miner={miner}", "candidates.mine_run=runs/round1"]
    with pytest.raises(ConfigError, match=f"labels.source=bm25 .* got miner={miner}"):
        load_config([], [*sets, "labels.source=bm25"])
    assert load_config([], sets).labels.source == "lm"
    assert load_config([], ["labels.source=bm25", "candidates.rounds=1"]).candidates.miner == "bm25"
    # the default two rounds re-mine round 2 with the encoder: BM25-ranked labels need one round
    with pytest.raises(ConfigError, match="labels.source=bm25 .* rounds=2"):
        load_config([], ["labels.source=bm25"])


def test_the_api_budget_default_k_is_retrieve_k():
    from epr.config import RetrieveConfig
    from epr.retrieval.prompt_budget import Budget

    assert Budget(1, 0, 1, "lm").k == RetrieveConfig().k


def test_a_config_that_names_no_run_is_named_by_its_file(tmp_path):
    """A config of one's own without ``name:`` writes to runs/<its file's name>, never into the demo's run folder;
    an explicit name, a --set name and no config at all (the demo) keep theirs; overlays after the first do not
    rename the run."""
    from epr.config import load_config

    mine = tmp_path / "mydata.yaml"
    mine.write_text(
        "inherit: " + str(ROOT / "configs" / "base.yaml") + "\ndata: {task: jsonl, path: rows.csv}\n"
    )
    assert load_config([mine]).name == "mydata"
    assert load_config([mine, ROOT / "configs" / "paper.yaml"]).name == "mydata"
    assert load_config([mine], ["name=other"]).name == "other"
    named = tmp_path / "x.yaml"
    named.write_text("name: kept\n")
    assert load_config([named]).name == "kept"
    assert load_config([mine, named]).name == "kept"  # a later file's own name wins, as any setting does
    child = tmp_path / "child.yaml"  # inherits a named config: its own file's name, not the parent's run
    child.write_text(f"inherit: {ROOT / 'configs' / 'mtop.yaml'}\n")
    assert load_config([child]).name == "child"
    assert load_config([]).name == "demo"
