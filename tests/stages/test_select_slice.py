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
