"""Pack a lent GPU machine's run root into what the device tool returns (scripts/gpu_runs.sh calls this; standard
library only, since the machine's own python3 runs it). The tool returns at most 8 files from $OUT, 16 MiB each and
64 MiB together, and leaves out what does not fit, so the packing decides what comes back:

1. ``records.tgz``: every run's record, always: its manifests, reports, configs, plots, and the per-example rows of
   its evaluations and of ``select`` (what ``epr experiment record`` reads), without the bulk below. Small (about
   0.3 MB a run), so it holds every run of the lease in one file.
2. ``run-<name>.tgz``: a run's folder whole but for its weights and caches (its candidates, scores, labels,
   retrievals, prompts and predictions too: the raw output kept beside the record), as many as the limits leave
   room for: first the runs that changed since this machine last packed them, finished ones before unfinished ones,
   then the others, each only if it fits. What is left is named in ``packing.txt`` and comes in a later call.
3. ``runs.tgz``: the run root's own files (the runs' logs, markers) and ``packing.txt``, last.

Files already in $OUT (the score export) count against the limits.

    python3 scripts/gpu_pack.py RUN_ROOT OUT
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import time
from pathlib import Path

MiB = 1024 * 1024
MAX_FILES, MAX_BYTES, FILE_MAX = 8, 60 * MiB, 16 * MiB  # the tool's 8 files, 64 MiB (4 spare), 16 MiB a file
WEIGHTS = (".safetensors", ".npy", ".bin", ".faiss")
# rebuilt by any run (the pool is the payload's data)
NOT_PACKED = ("pool.jsonl", "tokenizer.json", "vocab.txt")
STAMP = ".packed"  # in a run's folder: the newest change of the run this machine packed whole


def kept(rel: Path) -> bool:
    """Whether a run's file goes into its whole archive: not its weights, caches or chunk parts."""
    parts = rel.parts
    return not (
        rel.name.endswith(WEIGHTS) or rel.name in NOT_PACKED or rel.name == STAMP or ".cache" in parts
        or "parts" in parts[:-1] or rel.name.endswith(".tmp")  # a file epr writes now (renamed when whole)
    )  # fmt: skip


def record_file(rel: Path) -> bool:
    """Whether a kept file is part of the run's record: everything but the bulk rows, which are every ``.jsonl``
    outside an ``evaluate`` or ``select`` folder (candidates, scores, labels, retrievals, prompts, predictions)."""
    return kept(rel) and not (rel.suffix == ".jsonl" and not {"evaluate", "select"} & set(rel.parts[:-1]))


def _files(run: Path, keep) -> list[Path]:
    """The run's files ``keep`` takes, as they are now: a lane writes beside the packing, so a folder or file that
    goes while they are listed is left out (os.walk's errors ignored), not an error."""
    out = []
    for d, _dirs, names in os.walk(run):
        for n in names:
            p = Path(d) / n
            if keep(p.relative_to(run)):
                out.append(p)
    return sorted(out)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:  # gone since it was listed
        return 0.0


def _newest(run: Path) -> float:
    return max((_mtime(p) for p in _files(run, kept)), default=0.0)


def _finished(run: Path) -> bool:
    return any((run / d / "manifest.json").exists() for d in ("evaluate", "locked/evaluate"))


def _tar(dest: Path, root: Path, members: list[Path], extra: dict[str, bytes] | None = None) -> int:
    """A gzipped tar of ``members`` (named from ``root``) and of ``extra`` (name: bytes); its size. Each file is
    read whole before it goes in: a lane still writes beside the packing, and a file it replaces or removes
    meanwhile is left for a later call rather than cut short in the archive."""
    with tarfile.open(dest, "w:gz") as t:
        for p in members:
            name = str(p.relative_to(root))
            if p.is_dir():
                t.add(p, arcname=name, recursive=False)
                continue
            try:
                data, mtime = p.read_bytes(), p.stat().st_mtime
            except OSError:
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(mtime), 0o644
            t.addfile(info, io.BytesIO(data))
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            t.addfile(info, io.BytesIO(data))
    return dest.stat().st_size


def pack(root: Path, out: Path, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES,
         file_max: int = FILE_MAX) -> dict:  # fmt: skip
    """Write records.tgz, as many run-<name>.tgz as fit, and runs.tgz into ``out``; return what went where."""
    root, out = Path(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    used = [p.stat().st_size for p in out.iterdir() if p.is_file()]
    top = root.parent
    rec = _tar(out / "records.tgz", top, [f for r in runs for f in _files(r, record_file)])
    used.append(rec)
    log_reserve = sum(p.stat().st_size for p in root.iterdir() if p.is_file()) + MiB  # runs.tgz, at most
    report = {"records.tgz": [r.name for r in runs], "whole": [], "left": []}

    newest = {r: _newest(r) for r in runs}  # walked once a run: it orders the runs and stamps the packed ones

    def order(r: Path) -> tuple:
        stamp = r / STAMP
        changed = not stamp.exists() or float(stamp.read_text() or 0) < newest[r]
        return (not changed, not _finished(r), r.name)

    for r in sorted(runs, key=order):
        dest = out / f"run-{r.name}.tgz"
        room = max_bytes - sum(used) - log_reserve
        if len(used) + 1 >= max_files or room <= 0:  # one file kept for runs.tgz
            report["left"].append(r.name)
            continue
        try:
            size = _tar(dest, top, [r, *_files(r, kept)])
        except OSError as e:  # the run's folder changed under the packing: it comes in a later call
            dest.unlink(missing_ok=True)
            report["left"].append(f"{r.name} ({e.__class__.__name__})")
            continue
        if size > min(room, file_max):
            dest.unlink()
            report["left"].append(f"{r.name} ({size / MiB:.1f} MiB)")
            continue
        used.append(size)
        (r / STAMP).write_text(repr(newest[r]))
        report["whole"].append(r.name)
    text = "".join(f"{k}: {' '.join(v) or '-'}\n" for k, v in report.items())
    logs = [p for p in sorted(root.iterdir()) if p.is_file()]
    _tar(out / "runs.tgz", top, logs, {f"{root.name}/packing.txt": text.encode()})
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    report = pack(a.root, a.out)
    for k, v in report.items():
        print(f"gpu_pack {k}: {' '.join(v) or '-'}")
    for p in sorted(a.out.iterdir()):
        size = p.stat().st_size
        print(f"gpu_pack {p.name}: {size / MiB:.2f} MiB")
        if size > FILE_MAX:  # the score export is packed before this script sees it
            print(
                f"gpu_pack: {p.name} is over the {FILE_MAX // MiB} MiB a returned file: it will not come back"
            )


if __name__ == "__main__":
    main()
