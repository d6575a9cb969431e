"""scripts/gpu_runs.sh's lanes, on this machine with a stand-in for ``python -m epr.cli``: the runs of one lane run in
order, two lanes run side by side, a failed run ends its own lane only (its number in ``failed``), every run gets the
run root and the payload's data, and a second call with the same RUNS starts nothing again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUB = """
import json, sys, time
args = sys.argv[3:]  # after "-m epr.cli"
name = args[args.index("--name") + 1]
log = sys.argv[0] + ".jsonl"
with open(log, "a") as f:
    f.write(json.dumps({"name": name, "at": time.time(), "args": args}) + "\\n")
time.sleep(float(args[args.index("--sleep") + 1]))
with open(log, "a") as f:
    f.write(json.dumps({"name": name, "end": time.time()}) + "\\n")
sys.exit(3 if name.startswith("fail") else 0)
"""


def _call(tmp: Path, runs: str, limit: int = 60, extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": f"{sys.executable} {tmp / 'stub.py'}", "S": str(tmp / "s"), "T": str(tmp / "t"),
           "R": str(tmp / "runs"), "LIMIT": str(limit), "POLL": "0.2", "RUNS": runs, **(extra or {})}  # fmt: skip
    env.pop("OUT", None)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_runs.sh")], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_lanes_run_side_by_side_each_in_order_and_a_failure_ends_only_its_lane(tmp_path):
    import json

    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()  # the payload is installed already: only the runs are under test
    runs = "--name a --sleep 3;--name b --sleep 0.2|--name fail-c --sleep 0.2;--name d --sleep 0.1|--name e --sleep 0.5"
    out = _call(tmp_path, runs)
    assert out.returncode == 0, out.stderr
    R = tmp_path / "runs"
    events = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    start = {e["name"]: e["at"] for e in events if "at" in e}
    end = {e["name"]: e["end"] for e in events if "end" in e}
    assert set(start) == {"a", "b", "fail-c", "e"}  # d never starts: its lane's run before it failed
    assert start["b"] >= end["a"]  # one lane: in order
    assert start["fail-c"] < end["a"] and start["e"] < end["a"]  # three lanes: side by side
    assert (R / "failed").read_text().split() == ["2"]  # runs are numbered across lanes in RUNS order
    assert sorted(p.name for p in R.glob("*.done")) == ["0.done", "1.done", "4.done"]
    assert (R / "done").exists() and not (R / "3.log").exists()
    for e in events:
        if "args" in e:
            i = e["args"].index("--set")
            assert e["args"][i:] == [
                "--set",
                f"run_root={R}",
                "--set",
                f"data.data_dir={tmp_path / 't'}/payload/data",
            ]
    # a later call with the same RUNS waits and reports; it starts nothing again
    time.sleep(0.1)
    again = _call(tmp_path, runs, limit=5)
    assert again.returncode == 0 and len((tmp_path / "stub.py.jsonl").read_text().splitlines()) == len(events)
    assert "== " in again.stdout  # the logs' tails


def test_the_call_returns_at_its_limit_while_a_lane_still_runs(tmp_path):
    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()
    t0 = time.time()
    out = _call(tmp_path, "--name slow --sleep 6|--name quick --sleep 0.1", limit=2)
    assert out.returncode == 0 and time.time() - t0 < 5.5
    R = tmp_path / "runs"
    assert (R / "1.done").exists() and not (R / "0.done").exists() and not (R / "done").exists()
    deadline = time.time() + 15
    while not (R / "lane0.end").exists() and time.time() < deadline:  # the run outlives the call
        time.sleep(0.2)
    assert (R / "0.done").exists()


def test_the_payload_folder_is_ignored_by_git():
    """The device tool copies every untracked file git does not ignore into each call: the payload's pieces
    (.gpu/xK, ~37 MB each) must be ignored, so that each call carries only the piece named in its ``carry``. A fresh
    clone has no .git/info/exclude, so .gitignore itself must say it."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert ".gpu/" in lines
    assert ".gpu/" in (ROOT / "scripts" / "gpu_payload.sh").read_text()


def test_after_waits_for_another_lanes_file_and_never_for_ever(tmp_path):
    """``after:PATH`` holds its lane until ``$R/PATH`` exists (here run 0's done mark: seeds wait for seed 42's round-1
    scores this way), counts as no run, and lets go when a lane ends without the file ever appearing."""
    import json

    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()
    out = _call(
        tmp_path,
        "--name a --sleep 1.5;--name b --sleep 0.5| after:0.done ;--name c --sleep 0.1|after:never;--name d --sleep 0.1",
    )
    assert out.returncode == 0, out.stderr
    events = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    start = {e["name"]: e["at"] for e in events if "at" in e}
    end = {e["name"]: e["end"] for e in events if "end" in e}
    assert end["a"] <= start["c"] < end["b"]  # c waited for a's done mark, not for a's whole lane
    assert (
        start["d"] >= end["b"]
    )  # d's file never came: it went on once the lane that makes files (a, b) had ended
    R = tmp_path / "runs"
    assert sorted(p.name for p in R.glob("*.done")) == [
        "0.done",
        "1.done",
        "2.done",
        "3.done",
    ]  # barriers are not runs
    assert "found" in (R / "driver1.log").read_text()
    assert "going on without" in (R / "driver2.log").read_text()


CACHE_STUB = """
import json, sys
args = sys.argv[3:]
with open(sys.argv[0] + ".jsonl", "a") as f:
    f.write(json.dumps(args) + "\\n")
sys.exit(7 if any(a.endswith("bad.json.gz") for a in args) else 0)
"""


def test_scores_move_between_leases_import_before_the_runs_and_export_at_packing(tmp_path):
    """A lease ends with its machine: IMPORT's files go into the run root's score cache before any run starts, and
    each packing call exports every score to ``$OUT/scores.json.gz``; an import that fails starts nothing."""
    import json

    (tmp_path / "stub.py").write_text(CACHE_STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()
    R, out = tmp_path / "runs", tmp_path / "out"
    (R / ".cache" / "scores").mkdir(parents=True)
    (R / "a" / "evaluate").mkdir(parents=True)  # a run's folder, with its weights
    (R / "a" / "evaluate" / "results.md").write_text("rows")
    (R / "a" / "model.safetensors").write_bytes(b"0" * 1000)
    out.mkdir()
    env = {**os.environ, "PY": f"{sys.executable} {tmp_path / 'stub.py'}", "S": str(tmp_path / "s"),
           "T": str(tmp_path / "t"), "R": str(R), "LIMIT": "30", "POLL": "0.2", "RUNS": "--name a",
           "IMPORT": "one.json.gz two.json.gz", "OUT": str(out)}  # fmt: skip
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_runs.sh")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    assert [c[:3] for c in calls] == [["cache", "import", "one.json.gz"], ["cache", "import", "two.json.gz"],
                                      ["run", "--name", "a"], ["cache", "export", f"{out}/scores.json.gz"]]  # fmt: skip
    # the export carries what the imported files do not: every earlier lease's file is imported next time
    assert calls[-1][3:7] == ["--skip", "one.json.gz", "--skip", "two.json.gz"]
    assert all(f"run_root={R}" in c for c in calls)
    # every run's record, each run whole without its weights as the limits allow, the logs (scripts/gpu_pack.py)
    import tarfile

    with tarfile.open(out / "run-a.tgz") as f:
        assert sorted(f.getnames()) == ["runs/a", "runs/a/evaluate/results.md"]
    with tarfile.open(out / "records.tgz") as f:
        assert f.getnames() == ["runs/a/evaluate/results.md"]
    with tarfile.open(out / "runs.tgz") as f:
        names = f.getnames()
    assert "runs/0.log" in names and "runs/started" in names and "runs/packing.txt" in names
    assert not [n for n in names if n.startswith(("runs/a", "runs/.cache"))]
    assert sorted(p.name for p in out.glob("*.tgz")) == [
        "records.tgz",
        "run-a.tgz",
        "runs.tgz",
    ]  # no score cache

    (tmp_path / "stub.py.jsonl").unlink()
    env |= {"R": str(tmp_path / "runs2"), "IMPORT": "bad.json.gz"}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_runs.sh")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 5 and "cannot import bad.json.gz" in res.stdout
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    assert [c[:2] for c in calls] == [["cache", "import"]]  # nothing ran


def test_barriers_refused_where_nothing_makes_their_files_and_bounded_in_time(tmp_path):
    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()
    out = _call(tmp_path, "after:x;--name a --sleep 0.1|after:y;--name b --sleep 0.1")
    assert out.returncode == 6 and "every lane begins with after:" in out.stdout
    assert not (tmp_path / "runs" / "started").exists()
    # a file that never comes while its maker still runs: AFTER_MAX lets the lane go on; an absolute path is kept
    env_max = {"AFTER_MAX": "1"}
    out = _call(tmp_path, f"--name slow --sleep 4|after:{tmp_path}/never;--name c --sleep 0.1", extra=env_max)
    assert out.returncode == 0, out.stderr
    import json

    events = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    start = {e["name"]: e["at"] for e in events if "at" in e}
    end = {e["name"]: e["end"] for e in events if "end" in e}
    assert start["c"] < end["slow"]  # released by AFTER_MAX, not by the slow lane's end
    assert f"waiting for {tmp_path}/never" in (tmp_path / "runs" / "driver1.log").read_text()


def test_the_queue_imports_the_earlier_lease_and_passes_each_planned_run_whole(tmp_path):
    """scripts/gpu_queue.sh, the next lease's one call: the earlier lease's scores go in first, then every queued run
    reaches ``epr run`` with its arguments as its plan writes them (a list setting is one argument, its brackets
    and commas intact), the MTOP seed, the two tasks' arms, MTOP's encoder trial and issue 74's L50 as five lanes, each in its plan's order."""
    import json
    import shlex

    (tmp_path / "stub.py").write_text(CACHE_STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()
    (tmp_path / "t" / "mpnet.ok").touch()  # mpnet's pieces are in: its arms need not wait
    env = {**os.environ, "PY": f"{sys.executable} {tmp_path / 'stub.py'}", "S": str(tmp_path / "s"),
           "T": str(tmp_path / "t"), "R": str(tmp_path / "runs"), "LIMIT": "30", "POLL": "0.2"}  # fmt: skip
    for k in ("OUT", "RUNS", "IMPORT", "DRY_RUN"):
        env.pop(k, None)
    queue = str(ROOT / "scripts" / "gpu_queue.sh")
    planned = subprocess.run(
        ["bash", queue], env={**env, "DRY_RUN": "1"}, capture_output=True, text=True
    ).stdout
    imports, *steps = planned.splitlines()
    runs = [r.removeprefix("?") for r in steps if not r.startswith("after:")]
    # mpnet's arms wait for its pieces, which come in the calls after the lanes start (scripts/gpu_payload.sh)
    for before, r in zip(steps, steps[1:]):
        # waiting at most 5 minutes, and optional: skipped or failed, the lane goes on
        assert (before == "after:mpnet.ok@300") == ("models.encoder=mpnet" in r) == r.startswith("?")
    assert imports == "IMPORT=results/mtop-8000-locked/scores-h200.json.gz"
    assert (ROOT / imports.split("=")[1]).exists()
    res = subprocess.run(["bash", queue], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    assert calls[0][:3] == ["cache", "import", "results/mtop-8000-locked/scores-h200.json.gz"]
    got = [c[1:-4] for c in calls[1:]]  # each run's own arguments, without the run root and the data dir
    assert sorted(got) == sorted(shlex.split(r) for r in runs) and len(runs) == 3
    names = [
        a[-1].removeprefix("name=") for a in got
    ]  # in the order they started: each lane in its plan's order
    # SMCalFlow's A, E and B recorded (ran on a CPU, amendment 5); B did not pass the walk's rule: C and D never run
    assert not [n for n in names if n.startswith("smc")]
    # BREAK's A, E and B recorded (ran on CPUs, amendments 5-8): B did not pass rule B, and no arm is left
    assert not [n for n in names if n.startswith("break")]
    assert "mtop-8000-locked-s2" not in names  # recorded (results/mtop-8000-locked, seed 2 ran on a CPU)
    assert [n for n in names if n in ("mtop-8000", "mtop-8000-mpnet")] == ["mtop-8000", "mtop-8000-mpnet"]
    by_name = dict(zip(names, got))
    assert "models.encoder=mpnet" in by_name["mtop-8000-mpnet"]  # the plan's arms, as amendment 6 names them
    assert "retrieve.retrievers=[epr,hybrid]" in by_name["mtop-8000-mpnet"]
    assert "models.encoder=mpnet" not in by_name["mtop-8000"]
    for n in ("mtop-8000", "mtop-8000-mpnet"):  # dev: the locked examples are the other plan's, read once
        assert "candidates.num_queries=8000" in by_name[n] and not any("eval_part" in a for a in by_name[n])
    # issue 74's L50 (results/mtop-reward-dev, amendment 1): the default recipe's 2,000 labels with 50 candidates
    l50 = by_name["mtop-l50"]
    assert (
        "candidates.L=50" in l50
        and "select.weigh=logprob+em" in l50
        and "candidates.num_queries=8000" not in l50
    )
    assert "select.retrievers=[epr,hybrid,epr+rm,hybrid+rm]" in l50 and not any("eval_part" in a for a in l50)
    # the queued runs take the GPU's default (one padded batch), as their plans' amendments say
    assert not [n for n, a in by_name.items() if any("length_buckets" in x for x in a)]


def test_mpnet_comes_after_the_start_and_its_lanes_wait_for_it(tmp_path):
    """gpu_payload.sh MPNET=1 cuts mpnet's wheels into a tar of their own, carried in the calls after the lanes
    start: each call adds its piece, the tar installs once whole and checked (``mpnet.ok``), and an arm behind
    ``after:mpnet.ok`` starts only then; a piece that does not match the digest installs nothing."""
    import hashlib
    import io
    import json
    import tarfile

    (tmp_path / "stub.py").write_text(CACHE_STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = b"wheel" * 1000
        info = tarfile.TarInfo("payload/whl/mpnet_part-0.0.1-py3-none-any.whl")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    tar = buf.getvalue()
    digest = hashlib.sha256(tar).hexdigest()
    half = len(tar) // 2

    def carry(k: int, piece: bytes) -> None:  # the device keeps only this call's carried folder
        import shutil

        shutil.rmtree(tmp_path / ".gpu", ignore_errors=True)
        (tmp_path / ".gpu" / f"m{k}").mkdir(parents=True)
        (tmp_path / ".gpu" / f"m{k}" / ("m.a" + "ab"[k - 1])).write_bytes(piece)
        (tmp_path / ".gpu" / f"m{k}" / "mpnet.sha256").write_text(f"{digest} 2\n")

    runs = "--name a;after:mpnet.ok;--name b"
    carry(1, tar[:half])
    first = _call(tmp_path, runs, limit=1)
    assert "mpnet's payload: 1 of 2 pieces so far" in first.stdout
    R = tmp_path / "runs"
    assert not (R / "mpnet.ok").exists()
    carry(2, tar[half:-1] + b"x")  # a damaged piece: nothing installs
    bad = _call(tmp_path, runs, limit=1)
    assert "all 2 pieces in, but they do not match its digest" in bad.stdout
    assert not (tmp_path / "t" / "mpnet.ok").exists()
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    assert [c[-1] for c in calls if c[0] == "run"] == [
        f"data.data_dir={tmp_path / 't'}/payload/data"
    ]  # a only
    carry(2, tar[half:])
    done = _call(tmp_path, runs, limit=20)
    assert "mpnet installed" in done.stdout and (R / "mpnet.ok").exists()
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    pip = [c for c in calls if c[:1] == ["install"]]
    assert len(pip) == 1 and f"{tmp_path / 't'}/site" in pip[0]
    assert pip[0][-1] == f"{tmp_path / 't'}/mpnet/payload/whl/mpnet_part-0.0.1-py3-none-any.whl"
    assert [c[2] for c in calls if c[0] == "run"] == ["a", "b"]  # b only after mpnet.ok
    assert (R / "done").exists()


def test_the_queue_smoke_runs_each_distinct_run_shrunk_and_on_dev(tmp_path):
    """``SMOKE=1 scripts/gpu_queue.sh`` runs each distinct queued run on this machine before a lease, shrunk, with
    the dev part last on the line (a smoke run reads no locked example); runs that differ only in their label count,
    seed or name run once; a failing one is named and the script fails."""
    import json

    (tmp_path / "stub.py").write_text(
        CACHE_STUB.replace('any(a.endswith("bad.json.gz") for a in args)', '"name=mtop-8000" in args')
    )
    env = {**os.environ, "PY": f"{sys.executable} {tmp_path / 'stub.py'}", "SMOKE": "1",
           "SMOKE_ROOT": str(tmp_path / "smoke")}  # fmt: skip
    for k in ("OUT", "RUNS", "IMPORT", "DRY_RUN"):
        env.pop(k, None)
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_queue.sh")], env=env, capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert res.returncode == 1 and "smoke: mtop-8000 FAILED" in res.stdout
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    names = [next(a for a in c if a.startswith("name=")).removeprefix("name=") for c in calls]
    # the locked seed and SMCalFlow's and BREAK's arms are recorded
    assert names == ["mtop-8000", "mtop-8000-mpnet", "mtop-l50"]  # fmt: skip
    for c in calls:
        sets = [c[i + 1] for i, a in enumerate(c) if a == "--set"]
        last = {s.split("=")[0]: s.split("=", 1)[1] for s in sets}  # a later --set of a key wins
        assert last["data.eval_part"] == "dev" and last["candidates.num_queries"] == "64"
        assert last["run_root"] == str(tmp_path / "smoke")
    assert "smoke: mtop-8000-mpnet passed" in res.stdout


def test_a_barrier_with_its_own_limit_and_an_optional_run_keep_the_lane_going(tmp_path):
    """``after:PATH@S`` waits at most S seconds; a run written ``?<args>`` that fails is in ``failed`` like any,
    but its lane goes on (mpnet's arms: where its pieces do not come in time, the label-count arms after it run)."""
    import json

    (tmp_path / "stub.py").write_text(STUB)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "site.ok").touch()
    runs = "--name a --sleep 0.1;after:never@1;?--name fail-e --sleep 0.1;--name b --sleep 0.1|--name slow --sleep 4"
    t0 = time.time()
    out = _call(tmp_path, runs, limit=30)
    assert out.returncode == 0, out.stderr
    events = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    start = {e["name"]: e["at"] for e in events if "at" in e}
    end = {e["name"]: e["end"] for e in events if "end" in e}
    assert (
        start["fail-e"] - end["a"] < 3 and start["fail-e"] < end["slow"]
    )  # 1 s, not AFTER_MAX nor slow's end
    assert start["b"] >= end["fail-e"]  # the optional run failed, and its lane went on
    R = tmp_path / "runs"
    assert (
        (R / "failed").read_text().split() == ["1"]
        and (R / "2.done").exists()
        and not (R / "1.done").exists()
    )
    assert "optional, the lane goes on" in (R / "driver0.log").read_text()
    assert time.time() - t0 < 30


def test_a_recorded_run_leaves_the_queue_and_collect_records_what_a_lease_finished(tmp_path):
    """After a lease, ``COLLECT=<its files>`` keeps the score export, records and logs, and records each finished
    run of the queue's table into its plan's folder under its side's name (the part its plan names); the queue then
    leaves out every run whose rows are in its folder, with the barrier before it."""
    import io
    import json
    import tarfile

    (tmp_path / "stub.py").write_text(CACHE_STUB)
    results = tmp_path / "results"
    back = tmp_path / "back"
    back.mkdir()
    with tarfile.open(back / "records.tgz", "w:gz") as t:
        for name in ("runs/smc-1000/evaluate/manifest.json", "runs/mtop-8000-locked-s2/locked/evaluate/manifest.json",
                     "runs/smc-2000/scores/manifest.json", "runs/elsewhere/evaluate/manifest.json"):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = 2
            t.addfile(info, io.BytesIO(b"{}"))
    (back / "scores.json.gz").write_bytes(b"scores")
    env = {**os.environ, "PY": f"{sys.executable} {tmp_path / 'stub.py'}", "RESULTS": str(results),
           "COLLECT": str(back), "LEASES": str(tmp_path / "leases"), "COLLECT_ROOT": str(tmp_path / "root")}  # fmt: skip
    for k in ("OUT", "RUNS", "IMPORT", "DRY_RUN", "SMOKE"):
        env.pop(k, None)
    queue = str(ROOT / "scripts" / "gpu_queue.sh")
    res = subprocess.run(["bash", queue], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    root = tmp_path / "root" / "runs"
    assert sorted(calls) == sorted([
        ["experiment", "record", str(root / "mtop-8000-locked-s2"), str(results / "mtop-8000-locked"), "--part", "locked", "--as", "s2"],
        ["experiment", "record", str(root / "smc-1000"), str(results / "smcalflow-recipe-choices"), "--part", "dev", "--as", "r1000"],
    ])  # fmt: skip
    assert "smc-2000 did not finish" in res.stdout and "elsewhere is not in the queue's table" in res.stdout
    (kept,) = (tmp_path / "leases").iterdir()  # the lease's day
    assert sorted(p.name for p in kept.iterdir()) == ["records.tgz", "scores.json.gz"]

    # those two recorded (their rows in their folders): the queue runs the rest
    for folder, side in (("mtop-8000-locked", "s2"), ("smcalflow-recipe-choices", "r1000")):
        (results / folder / "rows").mkdir(parents=True, exist_ok=True)
        (results / folder / "rows" / f"per_query-{side}.jsonl.gz").write_bytes(b"")
    env.pop("COLLECT")
    plan = subprocess.run(["bash", queue], env={**env, "DRY_RUN": "1"}, capture_output=True, text=True).stdout
    imports, *steps = plan.splitlines()  # the next lease imports the kept scores too
    assert imports == f"IMPORT=results/mtop-8000-locked/scores-h200.json.gz {kept}/scores.json.gz"
    names = [s.rsplit("name=", 1)[-1] for s in steps]
    assert "mtop-8000-locked-s2" not in names and "smc-1000" not in names
    i = names.index("smc-1000-mpnet")
    assert steps[i - 1] == "after:mpnet.ok@300" and names[i + 1] == "smc-2000"  # E keeps its wait for mpnet
    assert len([n for n in names if not n.startswith("after:")]) == 8
    # a lease that will not carry mpnet's pieces: its arms and their waits are left out
    plan = subprocess.run(
        ["bash", queue], env={**env, "DRY_RUN": "1", "MPNET": "0"}, capture_output=True, text=True
    )
    steps = plan.stdout.splitlines()[1:]
    assert not [x for x in steps if "mpnet" in x] and len(steps) == 4


def test_here_runs_one_queued_arm_on_this_machine_then_exports_its_labels_and_records_it(tmp_path):
    """``HERE=<name> scripts/gpu_queue.sh`` (no GPU lent; each plan's amendment 5): the queued run's own arguments,
    under the run root R; then its labels beside its results folder and its record there, as COLLECT records a
    lease's. Refused where ``auto`` would label in fp32, for a name not in the queue, on another CPU than the one the
    arm started on (amendment 6: a later session resumes it on its own CPU only), and once recorded."""
    import json
    import shlex

    (tmp_path / "stub.py").write_text(CACHE_STUB)
    results = tmp_path / "results"
    env = {**os.environ, "PY": f"{sys.executable} {tmp_path / 'stub.py'}", "RESULTS": str(results),
           "R": str(tmp_path / "runs"), "HERE": "smc-1000", "DTYPE": "bf16", "MACHINE": "zen4",
           "DEVICE": "AMD EPYC (family 25 model 17, avx512_bf16), torch 2.13.0"}  # fmt: skip
    for k in ("OUT", "RUNS", "IMPORT", "DRY_RUN", "SMOKE", "COLLECT"):
        env.pop(k, None)
    queue = str(ROOT / "scripts" / "gpu_queue.sh")
    res = subprocess.run(["bash", queue], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    calls = [json.loads(x) for x in (tmp_path / "stub.py.jsonl").read_text().splitlines()]
    own = shlex.split(
        '-c configs/smcalflow.yaml --set "retrieve.retrievers=[bm25,sbert,epr,hybrid,lm-oracle]"'
    )
    own += ["--set", "name=smc-1000", "--set", f"run_root={tmp_path / 'runs'}"]
    side = results / "smcalflow-recipe-choices"
    assert calls == [
        ["run", *own],
        ["cache", "export", str(side / "scores-r1000-zen4.json.gz"), *own, "--this-run"],
        ["experiment", "record", str(tmp_path / "runs" / "smc-1000"), str(side), "--part", "dev", "--as", "r1000"],
    ]  # fmt: skip
    assert (tmp_path / "runs" / "smc-1000.device").read_text() == env["DEVICE"] + "\n"
    for bad, says in (
        ({"DTYPE": "fp32"}, "labels in fp32"),
        ({"HERE": "smc-3000"}, "no queued run's name"),
        ({"DEVICE": "Intel Xeon (family 6 model 143, amx_bf16), torch 2.13.0"}, "an arm keeps one device"),
    ):
        res = subprocess.run(["bash", queue], env={**env, **bad}, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and says in res.stdout
    assert len((tmp_path / "stub.py.jsonl").read_text().splitlines()) == 3  # none of them ran anything
    # a later session on the same CPU: the same command resumes the arm
    res = subprocess.run(["bash", queue], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and len((tmp_path / "stub.py.jsonl").read_text().splitlines()) == 6  # resumed
    (side / "rows").mkdir(parents=True)
    (side / "rows" / "per_query-r1000.jsonl.gz").write_bytes(b"")
    res = subprocess.run(["bash", queue], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "recorded already" in res.stdout
    assert len((tmp_path / "stub.py.jsonl").read_text().splitlines()) == 6  # nothing ran again


def test_the_device_stamp_names_the_cpu_and_its_bf16_instructions_not_the_day():
    """HERE mode's stamp (amendment 6): two sessions on one CPU agree; another generation, another bf16 unit or
    another torch does not."""
    from epr.reports.machine import machine, stamp

    m = machine()
    assert stamp(m) == stamp({**m, "date": "2030-01-01 00:00", "threads": 99})
    for other in ({"cpu_model": "1"}, {"amx_bf16": not m["amx_bf16"]}, {"torch": "0.0"}, {"cpu": "Other"}):
        assert stamp({**m, **other}) != stamp(m)


def test_here_carries_an_arms_labels_between_sessions_on_different_bf16_cpus_in_parts(tmp_path):
    """An arm in the queue's ``moves`` table (BREAK's PLAN amendment 8: B's labels may be scored over sessions on
    more than one bf16 CPU): each session imports the labels the arm builds on and its own earlier parts before it
    runs; the stamp lists every CPU instead of refusing another one; ``PART=1`` exports the session's new labels
    without those of every file before them, numbered after the parts that exist; an import that fails runs
    nothing."""
    import json
    import shlex

    (tmp_path / "stub.py").write_text(CACHE_STUB)
    results = tmp_path / "results"
    side = results / "break-recipe-choices"
    side.mkdir(parents=True)
    zen4, zen5 = (f"AMD EPYC (family {f}, avx512_bf16), torch 2.13.0" for f in ("25 model 17", "26 model 2"))
    env = {**os.environ, "PY": f"{sys.executable} {tmp_path / 'stub.py'}", "RESULTS": str(results),
           "R": str(tmp_path / "runs"), "HERE": "break-4000-mpnet", "DTYPE": "bf16", "MACHINE": "zen5",
           "DEVICE": zen5}  # fmt: skip
    for k in ("OUT", "RUNS", "IMPORT", "DRY_RUN", "SMOKE", "COLLECT", "PART"):
        env.pop(k, None)
    queue = str(ROOT / "scripts" / "gpu_queue.sh")
    log = tmp_path / "stub.py.jsonl"

    def calls():
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    own = shlex.split(
        '-c configs/break.yaml --set models.encoder=mpnet --set "retrieve.retrievers=[epr,hybrid]"'
    )
    own += ["--set", "candidates.num_queries=4000", "--set", "name=break-4000-mpnet"]
    own += ["--set", f"run_root={tmp_path / 'runs'}"]
    base = [str(side / "scores-r2000-zen4.json.gz"), str(side / "scores-r2000mpnet-zen4.json.gz")]
    # session 1, on a Zen 5: the labels it builds on go in first, then the run; then its part
    res = subprocess.run(["bash", queue], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert calls()[:3] == [
        ["cache", "import", base[0], *own],
        ["cache", "import", base[1], *own],
        ["run", *own],
    ]
    log.unlink()
    res = subprocess.run(
        ["bash", queue], env={**env, "PART": "1"}, capture_output=True, text=True, timeout=60
    )
    part1 = str(side / "scores-r4000mpnet-part1-zen5.json.gz")
    assert res.returncode == 0 and calls() == [
        ["cache", "export", part1, *own, "--this-lm", "--skip", base[0], "--skip", base[1]]
    ], res.stdout + res.stderr
    (side / "scores-r4000mpnet-part1-zen5.json.gz").write_bytes(b"")
    log.unlink()
    # session 2, on a Zen 4: accepted and listed; part 1 is imported too, and part 2 skips it
    res = subprocess.run(["bash", queue], env={**env, "DEVICE": zen4, "MACHINE": "zen4"}, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert [c[:3] for c in calls()[:4]] == [["cache", "import", b] for b in (*base, part1)] + [
        ["run", *own[:2]]
    ]
    assert (tmp_path / "runs" / "break-4000-mpnet.device").read_text() == f"{zen5}\n{zen4}\n"
    log.unlink()
    res = subprocess.run(["bash", queue], env={**env, "PART": "1", "MACHINE": "zen4"}, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert calls()[0][:3] == ["cache", "export", str(side / "scores-r4000mpnet-part2-zen4.json.gz")]
    assert calls()[0][-6:] == ["--skip", base[0], "--skip", base[1], "--skip", part1]
    # a session whose import fails runs nothing
    log.unlink()
    (side / "scores-r4000mpnet-part2-bad.json.gz").write_bytes(b"")
    res = subprocess.run(["bash", queue], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and not [c for c in calls() if c[0] == "run"]
