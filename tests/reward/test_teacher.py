"""The reward model as the dual encoder's teacher (issue 74, item 3; LLM-R's distillation): the ``teacher`` stage
scores each labelled example's wider mined candidates with the trained reward model, the encoder learns those
scores (``train.teacher: reward``) and is still judged on the LM's labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from epr import pipeline
from epr.encoder.data import LabelRow
from epr.reward.model import CrossEncoder
from epr.stages.teacher import teacher_rows

from .test_reward import _ctx

SETS = (
    "reward.epochs=1",
    "reward.teach_k=10",
    "train.epochs=1",
    "train.batch_size=4",
    "train.chunk_size=0",
    "train.dev_size=3",
    "train.list_size=4",
    "candidates.num_queries=16",
)


def test_teacher_rows_merge_the_mined_and_the_lm_candidates_and_order_them_by_the_teacher():
    labels = [
        LabelRow(0, (5,), (7,), (5, 6, 7), (-1.0, -2.0, -3.0)),
        LabelRow(3, (1,), (2,), (1, 2), (0.0, -1.0)),
    ]
    mined = {
        0: [9, 6, 0, 4],
        3: [2, 8],
    }  # the query itself (0) is never its own candidate; 6 is in both lists
    teach = {9: 0.5, 6: 2.0, 4: -1.0, 5: 0.1, 7: 2.0, 2: 1.0, 8: 3.0, 1: -5.0}
    seen = []

    def score(qid, ids):
        seen.append((qid, list(ids)))
        return [teach[i] for i in ids]

    rows = teacher_rows(labels, mined, score, k_pos=2, k_neg=1)
    assert seen == [(0, [9, 6, 4, 5, 7]), (3, [2, 8, 1])]  # mined first, then the LM's; once each
    assert [r["qid"] for r in rows] == [0, 3]
    assert rows[0]["cands"] == [6, 7, 9, 5, 4] and rows[0]["cand_scores"] == [
        2.0,
        2.0,
        0.5,
        0.1,
        -1.0,
    ]  # ties: id
    assert rows[0]["pos"] == [6, 7] and rows[0]["neg"] == [4]
    assert rows[1]["pos"] == [8, 2] and rows[1]["neg"] == [1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.conftest import write_tiny_task

    return write_tiny_task(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def taught(tmp_path_factory, tiny, tiny_lm_dir, minilm_dir):
    root = tmp_path_factory.mktemp("teacher")
    ctx = _ctx(
        root, tiny, tiny_lm_dir, minilm_dir, f"models.encoder={minilm_dir}", *SETS, "train.teacher=reward"
    )
    pipeline.run(ctx, until="encoder")
    return ctx


def read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_teacher_stage_is_the_reward_models_scores_of_the_wider_mined_candidates(taught):
    from epr.stages.candidates import mine

    ctx, c = taught, taught.cfg.candidates
    assert {"reward", "teacher"} <= set(pipeline.upstream(ctx, "encoder"))
    labels = {r["qid"]: r for r in read(ctx.stage_dir("labels") / "labels.jsonl")}
    rows = read(ctx.stage_dir("teacher") / "teacher.jsonl")
    assert [r["qid"] for r in rows] == list(labels)  # one row per label row, in its order
    pool = ctx.examples("pool")
    qids = np.array(list(labels))
    wide = {r.qid: r.ids for r in mine(pool, qids, 10, c.view, c.backend, progress=False)}
    model = CrossEncoder.from_pretrained(str(ctx.stage_dir("reward") / "model"))
    for r in rows:
        q = r["qid"]
        assert set(r["cands"]) == set(wide[q]) | set(labels[q]["cands"]) and q not in r["cands"]
        assert len(r["cands"]) > len(labels[q]["cands"])  # wider than what the LM scored
        # each score is the reward model's own, one pair at a time
        s = [float(model.score([pool[q].input], [model.demo(ctx.task, pool[i])])[0]) for i in r["cands"]]
        assert np.allclose(r["cand_scores"], s, atol=1e-4)
        assert r["cand_scores"] == sorted(r["cand_scores"], reverse=True)
    # negative control: the teacher's order is not the LM's
    assert any(r["cands"][: len(labels[r["qid"]]["cands"])] != labels[r["qid"]]["cands"] for r in rows)


def test_the_taught_encoder_is_keyed_by_its_teacher_and_judged_on_the_lms_labels(
    taught, tiny, tiny_lm_dir, minilm_dir
):
    from epr.cache import read_manifest

    root = Path(taught.cfg.run_root)
    plain = _ctx(root.parent, tiny, tiny_lm_dir, minilm_dir, f"models.encoder={minilm_dir}", *SETS)
    assert "teacher" not in pipeline.upstream(plain, "encoder")
    for s in ("candidates", "labels", "reward"):
        assert pipeline.stage_fingerprint(plain, s) == pipeline.stage_fingerprint(taught, s)
    assert pipeline.stage_fingerprint(plain, "encoder") != pipeline.stage_fingerprint(taught, "encoder")
    deeper = _ctx(root.parent, tiny, tiny_lm_dir, minilm_dir, f"models.encoder={minilm_dir}", *SETS,
                  "train.teacher=reward", "reward.teach_k=12")  # fmt: skip
    assert pipeline.stage_fingerprint(deeper, "reward") == pipeline.stage_fingerprint(taught, "reward")
    for s in ("teacher", "encoder"):
        assert pipeline.stage_fingerprint(deeper, s) != pipeline.stage_fingerprint(taught, s)
    # epoch 0 (the same untrained encoder, the same held-out examples) is judged as the plain run judges it: by the
    # LM's labels, not by the teacher's rows
    h_t = read_manifest(taught.stage_dir("encoder"))["history"][0]
    pipeline.run(
        plain, until="encoder"
    )  # the same run folder: its candidates, labels and reward model are reused
    h_p = read_manifest(plain.stage_dir("encoder"))["history"][0]
    assert h_t == h_p
