"""Rounds inside one run (``candidates.rounds``): round r + 1's candidates are mined by round r's trained encoder,
in ``<run_dir>/rounds/round-r/``. Here: the candidates' keys (who mined them), the ``rounds`` stage's keys and the
context each sub-run stage runs (earlier rounds, and the DR-BM25 sub-run). The graph (``epr.pipeline.graph``)
hands in how an encoder's fingerprint is computed, so this module needs nothing of the pipeline above it."""

from __future__ import annotations

from collections.abc import Callable

from epr.context import Context

__all__ = [
    "candidates_keys",
    "candidates_deps",
    "rounds_keys",
    "encoder_fp_once",
    "previous_round",
    "dr_bm25",
]

EncoderFp = Callable[[Context], str]  # a context -> its encoder stage's fingerprint


def candidates_keys(ctx: Context, encoder_fp: EncoderFp) -> dict:
    sec = ctx.cfg.section("candidates")
    # BM25 (round 1) keys stay as they were before re-mining and in-run rounds: who mines is said by mined_by
    for k in ("miner", "mine_run", "rounds"):
        sec.pop(k)
    keys = {"candidates": sec, "query_order": "nested-permutation"}
    miner = ctx.this_round.miner
    if ctx.this_round.remined:  # which encoder mined, and the round; not where its run folder lives
        keys["mined_by"] = mined_by(ctx, encoder_fp)
    if miner == "mixed":
        keys["miner"] = miner
    c, sel = ctx.cfg.candidates, ctx.cfg.select
    if sel.size > 0 and c.num_queries is None:  # the select slice is left out of the labelled set
        keys["held_out"] = {"size": sel.size, "seed": sel.seed}
    return keys


def mined_by(ctx: Context, encoder_fp: EncoderFp) -> dict:
    """What re-mined candidates come from: the mining encoder's stage fingerprint and this round's number. An
    in-run round's encoder fingerprint is computed (so ``epr status`` knows round r + 1 before round r has trained,
    and round r + 1 goes stale whenever anything round r depends on changes); an outside ``mine_run``'s is read
    from its manifest (``None`` while untrained: the stage then refuses to run)."""
    if ctx.this_round.outside:
        return ctx.this_round.outside_identity()
    return {"encoder": encoder_fp_once(ctx.prev_round(), encoder_fp), "round": ctx.this_round.number()}


def encoder_fp_once(prev: Context, encoder_fp: EncoderFp) -> str:
    """An earlier round's encoder fingerprint, computed once per round context: both the ``rounds`` stage and the
    re-mined candidates key on it, so without the memo each round doubled the work of the one before (nine rounds:
    minutes for ``epr status``)."""
    if "encoder" not in prev.round_fps:
        prev.round_fps["encoder"] = encoder_fp(prev)
    return prev.round_fps["encoder"]


def candidates_deps(ctx: Context) -> tuple[str, ...]:
    return ("examples", "rounds") if ctx.prev_round() is not None else ("examples",)


def rounds_keys(ctx: Context, encoder_fp: EncoderFp) -> dict:
    prev = ctx.prev_round()
    if prev is None:  # round 1: no earlier round (the stage is not in this run's graph)
        return {"round": 0}
    return {"encoder": encoder_fp_once(prev, encoder_fp), "round": prev.round}


def previous_round(ctx: Context) -> Context | None:
    """The ``rounds`` stage's sub-run: the earlier rounds of this run (``<run_dir>/rounds/round-r/``), each up to its
    trained encoder. A round that is fresh is skipped, so a kill in a later round never redoes an earlier one."""
    return ctx.prev_round()


def dr_bm25(ctx: Context) -> Context:
    """The DR-BM25 sub-run (``<run_dir>/dr-bm25/``): the same candidates and training, BM25-ranked labels."""
    return ctx.sub_run("dr-bm25")
