"""Experiments as data: each results folder declares what it is (``experiment.yaml``), ``epr experiment check``
recomputes its numbers from its committed rows, ``epr experiment index`` writes ``results/README.md`` (the decisive
rows per dataset, the ledger of locked looks with Holm over each dataset's family), ``epr experiment run`` reruns a
folder's commands."""

from epr.experiments.check import check, check_all, recompute
from epr.experiments.declaration import Experiment, load

__all__ = ["Experiment", "load", "check", "check_all", "recompute"]
