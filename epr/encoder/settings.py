"""The training settings as they act on this machine and round, without importing torch (``epr status`` keys
stages with them)."""

from __future__ import annotations

__all__ = ["effective_train"]


def effective_train(tc, warm: bool):
    """``train`` as it acts: ``mixed_precision: auto`` resolved on this machine (bf16 where ``models.dtype: auto``
    would run bf16, else no), ``length_buckets: null`` as this machine's size (``epr.lm.identity.DEVICE_SIZES``),
    and a warm-started round's epochs (``warm_epochs``)."""
    import dataclasses

    from epr.lm.identity import default_device, device_size, resolve_dtype

    device = default_device()
    mp = tc.mixed_precision
    if mp == "auto":
        mp = "bf16" if resolve_dtype("auto", device) == "bf16" else "no"
    buckets = device_size("train.length_buckets", tc.length_buckets, device)
    epochs = tc.warm_epochs if warm and tc.warm_epochs is not None else tc.epochs
    return dataclasses.replace(tc, mixed_precision=mp, epochs=epochs, length_buckets=buckets)
