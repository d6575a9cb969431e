"""A value per kind of machine (``{cpu: A, gpu: B}``): the loader keeps this machine's, before every other check,
so keys and manifests see the value that ran; a mapping missing a kind is an error naming the key."""

import logging

import pytest

from epr.config import dump_config, load_config
from epr.types import ConfigError


@pytest.fixture
def on(monkeypatch):
    def set_kind(kind):
        monkeypatch.setattr("epr.config.per_device.machine_kind", lambda: kind)

    return set_kind


def test_each_machine_takes_its_own_value(tmp_path, on, caplog):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("inherit: base.yaml\ncandidates: {L: {cpu: 12, gpu: 24}, num_queries: 100}\n")
    (tmp_path / "base.yaml").write_text("name: x\n")
    on("cpu")
    assert load_config([cfg_file]).candidates.L == 12
    on("gpu")
    with caplog.at_level(logging.INFO, logger="epr.config.per_device"):
        cfg = load_config([cfg_file])
    assert cfg.candidates.L == 24 and cfg.candidates.num_queries == 100
    assert "config candidates.L: 24 on this machine (a GPU; a CPU takes 12)" in caplog.text
    # what the run records is the plain value: the dump loads back the same on any machine
    assert "L: 24" in dump_config(cfg)
    # an override may give one too, and a plain override replaces a per-device value
    assert load_config([cfg_file], ["candidates.L={cpu: 16, gpu: 20}"]).candidates.L == 20
    assert load_config([cfg_file], ["candidates.L=30"]).candidates.L == 30


def test_a_missing_kind_or_a_bad_value_is_named(tmp_path, on):
    on("cpu")
    with pytest.raises(
        ConfigError, match=r"candidates.num_queries: a per-device value names \['gpu'\] but not \['cpu'\]"
    ):
        load_config([], ["candidates.num_queries={gpu: 5}"])
    # the kept value is checked as any value is: here the CPU's is out of range
    with pytest.raises(ConfigError, match="candidates.num_queries"):
        load_config([], ["candidates.num_queries={cpu: 0, gpu: 5}"])
    on("gpu")
    assert load_config([], ["candidates.num_queries={cpu: 0, gpu: 5}"]).candidates.num_queries == 5
    # a mapping with other keys is not a per-device value: the field's own check names it
    with pytest.raises(ConfigError, match="candidates.num_queries"):
        load_config([], ["candidates.num_queries={cpu: 3, tpu: 5}"])


def test_mtop_labels_what_each_machine_affords(on):
    """configs/mtop.yaml: 8,000 labels on a GPU (the locked look's recipe), 2,000 on a CPU (its keys, and every
    committed CPU run's, as before); the curve's config pins its own count on both."""
    on("cpu")
    assert load_config(["configs/mtop.yaml"]).candidates.num_queries == 2000
    assert load_config(["configs/mtop_curve.yaml"]).candidates.num_queries == 2000
    on("gpu")
    assert load_config(["configs/mtop.yaml"]).candidates.num_queries == 8000
    assert load_config(["configs/mtop_curve.yaml"]).candidates.num_queries == 2000
    assert load_config(["configs/mtop.yaml"], ["candidates.num_queries=2000"]).candidates.num_queries == 2000
    # each machine's recipe in its own run folder: a GPU's 8,000-label run never overwrites a CPU's
    assert load_config(["configs/mtop.yaml"]).name == "mtop-8000"
    on("cpu")
    assert load_config(["configs/mtop.yaml"]).name == "mtop"


def test_a_per_device_value_is_one_value_when_files_merge(tmp_path, on):
    """``inherit`` replaces a per-device value whole (a child's partial mapping is an error, as in a --set, not
    filled in from its parent's); a key path deeper than any section is the loader's unknown-key error."""
    on("cpu")
    (tmp_path / "base.yaml").write_text("name: x\ncandidates: {num_queries: {cpu: 100, gpu: 200}}\n")
    child = tmp_path / "child.yaml"
    child.write_text("inherit: base.yaml\ncandidates: {num_queries: {cpu: 300}}\n")
    with pytest.raises(ConfigError, match=r"candidates.num_queries: a per-device value names \['cpu'\]"):
        load_config([child])
    child.write_text("inherit: base.yaml\ncandidates: {num_queries: 50}\n")
    assert load_config([child]).candidates.num_queries == 50
    with pytest.raises(ConfigError, match="unknown key"):
        load_config([], ["candidates." + ".".join(["x"] * 1200) + "=1"])
