"""What git says of the results folders: when each locked look was made, and whether its pre-registration came first.

A folder says of itself when it ran (``date``), which split it read (``split``) and which pre-registration governs it;
none of that can be trusted on its own word, since a declaration is a file anyone can edit. Git's history cannot be
rewritten without it showing, so this module reads it:

- **A look is the commit that first holds a locked row file's content.** For every file under a locked folder's
  ``rows/``, its first reveal is the earliest commit in which any content that path ever had appeared anywhere in
  ``results/`` (so a row file copied or moved from another folder keeps its first date). A folder's look is its
  earliest reveal; each later commit that reveals more of its rows (another seed, an oracle row) is counted too.
- **A pre-registration counts if its first commit precedes the look.** Commits that change it after the look are
  amendments after the look; the folder must declare them (``after_look``: one line each, naming the commit).
- **Locked rows are never edited**: a row file of a locked folder changed after its first commit fails.
- **The declaration must agree with git**: the declared date no later than the look (a few minutes' slack for a
  declaration written as the rows were committed) and no more than a day before it; a folder whose
  ``experiment.yaml`` once declared a locked split declares one still; from ``PREREGISTERED_FROM`` on (by git's
  date of the look, not the declared one), a look without a pre-registration committed before it is refused.

``ledger`` gives the looks per dataset in git's order; ``problems`` gives every disagreement; both take the results
folder of a git checkout with its full history (a shallow clone is deepened where a remote answers).
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from epr.experiments.declaration import FILE, LOCKED, PREREGISTERED_FROM, Experiment, load

__all__ = ["History", "Look", "read", "ledger", "problems", "SLACK_MINUTES", "BEFORE_HOURS"]

SLACK_MINUTES = 10  # a declaration dated as its rows were committed may be a few minutes after the commit
BEFORE_HOURS = 24  # and no more than a day before the look it describes (a run dated at its start)
PENDING = 1 << 62  # the commit index of a file not committed yet


class NoHistory(RuntimeError):
    """The results folder is not in a git checkout with its full history."""


@dataclass
class History:
    """``results/``'s git history in one pass: commits oldest first, each path's versions, each content's first
    commit."""

    root: Path  # the repository's top
    commits: list[tuple[str, int]]  # (hash, commit time, unix seconds), oldest first
    versions: dict[
        str, list[tuple[int, str | None]]
    ]  # repository path -> [(commit index, blob or None: deleted)]
    first_seen: dict[str, int]  # blob -> index of the first commit holding it under results/
    first_paths: dict[str, set[str]]  # blob -> the paths holding it in that first commit

    def date(self, i: int) -> str:
        if i >= PENDING:
            return "not committed"
        t = _dt.datetime.fromtimestamp(self.commits[i][1], _dt.timezone.utc)
        return t.strftime("%Y-%m-%d %H:%M")

    def short(self, i: int) -> str:
        return "uncommitted" if i >= PENDING else self.commits[i][0][:7]

    def rel(self, p: Path) -> str:
        return Path(os.path.relpath(Path(p).resolve(), self.root)).as_posix()

    def origin(self, path: Path) -> tuple[int, set[str]]:
        """The first commit holding any content ``path`` ever had, and the paths that held that content then
        (PENDING and no path where it was never committed)."""
        blobs = [b for _, b in self.versions.get(self.rel(path), ()) if b]
        if not blobs:
            return PENDING, set()
        b = min(blobs, key=lambda b: self.first_seen[b])
        return self.first_seen[b], self.first_paths[b]

    def first_reveal(self, path: Path) -> int:
        return self.origin(path)[0]

    def first_commit(self, path: Path) -> int:
        return self.first_reveal(path)

    def changes(self, path: Path) -> list[int]:
        """The commits that changed ``path`` (its first included)."""
        return [i for i, b in self.versions.get(self.rel(path), ()) if b]

    def contents(self, path: Path) -> list[tuple[int, str]]:
        """Every committed version of ``path``'s text, oldest first."""
        vs = [(i, b) for i, b in self.versions.get(self.rel(path), ()) if b]
        if not vs:
            return []
        out = subprocess.run(
            ["git", "-C", str(self.root), "cat-file", "--batch"],
            input="".join(f"{b}\n" for _, b in vs).encode(),
            capture_output=True,
            check=True,
        ).stdout
        texts, pos = [], 0
        for _ in vs:
            header_end = out.index(b"\n", pos)
            size = int(out[pos:header_end].split()[2])
            texts.append(out[header_end + 1 : header_end + 1 + size].decode("utf-8", "replace"))
            pos = header_end + 1 + size + 1
        return [(i, t) for (i, _), t in zip(vs, texts)]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout


def read(results: Path) -> History:
    """The history of ``results`` (raises NoHistory where there is no git checkout, or only a shallow one that
    cannot be deepened)."""
    results = Path(results).resolve()
    try:
        root = Path(_git(results, "rev-parse", "--show-toplevel").strip())
    except (OSError, subprocess.CalledProcessError) as e:
        raise NoHistory(f"{results} is not in a git checkout ({e})") from None
    if _git(root, "rev-parse", "--is-shallow-repository").strip() == "true":
        try:  # the CI checkout may be shallow: the ledger needs every commit
            _git(root, "fetch", "--quiet", "--unshallow")
        except subprocess.CalledProcessError as e:
            raise NoHistory(
                f"{root} is a shallow clone and `git fetch --unshallow` failed: {e.stderr.strip()}"
            ) from None
    where = Path(os.path.relpath(results, root)).as_posix()
    log = _git(
        root, "log", "--reverse", "--raw", "--no-abbrev", "--no-renames", "--format=C %H %ct", "--", where
    )
    commits: list[tuple[str, int]] = []
    versions: dict[str, list[tuple[int, str | None]]] = defaultdict(list)
    first_seen: dict[str, int] = {}
    first_paths: dict[str, set[str]] = defaultdict(set)
    for line in log.splitlines():
        if line.startswith("C "):
            _, h, t = line.split()
            commits.append((h, int(t)))
        elif line.startswith(":"):
            meta, path = line.split("\t", 1)
            blob = meta.split()[3]
            i = len(commits) - 1
            if set(blob) == {"0"}:
                versions[path].append((i, None))
            else:
                versions[path].append((i, blob))
                first_seen.setdefault(blob, i)
                if first_seen[blob] == i:
                    first_paths[blob].add(path)
    return History(root, commits, dict(versions), first_seen, dict(first_paths))


@dataclass
class Look:
    """A locked folder as git has it: its first reveal (the look), every commit that revealed more of its rows,
    its pre-registration's first commit and the amendments after the look."""

    exp: Experiment
    reveals: list[int]  # commit indexes, oldest first (PENDING for rows not committed yet)
    prereg: int | None = None  # the pre-registration's first commit
    amendments: list[int] = field(
        default_factory=list
    )  # commits changing the pre-registration after the look

    @property
    def look(self) -> int:
        return self.reveals[0]


def _row_files(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "rows").rglob("*") if p.is_file())


def _minutes(date: str) -> _dt.datetime | None:
    for fmt in ("%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return _dt.datetime.strptime(date, fmt).replace(tzinfo=_dt.timezone.utc)
        except ValueError:
            pass
    return None


def _folder_of(path: str) -> str:
    parts = path.split("/")
    return parts[parts.index("results") + 1] if "results" in parts[:-1] else ""


def owners(h: History, exps: list[Experiment]) -> dict[str, tuple[str, int]]:
    """Each locked row file (repository path) -> (the folder whose look revealed it, that commit index). A row
    file copied into another folder (a shared BM25 or LM-Oracle row) belongs to the folder that held it first; a
    file first committed under a folder that no longer exists (renamed since) belongs to every folder that holds
    it now."""
    names = {e.name for e in exps}
    out: dict[str, tuple[str, int]] = {}
    for e in exps:
        if not e.locked:
            continue
        for f in _row_files(e.folder):
            i, paths = h.origin(f)
            firsts = {_folder_of(p) for p in paths} & names
            out[h.rel(f)] = (e.name if not firsts or e.name in firsts else sorted(firsts)[0], i)
    return out


def looks(h: History, exps: list[Experiment]) -> list[Look]:
    own = owners(h, exps)
    out = []
    for e in exps:
        if not e.locked:
            continue
        reveals = sorted({i for p, (who, i) in own.items() if who == e.name and _folder_of(p) == e.name})
        if not reveals:  # every row borrowed from another look: nothing of the locked split seen anew here
            continue
        lk = Look(e, reveals)
        if e.preregistration:
            pre = e.folder / e.preregistration
            lk.prereg = h.first_commit(pre)
            lk.amendments = [i for i in h.changes(pre) if i >= lk.look and i != lk.prereg]
        out.append(lk)
    return out


def ledger(h: History, exps: list[Experiment]) -> dict[str, list[Look]]:
    """The locked looks per dataset, in git's order (a folder's first reveal; ties by name)."""
    by: dict[str, list[Look]] = defaultdict(list)
    for lk in looks(h, exps):
        by[lk.exp.dataset].append(lk)
    return {ds: sorted(v, key=lambda lk: (lk.look, lk.exp.name)) for ds, v in by.items()}


def _split_history(h: History, e: Experiment) -> list[tuple[int, str]]:
    out = []
    for i, text in h.contents(e.folder / FILE):
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(d, dict) and d.get("split"):
            out.append((i, str(d["split"])))
    return out


def problems(h: History, exps: list[Experiment]) -> list[str]:
    """Every place a declaration disagrees with git (empty: the ledger is git's)."""
    out: list[str] = []
    for e in exps:  # a split once declared locked stays locked
        if e.locked:
            continue
        was = [(i, s) for i, s in _split_history(h, e) if s in LOCKED]
        if was:
            i, s = was[0]
            out.append(
                f"{e.name}: declares split {e.split!r}, but its {FILE} declared {s!r} in {h.short(i)} "
                f"({h.date(i)}): a look at a locked split stays one"
            )
    for e in exps:  # a locked row file, once committed, is never edited (a rerun is a new file)
        if not e.locked:
            continue
        for f in _row_files(e.folder):
            first, *later = h.changes(f) or [PENDING]
            if later:
                out.append(
                    f"{e.name}: {f.relative_to(e.folder)} was changed in {h.short(later[0])} ({h.date(later[0])}) "
                    f"after its first commit {h.short(first)} ({h.date(first)}): locked rows are never edited"
                )
    rule = _minutes(PREREGISTERED_FROM)
    for lk in looks(h, exps):
        e, first = lk.exp, lk.look
        when = h.date(first)
        declared = _minutes(e.date)
        if first < PENDING and declared is not None:
            git_t = _dt.datetime.fromtimestamp(h.commits[first][1], _dt.timezone.utc)
            if declared > git_t + _dt.timedelta(minutes=SLACK_MINUTES):
                out.append(
                    f"{e.name}: declares date {e.date}, after its first locked rows were committed "
                    f"({h.short(first)}, {when}): the look's date is git's"
                )
            elif declared < git_t - _dt.timedelta(hours=BEFORE_HOURS):
                out.append(
                    f"{e.name}: declares date {e.date}, more than {BEFORE_HOURS} h before its first locked rows "
                    f"were committed ({h.short(first)}, {when}): the look's date is git's"
                )
        git_dt = (
            _dt.datetime.now(_dt.timezone.utc)
            if first >= PENDING
            else _dt.datetime.fromtimestamp(h.commits[first][1], _dt.timezone.utc)
        )
        if git_dt >= rule:
            if not e.preregistration:
                out.append(
                    f"{e.name}: its look ({when}) is after {PREREGISTERED_FROM} and has no pre-registration"
                )
            elif lk.prereg is None or lk.prereg >= PENDING or lk.prereg >= first:
                committed = lk.prereg is not None and lk.prereg < PENDING
                pre = (
                    f"was first committed in {h.short(lk.prereg)} ({h.date(lk.prereg)})"
                    if committed
                    else ("is not committed")
                )
                out.append(
                    f"{e.name}: its pre-registration {e.preregistration} {pre}, not before its look "
                    f"({h.short(first)}, {when}): a pre-registration counts only if committed before the rows"
                )
        declared_after = list(e.after_look)
        for i in lk.amendments:
            if not any(h.short(i) in line for line in declared_after):
                out.append(
                    f"{e.name}: {e.preregistration} was changed in {h.short(i)} ({h.date(i)}), after the look "
                    f"({h.short(first)}, {when}); list it under after_look (one line naming {h.short(i)})"
                )
    for ds, lks in ledger(h, exps).items():  # the index lists looks by declared date: it must be git's order
        by_date = sorted(lks, key=lambda lk: (lk.exp.date, lk.exp.name))
        if [lk.exp.name for lk in by_date] != [lk.exp.name for lk in lks]:
            for k, (a, b) in enumerate(zip(by_date, lks), 1):
                if a is not b:
                    out.append(
                        f"{ds}: look {k} is {b.exp.name} by git ({h.date(b.look)}) but {a.exp.name} by the declared "
                        f"dates ({a.exp.date}): correct the declared date to git's"
                    )
                    break
    return out


def load_all(results: Path) -> list[Experiment]:
    from epr.experiments.check import folders

    return [load(f) for f in folders(results)]
