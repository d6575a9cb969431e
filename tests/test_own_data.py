"""A user's own CSV, from file to a trained retriever and a ready prompt; and the demo end to end (slow)."""

import csv

import numpy as np
import pytest

from epr import pipeline
from epr.api import PromptRetriever
from epr.cli import main
from epr.config import load_config
from epr.context import Context
from epr.retrieval.index import load_index


def write_csv(path, rows, header=("question", "answer")):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


ROWS = [
    (f"how do I {v} my {o}", f"{v.upper()}({o})")
    for v in ("reset", "change", "delete", "export")
    for o in ("password", "email", "account", "photos", "contacts")
]


def own_config(tmp_path, minilm_dir, *extra: str):
    """A small own-data run: BM25 labels (no LM needed), one short training epoch."""
    p = write_csv(tmp_path / "mine.csv", ROWS)
    sets = [
        f"run_root={tmp_path}",
        "name=mine",
        "data.task=jsonl",
        f"data.path={p}",
        "data.input_field=question",
        "data.output_field=answer",
        "data.eval_size=4",
        "labels.source=bm25",
        "candidates.rounds=1",  # BM25 labels: one round, and no LM to select with
        "select.size=0",
        "candidates.L=6",
        "labels.k_pos=2",
        "labels.k_neg=2",
        f"models.encoder={minilm_dir}",
        "train.batch_size=4",
        "train.epochs=1",
        "train.dev_size=2",
        "train.chunk_size=0",
    ]
    return load_config([], [*sets, *extra])


def test_own_csv_to_retrieve(tmp_path, minilm_dir):
    cfg = own_config(tmp_path, minilm_dir)
    ctx = Context(cfg)
    assert pipeline.run(ctx, until="encoder")[-1] == "encoder"
    r = PromptRetriever.from_run(tmp_path / "mine")
    res = r.retrieve("how do I reset my email", k=3)
    assert len(res.demos) == 3 and res.scores == sorted(res.scores, reverse=True)
    assert res.prompt.endswith("how do I reset my email\t")
    assert res.prompt.index(res.demos[0].input) > res.prompt.index(
        res.demos[2].input
    )  # best right before the query
    cached = list((tmp_path / "mine" / ".cache" / "index").glob("*.faiss"))
    assert len(cached) == 1 and cached[0].stat().st_size > 0  # the index, saved for the next from_run
    assert load_index(cached[0]).ntotal == len(r.pool) == 16  # 20 rows minus data.eval_size=4
    stamp = cached[0].stat().st_mtime_ns
    r2 = PromptRetriever.from_run(tmp_path / "mine")  # cached index: loaded, not rebuilt
    assert cached[0].stat().st_mtime_ns == stamp
    assert r2.retrieve("how do I reset my email", k=3).demos == res.demos


def test_own_csv_compare_with_ragsys_rows(tmp_path, minilm_dir, tiny_lm_dir):
    """The comparison stage on own data, fast: tiny random LM, every retriever kind, RAGSys rows with quality bias."""
    import json

    names = ["random", "bm25", "sbert", "epr", "epr+div", "epr+div+bias", "dr-bm25", "bm25-oracle"]
    cfg = own_config(
        tmp_path,
        minilm_dir,
        f"models.lm={tiny_lm_dir}",
        "generate.max_new_tokens=6",
        "retrieve.k=8",
        "retrieve.max_demos=3",
        f"retrieve.retrievers={','.join(names)}",
    )
    ctx = Context(cfg)
    assert pipeline.run(ctx, until="compare")[-1] == "evaluate"
    res = json.loads((tmp_path / "mine" / "evaluate" / "results.json").read_text())
    assert list(res) == names
    assert res["bm25-oracle"]["oracle"] and not res["epr+div+bias"]["oracle"]
    assert all(0 < v["mean_demos"] <= 3 for k, v in res.items())
    paired = json.loads((tmp_path / "mine" / "evaluate" / "paired.json").read_text())["correct"]
    assert len(paired) == len(names) * (len(names) - 1) // 2
    assert all(0.0 <= r["p_mcnemar"] <= 1.0 and 0.0 <= r["demo_overlap"] <= 1.0 for r in paired)
    q = np.load(tmp_path / "mine" / "rerank" / "quality_bias.npy")
    assert q.shape == (16,) and np.isfinite(q).all()  # one per pool demonstration, for the +bias row
    # the RAGSys rows are Algorithm 1 (the reference MMR) over the first stage's shortlist with the run's lambdas:
    # a stage that dropped diversity or the quality bias, or hard-coded a lambda, would not match
    from ragsys import mmr_select_reference

    first, rr, rs = tmp_path / "mine" / "retrieve", tmp_path / "mine" / "rerank", cfg.ragsys
    qe, pe = np.load(first / "epr.query.npy"), np.load(first / "epr.pool.npy")
    shortlists = [json.loads(x)["ids"] for x in (first / "epr.jsonl").open()]
    for name, lam_d, qual in (("epr+div", rs.lambda_d, None), ("epr+div+bias", rs.lambda_d, q)):
        rows = [json.loads(x) for x in (rr / f"{name}.jsonl").open()]
        for i, (row, ids) in enumerate(zip(rows, shortlists)):
            ids = np.array(ids)
            want = mmr_select_reference(qe[i], pe[ids], None if qual is None else qual[ids], 3, lam_d,
                                        rs.lambda_b if qual is not None else 1.0)  # fmt: skip
            assert row["ids"] == ids[want].tolist(), (name, i)
    assert rs.lambda_d < 1 and rs.lambda_b < 1  # the defaults (0.75, 0.95): both terms are in play
    # DR-BM25: its own encoder, trained on BM25-ranked labels of the same candidates, no LM scoring
    sub = tmp_path / "mine" / "dr-bm25"
    assert (sub / "encoder" / "model").exists() and not (sub / "scores").exists()
    lab = json.loads((sub / "labels" / "manifest.json").read_text())
    assert lab["config"]["labels"]["source"] == "bm25"


def test_own_csv_missing_column_is_named(tmp_path, capsys, caplog):
    p = write_csv(tmp_path / "bad.csv", ROWS, header=("question", "reply"))
    rc = main(
        [
            "run",
            "--until",
            "examples",
            "--set",
            f"run_root={tmp_path}",
            "--set",
            "data.task=jsonl",
            "--set",
            f"data.path={p}",
            "--set",
            "data.input_field=question",
            "--set",
            "data.output_field=answer",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "bad.csv: missing column(s) ['answer']; columns are ['question', 'reply']" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_demo_end_to_end(tmp_path, capsys):
    """The README's main command, on the real packaged models (a few minutes on 2 cores)."""
    import json

    sets = [
        "--set",
        f"run_root={tmp_path}",
        "--set",
        "candidates.num_queries=40",
        "--set",
        "train.epochs=1",
        "--set",
        "data.eval_limit=16",
        "--set",
        "retrieve.retrievers=random,bm25,epr,epr+div",
    ]
    rc = main(["demo", *sets])
    assert rc == 0
    out = capsys.readouterr().out
    assert "| retriever | EM (ours)" in out and "epr+div" in out
    run = tmp_path / "demo"
    assert "<table>" in (run / "evaluate" / "report.html").read_text()
    res = json.loads((run / "evaluate" / "results.json").read_text())
    assert list(res) == ["random", "bm25", "epr", "epr+div"]
    # the real LM with real demonstrations: BM25's prompts parse commands, random ones much less often
    assert res["bm25"]["em"] >= 50.0 and res["random"]["em"] < res["bm25"]["em"]
    assert all(v["prompt_status"]["ok"] == 16 and v["gold_logprob_n"] == 16 for v in res.values())
    assert res["bm25"]["gold_logprob"]["value"] > res["random"]["gold_logprob"]["value"]
    per_query = [json.loads(x) for x in (run / "evaluate" / "per_query.jsonl").read_text().splitlines()]
    assert len(per_query) == 16 and all(len(q["epr"]["demos"]) >= 1 for q in per_query)
    labels = (run / "labels" / "labels.jsonl").read_text().splitlines()
    assert len(labels) == 40
    # a second `epr demo` finds every stage fresh and prints the same table
    assert main(["demo", *sets]) == 0
    again = capsys.readouterr().out

    def table(text: str) -> str:  # the printed table (training prints its epochs before it on the first run)
        return text[text.index("# demo:") :].split("Done in")[0]

    assert "epoch 1:" not in again and table(again) == table(out)


def test_editing_own_data_in_place_makes_the_run_stale(tmp_path, minilm_dir):
    cfg = own_config(tmp_path, minilm_dir)
    ctx = Context(cfg)
    assert pipeline.run(ctx, until="candidates") == ["examples", "candidates"]
    assert pipeline.run(Context(own_config(tmp_path, minilm_dir)), until="candidates") == []
    rows = [*ROWS[:-1], ("how do I archive my photos", "ARCHIVE(photos)")]  # same file, one row edited
    write_csv(tmp_path / "mine.csv", rows)
    ctx2 = Context(cfg)  # the same config: only the file's content changed
    assert pipeline.status(ctx2)["examples"] == "stale"
    assert pipeline.run(ctx2, until="candidates") == ["examples", "candidates"]
    assert (
        "how do I archive my photos"
        in (ctx2.stage_dir("examples") / "pool.jsonl").read_text()
        + (ctx2.stage_dir("examples") / "eval.jsonl").read_text()
    )
