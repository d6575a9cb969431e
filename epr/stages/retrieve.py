"""Stage ``retrieve``: every first-stage retriever of ``retrieve.retrievers`` on the compared examples.

Writes ``<name>.jsonl`` (one row per example: ``{idx, ids, scores}``, ``retrieve.k`` ids best first with the
retriever's own scores) and, for dense retrievers, the query and pool embeddings (``<name>.query.npy``,
``<name>.pool.npy``) that the ``rerank`` stage's diversity term needs. ``+div``/``+bias`` names are re-ranked
downstream; here only their first stage runs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from epr.artifacts import prune_outputs, save_npy, write_jsonl
from epr.config import parse_retriever_name
from epr.context import Context
from epr.reports.stats import eval_part, seeded_subset
from epr.types import ConfigError, Example

log = logging.getLogger(__name__)


def eval_examples(ctx: Context) -> list[Example]:
    """The compared examples (``idx``: the row of the eval split): ``data.eval_part`` of the split (``dev``: the
    seeded subset of ``data.eval_limit``; ``locked``: the rest), then a seeded subset of ``retrieve.eval_limit``."""
    d = ctx.cfg.data
    ev = ctx.examples("eval")
    try:
        groups = ctx.task.groups(ev) if d.eval_cut == "groups" else None
        ev = [ev[i] for i in eval_part(len(ev), d.eval_limit, d.eval_part, d.split_seed, groups)]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return [ev[i] for i in seeded_subset(len(ev), ctx.cfg.retrieve.eval_limit, ctx.cfg.seed)]


def first_stages(names) -> list[str]:
    """The distinct first-stage retrievers of a list of (possibly re-ranked) names, in order."""
    return list(dict.fromkeys(parse_retriever_name(n)[0] for n in names))


def run_retrieve(ctx: Context, out: Path, fp: str) -> dict:
    from epr.retrieval.retrievers import DenseRetriever, make_retriever

    cfg = ctx.cfg
    pool, ev = ctx.examples("pool"), eval_examples(ctx)
    if not ev:
        raise ValueError(
            f"retrieve: no evaluation examples to compare in {ctx.stage_dir('examples') / 'eval.jsonl'} "
            f"(data.eval_path {cfg.data.eval_path!r}, data.eval_size {cfg.data.eval_size}, data.eval_part "
            f"{cfg.data.eval_part!r}): give held-out rows with data.eval_path or set data.eval_size"
        )
    loaded: dict = {}
    produced = []
    for name in first_stages(cfg.retrieve.retrievers):
        r = make_retriever(name, pool, ctx.task, cfg, ctx.encoder_dir(name), loaded, ctx.prompt())
        hits = r.retrieve(ev, cfg.retrieve.k)
        write_jsonl(out / f"{name}.jsonl", hits.rows(ev))
        produced.append(f"{name}.jsonl")
        if isinstance(r, DenseRetriever):
            save_npy(out / f"{name}.query.npy", r.query_embeddings(ev))
            save_npy(out / f"{name}.pool.npy", r.pool_emb)
            produced += [f"{name}.query.npy", f"{name}.pool.npy"]
        log.info("retrieve: %s, %d x %d", name, *hits.ids.shape)
    prune_outputs(out, produced)
    return {"rows": {"eval": len(ev), "retrievers": len(first_stages(cfg.retrieve.retrievers))}}
