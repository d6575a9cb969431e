"""A content-keyed store of LM scores, shared by every run under one ``run_root``.

A score ``log p(target | context)`` depends on the two texts and on how the LM computed it: the model, the dtype it
ran in, the forward (lean or transformers) and, in bf16, the batch layout (``scoring_key`` names all of these).
Entries are keyed by a hash of (context, target) inside a folder named by the fingerprint of that computation key,
so a run with a larger label set reuses every score a smaller one computed, and a change of model, dtype or
forward never reads another computation's scores. Shards are written atomically, one per finished chunk, so a
killed run loses at most the chunk it was scoring. A shard is named by a digest of its entries, so no write
replaces another, within a process or across processes.

A store whose key says ``"quantity": "generation"`` holds the predict stage's greedy generations the same way: per
(prompt, gold answer) the pair ``[prediction, log p(gold | prompt) or null]``, under the generation settings and the
LM's key, so a prompt any earlier run generated for (BM25's, the LM-Oracle's: the same in every run of a dataset) is
not generated again, and ``epr cache export`` carries generations between machines like scores.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Sequence
from pathlib import Path

from epr.artifacts import atomic_write_text, remove_stale_temps
from epr.cache import fingerprint

__all__ = [
    "ScoreCache",
    "pair_key",
    "cached_scores",
    "cached_greedy",
    "greedy_cache",
    "export_scores",
    "import_scores",
    "read_export",
]

log = logging.getLogger(__name__)


PAIR_KEY = re.compile(r"[0-9a-f]{24}")  # what pair_key writes
GENERATION = "generation"  # a store's ``quantity`` whose values are ``[prediction, gold log-prob or None]``


def _valid(kind: str | None, v) -> bool:
    """Whether ``v`` is a value a store of this ``quantity`` holds: a finite number (a score, a greedy flag), or
    for a generation store ``[text, finite number or null]``."""
    if kind == GENERATION:
        return (
            isinstance(v, list)
            and len(v) == 2
            and isinstance(v[0], str)
            and (v[1] is None or _valid(None, v[1]))
        )
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _value(kind: str | None, v):
    return [str(v[0]), None if v[1] is None else float(v[1])] if kind == GENERATION else float(v)


def _differs(kind: str | None, a, b, tol: float) -> bool:
    """Two values of one entry that disagree: another text, or numbers more than ``tol`` apart."""
    if kind == GENERATION:
        return (
            a[0] != b[0] or (a[1] is None) != (b[1] is None) or (a[1] is not None and abs(a[1] - b[1]) > tol)
        )
    return abs(a - b) > tol


def pair_key(context: str, target: str) -> str:
    return hashlib.sha1(f"{context}\x1f{target}".encode()).hexdigest()[:24]


class ScoreCache:
    def __init__(self, root: str | Path, key: dict):
        self.key, self.kind = key, key.get("quantity")
        self.dir = Path(root) / fingerprint(key)
        self.dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.dir)
        kf = self.dir / "KEY.json"
        if not kf.exists():
            atomic_write_text(kf, json.dumps(key, indent=2, sort_keys=True) + "\n")
        self._mem: dict[str, float | list] = {}
        self._seen: set[str] = set()
        self._others: list[ScoreCache] = []
        self.served: dict[str, int] = {}  # scores each accepted store served (``accept``)
        self.refresh()

    @classmethod
    def open(cls, store: str | Path) -> ScoreCache:
        """An existing store, by its folder (its key is read from its ``KEY.json``)."""
        store = Path(store)
        cache = cls(store.parent, json.loads((store / "KEY.json").read_text(encoding="utf-8")))
        if cache.dir != store:
            raise RuntimeError(f"score cache {store}: its KEY.json names another store ({cache.dir.name})")
        return cache

    def accept(self, others: Sequence[ScoreCache]) -> None:
        """Serve a pair's score from the first of ``others`` that holds it, before this store (read only: new
        scores are written to this store); ``served`` counts the look-ups each of them answered."""
        self._others = list(others)
        self.served = {o.dir.name: 0 for o in self._others}

    def refresh(self) -> None:
        """Read shards written since the last call (by this or another process)."""
        for f in sorted(self.dir.glob("shard-*.json")):
            if f.name in self._seen:
                continue
            try:
                self._mem.update(json.loads(f.read_text(encoding="utf-8")))
            except (json.JSONDecodeError, OSError) as e:  # a shard is written atomically: this is corruption
                log.warning("score cache: unreadable shard %s (%s); ignored", f, e)
                continue
            self._seen.add(f.name)

    def __len__(self) -> int:
        return len(self._mem)

    def items(self) -> dict[str, float]:
        """Every held score by pair key (a copy)."""
        return dict(self._mem)

    def get(self, contexts: Sequence[str], targets: Sequence[str]) -> list[float | None]:
        keys = [pair_key(c, t) for c, t in zip(contexts, targets)]
        out: list[float | None] = [None] * len(keys)
        for other in self._others:  # the accepted stores first: a run's labels do not depend on what this
            for i, k in enumerate(keys):  # device's store happened to hold already
                if out[i] is None and (v := other._mem.get(k)) is not None:
                    out[i] = v
                    self.served[other.dir.name] += 1
        return [self._mem.get(k) if v is None else v for k, v in zip(keys, out)]

    def sources(self, pairs: set[str]) -> dict[str, int]:
        """How many of ``pairs`` (pair keys) each store serves, in :meth:`get`'s order: the accepted stores, then
        this one; ``missing``: held by none."""
        left, out = set(pairs), {}
        for c in [*self._others, self]:
            mine = {k for k in left if k in c._mem}
            out[c.dir.name] = len(mine)
            left -= mine
        return out | {"missing": len(left)}

    def put(self, contexts: Sequence[str], targets: Sequence[str], scores: Sequence, name: str) -> None:
        """Add one finished chunk's values (scores; for a generation store ``[prediction, gold log-prob]``)."""
        new = {pair_key(c, t): _value(self.kind, s) for c, t, s in zip(contexts, targets, scores)}
        if not new:
            return
        # named by its content: no write replaces another (in one process or across processes), and the same
        # entries written twice are one file
        f = self.dir / f"shard-{name}-{fingerprint(new)}.json"
        if not f.exists():
            atomic_write_text(f, json.dumps(new, sort_keys=True))
        self._seen.add(f.name)
        self._mem.update(new)


def cached_scores(
    scorer,
    cache: ScoreCache | None,
    contexts: list[str],
    targets: list[str],
    name: str,
    chunk: int = 256,
    progress: bool = True,
):
    """``(n,) float64`` log p(target | context) from ``cache`` where it has them, else from ``scorer`` (added to
        the cache under ``name`` every ``chunk`` pairs, so a killed run loses at most one chunk); NaN for a pair longer
        than the LM's context. A progress bar when more than one chunk is to be scored (``progress=False``: the caller
    shows its own)."""
    import numpy as np
    from tqdm.auto import tqdm

    known = cache.get(contexts, targets) if cache is not None else [None] * len(contexts)
    out = np.array([np.nan if v is None else v for v in known], dtype=np.float64)
    todo = [i for i, v in enumerate(known) if v is None]
    if not todo:
        return out
    pairs = scorer.encode([contexts[i] for i in todo], [targets[i] for i in todo])
    long = set(scorer.too_long(pairs))
    ok = [j for j in range(len(todo)) if j not in long]
    with tqdm(
        total=len(ok), desc=f"scoring [{name}]", unit="seq", disable=not progress or len(ok) <= chunk
    ) as bar:
        for a in range(0, len(ok), chunk):
            part = ok[a : a + chunk]
            c_ok, t_ok = [contexts[todo[j]] for j in part], [targets[todo[j]] for j in part]
            vals = np.round(scorer.score_pairs(c_ok, t_ok, [pairs[j] for j in part]), 4)
            out[[todo[j] for j in part]] = vals
            if cache is not None:
                cache.put(c_ok, t_ok, list(vals), name)
            bar.update(len(part))
    return out


def greedy_cache(cache: ScoreCache) -> ScoreCache:
    """The store of greedy-match flags (1.0 / 0.0) beside ``cache``: the same computation key plus what it holds."""
    return ScoreCache(cache.dir.parent, {**cache.key, "quantity": "greedy_match"})


def cached_greedy(
    scorer, cache: ScoreCache | None, contexts: list[str], targets: list[str], name: str, chunk: int = 256
):
    """``(log p, greedy)`` for each pair: the summed log-prob as :func:`cached_scores` gives it (a score the cache
    holds is served unchanged) and whether greedy decoding after the context reproduces the target token for token
    (``LMScorer.score_greedy``: ``1.0`` / ``0.0``, NaN for a pair longer than the LM's context). Both come from one
    forward pass per pair not yet in the greedy store (kept beside ``cache``, written every ``chunk`` pairs)."""
    import numpy as np
    from tqdm.auto import tqdm

    if not hasattr(scorer, "score_greedy"):
        raise ValueError(f"{type(scorer).__name__} cannot check greedy matches: it needs the in-process LM")
    gcache = greedy_cache(cache) if cache is not None else None
    known = gcache.get(contexts, targets) if gcache is not None else [None] * len(contexts)
    match = np.array([np.nan if v is None else v for v in known], dtype=np.float64)
    lp = (
        cached_scores(scorer, cache, contexts, targets, name, chunk, progress=False)
        if all(v is not None for v in known)
        else None
    )
    if lp is not None:
        return lp, match
    old = cache.get(contexts, targets) if cache is not None else [None] * len(contexts)
    lp = np.array([np.nan if v is None else v for v in old], dtype=np.float64)
    todo = [i for i, v in enumerate(known) if v is None]
    pairs = scorer.encode([contexts[i] for i in todo], [targets[i] for i in todo])
    long = set(scorer.too_long(pairs))
    ok = [j for j in range(len(todo)) if j not in long]
    with tqdm(total=len(ok), desc=f"greedy check [{name}]", unit="seq", disable=len(ok) <= chunk) as bar:
        for a in range(0, len(ok), chunk):
            part = ok[a : a + chunk]
            rows = [todo[j] for j in part]
            c_ok, t_ok = [contexts[i] for i in rows], [targets[i] for i in rows]
            vals, m = scorer.score_greedy([pairs[j] for j in part])
            vals = np.round(vals, 4)
            new = [k for k, i in enumerate(rows) if old[i] is None]  # a held score is served, not replaced
            lp[[rows[k] for k in new]] = vals[new]
            match[rows] = m.astype(np.float64)
            if cache is not None:
                cache.put([c_ok[k] for k in new], [t_ok[k] for k in new], list(vals[new]), name)
                gcache.put(c_ok, t_ok, list(m.astype(np.float64)), name)
            bar.update(len(part))
    return lp, match


FORMAT = "epr-score-cache/1"


def read_export(path: str | Path) -> list[dict]:
    """The stores (``{"key", "scores"}``) of an :func:`export_scores` file, every one checked before any is used: a
    file that is not such an export, or holds a score that is not a number, is an error naming the file and store."""
    import gzip

    from epr.types import InputError

    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError) as e:
        raise InputError(
            f"{path}: not a score-cache export (gzipped JSON from `epr cache export`): {e}"
        ) from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"{path}: not a score-cache export (expected format {FORMAT!r})")
    stores = data.get("stores")
    if not isinstance(stores, list):
        raise InputError(f"{path}: 'stores' is not a list")
    for i, s in enumerate(stores):  # every store checked before anything is written
        if (
            not isinstance(s, dict)
            or not isinstance(s.get("key"), dict)
            or not isinstance(s.get("scores"), dict)
        ):
            raise InputError(f"{path}: store #{i} has no key/scores mapping")
        empty = [
            f
            for f, v in s["key"].items()
            if v is None or v == "" or not isinstance(v, (str, int, float, list, dict))
        ]
        if not s["key"] or empty:  # a store key names the computation: every field a value
            raise InputError(
                f"{path}: store #{i}: its computation key has empty or untyped fields {empty or '(none)'}"
            )
        kind = s["key"].get("quantity")
        bad = [k for k, v in s["scores"].items() if not _valid(kind, v)]
        if bad:  # JSON's NaN / Infinity too: a log-probability is a finite number
            what = "[prediction, finite log-prob or null] pairs" if kind == GENERATION else "finite numbers"
            raise InputError(f"{path}: store #{i}: {len(bad)} values are not {what} (first pair {bad[0]})")
        keys = [k for k in s["scores"] if not PAIR_KEY.fullmatch(k)]
        if keys:
            raise InputError(
                f"{path}: store #{i}: {len(keys)} pair keys are not pair_key digests (first {keys[0]!r})"
            )
    return stores


def export_scores(
    root: str | Path,
    path: str | Path,
    key: dict | list[dict] | None = None,
    only: set[str] | None = None,
    skip: Sequence[str | Path] = (),
) -> dict[str, int]:
    """Write the score stores under ``root`` (a run root's ``.cache/scores``; only ``key``'s when given, or the
    stores of a list of keys) to one gzipped JSON file that :func:`import_scores` reads on another machine: labels
    scored once travel with a repository instead of being scored again. ``only``: just these pair keys
    (:func:`pair_key`; one run's pairs), each from the first of the stores that holds it (a run's own store, then
    those it accepts: ``ScoreCache.accept``); a pair of ``only`` that no store holds is an error (the run is not
    fully scored). ``skip``: earlier
    exports whose pairs (of the same store) are left out, so a long run carried across machines in stages commits
    each stage's new scores once (a store left with none is not written). Returns entries per store fingerprint."""
    import gzip

    from epr.types import InputError

    root = Path(root)
    carried: dict[str, set[str]] = {}
    for p in skip:
        if Path(p).resolve() == Path(path).resolve():
            raise InputError(f"{p}: the file to write is also one to skip; name the new stage another file")
        for s in read_export(p):
            carried.setdefault(fingerprint(s["key"]), set()).update(s["scores"])
    keys = [key] if isinstance(key, dict) else key
    dirs = (
        [root / fingerprint(k) for k in keys]
        if keys is not None
        else sorted(p.parent for p in root.glob("*/KEY.json"))
    )
    stores, counts = [], {}
    taken: set[str] = set()  # ``only``'s pairs an earlier store gave
    carried_any = set().union(*(carried.get(d.name, set()) for d in dirs))  # --skip files, these stores only
    for d in dirs:
        if not (d / "KEY.json").exists():
            raise FileNotFoundError(f"{d}: no score store for this computation (nothing scored yet?)")
        c = ScoreCache.open(d)  # its KEY.json must name this very store
        held = c.items()
        done = carried.get(d.name, set())
        if only is not None:
            held = {k: held[k] for k in only - taken if k in held}
            taken |= held.keys()
        held = {k: v for k, v in held.items() if k not in done}
        stores.append({"key": c.key, "scores": dict(sorted(held.items()))})
        counts[d.name] = len(held)
    if not stores:
        raise FileNotFoundError(f"{root}: no score stores to export")
    missing = set() if only is None else only - taken - carried_any
    if missing:
        raise FileNotFoundError(
            f"{dirs[0]}: {len(missing)} of the run's {len(only)} pairs are not scored yet; finish the scores "
            "stage first (the export would be partial)"
        )
    # a store that earlier stages carry whole is not written again
    stores = [s for s in stores if s["scores"] or not skip]
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "stores": stores}, f)
    tmp.replace(path)
    return counts


def import_scores(root: str | Path, path: str | Path, tol: float = 1e-3) -> dict[str, dict[str, int]]:
    """Add the scores of an :func:`export_scores` file to the stores under ``root``, each into the store of its own
    computation key (so they are served only to the same model, dtype and forward). Scores the store already holds
    are kept; one that differs by more than ``tol`` nats is counted as a conflict (and logged), never replaced.
    Returns ``{store: {"added", "kept", "conflicts"}}``."""
    out = {}
    for s in read_export(path):
        c = ScoreCache(root, s["key"])
        held = c.items()
        new = {k: _value(c.kind, v) for k, v in s["scores"].items() if k not in held}
        conflicts = [k for k, v in s["scores"].items() if k in held and _differs(c.kind, held[k], v, tol)]
        if conflicts:
            log.warning(
                "score cache import: %d entries differ from the store's %s (by > %g nats or in text); the store's kept",
                len(conflicts),
                c.dir,
                tol,
            )
        if new:
            f = c.dir / f"shard-imported-{fingerprint(new)}.json"
            atomic_write_text(f, json.dumps(new, sort_keys=True))
            c.refresh()
        out[c.dir.name] = {
            "added": len(new),
            "kept": len(s["scores"]) - len(new),
            "conflicts": len(conflicts),
        }
    return out
