"""Which epoch training keeps (``epr.encoder.dev_metric.best_epoch``)."""

from epr.encoder.dev_metric import best_epoch

H = [{"epoch": 0, "mrr": 0.64, "recall@3": 0.4}, {"epoch": 1, "mrr": 0.60, "recall@3": 0.4},
     {"epoch": 2, "mrr": 0.62, "recall@3": 0.5}]  # fmt: skip


def test_the_best_dev_epoch_and_a_warm_starts_trained_ones_only():
    assert best_epoch(H, "mrr", 3) == 0  # a cold start may keep the untrained encoder
    assert best_epoch(H, "mrr", 3, trained_only=True) == 2  # a warm start keeps a trained epoch
    assert best_epoch(H, "recall", 3) == 2 and best_epoch(H, "last", 3) == 2
    assert best_epoch(H[:1], "mrr", 3, trained_only=True) == 0  # nothing trained: the start is all there is
    ties = [{**h, "mrr": 0.5} for h in H]
    assert best_epoch(ties, "mrr", 3) == 0 and best_epoch(ties, "mrr", 3, trained_only=True) == 1  # earliest
