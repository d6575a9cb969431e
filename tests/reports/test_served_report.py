"""The served row's report (epr experiment record): any set of compared retrievers, not only bm25 and sbert."""

import pytest

from epr.reports.served import served_report

SEL = {"selected": "hybrid", "reason": "hybrid beat BM25"}


def rows(names, n=12):
    return [
        {k: {"correct": (i + j) % 3 == 0, "gold_logprob": -float(i + j)} for j, k in enumerate(names)}
        for i in range(n)
    ]


def test_a_run_without_sbert_is_reported():
    md, raw = served_report(rows(["bm25", "epr", "hybrid"]), SEL, "dev", "no sbert")
    assert raw["best_unsupervised"] == "bm25" and "metric_vs_sbert" not in raw["tests"]
    assert set(raw["holm"]) == {"metric_vs_bm25", "logprob_vs_bm25"} and "vs sbert" not in md


def test_with_both_baselines_every_test_is_there():  # the report as before, where both were compared
    _, raw = served_report(rows(["bm25", "sbert", "hybrid"]), SEL, "dev", "both")
    assert {"metric_vs_bm25", "metric_vs_sbert", "logprob_vs_bm25", "logprob_vs_sbert"} <= set(raw["tests"])


def test_no_baseline_at_all_reports_rows_and_no_test():
    _, raw = served_report(rows(["epr", "hybrid"]), SEL, "dev", "learned only")
    assert raw["best_unsupervised"] is None and raw["tests"] == {} and raw["holm"] == {}
    with pytest.raises(ValueError, match="no per-example rows"):
        served_report([], SEL, "dev", "empty")
