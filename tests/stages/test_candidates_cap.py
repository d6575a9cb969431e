"""``candidates.L`` larger than the pool less the query itself: capped, said so in the log (a warning naming the
asked and the used L) and recorded in the candidates manifest; the stage's key is the configured value, as before."""

from __future__ import annotations

import json
import logging

from epr import pipeline
from tests.stages.test_pipeline import make_ctx


def test_L_capped_to_the_pool_with_a_word(tmp_path, tiny_task_files, caplog):
    """The reported case: `candidates.L=50` on a small pool ran with fewer candidates while the log said L=50."""
    ctx = make_ctx(tmp_path, tiny_task_files, "/unused", "labels.source=bm25", "candidates.L=50")
    with caplog.at_level(logging.INFO, logger="epr.stages.candidates"):
        pipeline.run(ctx, until="candidates")
    n_pool = len(ctx.examples("pool"))
    rows = [
        json.loads(x) for x in (ctx.stage_dir("candidates") / "candidates.jsonl").read_text().splitlines()
    ]
    assert {len(r["ids"]) for r in rows} == {n_pool - 1}
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "capped" in r.getMessage()]
    assert len(warned) == 1
    msg = warned[0].getMessage()
    assert f"L={n_pool - 1} (candidates.L=50 capped: the pool holds {n_pool} examples" in msg
    man = json.loads((ctx.stage_dir("candidates") / "manifest.json").read_text())
    assert man["L"] == n_pool - 1 and man["L_asked"] == 50
    assert man["config"]["candidates"]["L"] == 50  # the key: what was configured


def test_L_within_the_pool_is_not_capped(tmp_path, tiny_task_files, caplog):
    ctx = make_ctx(tmp_path, tiny_task_files, "/unused", "labels.source=bm25", "candidates.L=6")
    with caplog.at_level(logging.INFO, logger="epr.stages.candidates"):
        pipeline.run(ctx, until="candidates")
    man = json.loads((ctx.stage_dir("candidates") / "manifest.json").read_text())
    assert man["L"] == 6 and "L_asked" not in man
    assert "capped" not in caplog.text and "x L=6 (" in caplog.text
