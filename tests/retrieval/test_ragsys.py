"""RAGSys re-ranking on top of a dense first stage (epr.retrieval.ragsys), as the comparison and `epr inspect` use it."""

from __future__ import annotations

import numpy as np
import pytest

from epr.lm.scoring import LMScorer
from epr.retrieval.ragsys import mean_logprob, parse_retriever_name, rerank
from ragsys import mmr_select_reference


@pytest.mark.parametrize(
    "name,want",
    [
        ("epr", ("epr", False, False, False)),
        ("epr+div", ("epr", True, False, False)),
        ("epr+div+bias", ("epr", True, True, False)),
        ("sbert+bias", ("sbert", False, True, False)),
        ("dr-bm25+div", ("dr-bm25", True, False, False)),
        ("hybrid+rm", ("hybrid", False, False, True)),
    ],
)
def test_parse_retriever_name(name, want):
    assert parse_retriever_name(name) == want


def test_rerank_is_algorithm1_on_each_shortlist():
    rng = np.random.default_rng(3)
    pool, q = rng.normal(size=(60, 6)), rng.normal(size=(4, 6))
    quality = rng.normal(size=60)
    ids = np.stack([rng.permutation(60)[:15] for _ in range(4)])
    got = rerank(q, pool, ids, 5, 0.6, 0.8, quality)
    for i in range(4):
        want = mmr_select_reference(q[i], pool[ids[i]], quality[ids[i]], 5, 0.6, 0.8)
        assert got[i].tolist() == ids[i][want].tolist()
    # no quality: lambda_b is ignored (pure relevance + diversity)
    assert (
        rerank(q, pool, ids, 5, 0.6, 0.1, None).tolist() == rerank(q, pool, ids, 5, 0.6, 1.0, None).tolist()
    )

    # pure relevance keeps the shortlist's cosine order
    def cos(i):
        e = pool[ids[i]] / np.linalg.norm(pool[ids[i]], axis=1, keepdims=True)
        return e @ (q[i] / np.linalg.norm(q[i]))

    assert rerank(q, pool, ids, 5, 1.0).tolist() == [
        ids[i][np.argsort(-cos(i))[:5]].tolist() for i in range(4)
    ]


def test_quality_bias_is_mean_token_logprob(tiny_lm):
    model, tok = tiny_lm
    sc = LMScorer(model, tok)
    ctx, tgt = ["turn on the light\t", "dim\t"], [" [IN:ON ]", " [IN:DIM [SL:ROOM x ] ]"]
    b = mean_logprob(sc, ctx, tgt)
    n = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in tgt]
    assert n[0] != n[1]  # a sum would differ from the mean
    np.testing.assert_allclose(b, sc.score(ctx, tgt) / np.array(n), rtol=1e-5)
