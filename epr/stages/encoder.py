"""Stage ``encoder``: train the dual encoder on the run's labels (``epr.train``) in the pipeline's processes.

The stage is run by every process of a launch (``distributed``): ``accelerate launch training/train_epr.py -c
<config>`` (or ``-m epr.cli``) trains it across processes or GPUs and writes the same folder and manifest. A
killed training resumes from its newest complete checkpoint when the stage runs again with the same config.
"""

from __future__ import annotations

from pathlib import Path

from epr.context import Context


def run_encoder(ctx: Context, out: Path, fp: str) -> dict:
    from epr.train import train

    return train(ctx, out, resume=True, fp=fp)
