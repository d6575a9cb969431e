"""The served retriever (``PromptRetriever.mode``): ``hybrid`` is exactly the reciprocal-rank fusion of the dense and
the BM25 rankings, ``bm25`` exactly BM25 over the pool's inputs; ``from_run`` serves what a finished ``select`` stage
chose (an unfinished one is ignored); a shipped folder keeps its mode, and its card says what it serves and why."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from epr.api import PromptRetriever
from epr.cache import read_manifest, write_manifest
from epr.retrieval.index import search
from epr.retrieval.retrievers import BM25Retriever, DenseRetriever, FusionRetriever, rrf_fuse
from epr.types import Example, UpstreamError


def _rows() -> dict:
    """What a real ``select`` writes (``choose``), not a copy of its keys: a card that reads other keys shows '–'."""
    from epr.stages.select import choose

    g = np.random.default_rng(0)
    base = g.normal(-12.2, 1.0, 300)
    lp = {
        "bm25": base,
        "epr": base - 0.31 + g.normal(0, 0.5, 300),
        "hybrid": base + 0.27 + g.normal(0, 0.5, 300),
    }
    return choose(lp, ["epr", "hybrid"], 0.05)["rows"]


ROWS = _rows()


def card_line(name: str, mark: str = "") -> str:
    r = ROWS[name]
    return f"| `{name}`{mark} | {r['gold_logprob']:.3f} | {r['gain']:+.3f} | {r['p']:.3g} |"


def report(selected: str, backend: str = "bm25s") -> dict:
    return {"selected": selected, "reason": f"{selected} had the best held-out gold log-prob", "baseline": "bm25",
            "n": 300, "rows": ROWS, "rule": "the best row whose gain over bm25 has p < 0.05, else bm25",
            "backend": backend}  # fmt: skip


def as_query(q: str) -> list[Example]:
    return [Example(-1, q, "", {})]


def dense(r: PromptRetriever, q: str, k: int) -> np.ndarray:
    return search(r.index, r.encoder.encode([q], "query"), k)[0][0]


@pytest.fixture
def loaded(shipped):
    """A fresh copy of the shipped (dense) retriever, and the run's evaluation inputs."""
    path, queries = shipped
    return PromptRetriever.from_pretrained(path), queries


@pytest.fixture
def run(shipped, tmp_path) -> Path:
    """A run folder of its own: the shipped fixture's stages linked in, no select stage yet."""
    src = shipped[0].parent / "runs" / "mine"
    run = tmp_path / "mine"
    run.mkdir()
    for p in src.iterdir():
        if p.name not in (".cache", "select") and not p.name.startswith(".epr.lock"):  # a lock is per run
            (run / p.name).symlink_to(p)
    return run


def write_select(run: Path, rep: dict, finished: bool = True, encoder_fp: str | None = None) -> None:
    d = run / "select"
    d.mkdir(exist_ok=True)
    (d / "report.json").write_text(json.dumps(rep))
    if finished:
        fp = encoder_fp or read_manifest(run / "encoder")["fingerprint"]
        write_manifest(d, stage="select", fp="test", config={}, rows={}, extra={"upstream": {"encoder": fp}})


def test_hybrid_is_the_rrf_of_dense_and_bm25(loaded, shipped):
    r, queries = loaded
    r.mode = "hybrid"
    bm25 = BM25Retriever(r.pool, "input", "bm25s")
    emb = np.stack([r.index.reconstruct(i) for i in range(r.index.ntotal)])
    pipeline_hybrid = FusionRetriever(  # the pipeline's own hybrid, built as make_retriever builds it
        "hybrid", [DenseRetriever("epr", emb, lambda t: r.encoder.encode(list(t), "query")), bm25]
    )
    differs = 0
    for q in queries:
        for k in (3, 6):
            want_ids, want_sc = rrf_fuse([dense(r, q, k), bm25.retrieve(as_query(q), k).ids[0]], k)
            res = r.retrieve(q, k)
            assert [d.idx for d in res.demos] == want_ids.tolist()
            assert res.scores == want_sc.tolist()  # value for value: the fused scores
            assert r.select(q, k) == want_ids.tolist()
            assert pipeline_hybrid.retrieve(as_query(q), k).ids[0].tolist() == want_ids.tolist()
            differs += want_ids.tolist() != dense(r, q, k).tolist()
    assert differs  # negative control: the fusion changes some ranking
    again = PromptRetriever.from_pretrained(shipped[0])
    again.mode = "hybrid"  # a fresh retriever, the same answers (deterministic)
    for q in queries:
        a, b = r.retrieve(q, 6), again.retrieve(q, 6)
        assert [d.idx for d in a.demos] == [d.idx for d in b.demos] and a.scores == b.scores


@pytest.mark.parametrize("backend", ["bm25s", "rank_bm25"])
def test_bm25_mode_is_bm25_over_the_inputs(loaded, backend):
    r0, queries = loaded
    r = PromptRetriever(r0.encoder, r0.pool, r0.task, r0.index, budget=r0.budget, count=r0.count,
                        mode="bm25", bm25_backend=backend)  # fmt: skip
    ref = BM25Retriever(r.pool, "input", backend)
    for q in queries:
        hits = ref.retrieve(as_query(q), 5)
        res = r.retrieve(q, 5)
        assert [d.idx for d in res.demos] == hits.ids[0].tolist() and res.scores == hits.scores[0].tolist()
        assert r.select(q, 5) == hits.ids[0].tolist()
    assert any(r.select(q, 5) != dense(r, q, 5).tolist() for q in queries)  # not the dense ranking
    with pytest.raises(ValueError, match="mode='bm42': choose one of epr, hybrid, bm25"):
        r.mode = "bm42"
    with pytest.raises(ValueError, match="bm25_backend='lucene'"):
        PromptRetriever(r0.encoder, r0.pool, r0.task, r0.index, mode="bm25", bm25_backend="lucene")


def test_ragsys_shortlist_comes_from_the_mode(loaded):
    from ragsys import mmr_select

    r, queries = loaded
    r.mode = "hybrid"
    bm25 = BM25Retriever(r.pool, "input", "bm25s")
    q, n = queries[0], 8
    cand = rrf_fuse([dense(r, q, n), bm25.retrieve(as_query(q), n).ids[0]], n)[0]
    emb = np.stack([r.index.reconstruct(int(i)) for i in cand])
    qe = r.encoder.encode([q], "query")[0]
    want = cand[mmr_select(qe, emb, r.quality[cand], 4, 0.3, 0.5)].tolist()
    assert r.select(q, 4, lambda_d=0.3, lambda_b=0.5, shortlist=n) == want


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_added_demonstration_reaches_bm25(loaded, mode):
    r, _ = loaded
    r.mode = mode
    q = "zebra xylophone quantum banana"
    assert r.retrieve("how do I reset my email", 3).demos  # BM25 built over the pool as it was
    i = r.add(q, "a brand new demonstration")
    assert r.select(q, 1) == [i]  # BM25 rebuilt after the add: its only lexical match comes first
    assert r.retrieve(q, 1).demos[0].output == "a brand new demonstration"


def test_from_run_serves_what_the_select_stage_chose(run, caplog):
    caplog.set_level(logging.INFO, logger="epr")  # epr.api and the served mode (epr.retrieval.modes)
    assert PromptRetriever.from_run(run).mode == "epr"  # no select stage: the dense encoder, as before
    assert "serving the 'epr' retriever (the run has no finished select stage)" in caplog.text

    assert "did not finish" not in caplog.text  # a run without select: nothing to warn of
    write_select(run, report("hybrid"), finished=False)  # a select folder without its manifest is unfinished
    caplog.clear()
    assert PromptRetriever.from_run(run).mode == "epr"
    warned = [
        r for r in caplog.records if r.levelno == logging.WARNING
    ]  # said where a plain Python user sees it
    assert len(warned) == 1 and "its select stage did not finish" in warned[0].getMessage()

    write_select(run, report("hybrid"))
    caplog.clear()
    r = PromptRetriever.from_run(run)
    assert r.mode == "hybrid" and r.selection_report["rows"] == ROWS
    assert "serving the 'hybrid' retriever (the run's select stage chose 'hybrid': hybrid had the best" in (
        caplog.text
    )
    q = "how do I reset my email"
    bm = BM25Retriever(r.pool, "input", "bm25s").retrieve(as_query(q), 4).ids[0]
    assert r.select(q, 4) == rrf_fuse([dense(r, q, 4), bm], 4)[0].tolist()
    assert PromptRetriever.from_run(run, mode="epr").select(q, 4) == dense(r, q, 4).tolist()  # the override
    assert "asked for with mode='epr'; the run's select stage chose 'hybrid'" in caplog.text

    write_select(run, report("bm25", backend="rank_bm25"))
    r = PromptRetriever.from_run(run)
    assert (r.mode, r.bm25_backend) == ("bm25", "rank_bm25")

    write_select(run, report("bm25"), encoder_fp="an-earlier-encoder")
    PromptRetriever.from_run(run)
    assert "the select stage compared an earlier encoder of this run" in caplog.text

    write_select(run, {"selected": "sparse-magic"})
    with pytest.raises(UpstreamError, match="not a readable select report"):
        PromptRetriever.from_run(run)
    assert PromptRetriever.from_run(run, mode="bm25").mode == "bm25"  # an explicit mode still serves


def test_shipped_folder_keeps_the_mode_and_states_it(run, tmp_path):
    write_select(run, report("hybrid"))
    r = PromptRetriever.from_run(run)
    out = r.save_pretrained(tmp_path / "ret", run=run)
    meta = json.loads((out / "retriever.json").read_text())
    assert meta["mode"] == "hybrid" and meta["bm25_backend"] == "bm25s"
    assert meta["selection"]["selected"] == "hybrid" and meta["selection"]["rows"] == ROWS
    assert meta["format"] == "epr-retriever/2"  # an epr without modes refuses it instead of serving epr
    back = PromptRetriever.from_pretrained(out)
    assert back.mode == "hybrid" and back.selection_report == meta["selection"]
    for q in ["how do I reset my email", "how do I export my photos", "delete contacts"]:
        a, b = r.retrieve(q, 5), back.retrieve(q, 5)
        assert [d.idx for d in a.demos] == [d.idx for d in b.demos] and a.scores == b.scores
        assert a.prompt == b.prompt
    card = (out / "README.md").read_text()
    assert "## Served retriever: `hybrid`" in card and "Dev metrics per epoch" in card
    assert card_line("hybrid", " (served)") in card and "300 held-out queries" in card
    assert card_line("epr") in card  # every number the report holds is shown (the baseline's own gain is '–')
    assert "No learned retriever beat BM25" not in card


def test_card_says_plainly_when_bm25_won(run, tmp_path):
    write_select(run, report("bm25"))
    out = PromptRetriever.from_run(run).save_pretrained(tmp_path / "ret", run=run)
    card = (out / "README.md").read_text()
    assert "## Served retriever: `bm25`" in card
    assert "**No learned retriever beat BM25 on your pool**" in card
    assert card_line("epr") in card and card_line("hybrid") in card
    # loaded, switched back to the dense encoder and saved again: the card restates what it serves now
    r = PromptRetriever.from_pretrained(out)
    r.mode = "epr"
    card2 = (r.save_pretrained(tmp_path / "ret2") / "README.md").read_text()
    assert "## Served retriever: `epr`" in card2 and "## Served retriever: `bm25`" not in card2
    assert "Served by choice: the run's `select` stage chose `bm25`" in card2
    assert "Dev metrics per epoch" in card2  # the rest of the card is kept
    assert json.loads((tmp_path / "ret2" / "retriever.json").read_text())["format"] == "epr-retriever/1"


def test_folder_written_before_modes_loads_as_epr(shipped, tmp_path):
    from epr.shipping import MANIFEST, _file_list

    path, queries = shipped
    old = tmp_path / "old"
    shutil.copytree(path, old)
    meta = json.loads((old / "retriever.json").read_text())
    for key in ("mode", "bm25_backend", "selection"):
        meta.pop(key)
    (old / "retriever.json").write_text(json.dumps(meta, indent=2) + "\n")
    man = json.loads((old / MANIFEST).read_text())
    (old / MANIFEST).write_text(json.dumps({**man, "files": _file_list(old)}))
    r = PromptRetriever.from_pretrained(old)
    assert r.mode == "epr" and r.selection_report is None
    for q in queries:
        assert r.select(q, 4) == dense(r, q, 4).tolist()


def test_epr_export_ships_the_selection_or_the_mode_asked_for(run, tmp_path):
    from epr.cli import main

    write_select(run, report("hybrid"))
    args = ["export", "--set", f"run_root={tmp_path}", "--set", "name=mine"]
    out = tmp_path.parent / f"{tmp_path.name}-exports"  # never inside the run root (epr export refuses that)
    assert main([*args, str(out / "chosen")]) == 0
    assert json.loads((out / "chosen" / "retriever.json").read_text())["mode"] == "hybrid"
    assert main([*args, "--mode", "bm25", str(out / "asked")]) == 0
    meta = json.loads((out / "asked" / "retriever.json").read_text())
    assert meta["mode"] == "bm25" and meta["selection"]["selected"] == "hybrid"
    assert (
        "Served by choice: the run's `select` stage chose `hybrid`"
        in (out / "asked" / "README.md").read_text()
    )


def test_status_says_when_the_served_choice_is_not_these_settings(run, minilm_dir):
    """``epr status``'s served-retriever line marks a choice made under other settings (a stale select stage), and
    one left by an earlier run when these settings run no select stage; a fresh choice carries no note."""
    from epr.cli.ending import selection_line as _selection_line
    from epr.context import Context
    from epr.pipeline import stage_fingerprint

    from .test_own_data import own_config

    ctx = Context(own_config(run.parent, minilm_dir, "select.size=8"))
    assert ctx.cfg.run_dir == run
    write_select(run, report("hybrid"))  # finished, under a fingerprint these settings do not give
    assert "served retriever: hybrid" in _selection_line(
        ctx
    ) and "; stale: chosen under other" in _selection_line(ctx)
    man = read_manifest(run / "select")
    write_manifest(run / "select", stage="select", fp=stage_fingerprint(ctx, "select"), config={}, rows={},
                   extra={"upstream": man["upstream"]})  # fmt: skip
    line = _selection_line(ctx)
    assert line.startswith("served retriever: hybrid") and "stale" not in line and "earlier run" not in line
    no_select = Context(own_config(run.parent, minilm_dir))  # select.size 0
    assert "these settings run no select stage" in _selection_line(no_select)


def test_lambda_b_without_a_quality_bias_says_how_to_get_one(loaded):
    r, _ = loaded
    r.quality = None  # a run whose retrievers had no +bias: its rerank stage computed no quality bias
    with pytest.raises(ValueError, match=r"retrieve\.retrievers=\[epr,hybrid,epr\+div\+bias\]"):
        r.select("how do I reset my email", 3, lambda_b=0.9)
