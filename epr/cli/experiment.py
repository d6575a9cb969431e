"""``epr experiment``: check, index, declare and run the results folders (``epr experiment --help``)."""

from __future__ import annotations

import argparse
import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path

from epr.types import InputError

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]  # the repository (epr/cli/experiment.py)
HELP = """Experiments as data: every results folder declares what it is (experiment.yaml).

    epr experiment check                      # every folder recomputed from its committed rows (CI runs this)
    epr experiment check results/mtop-curve-round2-locked
    epr experiment show results/mtop-8000-locked   # its rows, recomputed (a planned look: the runs recorded so far)
    epr experiment index                      # write results/README.md (decisive rows, the ledger of locked looks)
    epr experiment index --check              # fail if results/README.md is not what the folders say
    epr experiment ledger                     # the locked looks as git has them (and where a folder disagrees)
    epr experiment digest results/FOLDER      # pin every data file's sha256 in its experiment.yaml (record does)
    epr experiment declare results/NEW        # a draft experiment.yaml for a new folder
    epr experiment record runs/mtop results/NEW --part locked   # an epr run's evaluation as a folder
    epr experiment record runs/mtop-4000 results/NEW --as r4000  # a run as one side of a slices folder
    epr experiment run results/FOLDER         # rerun it from scratch into runs/rerun/FOLDER (resumable), then
                                              # compare the rerun's rows with the numbers the folder declares

The tools behind the folders, each with its own options (``epr experiment NAME --help``):

    epr experiment curve -c configs/mtop_curve.yaml   # a learning curve (results/mtop-curve/)
    epr experiment compare-rows A.json B.json          # two committed rows paired on the same examples
    epr experiment compare-labels LABELS_A LABELS_B    # two label sets of the same training examples
    epr experiment em-agreement GENERATED/rows GREEDY/rows   # exact match generated vs read off the gold pass
    epr experiment collect NAME                        # a finished run's comparison into results/NAME/
    epr experiment reselect RUN --retrievers epr,hybrid  # what select would serve among fewer modes (no LM call)
"""


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _history(results: Path, ledger: bool) -> int:
    """Print git's ledger (``ledger``) and every place a declaration disagrees with git; the number of such places
    (0 where there is no history to read: said, not failed)."""
    from epr.experiments import history

    try:
        h = history.read(results)
    except history.NoHistory as e:
        say(f"history: not checked ({e})")
        return 0
    exps = history.load_all(results)
    if ledger:
        for ds, lks in history.ledger(h, exps).items():
            commits = len({i for lk in lks for i in lk.reveals})
            say(f"{ds}: {len(lks)} looks, {commits} commits revealing locked rows")
            for k, lk in enumerate(lks, 1):
                more = ", ".join(f"{h.short(i)} {h.date(i)}" for i in lk.reveals[1:])
                pre = "no pre-registration" if lk.prereg is None else f"pre-registered {h.date(lk.prereg)}"
                say(f"  {k:2d} {h.date(lk.look)} {h.short(lk.look)} {lk.exp.name} ({pre})")
                if more:
                    say(f"       more rows: {more}")
                for i in lk.amendments:
                    say(f"       changed after the look: {h.short(i)} {h.date(i)}")
    bad = history.problems(h, exps)
    for p in bad:
        say(f"FAIL history: {p}")
    say(f"history: {'ok' if not bad else f'{len(bad)} disagreements'} ({len(h.commits)} commits read)")
    return len(bad)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "experiment",
        help="check, index, declare or rerun the results folders (epr experiment --help)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "action", choices=("check", "show", "index", "ledger", "digest", "declare", "run", "record")
    )
    p.add_argument("folders", nargs="*", type=Path, help="results folders (check: default every folder)")
    p.add_argument(
        "--results", type=Path, default=ROOT / "results", help="the results root (default: %(default)s)"
    )
    p.add_argument(
        "--check", action="store_true", help="index: compare instead of writing; exit 1 on a difference"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="declare: replace an existing experiment.yaml; record: record anew",
    )
    p.add_argument("--dry-run", action="store_true", help="run: print the commands, run nothing")
    p.add_argument(
        "--part",
        choices=("dev", "locked"),
        default=None,
        help="record: the compared part (locked; --as: dev)",
    )
    p.add_argument(
        "--as",
        dest="side",
        metavar="NAME",
        help="record: the run as side NAME of a slices folder (runs side by side: rows/per_query-NAME.jsonl.gz)",
    )
    p.add_argument(
        "--run-root", default="runs", help="run: where the rerun's runs live (default: %(default)s)"
    )
    p.add_argument(
        "--into", type=Path, help="run: the rerun's results folder (default: <run-root>/rerun/<folder>)"
    )
    p.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    # a folder named by its name alone is the one under --results (where it is not a folder here)
    args.folders = [f if f.exists() or f.is_absolute() or not (args.results / f).exists() else args.results / f
                    for f in args.folders]  # fmt: skip
    return ACTIONS[args.action](args)


def _check(args: argparse.Namespace) -> int:
    from epr.experiments import check as checking

    targets = args.folders or checking.folders(args.results)
    bad = 0
    for f in targets:
        try:
            problems = checking.check(f)
        except InputError as e:  # a declaration that does not load: this folder fails, the others are checked
            problems = [str(e)]
        bad += bool(problems)
        say(f"{'FAIL' if problems else 'ok  '} {f.name}")
        for p in problems:
            say(f"     {p}")
    say(f"{len(targets) - bad} of {len(targets)} folders recompute to what they declare")
    if not args.folders:  # the whole tree: its declarations against git's history too
        bad += _history(args.results, ledger=False)
    return 1 if bad else 0


def _digest(args: argparse.Namespace) -> int:
    from epr.experiments import digests

    if not args.folders:
        raise SystemExit(
            "epr experiment digest: give the results folders to pin (their files as they are now)"
        )
    for f in args.folders:
        say(f"pinned {len(digests.pinned(f))} files in {digests.write(f)}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from epr.experiments import check as checking

    if not args.folders:
        raise SystemExit("epr experiment show: give one or more results folders")
    for f in args.folders:
        for line in checking.show(f):
            say(line)
    return 0


def _index(args: argparse.Namespace) -> int:
    from epr.experiments import index

    text, readmes = index.build(args.results)
    if args.check:
        stale = [] if (args.results / "README.md").read_text() == text else ["README.md"]
        stale += [
            f"{n}/README.md"
            for n, t in readmes.items()
            if not (args.results / n / "README.md").exists()
            or (args.results / n / "README.md").read_text() != t
        ]
        for s in stale:
            say(f"stale: {args.results / s} (run: epr experiment index)")
        return 1 if stale else 0
    for p in index.write(args.results):
        say(f"wrote {p}")
    return 0


def _record(args: argparse.Namespace) -> int:
    from epr.experiments.record import record, record_side

    if len(args.folders) != 2:
        raise SystemExit("epr experiment record: give the run folder and the results folder")
    run_dir, folder = args.folders
    if args.side:
        decl = record_side(run_dir, folder, args.side, args.part or "dev", args.overwrite)
        say(f"wrote {decl}: its extra names the pairs and the gap; write its title, status and outcome")
    else:
        decl = record(run_dir, folder, args.part or "locked", args.overwrite)
        say(f"wrote {decl}: write its title, status and outcome")
    return 0


def _declare(args: argparse.Namespace) -> int:
    from epr.experiments import declare

    for f in args.folders:
        say(f"wrote {declare.write_draft(f, overwrite=args.overwrite)}: write its title, status and outcome")
    return 0


def _rerun(args: argparse.Namespace) -> int:
    """``epr experiment run FOLDER``: its declared commands, templates filled, into a rerun folder; then the
    rerun's rows against the numbers the folder declares, within their tolerances."""
    from epr.experiments import check as checking
    from epr.experiments import declaration

    if len(args.folders) != 1:
        raise SystemExit("epr experiment run: give one results folder")
    exp = declaration.load(args.folders[0])
    into = args.into or Path(args.run_root) / "rerun" / exp.name
    per_seed = [  # a command naming {seed} runs once per declared seed
        c.replace("{seed}", str(seed))
        for c in exp.commands
        for seed in (exp.seeds if "{seed}" in c else (None,))
    ]
    commands = [c for c in (rerun_command(c, into, args.run_root) for c in per_seed) if c]
    if not commands:
        raise SystemExit(
            f"epr experiment run: {exp.name} declares no command that makes it (kind {exp.kind})"
        )
    for argv in commands:
        say(f"$ {shlex.join(argv)}")
        if missing := [a for a in _named_files(argv) if not (ROOT / a).exists()]:
            raise InputError(
                f"epr experiment run: {exp.name}: the command names files this checkout lacks: {missing}"
            )
        if args.dry_run:
            continue
        done = subprocess.run(argv, cwd=ROOT)
        if done.returncode:
            say(
                f"epr experiment run: stopped (exit {done.returncode}); the same command resumes where it stopped"
            )
            return done.returncode
    if args.dry_run:
        return 0
    problems = checking.check(exp.folder, rows_from=into)
    for p in problems:
        say(p)
    say(f"{exp.name}: the rerun {'differs' if problems else 'reproduces every declared number'} ({into})")
    return 1 if problems else 0


ACTIONS = {
    "check": _check,
    "show": _show,
    "index": _index,
    "ledger": lambda args: 1 if _history(args.results, ledger=True) else 0,
    "digest": _digest,
    "declare": _declare,
    "run": _rerun,
    "record": _record,
}


CURVE = ("scripts/learning_curve.py", "scripts/mtop_curve.py")
FILES = (".py", ".yaml", ".json", ".json.gz", ".jsonl", ".jsonl.gz", ".sh")


def _named_files(argv: list[str]) -> list[str]:
    """The repository files a command names (relative paths with a file's suffix; ``k=v`` values included), which a
    rerun needs to find; paths under the run root or the rerun's folder are made by the run, not named here."""
    out = []
    for a in argv:
        a = a.split("=", 1)[-1]
        if a.endswith(FILES) and not Path(a).is_absolute() and not a.startswith(("-", "runs/")):
            out.append(a)
    return out


def rerun_command(command: str, into: Path, run_root: str) -> list[str] | None:
    """A declared command as a fresh rerun runs it (argv after ``python``): a learning curve writes into ``into``
    under ``run_root`` (never into the committed folder); a redraw (``--from-rows``) is left out, as the rerun's
    own rows are checked; ``epr ...`` runs this package's CLI."""
    fill = {"run_root": str(run_root), "out": str(into), "results": str(ROOT / "results")}  # {seed}: run()
    try:
        command = re.sub(r"\{([a-z_]+)\}", lambda m: fill[m.group(1)], command)
    except KeyError as e:
        raise InputError(f"{command!r}: unknown template {{{e.args[0]}}} (known: {sorted(fill)})") from None
    argv = shlex.split(command, comments=True)
    env = []
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):  # NAME=value before a shell script
        env.append(argv.pop(0))
    if argv[0] in ("sh", "bash"):
        return ["env", *env, *argv] if env else argv
    if env:
        raise InputError(f"{command!r}: environment assignments are for shell scripts (sh / bash) only")
    argv = _python(argv, into, run_root)
    return None if argv is None else [sys.executable, *argv]


def _python(argv: list[str], into: Path, run_root: str) -> list[str] | None:
    if argv[0] in ("python", "python3"):
        argv = argv[1:]
    if argv[0] == "epr":
        return ["-m", "epr.cli", *argv[1:]]
    from epr.cli.tools import TOOLS

    for name, (_, script) in TOOLS.items():  # a results tool by the script path older folders recorded
        if script and argv[0].endswith(script):
            return ["-m", "epr.cli", "experiment", name, *argv[1:]]
    if any(argv[0].endswith(c) for c in CURVE):
        if "--from-rows" in argv:
            return None
        out: list[str] = ["-m", "epr.cli", "experiment", "curve"]
        skip = False
        for a in argv[1:]:
            if skip:
                skip = False
                continue
            if a in ("--out", "--run-root"):
                skip = True
                continue
            if a.startswith(("--out=", "--run-root=")):
                continue
            out.append(a)
        if old_root := next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--run-root"), None):
            # runs the command named under its own run root (a round-1 run mining round 2) move with it
            out = [a.replace(old_root.rstrip("/") + "/", str(run_root).rstrip("/") + "/") for a in out]
        return [*out, "--out", str(into), "--run-root", str(run_root)]
    return argv
