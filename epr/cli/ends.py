"""How an ``epr`` command ends when it does not simply succeed: the one-paragraph message of an expected failure
(:func:`explain`), SIGTERM unwound like Ctrl-C (:class:`Terminated`), and ``--debug``."""

from __future__ import annotations

import os

__all__ = ["READERS", "Terminated", "debug_flag", "explain", "terminate_as_interrupt"]


def explain(e: BaseException) -> str | None:
    """The one-paragraph message of an expected failure (what, where, what to do), or None for a bug (whose
    stack the user should see and report)."""
    import json
    import zlib

    import yaml

    from epr.types import UserError

    if isinstance(e, UserError):
        return str(e)
    if isinstance(e, json.JSONDecodeError):
        return f"malformed JSON ({e.msg} at line {e.lineno}, column {e.colno}); fix or re-create the file"
    if isinstance(e, yaml.YAMLError):
        return f"not valid YAML: {' '.join(str(e).split())}"
    if isinstance(e, OSError):
        name = e.filename if e.filename is not None else ""
        if isinstance(e, FileNotFoundError):
            what = "no such file or folder; check the path (relative paths are from the current folder)"
        elif isinstance(e, IsADirectoryError):
            what = "a folder where a file was expected; name the file inside it"
        elif isinstance(e, NotADirectoryError):
            what = "a file where a folder was expected"
        elif isinstance(e, PermissionError):
            what = "permission denied; check the file's owner and mode (ls -l)"
        else:
            what = e.strerror or ""
        text = " ".join(str(e).split()) if not (name and e.strerror) else f"{name}: {what}"
        return text if not name or str(name) in text else f"{name}: {text}"
    if isinstance(e, (EOFError, zlib.error)):
        return f"a compressed file ends early or is corrupt ({e}); re-download or re-compress it"
    if isinstance(e, ImportError):
        return f"{e} (an optional dependency is missing: install the extra the message names)"
    if isinstance(
        e, ValueError
    ):  # the package's own checks (config values, rows, arguments) say what and where
        return " ".join(str(e).split())
    return None


def debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug``, and whether the stack is to be shown (``--debug`` or ``EPR_DEBUG``)."""
    env = os.environ.get("EPR_DEBUG", "").strip().lower() not in ("", "0", "false", "no")
    return [a for a in argv if a != "--debug"], env or "--debug" in argv


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or ``kill``'s stop) while ``epr`` runs: unwound like Ctrl-C, said as such."""


READERS = (
    "status",
    "config",
    "inspect",
)  # commands that write nothing: a stop or a closed pipe loses nothing


def terminate_as_interrupt(argv: list[str]):
    """While a command that writes runs in one process, SIGTERM raises :class:`Terminated` once (Ctrl-C's path:
    stages' partial files are left as a resume expects, the one-writer lock is released, a message is printed);
    a second SIGTERM has the default action again. Not for readers, not under a multi-process launcher (a rank
    blocked in a collective would not run the handler until the launcher's SIGKILL; the default ends it at once),
    not off the main thread, and not where SIGTERM already has a handler. Returns the handler to put back (None
    where nothing was set)."""
    import signal
    import threading

    if not argv or argv[0] in (*READERS, "serve") or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # once: a second SIGTERM ends the process as before
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    return signal.SIG_DFL
