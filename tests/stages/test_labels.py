from epr.stages.labels import select_labels


def test_top_and_bottom_with_ties_by_id():
    ids = [10, 3, 7, 5, 8, 1]
    scores = [-1.0, -1.0, -5.0, -2.0, -5.0, -3.0]
    lab = select_labels(ids, scores, k_pos=2, k_neg=2)
    assert lab["pos"] == [3, 10]  # tie at -1.0: lower id first
    assert lab["neg"] == [7, 8]  # tie at -5.0 ordered by id, both at the bottom
    assert lab["pos_scores"] == [-1.0, -1.0]


def test_null_scores_left_out_and_no_overlap():
    lab = select_labels([1, 2, 3], [None, -1.0, -2.0], k_pos=2, k_neg=2)
    assert lab["pos"] == [2, 3] and lab["neg"] == []
    lab = select_labels([1, 2, 3], [-3.0, -1.0, -2.0], k_pos=2, k_neg=2)
    assert set(lab["pos"]).isdisjoint(lab["neg"]) and lab["neg"] == [1]
