"""The training settings as they act on this machine and round, without importing torch (``epr status`` keys
stages with them)."""

from __future__ import annotations

__all__ = ["effective_train"]


def effective_train(tc, warm: bool):
    """``train`` as it acts: ``mixed_precision: auto`` resolved on this machine (bf16 where ``models.dtype: auto``
    would run bf16, else no), and a warm-started round's epochs (``warm_epochs``)."""
    import dataclasses

    from epr.lm.identity import default_device, resolve_dtype

    mp = tc.mixed_precision
    if mp == "auto":
        mp = "bf16" if resolve_dtype("auto", default_device()) == "bf16" else "no"
    epochs = tc.warm_epochs if warm and tc.warm_epochs is not None else tc.epochs
    return dataclasses.replace(tc, mixed_precision=mp, epochs=epochs)
