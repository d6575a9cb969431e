import numpy as np
import pytest

from ragsys import mmr_select, mmr_select_reference, select_variant


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ld,lb", [(0.75, 0.95), (0.3, 0.5), (1.0, 1.0), (0.0, 0.9)])
def test_matches_loop_transcription(seed, ld, lb):
    rng = np.random.default_rng(seed)
    emb, q, b = rng.normal(size=(40, 8)), rng.normal(size=8), rng.normal(size=40)
    assert mmr_select(q, emb, b, 6, ld, lb).tolist() == mmr_select_reference(q, emb, b, 6, ld, lb)


def test_pure_relevance_is_topk_cosine():
    rng = np.random.default_rng(0)
    emb, q = rng.normal(size=(50, 5)), rng.normal(size=5)
    cos = (emb / np.linalg.norm(emb, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    assert mmr_select(q, emb, None, 6, 1.0, 1.0).tolist() == np.argsort(-cos)[:6].tolist()


def test_large_quality_weight_picks_by_quality():
    rng = np.random.default_rng(1)
    emb, q, b = rng.normal(size=(30, 4)), rng.normal(size=4), rng.normal(size=30)
    assert select_variant("bias", q, emb, b, 5, 0.75, 0.95).tolist() == np.argsort(-b)[:5].tolist()


def test_near_duplicates_suppressed():
    base = np.eye(4)
    emb = np.vstack([base[0], base[0] + 1e-3, base[0] + 2e-3, base[1] * 0.9 + base[0] * 0.5])
    q = base[0]
    assert mmr_select(q, emb, None, 2, 1.0, 1.0).tolist() == [0, 1]  # relevance alone keeps the duplicate
    assert mmr_select(q, emb, None, 2, 0.3, 1.0).tolist() == [0, 3]  # diversity replaces it


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"lambda_d": 1.5}, "lambda_d"),
        ({"lambda_b": -0.1}, "lambda_b"),
        ({"k": 11}, "larger than the candidate pool"),
    ],
)
def test_bad_arguments(kw, match):
    args = {"query": np.ones(3), "emb": np.ones((10, 3)), "quality": np.zeros(10), "k": 3}
    args |= {"lambda_d": 0.75, "lambda_b": 0.95, **kw}
    with pytest.raises(ValueError, match=match):
        mmr_select(**args)
