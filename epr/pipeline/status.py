"""What ``epr status`` shows: each stage's state (fresh / stale / missing), every round's stages, and what an
unfinished stage keeps for its next run."""

from __future__ import annotations

from pathlib import Path

from epr.cache import stage_state
from epr.context import Context
from epr.pipeline.graph import ALIASES, ROUND_STAGES, STAGES, stage_fingerprint, upstream

__all__ = ["status", "status_rows", "kept", "stage_label"]


def status(ctx: Context, until: str | None = None) -> dict[str, str]:
    """Each stage's state (fresh / stale / missing): every registered stage, or only ``until`` and what it needs."""
    names = STAGES if until is None else upstream(ctx, ALIASES.get(until, until))
    return {n: stage_state(ctx.stage_dir(n), stage_fingerprint(ctx, n)) for n in names}


def status_rows(ctx: Context, until: str | None = None) -> list[tuple[str, str, Path, str]]:
    """``(label, state, folder, kept)`` of every stage this config runs, the earlier rounds' stages first
    (``round-1/labels``...), so ``epr status`` shows each round; ``kept``: what an unfinished stage holds (:func:`kept`)."""
    rows: list[tuple[str, str, Path, str]] = []
    st = status(ctx, until)
    if "rounds" in st:
        for p in ctx.rounds()[:-1]:
            rows += [
                (f"round-{p.round}/{n}", s, p.stage_dir(n), kept(p, n, s))
                for n, s in status(p, "encoder").items()
            ]
    for n, s in st.items():
        label = f"round-{ctx.round}/{n}" if n in ROUND_STAGES and ctx.round > 1 else n
        rows.append((label, s, ctx.stage_dir(n), kept(ctx, n, s)))
    return rows


def kept(ctx: Context, name: str, state: str) -> str:
    """What stage ``name`` in ``state`` holds for its next run (``epr status``), where it is not fresh: the chunks of
    its ``parts/`` (scores, predictions; each served again only under its own key and inputs) and a training
    checkpoint saved under the stage's fingerprint (resumed from its step); "" where it holds nothing."""
    from epr.encoder.checkpoints import kept_step

    if state == "fresh":
        return ""
    d = ctx.stage_dir(name)
    n = sum(1 for _ in (d / "parts").rglob("chunk-*.json")) if (d / "parts").is_dir() else 0
    said = [f"{n} chunk{'s' * (n != 1)} kept, served again under the same settings and inputs"] if n else []
    if name == "encoder" and (step := kept_step(d / "checkpoints", stage_fingerprint(ctx, name))) is not None:
        said.append(f"training resumes from its checkpoint at step {step}")
    return "; ".join(said)


def stage_label(ctx: Context, name: str) -> str:
    """How logs name a stage: an earlier round's with its round (``round-1/examples``), as ``epr status`` does, so
    a first run's two ``examples`` stages (round 1's and the run's own) are told apart."""
    return f"round-{ctx.round}/{name}" if ctx.top is not None else name
