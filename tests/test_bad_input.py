"""Bad input at every door: each case is exit code 2 (or the right exception from the API), a message naming the
file / line / key, no traceback, and nothing changed outside the run folder. The CLI cases run in-process."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from epr.cli import main
from epr.types import ConfigError

GOOD = [{"input": f"how do I {v} my {o}", "output": f"{v.upper()}({o})"} for v in "abcd" for o in "wxyz"]


def jsonl(rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def csv_text(lines) -> str:
    return "input,output\n" + "".join(line + "\n" for line in lines)


GOOD_CSV = [f"how do I {r['input'][-5:]},{r['output']}" for r in GOOD]

# name -> (file name, content (str or bytes), extra --set, what the message must name besides the file)
DATA_CASES = {
    "csv-unquoted-comma": (
        "d.csv",
        csv_text([*GOOD_CSV[:3], "wake me at 7,[IN:ALARM [SL:TIME 7 , am ] ]", *GOOD_CSV[3:]]),
        (),
        "d.csv:5: 3 fields, the header has 2",
    ),
    "csv-short-row": (
        "d.csv",
        csv_text([*GOOD_CSV[:1], "no output here", *GOOD_CSV[1:]]),
        (),
        "d.csv:3: 1 fields",
    ),
    "tsv-extra-field": (
        "d.tsv",
        "input\toutput\n" + "".join(f"a{i}\tb{i}\n" for i in range(8)) + "x\ty\tz\n",
        (),
        "d.tsv:10: 3 fields",
    ),
    "csv-bad-quote": ("d.csv", csv_text([*GOOD_CSV, 'a "quoted" ,"unterminated']), (), "d.csv"),
    "csv-empty-file": ("d.csv", "", (), "d.csv: empty file"),
    "csv-repeated-column": (
        "d.csv",
        "input,output,output\na,b,c\n",
        (),
        "d.csv:1: the header names column(s)",
    ),
    "csv-upper-case-suffix": (  # read as CSV (a .CSV was once parsed as JSON Lines: "malformed JSON")
        "d.CSV",
        csv_text([*GOOD_CSV[:3], "wake me at 7,[IN:ALARM [SL:TIME 7 , am ] ]", *GOOD_CSV[3:]]),
        (),
        "d.CSV:5: 3 fields, the header has 2",
    ),
    "csv-header-only": ("d.csv", "input,output\n", (), "d.csv: a header line and no rows"),
    "csv-stray-quote": (  # the record that opens the quote is named, not the end of the file it ran to
        "d.csv",
        csv_text([*GOOD_CSV[:5], '"wake me, at 7,alarm', *GOOD_CSV[5:]]),
        (),
        "d.csv:7: not valid CSV in the record starting here",
    ),
    "tsv-tab-in-field": ("d.tsv", "input\toutput\na\tb\tc\n", (), "TSV has no quoting"),
    "jsonl-repeated-key": (  # plain json keeps the last value and drops the first without a word
        "d.jsonl",
        jsonl([*GOOD[:7], '{"input": "first", "output": "A", "input": "second"}', *GOOD[7:]]),
        (),
        "d.jsonl:8: an object names the key(s) ['input'] more than once",
    ),
    "json-array-repeated-key": ("d.json", '[{"input": "a", "output": "b", "output": "c"}]', (), "d.json"),
    "csv-missing-column": (
        "d.csv",
        "question,answer\na,b\n",
        (),
        "missing column(s) ['input', 'output']; columns are ['question', 'answer']; name your columns with "
        "data.input_field / data.output_field (now 'input' / 'output')",
    ),
    "jsonl-empty-file": ("d.jsonl", "", (), "d.jsonl: no rows"),
    "jsonl-blank-lines-only": ("d.jsonl", "\n\n  \n", (), "d.jsonl: no rows"),
    "jsonl-malformed": (
        "d.jsonl",
        jsonl([GOOD[0], '{"input": "x", "output": '] + GOOD[1:]),
        (),
        "d.jsonl:2:",
    ),
    "jsonl-list-line": ("d.jsonl", jsonl([*GOOD[:2], "[1, 2]"]), (), "d.jsonl:3: expected a JSON object"),
    "jsonl-missing-field": (
        "d.jsonl",
        jsonl([*GOOD[:3], {"input": "x"}]),
        (),
        "d.jsonl:4: missing field(s) ['output']; present: ['input']; name your columns with data.input_field",
    ),
    "output-object": (
        "d.jsonl",
        jsonl([*GOOD[:4], {"input": "x", "output": {"a": 1}}, *GOOD[4:]]),
        (),
        "d.jsonl:5: field 'output' is an object",
    ),
    "input-array": (
        "d.jsonl",
        jsonl([*GOOD[:1], {"input": ["x", "y"], "output": "z"}, *GOOD[1:]]),
        (),
        "d.jsonl:2: field 'input' is an array",
    ),
    "output-nan": (
        "d.jsonl",
        jsonl([*GOOD[:2], '{"input": "x", "output": NaN}', *GOOD[2:]]),
        (),
        "d.jsonl:3: field 'output' is nan",
    ),
    "output-infinity": (
        "d.jsonl",
        jsonl([*GOOD[:2], '{"input": "x", "output": -Infinity}', *GOOD[2:]]),
        (),
        "d.jsonl:3: field 'output' is -inf",
    ),
    "lone-surrogate": (
        "d.jsonl",
        jsonl([*GOOD[:6], '{"input": "bad \\ud800 text", "output": "y"}', *GOOD[6:]]),
        (),
        "d.jsonl:7: field 'input'",
    ),
    "not-utf8": ("d.csv", b"input,output\n" + b"caf\xe9,x\n" * 8, (), "d.csv:2: not UTF-8"),
    "fake-gz": ("d.jsonl.gz", jsonl(GOOD), (), "d.jsonl.gz: not a whole gzip file"),
    "truncated-gz": (
        "d.jsonl.gz",
        gzip.compress(jsonl(GOOD * 50).encode())[:80],
        (),
        "not a whole gzip file",
    ),
    "json-array-broken": ("d.json", '[\n{"input": "a", "output": "b"},\n', (), "d.json:"),
    "all-outputs-null": (
        "d.jsonl",
        jsonl([{"input": r["input"], "output": None} for r in GOOD]),
        (),
        "d.jsonl: the demonstration pool is empty",
    ),
    "pool-too-small": ("d.jsonl", jsonl(GOOD[:5]), ("data.eval_size=1",), "at least 5 needed"),
    "eval-file-malformed": ("d.jsonl", jsonl(GOOD), ("data.eval_path={tmp}/e.jsonl",), "e.jsonl:1"),
    "eval-file-all-unusable": (  # an error at the examples stage, not after labelling and training
        "d.jsonl",
        jsonl(GOOD),
        ("data.eval_path={tmp}/e2.jsonl",),
        "none of the 2 evaluation rows is usable",
    ),
}


def own_sets(tmp_path: Path, path, *extra: str) -> list[str]:
    sets = [
        f"run_root={tmp_path / 'runs'}",
        "name=bad",
        "data.task=jsonl",
        f"data.path={path}",
        "data.eval_size=4",
        "candidates.L=6",
        "labels.k_pos=2",
        "labels.k_neg=2",
        "labels.source=bm25",
        "candidates.rounds=1",  # BM25 labels: one round, no selection
        "select.size=0",
        *extra,
    ]
    return [x for s in sets for x in ("--set", s)]


def cli(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.err + cap.out


def snapshot(root: Path, skip: Path) -> dict:
    """Every file under ``root`` outside ``skip`` (the run folder), with its bytes' digest."""
    import hashlib

    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and skip not in p.parents
    }


def assert_clean_error(rc: int, err: str, *names: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert err.count("epr: error:") == 1, err
    for n in names:
        assert n in err, f"{n!r} not in {err!r}"


@pytest.mark.parametrize("case", sorted(DATA_CASES))
def test_bad_own_data(case, tmp_path, capsys):
    name, content, extra, expect = DATA_CASES[case]
    p = tmp_path / name
    (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    (tmp_path / "e.jsonl").write_text("{oops\n")
    (tmp_path / "e2.jsonl").write_text(
        jsonl([{"input": None, "output": "a"}, {"input": "ok q", "output": ""}])
    )
    before = snapshot(tmp_path, tmp_path / "runs")
    rc, err = cli(
        capsys, "run", "--until", "examples", *own_sets(tmp_path, p, *(e.format(tmp=tmp_path) for e in extra))
    )
    assert_clean_error(rc, err, expect)
    assert snapshot(tmp_path, tmp_path / "runs") == before  # nothing changed outside the run folder


@pytest.mark.parametrize(
    "case,make,expect",
    [
        ("directory-as-path", lambda t: (t / "dir").mkdir() or t / "dir", "a folder, not a file"),
        ("missing-file", lambda t: t / "nope.jsonl", "nope.jsonl: no such file"),
        ("no-path", lambda t: "null", "data.path is not set"),
    ],
)
def test_bad_data_path(case, make, expect, tmp_path, capsys):
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, make(tmp_path)))
    assert_clean_error(rc, err, expect)


def test_a_relative_data_path_that_is_not_there_says_where_it_was_looked_for(tmp_path, capsys, monkeypatch):
    """``data.path`` is read from the current folder (``inherit:`` from the config's): the message names the
    setting and the absolute path it looked for."""
    monkeypatch.chdir(tmp_path)
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, "my_rows.csv"))
    assert_clean_error(rc, err, f"data.path my_rows.csv: no such file (looked for {tmp_path / 'my_rows.csv'}: a "
                                "relative path is read from the current folder")  # fmt: skip


def test_dev_size_that_leaves_no_training_is_refused_before_labels(tmp_path, capsys):
    """A ``train.dev_size`` of at least the labelled count is known to fail once the labels exist: a run that goes
    on to train refuses it before the LM scores a label, naming the setting and a value that works; a run that stops
    before training (``--until scores``) is not refused for a setting it never reads."""
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    sets = own_sets(tmp_path, p, "candidates.num_queries=8", "train.dev_size=8", "labels.source=lm")
    rc, err = cli(capsys, "run", "--until", "encoder", *sets)
    assert_clean_error(rc, err, "train.dev_size=8 would leave no training instances", "labels 8 pool examples",
                       "--set train.dev_size=1")  # fmt: skip
    assert not (tmp_path / "runs" / "bad" / "scores").exists()
    rc, err = cli(capsys, "run", "--until", "candidates", *sets)
    assert rc == 0, err
    from epr.config import load_config
    from epr.context import Context
    from epr.stages.candidates import check_dev_size

    for dev, refused in ((7, False), (8, True)):  # the boundary: one instance left to train on is enough
        ctx = Context(load_config([], [*sets[1::2][:-2], f"train.dev_size={dev}"]))
        if refused:
            with pytest.raises(ConfigError, match="train.dev_size=8"):
                check_dev_size(ctx)
        else:
            check_dev_size(ctx)
    # the reward model's own held-out share, checked where the run trains it (and only there)
    base = [*sets[1::2][:-2], "train.dev_size=1"]
    ctx = Context(load_config([], [*base, "reward.dev_size=8"]))
    check_dev_size(ctx)  # negative control: a run that trains no reward model never reads it
    with pytest.raises(ConfigError, match=r"^reward\.dev_size=8 would leave .* --set reward\.dev_size=1"):
        check_dev_size(ctx, ("encoder", "reward"))
    check_dev_size(Context(load_config([], [*base, "reward.dev_size=7"])), ("encoder", "reward"))
    rm = [
        *sets,
        "--set",
        "train.dev_size=1",
        "--set",
        "reward.dev_size=8",
        "--set",
        "retrieve.retrievers=[bm25,epr+rm]",
    ]
    rc, err = cli(capsys, "run", "--until", "reward", *rm)
    assert_clean_error(rc, err, "reward.dev_size=8 would leave no training instances")
    assert not (tmp_path / "runs" / "bad" / "scores").exists()  # before the LM scored a label


@pytest.mark.parametrize("cmd", [["run", "--until", "tqa_report"], ["tqa_contexts"]])
def test_truthfulqa_stages_refused_for_another_task(cmd, tmp_path, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    rc, err = cli(capsys, *cmd, *own_sets(tmp_path, p))
    assert_clean_error(
        rc, err, "a truthfulqa stage, and this config's task is 'jsonl'", "configs/truthfulqa.yaml"
    )
    assert not list((tmp_path / "runs").glob("*/tqa_*"))  # no folder made


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_data_file(tmp_path, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    p.chmod(0)
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert_clean_error(rc, err, "d.jsonl", "permission denied")


def test_numbers_and_booleans_are_text(tmp_path, capsys):
    """An arithmetic data set: numeric answers (and inputs) are data, not "empty" rows."""
    rows = [{"input": f"{a} + {b}", "output": a + b} for a in range(5) for b in range(3)]
    rows += [{"input": 2.5, "output": True}, {"input": "half of 3", "output": 1.5}]
    p = tmp_path / "math.jsonl"
    p.write_text(jsonl(rows))
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert rc == 0, err
    ex = tmp_path / "runs" / "bad" / "examples"
    got = [json.loads(x) for f in ("pool.jsonl", "eval.jsonl") for x in (ex / f).read_text().splitlines()]
    pairs = {(e["input"], e["output"]) for e in got}
    assert ("3 + 2", "5") in pairs and ("2.5", "true") in pairs and ("half of 3", "1.5") in pairs
    assert len(got) == len(rows)


def test_json_numbers_kept_as_written(tmp_path, capsys):
    """A gold answer ``3.50`` stays ``3.50`` (as it would from a CSV), not ``3.5``; big and exponent numbers keep
    their digits."""
    rows = [*GOOD, '{"input": "price", "output": 3.50}', '{"input": "exp", "output": 1E3}']
    rows += [
        '{"input": "big", "output": 12345678901234567890.0}',
        '{"input": 7.0, "output": 12345678901234567890}',
    ]
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(rows))
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p, "data.eval_size=0"))
    assert rc == 0, err
    pool = [
        json.loads(x)
        for x in (tmp_path / "runs" / "bad" / "examples" / "pool.jsonl").read_text().splitlines()
    ]
    got = {e["input"]: e["output"] for e in pool}
    assert got["price"] == "3.50" and got["exp"] == "1E3" and got["big"] == "12345678901234567890.0"
    assert got["7.0"] == "12345678901234567890"


def test_pool_limit_accounts_for_every_row(tmp_path, capsys):
    """Rows past ``data.pool_limit`` are counted (and unusable ones skipped with their reason), so kept + skipped +
    left out = the rows in the file."""
    rows = [*GOOD[:10], {"input": "x", "output": ""}, *GOOD[10:]]
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(rows))
    rc, err = cli(
        capsys, "run", "--until", "examples", *own_sets(tmp_path, p, "data.eval_size=0", "data.pool_limit=6")
    )
    assert rc == 0, err
    m = json.loads((tmp_path / "runs" / "bad" / "examples" / "manifest.json").read_text())
    load = m["load_report"]
    assert load["kept"] == 6 and load["skipped"] == 1 and load["beyond_pool_limit"] == len(GOOD) - 6
    assert load["kept"] + load["skipped"] + load["beyond_pool_limit"] == len(rows)


def test_field_text_other_types():
    """Integers of any kind (numpy's) are digits; bytes and other types are an error naming the row and field,
    never a TypeError from building the message."""
    import numpy as np

    from epr.tasks.rows import field_text
    from epr.types import InputError

    assert field_text(np.int64(3), "f:1", "output") == "3"
    with pytest.raises(InputError, match="f:1: field 'output' is of type bytes.*decode it to a str"):
        field_text(b"x", "f:1", "output")
    with pytest.raises(InputError, match="f:2: field 'input' is of type complex"):
        field_text(1j, "f:2", "input")


def test_csv_quoted_commas_and_newlines_kept_whole(tmp_path, capsys, caplog):
    import csv

    p = tmp_path / "d.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["input", "output"])
        w.writerow(["wake me at 7", "[IN:ALARM [SL:TIME 7 , am ] ]"])
        w.writerow(['say "hi"\nthen stop', "A,B"])
        w.writerows([(r["input"], r["output"]) for r in GOOD])
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p, "data.eval_size=0"))
    assert rc == 0, err
    pool = [
        json.loads(x)
        for x in (tmp_path / "runs" / "bad" / "examples" / "pool.jsonl").read_text().splitlines()
    ]
    assert pool[0]["output"] == "[IN:ALARM [SL:TIME 7 , am ] ]"
    assert pool[1]["input"] == 'say "hi"\nthen stop' and pool[1]["output"] == "A,B"
    assert pool[2]["meta"]["source"].endswith("d.csv:5")  # the line it starts on, after a two-line record
    m = json.loads((tmp_path / "runs" / "bad" / "examples" / "manifest.json").read_text())
    assert (
        m["load_report"]["inputs_with_separators"] == 1
    )  # the two-line input: kept, counted and warned about
    assert "1 of 18 inputs hold a tab or a newline" in caplog.text and "d.csv:3" in caplog.text


def test_json_array_file_is_read(tmp_path, capsys):
    p = tmp_path / "d.json"
    p.write_text(json.dumps(GOOD, indent=2))
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert rc == 0, err
    assert (tmp_path / "runs" / "bad" / "examples" / "manifest.json").exists()


# ---- configuration -------------------------------------------------------------------------------------------
CONFIG_SETS = {
    "unclosed-list": ("retrieve.retrievers=[bm25", "retrieve.retrievers"),
    "empty-name": ("name=", "config name: may not be null (empty); give it a value (--set name=<value>"),
    "value-as-section": ("candidates.L.x=1", "candidates.L"),
    "no-equals": ("candidates.L", "expected key.path=value"),
    "empty-key-part": ("candidates..L=3", "candidates..L"),
    "unknown-key": ("candidates.nope=1", "unknown key(s) ['nope']"),
    "unknown-section": ("nope.x=1", "unknown key(s) ['nope']"),
    "negative-k": ("retrieve.k=-3", "retrieve.k=-3 must be >= 1"),
    "zero-k": ("retrieve.k=0", "retrieve.k=0"),
    "zero-max-demos": ("retrieve.max_demos=0", "retrieve.max_demos"),
    "zero-budget": ("retrieve.prompt_budget=0", "retrieve.prompt_budget=0"),
    "negative-reserve": ("retrieve.answer_reserve=-1", "retrieve.answer_reserve=-1"),
    "string-for-int": ("candidates.L=abc", "candidates.L"),
    "float-for-int": ("candidates.L=2.5", "candidates.L"),
    "list-for-int": ("candidates.L=[1,2]", "candidates.L"),
    "unknown-retriever": ("retrieve.retrievers=[nope]", "'nope'"),
    "div-on-bm25": ("retrieve.retrievers=[bm25+div]", "bm25+div"),
    "unknown-task": ("data.task=nope", "data.task='nope'"),
    "lambda-out-of-range": ("ragsys.lambda_d=2", "ragsys.lambda_d=2"),
    "k-pos-zero": ("labels.k_pos=0", "labels.k_pos"),
    "labels-exceed-L": ("candidates.L=3", "candidates.L (3)"),
    "bad-bool": ("train.tie_encoders=maybe", "train.tie_encoders"),
    "null-int": ("candidates.L=null", "candidates.L"),
    "batch-size-one": ("train.batch_size=1", "train.batch_size"),
    "bad-server-url": ("server.base_url=localhost:8000", "server.base_url"),
    "input-field-is-output-field": ("data.input_field=output", "both 'output'"),
    "server-retries": ("server.max_retries=-1", "max_retries"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_SETS))
def test_bad_override(case, tmp_path, capsys):
    item, expect = CONFIG_SETS[case]
    rc, err = cli(capsys, "status", "--set", f"run_root={tmp_path}", "--set", item)
    assert_clean_error(rc, err, expect)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "case,text,expect",
    [
        ("yaml-syntax", "data:\n  task: [jsonl\n", "bad.yaml:3"),
        ("yaml-tab", "data:\n\ttask: jsonl\n", "bad.yaml:2"),
        ("yaml-list-top", "- a\n- b\n", "top level must be a mapping"),
        ("yaml-unknown-key", "nope: 1\n", "unknown key(s) ['nope']"),
        ("yaml-inherit-missing", "inherit: other.yaml\n", "other.yaml: no such file"),
        ("yaml-not-utf8", b"name: caf\xe9\n", "not UTF-8"),
    ],
)
def test_bad_config_file(case, text, expect, tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    rc, err = cli(capsys, "status", "-c", str(p), "--set", f"run_root={tmp_path}")
    assert_clean_error(rc, err, expect)


@pytest.mark.parametrize("case", ["missing", "directory"])
def test_config_path_not_a_file(case, tmp_path, capsys):
    p = tmp_path / "cfg"
    if case == "directory":
        p.mkdir()
    rc, err = cli(capsys, "status", "-c", str(p))
    assert_clean_error(rc, err, str(p), "a folder" if case == "directory" else "no such file")


def test_debug_shows_the_stack(tmp_path, capsys, monkeypatch):
    with pytest.raises(ValueError, match="retrieve.k=-3"):
        main(["status", "--debug", "--set", "retrieve.k=-3"])
    monkeypatch.setenv("EPR_DEBUG", "1")
    with pytest.raises(ValueError, match="retrieve.k=-3"):
        main(["status", "--set", "retrieve.k=-3"])


# ---- the pipeline in the wrong order, models and servers that are not there ---------------------------------
def test_stage_before_upstream(tmp_path, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    rc, err = cli(capsys, "candidates", *own_sets(tmp_path, p))
    assert_clean_error(rc, err, "needs stage 'examples'", "epr run --until candidates")


@pytest.mark.parametrize("cmd", [["inspect", "turn on the lights"], ["export", "OUT"]])
def test_command_before_any_run(cmd, tmp_path, capsys):
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    argv = [c.replace("OUT", str(tmp_path / "out")) for c in cmd]
    rc, err = cli(capsys, *argv, *own_sets(tmp_path, p))
    assert_clean_error(rc, err, "epr run --until")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "key,name",
    [("models.lm", "nobody/no-such-model"), ("models.lm", "./no/such/folder"), ("models.lm", "gpt9")],
)
def test_unknown_model_offline(key, name, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    rc, err = cli(
        capsys, "run", "--until", "scores", *own_sets(tmp_path, p, f"{key}={name}", "labels.source=lm")
    )
    assert_clean_error(rc, err, f"model {name!r}", "not a packaged causal LM")


def test_unreachable_server(tmp_path, capsys, tiny_lm_dir):
    pytest.importorskip("httpx")
    p = tmp_path / "d.jsonl"
    p.write_text(jsonl(GOOD))
    sets = (
        "labels.source=lm",
        f"models.lm={tiny_lm_dir}",
        "server.base_url=http://127.0.0.1:9/v1",
        "server.model=m",
        "server.max_retries=0",
        "server.timeout_s=5",
    )
    rc, err = cli(capsys, "run", "--until", "scores", *own_sets(tmp_path, p, *sets))
    assert_clean_error(rc, err, "http://127.0.0.1:9/v1")


# ---- export: never deletes -----------------------------------------------------------------------------------
def export_args(tmp_path: Path, out, *more: str) -> list[str]:
    return ["export", "--set", f"run_root={tmp_path / 'runs'}", "--set", "name=mine", str(out), *more]


def test_export_onto_a_file(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    rc, err = cli(capsys, *export_args(tmp_path, f))
    assert_clean_error(rc, err, "notes.txt: an existing file")
    rc, err = cli(capsys, *export_args(tmp_path, f, "--overwrite"))
    assert_clean_error(rc, err, "notes.txt: an existing file")
    assert f.read_text() == "mine"


def test_export_onto_a_non_empty_folder(tmp_path, capsys):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    rc, err = cli(capsys, *export_args(tmp_path, keep))
    assert_clean_error(rc, err, "keep: not empty", "notes.txt", "--overwrite")
    assert (keep / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("target", ["run", "run-root", "parent-of-run-root", "cwd", "home"])
def test_export_overwrite_refuses_protected_folders(target, tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "mine"
    (run / "examples").mkdir(parents=True)
    (run / "examples" / "pool.jsonl").write_text("{}\n")
    home = tmp_path / "home"
    (home / "x").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    (work / "y").mkdir(parents=True)
    monkeypatch.chdir(work)
    out = {
        "run": run,
        "run-root": run.parent,
        "parent-of-run-root": tmp_path,
        "cwd": Path("."),
        "home": home,
    }[target]
    before = snapshot(tmp_path, tmp_path / "nothing")
    rc, err = cli(capsys, *export_args(tmp_path, out, "--overwrite"))
    what = {"cwd": "the current folder", "home": "your home folder"}.get(target, "the run folder")
    assert_clean_error(rc, err, what)
    assert snapshot(tmp_path, tmp_path / "nothing") == before


# ---- the Python API ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def retriever(shipped):
    from epr.api import PromptRetriever

    return PromptRetriever.from_pretrained(shipped[0])


@pytest.mark.parametrize(
    "query,k,exc,match",
    [
        (None, 3, TypeError, "query must be a str, got NoneType"),
        (123, 3, TypeError, "query must be a str, got int"),
        (b"bytes", 3, TypeError, "got bytes"),
        (["a"], 3, TypeError, "got list"),
        ("", 3, ValueError, "query is empty"),
        ("   ", 3, ValueError, "query is empty"),
        ("how do I reset my email", 0, ValueError, "k=0: must be >= 1"),
        ("how do I reset my email", -2, ValueError, "k=-2"),
        ("how do I reset my email", 1.5, TypeError, "k must be an int"),
        ("how do I reset my email", "3", TypeError, "k must be an int"),
        ("how do I reset my email", True, TypeError, "k must be an int"),
    ],
)
def test_api_retrieve_arguments(retriever, query, k, exc, match):
    with pytest.raises(exc, match=match):
        retriever.retrieve(query, k=k)
    with pytest.raises(exc, match=match):
        retriever.select(query, k=k)


@pytest.mark.parametrize(
    "inp,out,exc,match",
    [
        (None, "x", TypeError, "input must be a str"),
        ("x", {"b": 1}, TypeError, "output must be a str"),
        (["a"], "x", TypeError, "input must be a str"),
        ("", "x", ValueError, "add: empty input"),
        ("x", "   ", ValueError, "add: empty output"),
        ("x", "two\nlines", ValueError, "end marker"),
        ("x", float("nan"), Exception, "not a number"),
    ],
)
def test_api_add_refuses_what_a_data_file_may_not_hold(retriever, inp, out, exc, match):
    n, ntotal = len(retriever.pool), retriever.index.ntotal
    with pytest.raises(exc, match=match):
        retriever.add(inp, out)
    assert (len(retriever.pool), retriever.index.ntotal) == (n, ntotal)  # nothing half-added


def test_api_very_long_query_warns(retriever, caplog):
    res = retriever.retrieve("how do I reset my email " * 4000, k=2)
    assert res.prompt_demos == 0 and "no demonstrations" in caplog.text


def _damage(folder: Path, how: str) -> str:
    if how == "index-deleted":
        (folder / "index.faiss").unlink()
        return "index.faiss: missing"
    if how == "retriever-json-truncated":
        f = folder / "retriever.json"
        f.write_text(f.read_text()[:40])
        return "retriever.json: corrupt"
    if how == "encoder-deleted":
        shutil.rmtree(folder / "encoder")
        return "encoder/"
    if how == "pool-byte-flipped":
        f = folder / "pool.jsonl"
        b = bytearray(f.read_bytes())
        b[10] ^= 1
        f.write_bytes(bytes(b))
        return "pool.jsonl: corrupt: its sha256"
    if how == "tokenizer-deleted":
        shutil.rmtree(folder / "tokenizer")
        return "tokenizer/"
    if how == "manifest-garbled":
        (folder / "manifest.json").write_text("{")
        return "manifest.json: unreadable manifest"
    if how == "no-manifest-index-deleted":  # a folder written before manifests
        (folder / "manifest.json").unlink()
        (folder / "index.faiss").unlink()
        return "index.faiss: missing"
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "index-deleted",
        "retriever-json-truncated",
        "encoder-deleted",
        "pool-byte-flipped",
        "tokenizer-deleted",
        "manifest-garbled",
        "no-manifest-index-deleted",
    ],
)
def test_api_damaged_shipped_folder(how, shipped, tmp_path):
    from epr.api import PromptRetriever
    from epr.types import InputError

    copy = tmp_path / "copy"
    shutil.copytree(shipped[0], copy)
    expect = _damage(copy, how)
    with pytest.raises(InputError) as e:
        PromptRetriever.from_pretrained(copy)
    assert expect in str(e.value) and str(copy) in str(e.value)


@pytest.mark.parametrize("path", ["no/such/folder/at/all", "./nowhere"])
def test_api_missing_folder(path, monkeypatch):
    from epr.api import PromptRetriever

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises((FileNotFoundError, ValueError), match="nowhere|no/such"):
        PromptRetriever.from_pretrained(path)


def test_from_run_names_a_missing_folder_and_an_exported_one(shipped, tmp_path):
    """``from_run`` on a path that is not there says so (not 'train it first'), and on an exported folder points to
    ``from_pretrained``."""
    from epr.api import PromptRetriever
    from epr.types import UpstreamError

    with pytest.raises(UpstreamError, match="runs/typo: no such run folder"):
        PromptRetriever.from_run(tmp_path / "runs" / "typo")
    with pytest.raises(UpstreamError, match=r"an exported retriever, not a run folder: load it with "
                                            r"PromptRetriever\.from_pretrained"):  # fmt: skip
        PromptRetriever.from_run(shipped[0])
