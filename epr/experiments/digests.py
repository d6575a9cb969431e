"""Every data file of a results folder pinned by its sha256 in the folder's declaration (``files``), so that an edit
to any example of any row file fails ``epr experiment check``, whether or not a declared number reads that row.

Prose (``*.md``: READMEs, pre-registrations and their amendments), plots (``*.png``, drawn from the rows) and the
declaration itself are not pinned; every other file is: row files, tables, reports, logs, committed labels. A file
that is in the folder but not in ``files`` fails too (a row added behind the declaration's back), as does a folder
that pins nothing. ``epr experiment digest FOLDER`` (and ``record``) writes the block; git shows each change to it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from epr.artifacts import sha256_file
from epr.experiments.declaration import FILE

__all__ = ["pinned", "digest", "problems", "write", "KEY"]

KEY = "files"
UNPINNED = (".md", ".png")


def pinned(folder: Path) -> list[Path]:
    """The folder's files that the declaration pins (relative paths, sorted)."""
    folder = Path(folder)
    return sorted(
        p.relative_to(folder)
        for p in folder.rglob("*")
        if p.is_file() and p.name != FILE and p.suffix not in UNPINNED and not p.name.startswith(".")
    )


def digest(folder: Path) -> dict[str, str]:
    return {p.as_posix(): sha256_file(Path(folder) / p) for p in pinned(folder)}


def problems(folder: Path, declared: dict[str, str] | None) -> list[str]:
    """Where the folder's files differ from what its declaration pins (empty: every byte as declared)."""
    if declared is None:
        return [f"pins no file ({KEY}: missing): run `epr experiment digest {folder}` and commit it"]
    have = digest(folder)
    out = []
    for name, want in sorted(declared.items()):
        if name not in have:
            out.append(f"{name}: pinned but missing")
        elif have[name] != want:
            out.append(
                f"{name}: its sha256 is not the pinned one (an edited example, or a rerun not re-pinned)"
            )
    out += [f"{name}: not pinned ({KEY} does not list it)" for name in sorted(set(have) - set(declared))]
    return out


def block(files: dict[str, str]) -> str:
    if not files:
        return f"{KEY}: {{}}\n"
    return f"{KEY}:\n" + "".join(f'  {json.dumps(name)}: "{sha}"\n' for name, sha in sorted(files.items()))


def write(folder: Path) -> Path:
    """Pin the folder's files as they are now: the declaration's ``files`` block replaced (the rest kept as
    written)."""
    decl = Path(folder) / FILE
    text = decl.read_text(encoding="utf-8")
    text = re.sub(rf"^{KEY}:.*\n(?:[ \t]+.*\n?)*", "", text, flags=re.M).rstrip("\n") + "\n"
    decl.write_text(text + block(digest(folder)), encoding="utf-8")
    return decl
