"""The house's rules, checked over the source (``ast``, imports inside functions included): the library never
imports the pipeline or the faces, no module imports a higher layer, there are no import cycles between modules
nor between packages, every module is placed in a layer on purpose, and no module grows past what one person
holds in mind. ``scripts/``, ``benchmarks/`` and ``training/`` are the layer above the faces: they may import
anything in ``epr``, nothing in ``epr`` imports them, and they never edit ``sys.path``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "epr"

# Lower rank = lower layer. A module may import its own rank or lower, never higher. A rank per top-level module
# or package (a module takes its package's rank: no face hides inside a library package); the bare root ``epr``
# places only ``epr/__init__.py``, so a new module is placed here on purpose or fails.
RANKS = {
    "epr": 0,  # the package root itself; types, config, artifacts, the cache rule, the run lock: the ground
    "epr.types": 0,
    "epr.config": 0,
    "epr.artifacts": 0,
    "epr.cache": 0,
    "epr.run_lock": 0,
    "epr.prompt": 0,  # the one prompt renderer (a task's own format, the prompt section, chat templates)
    "epr.lm": 1,  # the library, bottom up
    "epr.encoder": 2,
    "epr.reward": 2,  # the reward model (a cross-encoder trained like the dual encoder, on the same labels)
    "epr.retrieval": 3,
    "epr.reports": 4,
    "epr.tasks": 5,  # each dataset's quirks (and the TruthfulQA prompt format the evaluation shares)
    "epr.truthfulqa": 6,
    "epr.context": 7,  # orchestration
    "epr.pipeline": 7,
    "epr.stages": 7,
    "epr.experiments": 7,  # the results folders: declarations, recomputation, the index
    "epr.api": 8,  # the faces
    "epr.shipping": 8,
    "epr.model_card": 8,
    "epr.cli": 8,  # the epr command: epr.cli.inspect, epr.cli.truthfulqa
    "epr.integrations": 8,
}
TOP_LAYER = ("scripts", "benchmarks", "training")  # above the faces; run from the repository root
MAX_LINES = 400
MAX_TOP_MODULES = 11  # files directly in epr/ (__init__ included): the rest lives in packages


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


def placed_by(name: str) -> str | None:
    """The RANKS entry that places ``name``: itself or its package (the bare ``epr`` only itself)."""
    hits = [p for p in RANKS if name == p or (p != "epr" and name.startswith(p + "."))]
    return max(hits, key=len) if hits else None


def rank(name: str) -> int:
    p = placed_by(name)
    if p is None:
        raise LookupError(f"{name}: in no layer; add it (or its package) to RANKS")
    return RANKS[p]


def unplaced(mods) -> list[str]:
    return sorted(n for n in mods if placed_by(n) is None)


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    return {n: imports(n, p, mods) for n, p in mods.items()}


def package(name: str) -> str:
    """``epr.stages.retrieve`` -> ``epr.stages``; a top-level module (and the root ``epr``) is its own node."""
    return ".".join(name.split(".")[:2])


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to packages (imports inside a package dropped)."""
    out: dict[str, set[str]] = {package(n): set() for n in g}
    for a, deps in g.items():
        out[package(a)] |= {package(b) for b in deps if package(b) != package(a)}
    return out


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


def sys_path_edits(path: Path) -> list[int]:
    """The lines of a file that touch ``sys.path`` (``sys.path.insert``, ``sys.path[:0] = ...``, ``from sys import
    path``): a script that needs them imports another checkout's code than it says."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and getattr(node.value, "id", None) == "sys"
        ):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "sys"
            and any(a.name == "path" for a in node.names)
        ):
            lines.append(node.lineno)
    return sorted(lines)


def top_layer_imports(path: Path) -> set[str]:
    """The ``scripts`` / ``benchmarks`` / ``training`` modules a file imports (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        found |= {n for n in names if n.split(".")[0] in TOP_LAYER}
    return found


def top_layer_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in TOP_LAYER for p in (root / d).rglob("*.py"))


def test_no_import_runs_up_a_layer_and_there_are_no_cycles():
    g = graph(modules())
    assert len(g) > 40  # the walk found the package
    assert upward(g) == []
    assert cycles(g) == []


def test_no_cycles_between_packages():
    """Collapsed to packages (``epr.stages.retrieve`` -> ``epr.stages``) the graph is a DAG too: a cycle of
    packages (context -> tasks -> truthfulqa -> pipeline -> stages -> context, once) is one layer in pieces."""
    pg = package_graph(graph(modules()))
    assert len(pg) > 15
    assert cycles(pg) == []


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


def test_the_package_check_catches_a_cycle_no_module_closes(tmp_path):
    """Negative control: stages.a -> context -> tasks.b -> stages.c is no module cycle, but a package cycle."""
    pkg = tmp_path / "epr"
    for d in ("stages", "tasks"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "stages" / "a.py").write_text("from epr.context import Context\n")
    (pkg / "context.py").write_text("def task():\n    from epr.tasks.b import get_task\n")
    (pkg / "tasks" / "b.py").write_text("from epr.stages import c\n")
    (pkg / "stages" / "c.py").write_text("")
    g = graph(modules(pkg))
    assert cycles(g) == []
    assert cycles(package_graph(g)) == [["epr.context", "epr.stages", "epr.tasks"]]


def test_every_module_is_placed_in_a_layer():
    assert unplaced(modules()) == [], "add each to RANKS (or its package)"
    assert all(p.count(".") <= 1 for p in RANKS), "a rank per top-level module or package, not per submodule"


def test_the_placement_check_catches_a_new_module(tmp_path):
    """Negative control: the root ``epr`` places only itself, so a new top-level module or a module of a new
    package is in no layer; a new module of a placed package takes the package's rank."""
    pkg = tmp_path / "epr"
    (pkg / "foo").mkdir(parents=True)
    (pkg / "lm").mkdir()
    for f in ("__init__.py", "newthing.py", "foo/bar.py", "lm/__init__.py", "lm/newer.py"):
        (pkg / f).write_text("")
    mods = modules(pkg)
    assert unplaced(mods) == ["epr.foo.bar", "epr.newthing"]
    assert rank("epr") == 0 and rank("epr.lm.newer") == RANKS["epr.lm"]
    with pytest.raises(LookupError, match="epr.newthing"):
        rank("epr.newthing")


def test_the_package_root_stays_small():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, (
        f"{len(top)} modules directly in epr/ ({top}): group them in a package"
    )


def test_the_top_layer_is_on_top_and_leaves_sys_path_alone():
    """``scripts/``, ``benchmarks/``, ``training/`` may import all of ``epr``; ``epr`` never imports them; they run
    as ``python -m scripts.x`` / ``python -m benchmarks.x`` from the repository root or against the installed
    package, never by editing ``sys.path`` (which imports another checkout's code than the one you stand in)."""
    files = top_layer_files()
    assert len(files) > 20  # the walk found them
    edits = {str(p.relative_to(ROOT)): sys_path_edits(p) for p in files}
    assert {k: v for k, v in edits.items() if v} == {}
    assert {n: top_layer_imports(p) for n, p in modules().items() if top_layer_imports(p)} == {}


def test_the_top_layer_checks_catch_what_they_are_for(tmp_path):
    """Negative controls: a script that inserts its checkout into ``sys.path``, one that assigns it, and a library
    module that imports a benchmark."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "a.py").write_text("import sys\nsys.path.insert(0, '..')\nimport epr\n")
    (tmp_path / "scripts" / "b.py").write_text("import sys\n\n\ndef f():\n    sys.path[:0] = ['.']\n")
    (tmp_path / "scripts" / "c.py").write_text("from sys import path\n")
    (tmp_path / "scripts" / "ok.py").write_text("import sys\nfrom epr.cli import main\nsys.exit(main())\n")
    found = {p.name: sys_path_edits(p) for p in top_layer_files(tmp_path)}
    assert found == {"a.py": [2], "b.py": [5], "c.py": [1], "ok.py": []}
    lib = tmp_path / "lib.py"
    lib.write_text("def f():\n    from benchmarks.common import save\n    import scripts.x, os\n")
    assert top_layer_imports(lib) == {"benchmarks.common", "scripts.x"}


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_grows_past_what_one_person_holds_in_mind(name):
    n = len(modules()[name].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{name}: {n} lines (> {MAX_LINES}): split it by concern"


def test_no_deprecation_shim_is_left():
    """Issue 76: the package is unreleased (0.1.0), so the old module paths (``epr.models``, ``epr.train``, ...) and
    the old top-level names of ``epr.encoder`` / ``epr.truthfulqa`` are gone, not aliased; nothing in the package
    says "moved" or warns of a deprecation."""
    import importlib

    for old in ("epr.models", "epr.train", "epr.truthfulqa_findings", "epr._moved"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    with pytest.raises(ImportError):
        from epr.encoder import DualEncoder  # noqa: F401
    said = [n for n, p in modules().items() if "DeprecationWarning" in p.read_text(encoding="utf-8")]
    assert said == []


MAX_INIT_LINES = 60  # an __init__.py says what its package holds; the code lives in named modules
FACES = RANKS["epr.api"]  # the rank of the faces: only they parse a command line


def parses_a_command_line(path: Path) -> bool:
    """Whether a file imports ``argparse`` (at module level or inside a function)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "argparse":
            return True
    return False


def library_parsers(mods: dict[str, Path]) -> list[str]:
    return sorted(n for n, p in mods.items() if rank(n) < FACES and parses_a_command_line(p))


def big_inits(root: Path = PKG) -> list[str]:
    return sorted(
        f"{p.relative_to(root.parent)}: {n}"
        for p in root.rglob("__init__.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_INIT_LINES
    )


def shims(root: Path = ROOT) -> list[str]:
    """Top-layer files that only forward to another path (a moved script kept for old commands)."""
    out = []
    for p in top_layer_files(root):
        doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or ""
        if (
            doc.lower().startswith(("moved to", "the learning curve's former name"))
            or "this path keeps" in doc
        ):
            out.append(str(p.relative_to(root)))
    return sorted(out)


def test_only_the_faces_parse_a_command_line():
    """Issue 76: a library module takes explicit parameters; its options live in ``epr.cli`` (``epr experiment
    curve``, ``compare-rows``, ``epr serve``, ``epr truthfulqa findings``, ...)."""
    assert library_parsers(modules()) == []


def test_no_package_hides_its_code_in_init_and_no_script_is_a_shim():
    assert big_inits() == []
    assert shims() == []


@pytest.mark.parametrize("path", top_layer_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_top_layer_stays_under_the_cap_too(path):
    n = len(path.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)}: {n} lines (> {MAX_LINES}): split it by concern"


def test_the_new_rules_catch_what_they_are_for(tmp_path):
    """Negative controls: a library module with a parser (inside a function), a big ``__init__.py``, a shim."""
    pkg = tmp_path / "epr"
    (pkg / "lm").mkdir(parents=True)
    (pkg / "cli").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "lm" / "__init__.py").write_text("\n" * (MAX_INIT_LINES + 1))
    (pkg / "lm" / "tool.py").write_text("def main():\n    from argparse import ArgumentParser\n")
    (pkg / "cli" / "__init__.py").write_text("import argparse\n")
    assert library_parsers(modules(pkg)) == ["epr.lm.tool"]
    assert big_inits(pkg) == [f"epr/lm/__init__.py: {MAX_INIT_LINES + 1}"]
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "old.py").write_text('"""Moved to ``epr.x``; this path keeps old commands."""\n')
    (tmp_path / "scripts" / "new.py").write_text('"""A real script."""\n')
    assert shims(tmp_path) == ["scripts/old.py"]


MAX_FUNCTION_LINES = 80
LONG_FUNCTIONS = {  # the functions allowed past MAX_FUNCTION_LINES, each with its reason (issue 76: at most 5)
    "epr/encoder/train.py:train": "the training loop: resume, epochs, steps, checkpoints and best-epoch keeping "
    "share its state (accelerator, optimiser, scheduler); split once the reward model's trainer shares it",
    "epr/reports/curve.py:write_curve": "one Markdown page written top to bottom (tables, notes, the figure)",
    "epr/reports/tables.py:comparison_table": "one table's columns and its notes, in reading order",
    "epr/stages/scores.py:run_scores": "the scoring stage's resumable chunk loop and its manifest",
    "epr/tasks/rows.py:read_table": "every malformed-row message of a user's file, in the order rows are read",
}


def long_functions(root: Path = PKG) -> dict[str, int]:
    out = {}
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out[f"{p.relative_to(root.parent)}:{node.name}"] = n
    return out


def test_a_function_past_80_lines_says_why():
    found = long_functions()
    assert set(found) <= set(LONG_FUNCTIONS), {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert len(LONG_FUNCTIONS) <= 5
    stale = set(LONG_FUNCTIONS) - set(found)
    assert not stale, f"{stale}: now short; remove them from LONG_FUNCTIONS"


def test_the_function_length_check_catches_a_long_one(tmp_path):
    pkg = tmp_path / "epr"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "\n\ndef g():\n    return 1\n"
    )
    assert long_functions(pkg) == {"epr/m.py:f": MAX_FUNCTION_LINES + 1}
