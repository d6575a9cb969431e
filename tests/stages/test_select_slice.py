"""The select stage's held-out slice: a cut below select.size, and a slice too small for any learned retriever to be
served, are said (issue 76's crack: select.size=300 on a 20-row pool held out 4 without a word)."""

import logging

from scipy.stats import wilcoxon

from epr.config import load_config
from epr.stages.candidates import held_out_ids
from epr.stages.select import check_slice, fewest_servable


def test_the_fewest_servable_is_where_wilcoxon_can_first_pass():
    for alpha in (0.05, 0.01):
        n = fewest_servable(alpha)
        assert wilcoxon(list(range(1, n + 1))).pvalue < alpha <= wilcoxon(list(range(1, n))).pvalue


def test_a_small_pool_cut_is_said(caplog):
    cfg = load_config([], ["data.task=demo", "select.size=300"])
    n = len(held_out_ids(cfg, 20))
    assert n == 4
    with caplog.at_level(logging.WARNING, logger="epr.stages.select"):
        check_slice(cfg, 20, n)
    said = caplog.text
    assert "4 of the 300 held-out pool examples" in said and "no learned retriever can be served" in said
    caplog.clear()
    with caplog.at_level(
        logging.WARNING, logger="epr.stages.select"
    ):  # negative control: a pool that holds them
        check_slice(cfg, 5000, len(held_out_ids(cfg, 5000)))
    assert caplog.text == ""


def test_running_select_with_size_0_is_refused_and_touches_nothing(tmp_path):
    """Issue 76's crack: `--set select.size=0 --until select` failed with the hint "set select.size=0" and removed
    the finished select stage's manifest, so a later export served epr where select had chosen bm25."""
    import pytest

    from epr import pipeline
    from epr.context import Context
    from epr.types import ConfigError

    sets = ["data.task=demo", f"run_root={tmp_path}", "name=r"]
    sel = tmp_path / "r" / "select"
    sel.mkdir(parents=True)
    (sel / "manifest.json").write_text("{}")
    for call in (lambda c: pipeline.run(c, until="select"), lambda c: pipeline.run_stage(c, "select")):
        with pytest.raises(ConfigError, match="select.size=0 turns selection off"):
            call(Context(load_config([], [*sets, "select.size=0"])))
        assert (sel / "manifest.json").exists()
    pipeline.check_task_stage(
        Context(load_config([], sets)), "select"
    )  # negative control: a size, no refusal
