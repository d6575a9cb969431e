"""The only module that knows file formats and the run-directory layout.

A run lives in ``runs/<experiment>/<stage>/``. Each stage writes ``manifest.json`` last and atomically;
a folder without a manifest counts as absent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from epr.types import InputError

__all__ = [
    "atomic_write_text",
    "file_mode",
    "dir_mode",
    "remove_stale_temps",
    "prune_outputs",
    "apply_umask",
    "read_jsonl",
    "read_jsonl_lines",
    "open_text",
    "write_jsonl",
    "save_npy",
    "load_npy",
    "fingerprint",
    "file_digest",
    "cached_digest",
    "write_manifest",
    "read_manifest",
    "stage_state",
    "ChunkStore",
]

log = logging.getLogger(__name__)


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask's set-and-restore races with other threads)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def file_mode() -> int:
    """The mode ``open`` gives a new file under the process's umask (0644 under 022): temp files are made 0600."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """The mode ``mkdir`` gives a new folder under the process's umask (0755 under 022)."""
    return 0o777 & ~_umask()


# a temp file names its writer's process: ``.<name>.<pid>.<random>.tmp``, so the next run can tell a temp file
# left by a killed writer (removed) from one another live process is writing (kept)
_TEMP = re.compile(r"^\..+\.(\d+)(\.[A-Za-z0-9_]+)?\.tmp$")
_OLD_TEMP = re.compile(r"^(\..+\.[A-Za-z0-9_]+\.tmp|.+\.tmp\.npy)$")  # written before the pid was in the name


def _temp(path: Path) -> tuple[int, str]:
    return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True


def remove_stale_temps(folder: str | Path, older_than: float = 600.0) -> int:
    """Remove the temp files a killed writer left in ``folder`` (between its temp write and its rename): those of
    a process that no longer runs, and unnamed ones older than ``older_than`` seconds. Returns how many."""
    folder, n = Path(folder), 0
    if not folder.is_dir():
        return 0
    now = time.time()
    for f in folder.iterdir():
        m = _TEMP.match(f.name)
        if m is not None:
            stale = not _alive(int(m.group(1)))
        elif _OLD_TEMP.match(f.name):
            try:
                stale = now - f.stat().st_mtime > older_than
            except OSError:
                continue
        else:
            continue
        if stale and f.is_file():
            try:
                f.unlink()
                n += 1
            except OSError:
                pass
    if n:
        log.info("%s: removed %d temp file(s) left by a killed run", folder, n)
    return n


def apply_umask(root: str | Path) -> None:
    """Give every file under ``root`` the mode a new file gets under the umask (0644 under 022) and every folder a
    new folder's (0755): libraries that write through private temp files (transformers' safetensors shards,
    ``mkstemp``) leave 0600, which hides a shared model or retriever from its other users."""
    root = Path(root)
    fm, dm = file_mode(), dir_mode()
    for p in [root, *root.rglob("*")]:
        if p.is_symlink():
            continue
        os.chmod(p, dm if p.is_dir() else fm)


def prune_outputs(stage_dir: str | Path, produced: Iterable[str]) -> list[str]:
    """Remove the files of ``stage_dir`` (top level) that this run of the stage did not write (``produced``: file
    names), so an output a former config made (``quality_bias.npy`` of a dropped ``+bias``, the rows of a removed
    retriever) is never read as this run's. Sub-folders (resumable parts) are left alone. Returns what went."""
    keep = {*produced, "manifest.json"}
    gone = []
    for f in sorted(Path(stage_dir).iterdir()):
        if f.is_file() and f.name not in keep:
            f.unlink()
            gone.append(f.name)
    if gone:
        log.info("%s: removed outputs this config no longer makes: %s", stage_dir, ", ".join(gone))
    return gone


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and ``os.replace``: readers never see half a file. The file
    gets the mode the umask gives a new file (not the temp file's 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp(path)
    try:
        os.fchmod(fd, file_mode())
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
    """Yield the objects of a JSONL file (UTF-8, a leading byte-order mark allowed; ``.gz`` too). A malformed
    line, a byte that is not UTF-8 or a missing field raises ``InputError`` naming the file and the 1-based line
    number. Blank lines are allowed and skipped. A file holding one JSON array of objects (``[{...}, ...]``) is
    read as its elements."""
    for _, row in read_jsonl_lines(path, required):
        yield row


def read_jsonl_lines(path: str | Path, required: Iterable[str] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`read_jsonl` with each object's 1-based line number (a JSON array's elements: their index)."""
    path = Path(path)
    required = tuple(required)

    def check(row: Any, where: str) -> dict[str, Any]:
        if not isinstance(row, dict):
            raise InputError(f"{where}: expected a JSON object (one per line), got {type(row).__name__}")
        missing = [k for k in required if k not in row]
        if missing:
            raise InputError(f"{where}: missing field(s) {missing}; present: {sorted(row)}")
        return row

    with open_text(path) as f:
        first = True
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if first and line.lstrip().startswith("["):  # a JSON array file, not JSON Lines: read it whole
                rest = line + "".join(f)
                try:
                    rows = json.loads(rest)
                except json.JSONDecodeError as e:
                    raise InputError(
                        f"{path}:{lineno - 1 + e.lineno}: the file starts like a JSON array but is not valid JSON "
                        f"({e.msg} at column {e.colno}); write one JSON object per line (JSON Lines) or a valid array"
                    ) from None
                if not isinstance(rows, list):
                    raise InputError(
                        f"{path}:{lineno}: expected JSON Lines (one object per line) or one array"
                    )
                for i, row in enumerate(rows, start=1):
                    yield i, check(row, f"{path}: array element {i}")
                return
            first = False
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            yield lineno, check(row, f"{path}:{lineno}")


def open_text(path: Path, newline: str | None = None):
    """The lines of a UTF-8 text file (gzip-compressed when it ends in ``.gz``): a context manager that gives an
    iterator of ``str``.

    A leading byte-order mark (what many Windows tools write) is dropped (``utf-8-sig``). A byte that is not
    UTF-8 raises ``InputError`` naming the file, the 1-based line, the column and the byte offset; so do a folder,
    a ``.gz`` that is not gzip or is cut short. ``newline`` is ``open``'s (``""`` for the csv module)."""
    import contextlib
    import gzip
    import zlib

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: a folder, not a file; name the data file itself (e.g. {path}/train.jsonl)")
    opener = gzip.open if path.suffix == ".gz" else open

    def lines() -> Iterator[str]:
        n = 0
        try:
            with opener(path, "rt", encoding="utf-8-sig", newline=newline) as f:
                try:
                    for line in f:
                        n += 1
                        yield line
                except UnicodeDecodeError as e:
                    _bad_utf8(path, opener, e)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise InputError(
                f"{path}: not a whole gzip file ({e}; {n} lines read); a .gz name needs gzip data: re-compress "
                "it (gzip -k file) or drop the .gz suffix if it is plain text"
            ) from None

    return contextlib.closing(lines())


def _bad_utf8(path: Path, opener, e: UnicodeDecodeError):
    # the text layer decodes in chunks: find the first bad byte again, line by line, in bytes
    offset = 0
    with opener(path, "rb") as raw:
        for lineno, b in enumerate(raw, start=1):
            try:
                b.decode("utf-8")
            except UnicodeDecodeError as bad:
                raise InputError(
                    f"{path}:{lineno}: not UTF-8: byte 0x{b[bad.start]:02x} at column {bad.start + 1}"
                    f" (byte offset {offset + bad.start}); the file must be UTF-8 (re-save it as"
                    " UTF-8, e.g. `iconv -f cp1252 -t utf-8 in.csv > out.csv`)"
                ) from None
            offset += len(b)
    raise InputError(f"{path}: not UTF-8 ({e}); the file must be UTF-8") from None


def save_npy(path: str | Path, array: np.ndarray) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp(path)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_npy(path: str | Path) -> np.ndarray:
    return np.load(path, allow_pickle=False)


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
