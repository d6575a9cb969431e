"""Experiments as data: each results folder declares what it is (``experiment.yaml``, :mod:`.declaration`);
``epr experiment check`` recomputes its numbers from its committed rows (:mod:`.check`); ``epr experiment index``
writes ``results/README.md`` (the decisive rows per dataset, the ledger of locked looks with Holm over each dataset's
family; :mod:`.index`); ``epr experiment run`` reruns a folder's commands (``epr.cli.experiment``)."""
