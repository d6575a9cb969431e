"""One writer per run folder: an advisory lock that every command writing a run takes for as long as it runs.

``epr run``, the stage commands, ``epr demo``, ``epr truthfulqa``, ``epr export`` (it reads the trained encoder) and
``epr cache import`` (it writes the run root's score stores) hold ``<folder>/.epr.lock`` through ``filelock``, an
``flock`` on Unix: the kernel releases it when the holder exits or is killed (``kill -9`` included), so a lock is
never left behind. Beside it, ``.epr.lock.json`` names the holder (pid, host, command, since when), so a second
writer is refused with one paragraph that says who holds the run instead of racing it (two runs scoring the same
sequences and saving the same checkpoint at the same moment). Readers (``epr status``, ``inspect``, ``config``)
take no lock and never wait.

Under ``accelerate launch`` / ``torchrun`` only the main process holds the lock; it tells the other processes
whether it got it, so either every process goes on or every process stops with the same message (none waits at a
barrier for a process that has left).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from epr.artifacts import atomic_write_text
from epr.types import UserError

__all__ = ["RunLocked", "LOCK_NAME", "HOLDER_NAME", "run_lock", "holder"]

LOCK_NAME = ".epr.lock"
HOLDER_NAME = ".epr.lock.json"


class RunLocked(UserError):
    """Another process holds the run folder's lock (a second writer)."""


def holder(folder: str | Path) -> dict | None:
    """What the side file says about the process holding ``folder``'s lock (pid, host, command, since), or None
    when there is none or it is unreadable (a holder between taking the lock and writing it)."""
    try:
        data = json.loads((Path(folder) / HOLDER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _ago(since: float) -> str:
    s = max(0, int(time.time() - since))
    return f"{s} s" if s < 120 else f"{s // 60} min" if s < 7200 else f"{s // 3600} h {s % 3600 // 60} min"


def _refusal(folder: Path, what: str) -> str:
    h = holder(folder)
    if h is None:
        who = "another process (it has just started: its pid, host and command are not written yet)"
    else:
        when = datetime.fromtimestamp(float(h.get("since", 0)), timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S UTC"
        )
        who = (
            f"pid {h.get('pid')} on {h.get('host')}, `{h.get('command')}`, since {when} "
            f"({_ago(float(h.get('since', 0)))} ago)"
        )
    return (
        f"{folder}: {what} is being written by {who}. One writer per run: two at once would score the same "
        f"sequences and overwrite each other's files. Wait for it to finish (or stop it: its lock goes with it, "
        f"even after kill -9), or give this one another run name (--set name=...); `epr status` reads a run "
        f"without waiting. The lock is {folder / LOCK_NAME}."
    )


def _acquire(folder: Path, what: str, command: str):
    """The held lock, or the refusal's text."""
    from filelock import FileLock, Timeout

    folder.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return _refusal(folder, what)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "since": time.time()}
    atomic_write_text(folder / HOLDER_NAME, json.dumps(info, sort_keys=True) + "\n")
    return lock


def _agree(dist, message: str | None) -> str | None:
    """The main process's outcome, told to every process of a multi-process run."""
    if dist is None or getattr(dist, "world", 1) <= 1:
        return message
    import torch.distributed as td

    box = [message]
    td.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def run_lock(
    folder: str | Path, what: str = "this run", command: Sequence[str] | str | None = None, dist=None
) -> Iterator[None]:
    """Hold ``folder``'s writer lock for the ``with`` block; ``RunLocked`` (a ``UserError``: exit 2, one
    paragraph naming the holder) when another process holds it. ``what`` names the folder in that message,
    ``command`` the holder in the side file (default: this process's command line). ``dist``: the run's
    :class:`epr.context.Dist`; only its main process takes the lock and the others follow its outcome."""
    folder = Path(folder)
    if command is None:  # this process's command line: `epr ...`, `train_epr.py ...`, `learning_curve.py ...`
        name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
        command = ["epr" if name in ("cli.py", "__main__.py") else name, *sys.argv[1:]]
    command = command if isinstance(command, str) else " ".join(command)
    main = dist is None or getattr(dist, "is_main", True)
    try:
        got = _acquire(folder, what, command) if main else None
    except OSError as e:  # a folder that cannot be written: said to every process, not left at a collective
        got = (
            f"{folder}: the run's lock cannot be taken ({e.strerror or e}); check that the folder is writable"
        )
    message = _agree(dist, got if isinstance(got, str) else None)
    if message is not None:
        raise RunLocked(message)
    try:
        yield
    finally:
        if got is not None:
            with contextlib.suppress(OSError):  # before the release: never a later holder's file
                (folder / HOLDER_NAME).unlink()
            got.release()
