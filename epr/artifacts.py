"""Files: atomic writes, JSONL / NumPy formats with errors that name the file and row, modes under the user's umask,
and the temporary files of dead writers. What a stage's folder means (fingerprints, manifests, chunk stores: the cache
rule) is in ``epr.cache``."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from epr.types import InputError

__all__ = [
    "sha256_file",
    "read_json",
    "atomic_write_text",
    "atomic_write_bytes",
    "file_mode",
    "dir_mode",
    "remove_stale_temps",
    "prune_outputs",
    "apply_umask",
    "read_jsonl",
    "read_jsonl_lines",
    "open_text",
    "nul_hint",
    "write_jsonl",
    "save_npy",
    "load_npy",
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
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """:func:`atomic_write_text` for bytes (a compressed file, an image)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp(path)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


class _RepeatedKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: an object naming a key twice is an error (plain ``json`` keeps the last value
    and drops the first without a word)."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        raise _RepeatedKey(sorted({k for k, _ in pairs if k in seen or seen.add(k)}))
    return d


def read_jsonl_lines(
    path: str | Path, required: Iterable[str] = (), numbers_as_written: bool = False, hint: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    """:func:`read_jsonl` with where each object is, for messages: ``'<path>:<line>'`` (1-based), or
    ``'<path>: array element <i>'`` in a JSON array file.

    An object that names a key twice raises ``InputError`` (which value is meant would be a guess).
    ``numbers_as_written``: a non-integer number is kept as the text the file holds (``3.50``, ``1E3``), not
    rewritten through a float (``3.5``, ``1000.0``, lost digits): how users' data rows are read."""
    path = Path(path)
    required = tuple(required)
    kw: dict[str, Any] = {"object_pairs_hook": _unique_keys}
    if numbers_as_written:
        kw["parse_float"] = str

    def loads(text: str, where: str) -> Any:
        try:
            return json.loads(text, **kw)
        except _RepeatedKey as e:
            raise InputError(
                f"{where}: an object names the key(s) {e.args[0]} more than once; JSON keeps only the last "
                "value, so which one is meant would be a guess: remove or rename the extra ones"
            ) from None

    def check(row: Any, where: str) -> dict[str, Any]:
        if not isinstance(row, dict):
            raise InputError(f"{where}: expected a JSON object (one per line), got {type(row).__name__}")
        missing = [k for k in required if k not in row]
        if missing:
            raise InputError(f"{where}: missing field(s) {missing}; present: {sorted(row)}{hint}")
        return row

    with open_text(path) as f:
        first = True
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if first and line.lstrip().startswith("["):  # a JSON array file, not JSON Lines: read it whole
                rest = line + "".join(f)
                try:
                    rows = loads(rest, f"{path} (a JSON array)")
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
                    where = f"{path}: array element {i}"
                    yield where, check(row, where)
                return
            first = False
            try:
                row = loads(line, f"{path}:{lineno}")
            except json.JSONDecodeError as e:
                raise InputError(
                    f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno}){nul_hint(line)}"
                ) from None
            where = f"{path}:{lineno}"
            yield where, check(row, where)


def read_json(path: str | Path) -> Any:
    """The JSON value a file holds (``.gz`` too); a malformed or truncated file raises ``InputError`` naming it
    and where it breaks (``json.loads`` alone names no file)."""
    path = Path(path)
    text = (
        gzip.decompress(path.read_bytes()).decode("utf-8")
        if path.suffix == ".gz"
        else path.read_text("utf-8")
    )
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{path}: malformed JSON ({e.msg} at line {e.lineno}, column {e.colno}); fix or re-create the file"
        ) from None


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
    opener = gzip.open if path.suffix.lower() == ".gz" else open

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


def nul_hint(text: str) -> str:
    """A hint for text holding NUL characters: what UTF-16 / UTF-32 without a byte-order mark reads as in UTF-8."""
    if "\x00" not in text:
        return ""
    return (
        "; the text holds NUL bytes, as UTF-16 or UTF-32 without a byte-order mark does: re-save the file as UTF-8 "
        "(e.g. `iconv -f UTF-16 -t UTF-8 in.csv > out.csv`)"
    )


# byte-order marks of the encodings a UTF-8 reader cannot read, longest first (UTF-32 LE starts like UTF-16 LE)
_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian)", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)", "UTF-32"),
    (b"\xff\xfe", "UTF-16 (little-endian)", "UTF-16"),
    (b"\xfe\xff", "UTF-16 (big-endian)", "UTF-16"),
)


def _bad_utf8(path: Path, opener, e: UnicodeDecodeError):
    # the encoding a byte-order mark names, with the hint that converts it (Windows tools save "Unicode" as UTF-16)
    with opener(path, "rb") as raw:
        head = raw.read(4096)
    for bom, name, iconv in _BOMS:
        if head.startswith(bom):
            raise InputError(
                f"{path}: {name} text (its first bytes are the {name} byte-order mark), not UTF-8; the file must be "
                f"UTF-8: re-save it as UTF-8, e.g. `iconv -f {iconv} -t UTF-8 in.csv > out.csv`"
            ) from None
    # the text layer decodes in chunks: find the first bad byte again, line by line, in bytes
    offset = 0
    with opener(path, "rb") as raw:
        for lineno, b in enumerate(raw, start=1):
            try:
                b.decode("utf-8")
            except UnicodeDecodeError as bad:
                hint = (
                    nul_hint(
                        "\x00"
                    )  # text in UTF-16 / UTF-32 without a byte-order mark: every other byte NUL
                    if head.count(0) > len(head) // 8
                    else "; the file must be UTF-8 (re-save it as UTF-8, e.g. `iconv -f cp1252 -t utf-8 in.csv > "
                    "out.csv`)"
                )
                raise InputError(
                    f"{path}:{lineno}: not UTF-8: byte 0x{b[bad.start]:02x} at column {bad.start + 1}"
                    f" (byte offset {offset + bad.start}){hint}"
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


def sha256_file(path: Path) -> str:
    """The full sha256 of a file's bytes, read in 1 MiB blocks (shipped files, pinned results files)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
