"""The ``epr`` process's ends that are not errors: SIGTERM (a scheduler's or ``kill``'s stop) unwinds like Ctrl-C,
says so and frees the run for the same command to resume; a reader that stops reading (``epr status | head``) is no
error. Both as real processes: signals and pipes are what is under test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .test_bad_input import GOOD, jsonl, own_sets

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}

TERM_WHEN = """
import os, pathlib, signal, sys, threading, time
from epr.cli import main
def term_when_there(path):  # SIGTERM once the run has finished this stage: mid-run, on a slow machine or a fast one
    while not pathlib.Path(path).exists():
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=term_when_there, args=(sys.argv[1],), daemon=True).start()
sys.exit(main(sys.argv[2:]))
"""


def test_sigterm_is_said_and_the_same_command_resumes(tmp_path, minilm_dir):
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD * 4))
    argv = ["run", "--until", "encoder", *own_sets(tmp_path, p, f"models.encoder={minilm_dir}", "train.dev_size=2",
                                                    "train.epochs=50", "train.batch_size=4")]  # fmt: skip
    done = tmp_path / "runs" / "bad" / "candidates" / "manifest.json"
    res = subprocess.run([sys.executable, "-c", TERM_WHEN, str(done), *argv], env=ENV, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 143, res.stderr[-2000:]
    assert "epr: terminated (SIGTERM; finished chunks are kept: the same command resumes)" in res.stderr
    assert "Traceback" not in res.stderr
    # what it finished is kept and the same run goes on: its stages up to the candidates are fresh, not rerun
    again = subprocess.run([sys.executable, "-m", "epr.cli", "run", "--until", "candidates", *argv[3:]], env=ENV,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert "examples: fresh, skipped" in again.stderr and "candidates: fresh, skipped" in again.stderr


def test_a_reader_that_stops_early_is_not_an_error(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    proc = subprocess.Popen([sys.executable, "-m", "epr.cli", "config", *own_sets(tmp_path, p)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()  # like `| head -0`: every write of the command meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Broken pipe" not in err and "epr: error" not in err


def test_a_writer_whose_reader_went_away_exits_as_sigpipe_would(tmp_path):
    """A command that writes may have stopped part way when its output pipe closed: no message, but SIGPIPE's exit
    code (141), so a script does not take it for success."""
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    proc = subprocess.Popen([sys.executable, "-m", "epr.cli", "run", "--until", "examples", *own_sets(tmp_path, p)],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "epr: error" not in err


def test_the_sigterm_handler_is_only_for_one_process_writers(monkeypatch):
    """Readers and the ranks of a multi-process launch keep SIGTERM's default action (a rank blocked in a collective
    would run no Python handler until the launcher's SIGKILL); a one-process writer gets it, once."""
    import signal

    from epr.cli.ends import Terminated, terminate_as_interrupt

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert terminate_as_interrupt(["status"]) is None and terminate_as_interrupt(["config"]) is None
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert terminate_as_interrupt(["run"]) is None
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.setenv("WORLD_SIZE", "1")
    try:
        assert terminate_as_interrupt(["run"]) is signal.SIG_DFL
        handler = signal.getsignal(signal.SIGTERM)
        try:
            handler(signal.SIGTERM, None)
            raise AssertionError("the handler did not raise")
        except Terminated:
            pass
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # a second SIGTERM ends the process
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
