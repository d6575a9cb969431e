"""The README and docs/ say what runs: every fenced code block is checked without running anything heavy.

- ``bash`` / ``sh`` / ``shell`` / ``console`` blocks: every command is recognised and checked. ``epr ...`` parses
  with the real CLI parser (``epr.cli.build_parser``; ``epr serve`` with its own flags) and its ``-c`` / ``--set``
  load as a config; ``python scripts/X.py`` / ``python -m benchmarks.X`` / ``training/train_epr.py`` (also under
  ``accelerate launch`` or ``torchrun``) name a file that exists, with flags its argparse parser declares (read from
  the source, not executed); ``make X`` names a Makefile target; ``pip install "epr[x]"`` names an extra; a
  ``cat > file <<'EOF'`` here-document writes a file the later lines and blocks of its document may use.
- ``yaml`` blocks load as a config (on top of the demo config).
- ``python`` blocks compile; those another test runs as written are listed in ``RUN_ELSEWHERE``.
- Any other block, or one that cannot be checked, carries a marker on the line before its fence:
  ``<!-- not-tested: why -->`` (skipped) or, for Python, ``<!-- compile-only: why -->``. An unmarked block that is
  not checked fails.

Beside the blocks: every repository path the text names (``configs/...``, ``results/...``, ``epr/...``) exists, so
does every ``epr.x.y`` module, and every relative link (and its ``#anchor``) resolves.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Blocks another test runs as written: (document, a line the block holds) -> (test file name, test function).
RUN_ELSEWHERE = {
    ("README.md", "from epr.integrations.langchain import few_shot_prompt"): (
        "test_langchain.py",
        "test_readme_snippet_runs",
    ),
    ("docs/serving.md", "# dspy"): ("test_dspy.py", "test_readme_dspy_snippet_runs"),
    ("docs/serving.md", "# configs/served.yaml"): (
        "test_served_llamacpp.py",
        "test_a_dying_server_gives_a_clear_error_and_the_run_resumes",
    ),
}
# Paths the docs name that are not committed: a documented command writes them, or the reader does.
WRITTEN_BY_COMMANDS = {"configs/mydata.yaml", "configs/mytask.yaml", "results/mtop-curve-locked"}
SHELLS = {"bash", "sh", "shell", "console"}
MARKER = re.compile(r"<!--\s*(not-tested|compile-only)\s*:\s*(\S.*?)\s*-->")


@dataclass
class Block:
    doc: str  # relative to ROOT
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # "not-tested" | "compile-only" | None

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def split_fences(text: str) -> tuple[list[tuple[int, str, str, str | None]], str]:
    """(line, lang, body, marker) of each fenced block, and the text outside the blocks."""
    lines = text.splitlines()
    out, prose = [], []
    i = 0
    while i < len(lines):
        m = re.match(r"^(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        before = [x for x in lines[:start] if x.strip()]
        mk = MARKER.search(before[-1]) if before else None
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"unclosed code fence at line {start + 1}"
        i += 1
        out.append((start + 1, lang, "\n".join(body) + "\n", mk.group(1) if mk else None))
    return out, "\n".join(prose)


def blocks() -> list[Block]:
    return [
        Block(rel(d), line, lang, body, mk)
        for d in DOCS
        for line, lang, body, mk in split_fences(d.read_text(encoding="utf-8"))[0]
    ]


ALL = blocks()


def ids(b: Block) -> str:
    return b.where


# ---- what the commands name ----------------------------------------------------------------------------------


@cache
def epr_parser():
    from epr.cli import build_parser

    return build_parser()


def module_file(dotted: str) -> Path | None:
    p = ROOT.joinpath(*dotted.split("."))
    for cand in (p.with_suffix(".py"), p / "__main__.py"):
        if cand.is_file():
            return cand
    return None


@cache
def declared_flags(path: Path) -> frozenset[str] | None:
    """The option strings a script's argparse calls declare (read from its source); None: it has no argparse."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    flags = set()
    uses_argparse = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("ArgumentParser", "add_argument", "add_parser"):
                uses_argparse = True
            if node.func.attr == "add_argument":
                for a in node.args:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-"):
                        flags.add(a.value)
    if not uses_argparse:
        return None
    return frozenset({*flags, "-h", "--help"})


def runs_main_of(script: Path) -> Path:
    """A script that only runs an epr module's ``main`` (``from epr.x.y import main``): that module's file, whose
    parser the script's options are; else the script itself."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    for node in tree.body:
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("epr.")
            and any(a.name == "main" for a in node.names)
        ):
            return ROOT / (node.module.replace(".", "/") + ".py")
    return script


def check_flags(script: Path, args: list[str]) -> None:
    script = runs_main_of(script)
    flags = declared_flags(script)
    given = [a.split("=", 1)[0] for a in args if a.startswith("-") and a != "-" and not re.match(r"-\d", a)]
    if flags is None:
        assert not given, f"{rel(script)} takes no options (no argparse), got {given}"
        return
    unknown = [g for g in given if g not in flags]
    assert not unknown, f"{rel(script)} does not declare {unknown}; it declares {sorted(flags)}"


def config_path(name: str, created: dict[str, Path]) -> Path:
    if name in created:
        return created[name]
    p = ROOT / name
    assert p.is_file(), f"config {name} does not exist"
    return p


def load_cfg(files: list[str], sets: list[str], created: dict[str, Path]):
    from epr.config import load_config

    return load_config([config_path(f, created) for f in files], sets)


def check_epr(argv: list[str], created: dict[str, Path]) -> None:
    from epr.cli.tools import TOOLS

    if argv[:1] == ["serve"]:  # its own parser (llama.cpp's server)
        check_flags(ROOT / "epr" / "cli" / "serve.py", argv[1:])
        return
    if argv[:2] == ["experiment", "curve"]:  # its own parser (the learning curve)
        check_flags(ROOT / "epr" / "cli" / "curve.py", argv[2:])
        return
    if argv[:1] == ["experiment"] and argv[1:2] and argv[1] in TOOLS:  # the results tools' own parsers
        check_flags(ROOT / "epr" / "cli" / "tools.py", argv[2:])
        return
    if argv[:2] == ["truthfulqa", "findings"]:
        check_flags(ROOT / "epr" / "cli" / "truthfulqa.py", argv[2:])
        return
    if argv[:1] == ["stage"]:  # epr stage NAME ... is epr NAME ... (epr/cli/app.py)
        argv = argv[1:]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = epr_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"`epr {shlex.join(argv)}` does not parse: {err.getvalue().strip()}") from None
    if args.cmd == "experiment":  # reads results folders, no config
        return
    if args.cmd == "config":
        files = [*args.config, *args.files]
    elif args.cmd == "truthfulqa":
        files = args.config or ["configs/truthfulqa.yaml"]
    elif args.cmd in ("demo", "inspect", "export"):
        files = args.config or ["configs/demo.yaml"]
    else:
        files = args.config
    load_cfg(files, args.set, created)


def check_python(argv: list[str], created: dict[str, Path]) -> None:
    """``argv`` after ``python`` (or after a launcher's own options)."""
    if argv[:1] == ["-m"]:
        mod, rest = argv[1], argv[2:]
        if mod == "epr.cli":
            return check_epr(rest, created)
        if mod == "pytest":
            for a in rest:
                if a.startswith("tests"):
                    assert (ROOT / a.split("::")[0]).exists(), f"pytest path {a} does not exist"
            return
        path = module_file(mod)
        assert path is not None, f"python -m {mod}: no such module in the repository"
    else:
        assert argv and argv[0].endswith(".py"), (
            f"python {shlex.join(argv)}: expected -m MODULE or a .py file"
        )
        path, rest = ROOT / argv[0], argv[1:]
        assert path.is_file(), f"{argv[0]} does not exist"
    check_flags(path, rest)
    if rel(path) == "training/train_epr.py":  # the encoder stage: its -c / --set load as a config
        files = [rest[i + 1] for i, a in enumerate(rest) if a in ("-c", "--config")]
        sets = [rest[i + 1] for i, a in enumerate(rest) if a == "--set"]
        load_cfg(files, sets, created)


def launched(argv: list[str]) -> list[str]:
    """What `accelerate launch ...` / `torchrun ...` run: from `-m MODULE` or the first .py file on."""
    for i, a in enumerate(argv):
        if a == "-m" or a.endswith(".py"):
            return argv[i:]
    raise AssertionError(f"no script or -m MODULE in {shlex.join(argv)}")


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


@cache
def extras() -> frozenset[str]:
    """The keys of pyproject.toml's [project.optional-dependencies] (read as text: tomllib needs Python 3.11)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return frozenset(re.findall(r"^([A-Za-z0-9_-]+)\s*=", section, re.M))


def check_pip(argv: list[str]) -> None:
    assert argv[:1] == ["install"], f"pip {shlex.join(argv)}: only `pip install` is documented"
    for a in argv[1:]:
        m = re.fullmatch(r"(?:epr|\.)\[([\w,-]+)\]", a)
        if m:
            missing = set(m.group(1).split(",")) - extras()
            assert not missing, f"pip install {a}: no extra(s) {sorted(missing)} in pyproject.toml"


def tokens(line: str) -> list[list[str]]:
    """The simple commands of one shell line: split on ; && || | &, redirections dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    cmds, cur, skip = [], [], False
    for t in lex:
        if skip:
            skip = False
        elif t in (";", "&&", "||", "|", "&"):
            cmds.append(cur)
            cur = []
        elif t in (">", ">>", "<", "2>", "2>&1"):
            skip = True
        else:
            cur.append(t)
    cmds.append(cur)
    return [c for c in cmds if c]


def check_command(argv: list[str], created: dict[str, Path]) -> None:
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # VAR=value prefixes
        argv = argv[1:]
    if not argv:
        return
    cmd, rest = argv[0], argv[1:]
    if cmd == "epr":
        check_epr(rest, created)
    elif cmd in ("python", "python3"):
        check_python(rest, created)
    elif cmd == "accelerate":
        assert rest[:1] == ["launch"], f"accelerate {shlex.join(rest)}"
        check_python(launched(rest[1:]), created)
    elif cmd == "torchrun":
        check_python(launched(rest), created)
    elif cmd == "make":
        for t in (a for a in rest if "=" not in a and not a.startswith("-")):
            assert t in make_targets(), f"make {t}: no such target in the Makefile ({sorted(make_targets())})"
    elif cmd == "pip":
        check_pip(rest)
    elif cmd.endswith(".sh"):
        p = ROOT / cmd
        assert p.is_file() and p.stat().st_mode & 0o111, f"{cmd} is not an executable file"
    else:
        raise AssertionError(
            f"unchecked command {cmd!r}: teach tests/test_docs.py, or mark the block not-tested"
        )


def shell_lines(block: Block) -> list[str]:
    out = []
    for raw in block.text.splitlines():
        if block.lang == "console":
            if not raw.startswith("$ "):
                continue  # output
            raw = raw[2:]
        out.append(raw)
    return out


def check_shell(block: Block, tmp: Path, created: dict[str, Path], commands: bool = True) -> int:
    """Check the block's commands (``commands``) and record the files its here-documents write in ``created``."""
    lines = shell_lines(block)
    n = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i]
            i += 1
        heredoc = re.match(r"^(.*?)<<-?\s*(['\"]?)(\w+)\2\s*$", line)
        if heredoc:
            body = []
            while i < len(lines) and lines[i].strip() != heredoc.group(3):
                body.append(lines[i])
                i += 1
            i += 1
            m = re.fullmatch(r"\s*cat\s*>\s*(\S+)\s*", heredoc.group(1))
            assert m, f"{block.where}: a here-document is only checked as `cat > FILE <<'EOF'`"
            name = m.group(1)
            data = yaml.safe_load("\n".join(body)) if name.endswith((".yaml", ".yml")) else None
            if isinstance(data, dict) and "inherit" in data:  # resolved where the file would be
                data["inherit"] = str((ROOT / name).parent / data["inherit"])
            path = tmp / f"heredoc{len(created)}-{Path(name).name}"
            path.write_text(yaml.safe_dump(data) if data is not None else "\n".join(body), encoding="utf-8")
            created[name] = path
            n += 1
            continue
        for argv in tokens(line) if commands else []:
            try:
                check_command(argv, created)
            except Exception as e:  # a failed check, or the config's own error (ConfigError names the key)
                raise AssertionError(f"{block.where}: `{line.strip()}`: {e}") from None
            n += 1
    return n


# ---- the blocks -----------------------------------------------------------------------------------------------


def test_docs_have_blocks():
    assert any(b.doc == "README.md" for b in ALL) and len({b.doc for b in ALL}) >= 5


@pytest.mark.parametrize("block", ALL, ids=ids)
def test_block(block: Block, tmp_path):
    if block.marker == "not-tested":
        return
    if block.lang in SHELLS:
        assert block.marker is None, f"{block.where}: compile-only is for Python; a shell block is checked"
        created: dict[str, Path] = {}  # a file a here-document wrote stays for the rest of its document
        for earlier in ALL:
            if earlier.doc == block.doc and earlier.line < block.line and earlier.lang in SHELLS:
                check_shell(earlier, tmp_path, created, commands=False)
        assert check_shell(block, tmp_path, created) > 0, f"{block.where}: no command in a shell block"
    elif block.lang == "yaml":
        assert block.marker is None, f"{block.where}: mark a YAML block that is not a config not-tested"
        data = yaml.safe_load(block.text)
        assert isinstance(data, dict), f"{block.where}: a YAML config is a mapping"
        cfg = tmp_path / "block.yaml"
        cfg.write_text(block.text, encoding="utf-8")
        load_cfg(["configs/demo.yaml", "block.yaml"], [], {"block.yaml": cfg})
    elif block.lang == "python":
        compile(block.text, block.where, "exec")
        if block.marker != "compile-only":
            assert any(doc == block.doc and key in block.text.splitlines() for doc, key in RUN_ELSEWHERE), (
                f"{block.where}: a Python block another test does not run: list it in RUN_ELSEWHERE or mark it compile-only"
            )
    else:
        pytest.fail(
            f"{block.where}: a ```{block.lang} block that nothing checks: mark it <!-- not-tested: why -->"
        )


@pytest.mark.parametrize("key", sorted(RUN_ELSEWHERE), ids=lambda k: f"{k[0]}:{k[1]}")
def test_blocks_run_elsewhere_exist_and_their_tests_read_them(key):
    doc, line = key
    found = [b for b in ALL if b.doc == doc and line in b.text.splitlines()]
    assert len(found) == 1, f"{doc}: {len(found)} blocks hold the line {line!r}, expected 1"
    test_file, test_name = RUN_ELSEWHERE[key]
    files = list((ROOT / "tests").glob(f"**/{test_file}"))
    assert len(files) == 1, f"tests/**/{test_file}: {files}"
    src = files[0].read_text(encoding="utf-8")
    assert f"def {test_name}(" in src, f"{rel(files[0])} has no {test_name}"
    assert Path(doc).name in src, f"{rel(files[0])} does not read {doc}"


# ---- paths, modules and links in the text ---------------------------------------------------------------------

TOP = "configs|results|benchmarks|scripts|training|docs|ragsys"
PATH = re.compile(rf"(?<![\w./-])((?:{TOP}|epr|tests)/[\w./*@-]*\w/?|(?:{TOP}|epr|tests)/)(?![\w-])")
MODULE = re.compile(r"(?<![\w./-])(epr(?:\.[A-Za-z_]\w*)+)")


def doc_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in PATH.finditer(text)}


def path_exists(p: str) -> bool:
    if p.rstrip("/") in WRITTEN_BY_COMMANDS:
        return True
    if "*" in p:
        return any(ROOT.glob(p))
    return (ROOT / p).exists()


def is_module_path(p: str) -> bool:
    return p.startswith(("epr/", "tests/"))


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_named_paths_exist(doc):
    missing = sorted(p for p in named_paths(doc_text(doc)) if not is_module_path(p) and not path_exists(p))
    assert not missing, f"{rel(doc)} names paths that do not exist: {missing}"


def module_exists(dotted: str) -> bool:
    """``epr.a.b.attr``: each part a package or a module until a module (or a package's attribute) is reached."""
    parts = dotted.split(".")
    here = ROOT / parts[0]
    for part in parts[1:]:
        if (here / part).is_dir():
            here = here / part
        elif (here / f"{part}.py").is_file():
            return True
        else:  # an attribute of the package itself
            init = here / "__init__.py"
            return (
                init.is_file()
                and re.search(rf"\b{re.escape(part)}\b", init.read_text(encoding="utf-8")) is not None
            )
    return True


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_named_modules_exist(doc):
    """``epr/...`` and ``tests/...`` paths and ``epr.x.y`` modules: the package layout the docs describe."""
    text = doc_text(doc)
    missing = sorted(p for p in named_paths(text) if is_module_path(p) and not path_exists(p))
    missing += sorted({m for m in MODULE.findall(text) if not module_exists(m)})
    assert not missing, f"{rel(doc)} names modules that do not exist: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    _, prose = split_fences(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", prose, re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return frozenset(out)


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_links_resolve(doc):
    _, prose = split_fences(doc_text(doc))
    bad = []
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            bad.append(f"{target} (no file {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not bad, f"{rel(doc)}: links that do not resolve: {bad}"


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= 140, f"README.md has {n} lines; move details into docs/"
