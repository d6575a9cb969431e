"""The cache rule, in one place: a result is reused only under the fingerprint of everything that changes it.

A run lives in ``runs/<experiment>/<stage>/``. A stage's fingerprint hashes the config sections it reads plus its
upstream fingerprints (``epr.pipeline`` says which); the stage writes ``manifest.json`` last and atomically, naming
its fingerprint, and a folder without a manifest (or with another fingerprint) counts as absent or stale. Work inside
a stage is cut into resumable chunks (``ChunkStore``), each reused only under the same key and inputs. A result row
outside the stages (a learning curve's row file) holds its key and is reused only while the key is unchanged
(``cached_row``). Files whose
content enters a key are named by a digest of their whole content (``cached_digest``), remembered by path, size and
modification time so a large file is hashed once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epr.artifacts import _dumps, atomic_write_text, remove_stale_temps

__all__ = [
    "fingerprint",
    "file_digest",
    "cached_digest",
    "write_manifest",
    "read_manifest",
    "stage_state",
    "ChunkStore",
    "keyed_row",
    "cached_row",
]

log = logging.getLogger(__name__)


def file_digest(path: str | Path) -> str | None:
    """sha256 (16 hex digits) of a file's bytes, or None when it does not exist: a key for data that may be edited
    in place."""
    p = Path(path)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


_DIGESTS: dict[tuple, str] = {}


def _digest_store() -> Path:
    return Path(os.environ.get("EPR_CACHE") or Path.home() / ".cache" / "epr") / "digests.json"


def cached_digest(path: str | Path, full: bool = False) -> str | None:
    """:func:`file_digest` (``full``: all 64 hex digits) of the file's whole content, remembered by its resolved
    path, size, mtime and ctime (in this process and in ``$EPR_CACHE/digests.json`` across processes), so a large
    file (a model's weights, a data set) is hashed once, and again only after it changed. None when it is absent."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return None
    if not p.is_file():
        return None
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    skey = json.dumps(key)
    if key not in _DIGESTS:
        store = _digest_store()
        try:
            known = json.loads(store.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        if not isinstance(known, dict):
            known = {}
        if skey in known:
            _DIGESTS[key] = known[skey]
        else:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            _DIGESTS[key] = known[skey] = h.hexdigest()
            try:  # a lost entry (two processes writing at once) is only hashed again
                live = {k: v for k, v in known.items() if Path(json.loads(k)[0]).exists()}
                atomic_write_text(store, json.dumps(live, indent=0, sort_keys=True) + "\n")
            except OSError:
                pass
    d = _DIGESTS[key]
    return d if full else d[:16]


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


def keyed_row(path: str | Path, key: Any) -> dict | None:
    """The JSON row file at ``path`` if it was computed from ``key`` (its ``key`` field), else None."""
    key = json.loads(json.dumps(key))  # as the file holds it (tuples as lists)
    path = Path(path)
    if path.exists():
        row = json.loads(path.read_text(encoding="utf-8"))
        if row.get("key") == key:
            return row
    return None


def cached_row(path: str | Path, key: Any, compute) -> dict:
    """A row file reused while its key (what it was computed from) is unchanged; else ``compute()`` is written
    atomically with its key and its wall time (a kill mid-write leaves the old row or none)."""
    key = json.loads(json.dumps(key))
    if (row := keyed_row(path, key)) is not None:
        return row
    t = time.time()
    row = {"key": key, **compute(), "seconds": round(time.time() - t, 1)}
    atomic_write_text(Path(path), json.dumps(row) + "\n")
    return row


class ChunkStore:
    """Resumable chunks of one computation, served again only under the same key and for the same inputs.

    ``key`` is everything that produced the chunks besides their inputs: config sections, upstream fingerprints,
    the model's identity, the resolved dtype and the device class. Every chunk file records the key's fingerprint
    and a digest of the inputs it was computed from; :meth:`get` returns its rows only when both match, so a changed
    setting, another LM with the same tokenizer, or other prompts recompute instead of serving a stale answer.
    The main process removes chunks written under another key (``claim``). Chunks are written atomically, so a
    killed run loses at most the chunk it was computing."""

    def __init__(self, root: str | Path, key: Any, *, claim: bool = True):
        self.root, self.key, self.fp = Path(root), key, fingerprint(key)
        if claim:
            self.claim()

    def claim(self) -> None:
        """Make the folder this key's: chunks of another key are deleted, ``KEY.json`` names the key."""
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.root)
        stamp = self.root / "KEY.json"
        old = json.loads(stamp.read_text(encoding="utf-8")).get("fingerprint") if stamp.exists() else None
        if old != self.fp:
            stale = list(self.root.glob("chunk-*.json"))
            if stale:
                log.info("%s: %d chunks from another computation removed", self.root, len(stale))
            for f in stale:
                f.unlink()
            atomic_write_text(stamp, json.dumps({"fingerprint": self.fp, "key": self.key}, indent=2) + "\n")

    @staticmethod
    def digest(inputs: Any) -> str:
        return hashlib.sha256(_dumps(inputs).encode()).hexdigest()[:24]

    def path(self, c: int) -> Path:
        return self.root / f"chunk-{c:06d}.json"

    def get(self, c: int, inputs: Any = None) -> list | None:
        """Chunk ``c``'s rows if it was computed under this key from ``inputs``; else None."""
        p = self.path(c)
        if not p.exists():
            return None
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            if d.get("key") != self.fp or d.get("inputs") != self.digest(inputs):
                return None
            return list(d["rows"])
        except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, not UTF-8, not a chunk
            log.warning("%s: unreadable chunk, recomputed", p)
            return None

    def put(self, c: int, rows: list, inputs: Any = None) -> None:
        body = {"key": self.fp, "inputs": self.digest(inputs), "rows": rows}
        atomic_write_text(self.path(c), json.dumps(body, ensure_ascii=False, sort_keys=True))

    def map(self, items: Sequence[Any], chunk: int, fn, desc: str = "", unit: str = "item", bar=None) -> list:
        """``fn`` over ``items`` in chunks of ``chunk`` (each a list of JSON-able rows, one per item), reusing
        the chunks already computed under this key from the same items; returns every row in order. ``bar``: a
        caller's progress bar (one over several maps) to advance instead of a bar of this map's own."""
        from tqdm.auto import tqdm

        out: list = []
        chunk = max(1, chunk)
        own = bar is None
        if own:
            bar = tqdm(total=len(items), desc=desc or self.root.name, unit=unit)
        for c, s in enumerate(range(0, len(items), chunk)):
            part = list(items[s : s + chunk])
            rows = self.get(c, part)
            if rows is None:
                rows = list(fn(part))
                if len(rows) != len(part):
                    raise RuntimeError(f"{self.root}: chunk {c} gave {len(rows)} rows for {len(part)} items")
                self.put(c, rows, part)
            out.extend(rows)
            bar.update(len(part))
        if own:
            bar.close()
        return out
