"""The pipeline: the stage graph (``graph``: each stage's upstream, keys and fingerprint), the rounds inside one run
(``rounds``), the runner (``runner``: ``run`` / ``run_stage``) and ``epr status``'s view (``status``)."""

from __future__ import annotations

from epr.pipeline.graph import ALIASES, ROUND_STAGES, STAGES, Stage, final_stage, stage_fingerprint, upstream
from epr.pipeline.runner import check_task_stage, run, run_stage
from epr.pipeline.status import kept, stage_label, status, status_rows

__all__ = [
    "Stage", "STAGES", "ALIASES", "ROUND_STAGES", "stage_fingerprint", "upstream", "final_stage", "status",
    "status_rows", "kept", "stage_label", "run_stage", "run", "check_task_stage",
]  # fmt: skip
