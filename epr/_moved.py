"""Old module paths (before the package layout), kept importable for one release with a ``DeprecationWarning``.

``import epr.models`` returns ``epr.lm.models`` itself (the same module object, so patches and isinstance checks
behave). ``epr.encoder`` and ``epr.truthfulqa`` are packages now; their old top-level names (``DualEncoder``,
``load_tqa``, ...) resolve through the package's ``__getattr__`` (``old_attribute``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "models": "lm.models",
    "cpu_linear": "lm.cpu_linear",
    "fastlm": "lm.fastlm",
    "scoring": "lm.scoring",
    "prefix_scoring": "lm.scoring",
    "decode": "lm.decode",
    "generate": "lm.generate",
    "score_cache": "lm.score_cache",
    "served": "lm.served",
    "llamacpp_server": "lm.llamacpp_server",
    "bm25": "retrieval.bm25",
    "index": "retrieval.index",
    "retrievers": "retrieval.retrievers",
    "rerank": "retrieval.ragsys",
    "prompts": "retrieval.prompt_budget",
    "loss": "encoder.losses",
    "train": "encoder.train",
    "train_checkpoints": "encoder.checkpoints",
    "train_data": "encoder.data",
    "train_eval": "encoder.dev_metric",
    "truthfulqa_stats": "truthfulqa.stats",
    "truthfulqa_findings": "truthfulqa.findings",
    "truthfulqa_cli": "cli.truthfulqa",
    "truthfulqa.cli": "cli.truthfulqa",
    "inspect_cmd": "cli.inspect",
    "stages.truthfulqa": "truthfulqa.stage",
    "stages.truthfulqa_report": "truthfulqa.report",
    "evaluation": "reports.stats",
    "report": "reports.tables",
    "machine": "reports.machine",
    "config_names": "config.names",
    "config_server": "config.server",
    "config_sections": "config.sections",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"epr.{old} moved to epr.{new}; the old path goes in the next release", DeprecationWarning, 3
    )


class _Alias(importlib.abc.Loader):
    def __init__(self, old: str, new: str, target):
        self.old, self.new, self.target = old, new, target  # target: the new module's spec

    def create_module(self, spec):
        _warn(self.old, self.new)
        return importlib.import_module(f"epr.{self.new}")

    def exec_module(self, module) -> None:  # already executed under its new name
        sys.modules[f"epr.{self.old}"] = module

    def get_code(self, fullname):  # ``python -m epr.<old>`` runs the new module's code as __main__
        _warn(self.old, self.new)
        return self.target.loader.get_code(self.target.name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("epr.") or fullname[4:] not in MOVED:
            return None
        old = fullname[4:]
        # the new module's spec; its origin is what python -m sets as sys.argv[0] and __file__
        new_spec = importlib.util.find_spec(f"epr.{MOVED[old]}")
        return importlib.util.spec_from_loader(
            fullname, _Alias(old, MOVED[old], new_spec), origin=new_spec.origin
        )


def install() -> None:
    # first, so an old path always means its new module: a leftover old file elsewhere on the path (the checkout
    # an editable install points at, when this is another worktree) cannot shadow the move
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def old_attribute(package: str, new_module: str, name: str):
    """``epr.encoder.DualEncoder`` (old module ``epr/encoder.py``) -> ``epr.encoder.model.DualEncoder``."""
    if name.startswith("__"):
        raise AttributeError(name)
    mod = importlib.import_module(f"epr.{package}.{new_module}")
    if not hasattr(mod, name):
        raise AttributeError(f"module 'epr.{package}' has no attribute {name!r}")
    _warn(f"{package}.{name}", f"{package}.{new_module}.{name}")
    return getattr(mod, name)
