"""Optional extras ([langchain], [dspy], [server]): their tests skip where the extra is not installed, except
under `make test` (CI), which installs every extra and sets EPR_REQUIRE_EXTRAS=1: there a missing one fails."""

import importlib
import os

import pytest


def need(module: str):
    if os.environ.get("EPR_REQUIRE_EXTRAS") == "1":
        return importlib.import_module(module)
    return pytest.importorskip(module)
