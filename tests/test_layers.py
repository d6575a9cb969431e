"""The house's rules, checked over the source (``ast``, imports inside functions included): the library never
imports the pipeline or the faces, no module imports a higher layer, there are no import cycles, and no module
grows past what one person holds in mind."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "epr"

# Lower rank = lower layer. A module may import its own rank or lower, never higher. Longest prefix wins.
RANKS = {
    "epr": 0,  # the package root, types, config, artifacts: the ground
    "epr._moved": 0,
    "epr.types": 0,
    "epr.config": 0,
    "epr.artifacts": 0,
    "epr.cache": 0,
    "epr.lm": 1,  # the library, bottom up
    "epr.encoder": 2,
    "epr.retrieval": 3,
    "epr.reports": 4,
    "epr.truthfulqa": 5,
    "epr.tasks": 6,
    "epr.context": 7,  # orchestration
    "epr.pipeline": 7,
    "epr.stages": 7,
    "epr.experiments": 7,  # the results folders: declarations, recomputation, the index
    "epr.api": 8,  # the faces
    "epr.shipping": 8,
    "epr.model_card": 8,
    "epr.cli": 8,
    "epr.inspect_cmd": 8,
    "epr.integrations": 8,
    "epr.truthfulqa.cli": 8,
}
MAX_LINES = 400


def modules(root: Path = PKG) -> dict[str, Path]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        name = ".".join(p.relative_to(root.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The epr modules ``name`` imports (at module level or inside functions), resolved to modules."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        for t in targets:
            while t not in mods and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in mods and t != name and t.startswith("epr"):
                found.add(t)
    return found


def rank(name: str) -> int:
    best = max((p for p in RANKS if name == p or name.startswith(p + ".")), key=len)
    return RANKS[best]


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    return {n: imports(n, p, mods) for n, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def upward(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in g.items() for b in deps if rank(b) > rank(a))


def test_no_import_runs_up_a_layer_and_there_are_no_cycles():
    g = graph(modules())
    assert len(g) > 40  # the walk found the package
    assert upward(g) == []
    assert cycles(g) == []


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Negative controls: a library module that imports the pipeline, and two modules that import each other."""
    pkg = tmp_path / "epr"
    (pkg / "lm").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "lm" / "__init__.py").write_text("")
    (pkg / "lm" / "scoring.py").write_text("def f():\n    from epr.pipeline import run\n")
    (pkg / "pipeline.py").write_text("from epr.lm import scoring\n")
    (pkg / "api.py").write_text("from . import shipping\n")
    (pkg / "shipping.py").write_text("def g():\n    from epr.api import X\n")
    g = graph(modules(pkg))
    assert upward(g) == ["epr.lm.scoring -> epr.pipeline"]
    assert sorted(cycles(g)) == [["epr.api", "epr.shipping"], ["epr.lm.scoring", "epr.pipeline"]]


def test_every_module_is_placed_in_a_layer():
    for name in modules():
        assert any(name == p or name.startswith(p + ".") for p in RANKS), f"{name}: add it to RANKS"


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_grows_past_what_one_person_holds_in_mind(name):
    n = len(modules()[name].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{name}: {n} lines (> {MAX_LINES}): split it by concern"


def test_old_module_paths_still_import_for_one_release_with_a_warning():
    """``epr.models``, ``epr.train``, ... (before the packages) are the moved modules themselves, with a
    DeprecationWarning; ``epr.encoder`` / ``epr.truthfulqa`` (once modules, now packages) still give their old
    names."""
    import importlib
    import sys
    import warnings

    from epr._moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(f"epr.{old}", None)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            mod = importlib.import_module(f"epr.{old}")
        assert mod is importlib.import_module(f"epr.{new}"), old
        assert any(
            issubclass(x.category, DeprecationWarning) and f"epr.{new}" in str(x.message) for x in w
        ), old
    with pytest.warns(DeprecationWarning, match="epr.encoder.model.DualEncoder"):
        from epr.encoder import DualEncoder
    from epr.encoder.model import DualEncoder as new

    assert DualEncoder is new
    with pytest.warns(DeprecationWarning, match="epr.truthfulqa.sets.load_tqa"):
        from epr.truthfulqa import load_tqa  # noqa: F401
    with pytest.raises(ImportError):
        from epr.encoder import NoSuchName  # noqa: F401


def test_old_module_paths_still_run_with_python_m():
    """``python -m epr.truthfulqa_findings`` (the command older results name) runs the moved module as __main__,
    with the warning; before the loader had ``get_code`` it died in runpy with an AttributeError."""
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "epr.truthfulqa_findings", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "findings across LMs" in p.stdout and "moved to epr.truthfulqa.findings" in p.stderr
