"""Training checkpoints of the ``encoder`` stage: guarded by the stage fingerprint, complete or ignored.

``<stage>/checkpoints/`` belongs to one fingerprint, named in ``FINGERPRINT.json``: a run with another config
or upstream deletes what is there instead of resuming it. A checkpoint is ``step_<N>/``, written by
``accelerator.save_state`` (weights, optimizer, LR schedule, every process's RNG states, accelerate's step
counter) and then ``progress.json`` (epoch, position in the epoch, history, the epoch's losses so far),
atomically and last: a folder without it was interrupted while being written and is never resumed. Once a
newer checkpoint is complete the older ones are deleted; a finished training deletes the folder.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from epr.artifacts import atomic_write_text

__all__ = ["Checkpoints", "Resumed", "kept_step", "save_model"]

log = logging.getLogger(__name__)

STAMP = "FINGERPRINT.json"
PROGRESS = "progress.json"


@dataclass(frozen=True)
class Resumed:
    path: Path
    progress: dict


class Checkpoints:
    def __init__(self, root: Path, fp: str, accelerator):
        self.root, self.fp, self.acc = Path(root), fp, accelerator

    def claim(self, fresh: bool = False) -> None:
        """Make the folder this fingerprint's (all processes call it): checkpoints of another fingerprint, or
        all of them when ``fresh``, are deleted by the main process."""
        if self.acc.is_main_process:
            stamp = self.root / STAMP
            old = _read_json(stamp).get("fingerprint") if stamp.exists() else None
            if fresh or old != self.fp:
                if self.root.exists() and any(self.root.glob("step_*")):
                    why = "--fresh" if fresh and old == self.fp else f"fingerprint {old} is not {self.fp}"
                    log.info("%s: checkpoints removed (%s)", self.root, why)
                shutil.rmtree(self.root, ignore_errors=True)
                atomic_write_text(stamp, json.dumps({"fingerprint": self.fp}) + "\n")
        self.acc.wait_for_everyone()

    def latest(self) -> Resumed | None:
        """The newest complete checkpoint of this fingerprint and process count, or None."""
        best: Resumed | None = None
        for d in self.root.glob("step_*"):
            p = _read_json(d / PROGRESS)
            if p.get("fingerprint") != self.fp:
                continue  # incomplete (killed while saving) or unreadable
            if p.get("processes") != self.acc.num_processes:
                n = self.acc.num_processes
                log.warning("%s: saved by %s processes, not %d: not resumed", d, p.get("processes"), n)
                continue
            if best is None or p["step"] > best.progress["step"]:
                best = Resumed(d, p)
        return best

    def save(self, step: int, progress: dict) -> None:
        """Checkpoint ``step`` (all processes call it); ``progress.json`` last, then older checkpoints go."""
        d = self.root / f"step_{step}"
        if self.acc.is_main_process and d.exists():
            shutil.rmtree(d)  # a leftover of a killed run: never written into
        self.acc.wait_for_everyone()
        self.acc.save_state(str(d))
        self.acc.wait_for_everyone()  # every process's RNG state is on disk
        if self.acc.is_main_process:
            body = {"fingerprint": self.fp, "step": step, "processes": self.acc.num_processes, **progress}
            atomic_write_text(d / PROGRESS, json.dumps(body) + "\n")
            for old in self.root.glob("step_*"):
                if old != d:
                    shutil.rmtree(old, ignore_errors=True)

    def remove(self) -> None:
        """Training finished: the checkpoints have served (main process)."""
        if self.acc.is_main_process:
            shutil.rmtree(self.root, ignore_errors=True)


def kept_step(root: Path, fp: str) -> int | None:
    """The step of the newest complete checkpoint under ``root`` saved for fingerprint ``fp`` (what the stage's
    next run under the same settings resumes from, with as many processes), or None; reads files only."""
    steps = [_read_json(d / PROGRESS) for d in Path(root).glob("step_*")]
    return max((p["step"] for p in steps if p.get("fingerprint") == fp and "step" in p), default=None)


def save_model(model, dest: Path) -> None:
    """``model.save_pretrained`` (or a copy of a saved model folder) into ``dest`` through a temporary
    folder, so a kill leaves the old folder or the new one."""
    dest = Path(dest)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(model, Path):
        shutil.copytree(model, tmp)
    else:
        model.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
