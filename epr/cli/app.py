"""``epr``: what a user types. ``demo`` (the whole pipeline on the packaged demo set), ``run`` (every stale stage,
the recipe's rounds, ``select``, the comparison) and ``status``; ``export`` and ``serve`` (the trained retriever,
shipped); ``inspect``, ``config``, ``cache``, ``experiment`` and ``truthfulqa``. One stage alone: ``epr stage NAME``
(``epr stage`` lists them; ``epr NAME`` works too, as accelerate launches it).

Examples::

    epr demo
    epr status -c configs/mtop.yaml
    epr run -c configs/mtop.yaml --until labels --set candidates.num_queries=1000
    epr stage scores -c configs/mtop.yaml
    accelerate launch --num_processes 2 -m epr.cli scores -c configs/mtop.yaml

A failure the user can fix (a file, a setting, a missing step, an unreachable server) is one paragraph on stderr
and exit code 2; ``--debug`` (anywhere on the line) or ``EPR_DEBUG=1`` shows the stack too.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path

from epr.cli.ending import label_cost_line, not_fresh, run_demo, selection_line
from epr.cli.ends import READERS, Terminated, debug_flag, explain, terminate_as_interrupt

__all__ = ["main", "build_parser", "context_from_args", "explain"]

# (the docstring above is ``epr --help``.) ``epr.cli.inspect`` is ``epr inspect``, ``epr.cli.truthfulqa`` is
# ``epr truthfulqa``; ``python -m epr.cli`` runs ``main`` (``__main__.py``).


def build_parser() -> argparse.ArgumentParser:
    from epr.pipeline import ALIASES, STAGES

    p = argparse.ArgumentParser(
        prog="epr", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-c", "--config", action="append", default=[], help="YAML config (repeatable, merged in order)"
    )
    common.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. candidates.L=20"
    )
    common.add_argument("--log-level", default="INFO")
    common.add_argument(
        "--verbose",
        action="store_true",
        help="also other libraries' INFO lines (accelerate's checkpoints, ...)",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("status", parents=[common], help="show each stage as fresh, stale or missing")
    r = sub.add_parser("run", parents=[common], help="run every stale stage up to --until")
    r.add_argument(
        "--until",
        default=None,
        choices=sorted([*STAGES, *ALIASES]),
        help="last stage to run (default: the config's last: every round, select, the comparison)",
    )
    r.add_argument(
        "--force",
        action="append",
        default=[],
        choices=sorted([*STAGES, *ALIASES]),
        help="rerun this stage even if fresh",
    )
    sub.add_parser(
        "stage", help="run one stage (its upstream must be fresh): epr stage NAME; epr stage lists them"
    )
    for name in [*STAGES, *ALIASES]:  # off the front page (no help=): `epr stage NAME` or `epr NAME`
        s = sub.add_parser(
            name, parents=[common], description=f"run the {name} stage (its upstream must be fresh)"
        )
        s.add_argument("--force", action="store_true")
    i = sub.add_parser("inspect", parents=[common], help="show what each retriever picks for one query")
    i.add_argument("query")
    i.add_argument("-k", type=int, default=5)
    _export_parser(sub, common)
    sub.add_parser(
        "demo",
        parents=[common],
        help="the whole pipeline on the packaged demo set, ending in a comparison table",
    )
    c = sub.add_parser(
        "config",
        parents=[common],
        help="print the resolved config: every key with its value, help and choices (YAML that -c loads back)",
        description=CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument(
        "files", nargs="*", metavar="CONFIG.yaml", help="YAML config(s), merged in order after any -c"
    )
    from epr.cli import cache as cache_cli

    cache_cli.add_parser(sub, common)
    from epr.cli import truthfulqa as truthfulqa_cli

    truthfulqa_cli.add_parser(sub)
    from epr.cli import experiment as experiments_cli

    experiments_cli.add_parser(sub)
    sub.add_parser(
        "serve",
        help="llama.cpp's OpenAI-compatible server for a packaged GGUF LM, with correct prompt log-probs "
        "(epr serve --help)",
        add_help=False,
    )
    return p


def _export_parser(sub, common: argparse.ArgumentParser) -> None:
    from epr.retrieval.modes import MODES

    e = sub.add_parser(
        "export", parents=[common], help="write the run's trained retriever as a shippable folder"
    )
    e.add_argument("out", help="folder to write (PromptRetriever.from_pretrained loads it)")
    e.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty OUT (never inside the run folder or the run root, nor a folder above the run, "
        "the current or the home folder)",
    )
    e.add_argument(
        "--mode",
        choices=MODES,
        help="the retriever to serve (default: what the run's select stage chose, else epr)",
    )


DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
CONFIG_HELP = """Print the resolved configuration (the defaults, then the YAML files in order, then the --set overrides) as
YAML: every key with its value and, as a comment, its help and its choices, grouped by section. The output
loads back unchanged (epr run -c resolved.yaml). Loads no model and imports no torch.

Examples::

    epr config                                          # every setting at its default
    epr config configs/mtop.yaml --set candidates.L=20  # what a run with these would use
    epr config configs/mtop.yaml > my.yaml              # a starting point to edit
"""


def print_config(args: argparse.Namespace) -> int:
    from epr.config import dump_config, load_config

    paths = [*args.config, *args.files]
    cfg = load_config(paths, args.set)
    sys.stdout.write(dump_config(cfg, [*map(str, paths), *(f"--set {s}" for s in args.set)]))
    return 0


def context_from_args(args: argparse.Namespace):
    from epr.config import load_config
    from epr.context import Context, Dist

    paths = args.config or ([DEMO_CONFIG] if args.cmd in ("demo", "inspect", "export") else [])
    return Context(load_config(paths, args.set), Dist.from_env())


def own_lines(record: logging.LogRecord) -> bool:
    """The log filter of a command without ``--verbose``: epr's own lines at the chosen level, other libraries'
    (accelerate's checkpoint notes, transformers', ...) from WARNING up."""
    return record.levelno >= logging.WARNING or record.name.split(".")[0] in ("epr", "ragsys", "__main__")


def main(argv: list[str] | None = None) -> int:
    """The ``epr`` command. Expected failures (:func:`explain`) print one paragraph and return 2."""
    argv, debug = debug_flag(sys.argv[1:] if argv is None else list(argv))
    restore = terminate_as_interrupt(argv)
    try:
        rc = _main(argv)
        sys.stdout.flush()  # here, so that a reader that stopped early (`epr status | head`) is caught below
        return rc
    except Terminated:
        sys.stderr.write("epr: terminated (SIGTERM; finished chunks are kept: the same command resumes)\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write("epr: interrupted (finished chunks are kept: the same command resumes)\n")
        return 130
    except BrokenPipeError:  # the reader of our output went away (`epr status | head`)
        # (a stdout with no file descriptor has nothing to redirect)
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        # a reader lost nothing; a command that writes may have stopped part way: SIGPIPE's exit code, for scripts
        return 0 if argv[:1] and argv[0] in READERS else 141
    except Exception as e:  # the error boundary: a message for what the user can fix, a stack for a bug
        msg = explain(e)
        if msg is None or debug:
            raise
        sys.stderr.write(f"epr: error: {msg}\n(run with --debug or EPR_DEBUG=1 to see where it was raised)\n")
        return 2
    finally:
        if restore is not None:  # in-process callers (tests, notebooks) get their own SIGTERM back
            import signal

            signal.signal(signal.SIGTERM, restore)


def _main(argv: list[str]) -> int:
    if argv[:2] == ["experiment", "curve"]:  # the learning curve's own options (epr/cli/curve.py)
        from epr.cli import curve

        return curve.main(argv[2:], prog="epr experiment curve")
    if argv[:1] == ["experiment"] and len(argv) > 1:  # the results tools' own options (epr/cli/tools.py)
        from epr.cli.tools import TOOLS

        if argv[1] in TOOLS:
            return TOOLS[argv[1]][0](argv[2:], prog=f"epr experiment {argv[1]}")
    if argv[:2] == ["truthfulqa", "findings"]:  # its own positional folders (epr/cli/truthfulqa.py)
        from epr.cli import truthfulqa as truthfulqa_cli

        return truthfulqa_cli.findings_main(argv[2:])
    if argv[:1] == ["serve"]:  # its own options (epr/cli/serve.py)
        from epr.cli import serve

        return serve.main(argv[1:])
    if argv[:1] == ["stage"]:  # epr stage NAME ...: the stage's own subcommand
        from epr.pipeline import ALIASES, STAGES

        if len(argv) < 2 or argv[1] not in {*STAGES, *ALIASES}:
            sys.stdout.write(
                "epr stage NAME [-c CONFIG] [--set KEY=VALUE] [--force]: run one stage (its upstream must be "
                "fresh; epr run runs what is stale up to a stage). Stages, in run order:\n  "
                + "\n  ".join(STAGES)
                + "\n"
            )
            return 0 if len(argv) < 2 or argv[1] in ("-h", "--help") else 2
        argv = argv[1:]
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.cmd == "experiment" and rest and not any(r.startswith("-") for r in rest):
        args.folders += [
            Path(r) for r in rest
        ]  # folders after the options (argparse stops at the first option)
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not getattr(args, "verbose", False):
        for h in logging.getLogger().handlers:
            h.addFilter(own_lines)
    if args.cmd == "config":
        return print_config(args)
    if args.cmd == "experiment":
        from epr.cli import experiment as experiments_cli

        return experiments_cli.run(args)
    if args.cmd == "truthfulqa":
        from epr.cli import truthfulqa as truthfulqa_cli

        return truthfulqa_cli.run(args)
    ctx = context_from_args(args)
    if args.cmd == "export":
        # refused before the lock and before anything is loaded: a wrong OUT costs nothing and changes nothing
        from epr.shipping import check_destination

        cfg = ctx.cfg
        check_destination(args.out, overwrite=args.overwrite, protect=[cfg.run_dir], roots=[cfg.run_root])
    with writer_lock(ctx, args, argv):
        return _dispatch(ctx, args)


def writer_lock(ctx, args: argparse.Namespace, argv: list[str]):
    """The lock of what ``args.cmd`` writes (``epr.run_lock``): the run folder for ``run``, ``demo``, the stage
    commands and ``export`` (it reads the trained encoder: never while a run rewrites it), the run root's score
    stores for ``cache import``; none for the readers (``status``, ``inspect``, ``cache export``)."""
    import contextlib

    from epr.run_lock import run_lock

    command = ["epr", *argv]
    if args.cmd in ("status", "inspect") or (args.cmd == "cache" and args.action == "export"):
        return contextlib.nullcontext()
    if args.cmd == "cache":
        root = Path(ctx.cfg.run_root) / ".cache" / "scores"
        return run_lock(root, "the run root's score stores", command, ctx.dist)
    if args.cmd == "export" and not ctx.cfg.run_dir.is_dir():
        # no run to read: the export refuses with its own message, and no run folder is made by asking
        return contextlib.nullcontext()
    return run_lock(ctx.cfg.run_dir, "this run", command, ctx.dist)


def _dispatch(ctx, args: argparse.Namespace) -> int:
    from epr import pipeline

    if args.cmd == "status":
        for label, state, path, kept in pipeline.status_rows(ctx, pipeline.final_stage(ctx)):
            sys.stdout.write(f"{label:<18} {state:<8} {path}" + (f"  ({kept})" if kept else "") + "\n")
        sys.stdout.write(selection_line(ctx) + label_cost_line(ctx))
        return 0
    if args.cmd == "demo":
        return run_demo(ctx)
    if args.cmd == "export":
        from epr.api import PromptRetriever

        r = PromptRetriever.from_run(ctx.cfg.run_dir, mode=args.mode)
        stale = not_fresh(ctx, ["encoder"] if args.mode else ["encoder", "select"])
        if stale:  # the folder ships what the run holds, which these settings would not have made
            logging.getLogger("epr.cli").warning(
                "epr export: %s: %s under these settings (stale: the -c/--set differ from the run's; missing: not "
                "run or not finished): the export ships the run as it is; `epr run` with these -c/--set first "
                "brings it up to date",
                ctx.cfg.run_dir,
                ", ".join(stale),
            )
        out = r.save_pretrained(args.out, run=ctx.cfg.run_dir, overwrite=args.overwrite)
        sys.stdout.write(f"wrote {out} (PromptRetriever.from_pretrained({str(out)!r}))\n")
        return 0
    if args.cmd == "cache":
        from epr.cli import cache as cache_cli

        return cache_cli.run(ctx, args)
    if args.cmd == "inspect":
        from epr.cli.inspect import inspect_query

        inspect_query(ctx, args.query, args.k)
        return 0
    if args.cmd == "run":
        ran = pipeline.run(ctx, args.until or pipeline.final_stage(ctx), tuple(args.force))
        if ctx.dist.is_main:
            sys.stdout.write(
                f"ran: {', '.join(ran) or 'nothing (all fresh)'}; outputs in {ctx.cfg.run_dir}\n"
            )
            sys.stdout.write(selection_line(ctx))
            res = ctx.stage_dir("evaluate") / "results.md"
            if res.exists() and (args.until or pipeline.final_stage(ctx)) in ("evaluate", "compare"):
                sys.stdout.write(f"comparison: {res}\n")
        return 0
    pipeline.run_stage(ctx, pipeline.ALIASES.get(args.cmd, args.cmd), force=args.force)
    return 0
