"""scripts/gpu_pack.py: what a lent GPU machine's call returns, inside the device tool's limits on returned files."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load_pack():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_pack", ROOT / "scripts" / "gpu_pack.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_folder(root: Path, name: str, bulk: int, finished: bool = True) -> None:
    r = root / name
    for d in (
        "candidates",
        "scores",
        "labels",
        "locked/prompts",
        "select",
        "locked/evaluate",
        "encoder/model",
    ):
        (r / d).mkdir(parents=True, exist_ok=True)
    (r / "candidates" / "candidates.jsonl").write_bytes(
        os.urandom(bulk)
    )  # incompressible: its size is its size
    (r / "scores" / "scores.jsonl").write_text("{}\n")
    (r / "scores" / "manifest.json").write_text("{}")
    (r / "locked" / "prompts" / "epr.jsonl").write_text("{}\n")
    (r / "select" / "per_example.jsonl").write_text("{}\n")
    (r / "select" / "report.json").write_text("{}")
    (r / "encoder" / "model" / "model.safetensors").write_bytes(b"0" * 100)
    if finished:
        (r / "locked" / "evaluate" / "per_query.jsonl").write_text("{}\n")
        (r / "locked" / "evaluate" / "manifest.json").write_text("{}")


def test_packing_returns_every_record_and_whole_runs_within_the_devices_limits(tmp_path):
    """What the device returns is at most 8 files, 16 MiB each, 64 MiB together, and it leaves out the rest: every
    run's record (what ``epr experiment record`` reads) comes back in one file whatever the count of runs; whole runs
    come as room allows, the ones changed since the last packing first and finished before unfinished; the rest
    is named in packing.txt and comes in a later call."""
    import tarfile

    pack = _load_pack()
    R, out = tmp_path / "runs", tmp_path / "out"
    R.mkdir()
    (R / "0.log").write_text("log")
    MiB = 1024 * 1024
    for name, finished in (("a", True), ("b", False), ("c", True)):
        _run_folder(R, name, 3 * MiB, finished)
    _run_folder(R, "huge", 5 * MiB)
    out.mkdir()
    (out / "scores.json.gz").write_bytes(b"0" * MiB)  # the score export, there first: it counts
    got = pack.pack(R, out, max_files=8, max_bytes=int(10.5 * MiB), file_max=4 * MiB)
    assert got["records.tgz"] == ["a", "b", "c", "huge"]
    with tarfile.open(out / "records.tgz") as f:
        names = set(f.getnames())
    for r in ("a", "b", "c", "huge"):  # the rows record reads, the manifests; not the bulk, not the weights
        assert {
            f"runs/{r}/select/per_example.jsonl",
            f"runs/{r}/select/report.json",
            f"runs/{r}/scores/manifest.json",
        } <= names
    assert "runs/a/locked/evaluate/per_query.jsonl" in names
    assert not [
        n for n in names if n.endswith(("candidates.jsonl", "scores.jsonl", "epr.jsonl", ".safetensors"))
    ]
    # 10.5 MiB less 1 (scores) less the log reserve (1 MiB and the logs): a and c (finished) fit, b does not; huge is
    # over the 4 MiB a file
    assert got["whole"] == ["a", "c"], got
    assert sorted(got["left"]) == ["b (3.0 MiB)", "huge (5.0 MiB)"], got
    with tarfile.open(out / "run-a.tgz") as f:
        names = set(f.getnames())
    assert (
        "runs/a/candidates/candidates.jsonl" in names
        and "runs/a/encoder/model/model.safetensors" not in names
    )
    with tarfile.open(out / "runs.tgz") as f:
        text, logs = f.extractfile("runs/packing.txt").read().decode(), f.getnames()
    assert "whole: a c\n" in text and "left: " in text and "runs/0.log" in logs
    assert sum(p.stat().st_size for p in out.iterdir()) <= 10.5 * MiB and len(list(out.iterdir())) <= 8

    # the next call: a and c unchanged, so b goes first; then a changes and goes before c
    for p in out.glob("*.tgz"):
        p.unlink()
    got = pack.pack(R, out, max_files=8, max_bytes=int(10.5 * MiB), file_max=4 * MiB)
    assert got["whole"][0] == "b"
    (R / "a" / "scores" / "manifest.json").write_text('{"more": 1}')
    import time

    t = time.time() + 5
    os.utime(R / "a" / "scores" / "manifest.json", (t, t))
    for p in out.glob("*.tgz"):
        p.unlink()
    got = pack.pack(R, out, max_files=8, max_bytes=int(10.5 * MiB), file_max=4 * MiB)
    assert got["whole"][0] == "a"
    # the file count binds too: one file left beside scores and records is runs.tgz's
    for p in out.glob("*.tgz"):
        p.unlink()
    got = pack.pack(R, out, max_files=3, max_bytes=64 * MiB, file_max=16 * MiB)
    assert got["whole"] == [] and len(list(out.iterdir())) == 3


def test_packing_goes_on_while_a_lane_writes(tmp_path, monkeypatch):
    """A lane writes beside the packing: epr's files being written (``*.tmp``, renamed when whole) are not packed,
    and a file that goes between its listing and its packing is left out, not an error that would stop the call
    from returning anything."""
    import tarfile

    pack = _load_pack()
    R, out = tmp_path / "runs", tmp_path / "out"
    _run_folder(R, "a", 1000)
    (R / "a" / "scores" / ".scores.jsonl.123.tmp").write_text("half")
    got = pack.pack(R, out)
    assert got["whole"] == ["a"]
    with tarfile.open(out / "run-a.tgz") as f:
        assert not [n for n in f.getnames() if n.endswith(".tmp")]
    files = pack._files
    monkeypatch.setattr(pack, "_files", lambda run, keep: [*files(run, keep), run / "gone.json"])
    for p in out.iterdir():
        p.unlink()
    got = pack.pack(R, out)  # the vanished file: no stat error, no tar error
    assert got["whole"] == ["a"] and (out / "records.tgz").exists() and (out / "runs.tgz").exists()
