import numpy as np
import pytest

from epr.retrieval.bm25 import BM25Index, tokenize

CORPUS = [
    "[IN:GET_WEATHER [SL:LOCATION Paris ] ]",
    "[IN:GET_WEATHER [SL:LOCATION Boston ] [SL:DATE_TIME tomorrow ] ]",
    "[IN:CREATE_ALARM [SL:DATE_TIME 7 am ] ]",
    "[IN:CREATE_ALARM [SL:DATE_TIME 7 am ] ]",  # an exact duplicate with another id
    "[IN:CREATE_CALL [SL:CONTACT Alice ] ]",
    "[IN:SEND_MESSAGE [SL:RECIPIENT Alice ] [SL:CONTENT_EXACT hello ] ]",
    "[IN:PLAY_MUSIC [SL:MUSIC_GENRE jazz ] ]",
    "",
]


def test_tokenize_splits_identifiers():
    assert tokenize("[IN:GET_WEATHER [SL:LOCATION Paris ] ]") == [
        "in",
        "get_weather",
        "sl",
        "location",
        "paris",
    ]


@pytest.mark.parametrize("query", CORPUS[:7] + ["alice alice weather", "no such words"])
def test_fast_backend_matches_rank_bm25(query):
    ref, fast = BM25Index(CORPUS, "rank_bm25"), BM25Index(CORPUS, "bm25s")
    np.testing.assert_allclose(fast.scores(query), ref.scores(query), rtol=1e-5, atol=1e-6)
    ids_r, sc_r = ref.search([query], 5)
    ids_f, sc_f = fast.search([query], 5)
    np.testing.assert_array_equal(ids_r, ids_f)
    np.testing.assert_allclose(sc_f, sc_r, rtol=1e-5, atol=1e-6)  # the scores returned with the ids agree too


def test_self_excluded_by_id_but_duplicate_kept():
    idx = BM25Index(CORPUS, "bm25s")
    ids, _ = idx.search([CORPUS[2], CORPUS[3]], k=3, exclude=np.array([2, 3]))
    assert 2 not in ids[0] and ids[0][0] == 3  # the twin with another id is a fair candidate
    assert 3 not in ids[1] and ids[1][0] == 2


def test_ties_broken_by_id_and_k_capped():
    idx = BM25Index(["a b", "a b", "a b", "c"], "rank_bm25")
    ids, scores = idx.search(["a"], k=10, exclude=np.array([1]))
    assert ids[0].tolist()[:2] == [0, 2] and ids.shape == (1, 3)
    assert scores[0, 0] == scores[0, 1]


def test_empty_corpus_is_an_error():
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Index([], "bm25s")


def test_bm25s_debug_records_follow_the_applications_level():
    """bm25s sets its logger to DEBUG at import, so a handler at the root (the CLI's, at INFO) printed its 'Building
    index from tokens': its records now follow the root's level."""
    import logging

    from epr.retrieval.bm25 import BM25Index

    seen = []
    h = logging.Handler()  # level NOTSET, like logging.basicConfig's: shows whatever reaches it
    h.emit = seen.append
    root = logging.getLogger()
    old = root.level
    root.addHandler(h)
    root.setLevel(logging.INFO)
    try:
        BM25Index(["turn on the lights", "set an alarm"], backend="bm25s")
    finally:
        root.removeHandler(h)
        root.setLevel(old)
    assert not [r for r in seen if r.name.startswith("bm25s") and r.levelno < logging.INFO]


@pytest.mark.parametrize("app_has_jax", [False, True])
def test_bm25s_import_does_not_start_jax(tmp_path, app_has_jax):
    """bm25s runs a jax top-k at import where jax is installed, and jax then takes 75% of a GPU's memory (on a lent
    H200 the runs beside such a process failed out of memory): with a stand-in jax whose ``lax.top_k`` leaves a
    mark, a process that builds a bm25s index never calls it, and can still import jax afterwards. An application
    that imported jax itself keeps it (bm25s may use it then)."""
    import os
    import subprocess
    import sys

    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text("")
    mark = tmp_path / "started"
    (tmp_path / "jax" / "lax.py").write_text(
        f"def top_k(x, k):\n    open({str(mark)!r}, 'w').close()\n    return x[:k], list(range(k))\n"
    )
    code = (
        ("import jax.lax; " if app_has_jax else "")
        + "from epr.retrieval.bm25 import BM25Index; ix = BM25Index(['turn on the lights', 'set an alarm', 'play some music'], 'bm25s'); "
        "print(ix.search(['alarm'], 1)[0].tolist()); import jax.lax; print('jax', callable(jax.lax.top_k))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[[1]]", "jax True"]
    assert mark.exists() == app_has_jax
