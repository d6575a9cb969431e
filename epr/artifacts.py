"""The only module that knows file formats and the run-directory layout.

A run lives in ``runs/<experiment>/<stage>/``. Each stage writes ``manifest.json`` last and atomically;
a folder without a manifest counts as absent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from epr.types import InputError

__all__ = [
    "atomic_write_text",
    "read_jsonl",
    "write_jsonl",
    "save_npy",
    "load_npy",
    "fingerprint",
    "write_manifest",
    "read_manifest",
    "stage_state",
]

log = logging.getLogger(__name__)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and ``os.replace``: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _dumps(row: Any) -> str:
    return json.dumps(row, ensure_ascii=False, sort_keys=True)


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> int:
    """Atomically write one JSON object per line (keys sorted, so equal data gives equal bytes)."""
    lines = [_dumps(r.to_json() if hasattr(r, "to_json") else r) for r in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_jsonl(path: str | Path, required: Iterable[str] = ()) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSONL file. A malformed line or a missing field raises ``InputError``
    naming the file and the 1-based line number. Blank lines are allowed and skipped."""
    path = Path(path)
    required = tuple(required)
    opener = _open_maybe_gz(path)
    with opener as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            missing = [k for k in required if k not in row]
            if missing:
                raise InputError(f"{path}:{lineno}: missing field(s) {missing}; present: {sorted(row)}")
            yield row


def _open_maybe_gz(path: Path):
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.suffix == ".gz":
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def save_npy(path: str | Path, array: np.ndarray) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, np.ascontiguousarray(array), allow_pickle=False)
    os.replace(tmp, path)


def load_npy(path: str | Path) -> np.ndarray:
    return np.load(path, allow_pickle=False)


def fingerprint(obj: Any) -> str:
    """A short stable hash of a JSON-able object (configs, upstream fingerprints)."""
    return hashlib.sha256(_dumps(obj).encode()).hexdigest()[:16]


def write_manifest(
    stage_dir: str | Path,
    *,
    stage: str,
    fp: str,
    config: Any,
    rows: dict[str, int],
    extra: dict[str, Any] | None = None,
) -> None:
    """Write the stage's manifest last, atomically. Its presence (with a matching ``fingerprint``) marks the stage done."""
    from epr import __version__

    manifest = {
        "stage": stage,
        "fingerprint": fp,
        "config": config,
        "rows": rows,
        "epr_version": __version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(extra or {}),
    }
    atomic_write_text(
        Path(stage_dir) / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    )


def read_manifest(stage_dir: str | Path) -> dict[str, Any] | None:
    p = Path(stage_dir) / "manifest.json"
    if not p.exists():
        return None
    return json.loads(p.read_text(encoding="utf-8"))


def stage_state(stage_dir: str | Path, fp: str) -> str:
    """``fresh`` (manifest matches), ``stale`` (manifest from another config/upstream) or ``missing``."""
    m = read_manifest(stage_dir)
    if m is None:
        return "missing"
    return "fresh" if m.get("fingerprint") == fp else "stale"
