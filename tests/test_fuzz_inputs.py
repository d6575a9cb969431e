"""Inputs fuzzed by the hundred (CI) and by the thousand (``slow``): generated own-data pools (JSONL, JSON arrays,
CSV, TSV; UTF-8 with and without a BOM, UTF-16/32, cp1252; quoting, embedded delimiters and newlines, numbers,
nulls, nested values, huge fields, lone surrogates), generated ``--set`` overrides and YAML configs, and generated
``PromptRetriever.retrieve()`` arguments.

The property, at the level of the loaders (milliseconds a case, no pipeline): success with every row accounted
for (kept + skipped + left out by the pool limit = the rows in the file), or a ``UserError`` (the CLI's exit 2)
whose message is one paragraph; never another exception (a traceback), never a changed input file. The API's
arguments: a result within ``k``, or a ``TypeError`` / ``ValueError`` saying what was given.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import re
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from epr.cli import explain
from epr.config import ExperimentConfig, load_config
from epr.config.names import out_of_range
from epr.types import UserError
from tests.test_config_ranges import ALL

settings.register_profile(
    "fuzz-ci",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
settings.register_profile("fuzz-slow", settings.get_profile("fuzz-ci"), max_examples=2500)
CI = settings(settings.get_profile("fuzz-ci"))
SLOW = settings(settings.get_profile("fuzz-slow"))
SEEN: Counter = Counter()  # outcomes by property, for the report at the end of a slow run


def one_paragraph(e: BaseException) -> None:
    msg = str(e)
    assert isinstance(e, UserError), f"{type(e).__name__}: {msg}"  # exit 2, never a traceback
    assert explain(e) == msg and msg.strip() and "\n" not in msg, repr(msg)


# ---- own-data pools --------------------------------------------------------------------------------------------
TRICKY = [
    ",",
    '"',
    "'",
    "\n",
    "\r",
    "\r\n",
    "\t",
    " ",
    "",
    "\ufeff",
    "\x00",
    "\u2028",
    "\\",
    "NaN",
    "null",
    "é",
    "日本",
]
text = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(TRICKY)), max_size=5).map("".join)
leaf = st.one_of(
    text,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.sampled_from(["\ud800", "a\udfffb"]),  # lone surrogates
    st.integers(1, 200_000).map(lambda n: "x" * n),  # huge fields (csv's field limit is 131,072)
)
value = st.one_of(leaf, st.lists(leaf, max_size=2), st.dictionaries(st.text(max_size=3), leaf, max_size=2))
# a file a user would write: text, numbers, empty values (most rows load; some are skipped and counted)
plain = st.one_of(text, text, st.text(min_size=1, max_size=30), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.none())  # fmt: skip
ENCODINGS = ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32", "cp1252"]


@st.composite
def pool_files(draw):
    """(file name, bytes, rows in, data.pool_limit, data.eval_size): a generated own-data file."""
    fmt = draw(st.sampled_from(["jsonl", "json", "csv", "tsv", "jsonl.gz", "csv.gz"]))
    wild = draw(st.booleans())  # half the files anything goes; the other half plain rows in UTF-8
    cell = value if wild else plain
    rows = draw(st.lists(st.tuples(cell, cell, cell), max_size=25))
    enc = draw(st.sampled_from(ENCODINGS if wild else ["utf-8", "utf-8-sig"]))
    base = fmt.removesuffix(".gz")
    if base == "jsonl":
        asc = draw(st.booleans())
        lines = [json.dumps({"input": a, "output": b, "meta": c}, ensure_ascii=asc) for a, b, c in rows]
        if lines and wild and draw(st.booleans()):  # a damaged line: cut short, a missing field, a blank line
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = draw(st.sampled_from([lines[i][: len(lines[i]) // 2], '{"input": "x"}', "[1]", "  "]))
        body = "".join(line + "\n" for line in lines)
        n_in = sum(1 for line in lines if line.strip())
    elif base == "json":
        body = json.dumps(
            [{"input": a, "output": b, "x": c} for a, b, c in rows], ensure_ascii=draw(st.booleans())
        )
        n_in = len(rows)
    elif base == "csv":
        buf = io.StringIO(newline="")
        quoting = draw(st.sampled_from([csv.QUOTE_MINIMAL, csv.QUOTE_ALL, csv.QUOTE_NONNUMERIC]))
        w = csv.writer(buf, quoting=quoting, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
        w.writerow(["input", "output", "extra"])
        w.writerows(rows)
        body, n_in = buf.getvalue(), len(rows)
    else:  # TSV has no quoting: a record per line (a tab or a newline in a value makes what it makes)
        body = "input\toutput\n" + "".join(f"{a}\t{b}\n" for a, b, _ in rows)
        n_in = sum(1 for line in re.split(r"\r\n|\r|\n", body)[1:] if line)
    data = body.encode(enc, errors="surrogatepass" if enc.startswith("utf") else "replace")
    if fmt.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    limit = draw(st.one_of(st.none(), st.integers(1, 30)))
    return f"d.{fmt}", data, n_in, limit, draw(st.integers(0, 10))


def check_pool(case) -> None:
    from epr.config import DataConfig
    from epr.tasks import get_task

    name, data, n_in, limit, eval_size = case
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / name
        p.write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        try:
            task = get_task(DataConfig(task="jsonl", path=str(p), pool_limit=limit, eval_size=eval_size))
            pool, ev = task.load()
        except Exception as e:
            one_paragraph(e)
            SEEN["pool: clear error"] += 1
        else:
            r = task.report
            assert len(pool) + len(ev) == r.kept and pool
            assert r.kept + len(r.skipped) + r.beyond_pool_limit == n_in, (r.to_json(), n_in)
            assert all(e.input.strip() and e.output.strip() for e in [*pool, *ev])
            SEEN["pool: rows accounted for"] += 1
        assert hashlib.sha256(p.read_bytes()).hexdigest() == digest  # the input file is never changed


@CI
@given(pool_files())
def test_fuzzed_pools(case):
    check_pool(case)


@pytest.mark.slow
@SLOW
@given(pool_files())
def test_fuzzed_pools_by_the_thousand(case):
    check_pool(case)


# ---- --set overrides and YAML configs ---------------------------------------------------------------------------
KEYS = [k for k, *_ in ALL]
RAW = [
    "-5", "0", "-1", "1e400", "-.inf", ".nan", "1_000", "0x10", "2**31", "99999999999999999999999", "[1, 2]",
    "{a: 1}", "null", "~", "yes", "off", "''", "'", '"', "[", "{", "&a [*a]", "!!python/object:os.system",
    "2024-01-01", "[bm25, 3]", "epr+div+bias", "\x00", "../..", "/", "a\x00b", "[" * 1200 + "]" * 1200,
]  # fmt: skip
# values a user would set (numbers near the ranges' bounds, names) and values nobody should
plausible = st.one_of(
    st.integers(-3, 100).map(str), st.floats(-2, 2).map(lambda x: f"{x:.3g}"), st.sampled_from(["bm25", "epr", "fp32", "mine", "runs/x", "true", "null", "[bm25, epr+div]", "0.5,1"]),
)  # fmt: skip
yaml_value = st.one_of(plausible, plausible, st.sampled_from(RAW), st.text(max_size=20))
key = st.one_of(
    st.sampled_from(KEYS),
    st.sampled_from(KEYS),
    st.sampled_from([k.split(".")[0] for k in KEYS]),  # a whole section
    st.sampled_from(["", ".", "a..b", "candidates.L.x", "nope.x", "inherit", "=", " name "]),
    st.text(max_size=10),
)


def typed_value(row):
    """Values for one setting as its declaration suggests: its choices, numbers around its bounds, a bool, a path."""
    _, f, tp, _ = row
    m = f.metadata
    if "choices" in m:
        one = st.sampled_from(m["choices"])
        return st.lists(one, min_size=1, max_size=3, unique=True).map(json.dumps) if isinstance(f.default, tuple) else one  # fmt: skip
    if tp is bool:
        return st.sampled_from(["true", "false", "maybe"])
    if "range" in m:
        lo = m["range"].get("ge", m["range"].get("gt", 0))
        nums = st.integers(int(lo) - 2, int(lo) + 40) if "int" in str(tp) else st.floats(lo - 0.5, lo + 2)
        return nums.map(lambda x: f"[{x}]" if isinstance(f.default, tuple) else str(x))
    return st.sampled_from(["mine", "runs/x", "null", "bm25", "''", "a/../b"])


typed = st.sampled_from(ALL).flatmap(lambda row: typed_value(row).map(lambda v: f"{row[0]}={v}"))
override = st.one_of(typed, typed, typed, st.tuples(key, yaml_value).map(lambda kv: f"{kv[0]}={kv[1]}"), st.text(max_size=20))  # fmt: skip


def check_config(paths, overrides) -> None:
    try:
        cfg = load_config(paths, overrides)
    except Exception as e:
        one_paragraph(e)
        SEEN["config: clear error"] += 1
        return
    assert isinstance(cfg, ExperimentConfig)
    for k, f, tp, _ in ALL:  # what loads is what the declarations allow
        section, _, name = k.rpartition(".")
        v = getattr(getattr(cfg, section) if section else cfg, name)
        for x in v if isinstance(v, tuple) else (v,):
            assert not out_of_range(x, f.metadata.get("range", {})), (k, v)
            assert x in f.metadata.get("choices", (x,)), (k, v)
            if "str" in str(tp) and x is not None:
                assert isinstance(x, str), (k, v)
            if "float" in str(tp) and x is not None and "range" in f.metadata:
                assert not math.isnan(x), (k, v)
    SEEN["config: loaded"] += 1


@CI
@given(st.lists(override, max_size=4))
@example(["retrieve.retrievers=null"])  # what the fuzzer found: an AttributeError
@example(["retrieve.retrievers=[bm25, null]"])
@example(["data.task=" + "[" * 1200])  # RecursionError in the YAML parser
def test_fuzzed_overrides(items):
    check_config([], items)


@pytest.mark.slow
@SLOW
@given(st.lists(override, max_size=4))
def test_fuzzed_overrides_by_the_thousand(items):
    check_config([], items)


def _yaml_tree(leaves):
    """A YAML mapping over the real sections and keys (and some unknown ones)."""
    section = st.dictionaries(
        st.sampled_from([k.split(".")[-1] for k in KEYS] + ["nope"]), leaves, max_size=4
    )
    sections = sorted({k.split(".")[0] for k in KEYS} | {"inherit"})
    return st.dictionaries(st.sampled_from(sections), st.one_of(section, leaves), max_size=4)


config_text = st.one_of(
    _yaml_tree(st.one_of(leaf.filter(lambda v: not isinstance(v, str) or len(v) < 1000), yaml_value)).map(
        lambda d: yaml.safe_dump(d, allow_unicode=True)
    ),
    st.text(max_size=200),
    st.sampled_from(RAW),
)


def check_config_file(text_or_bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "c.yaml"
        data = (
            text_or_bytes
            if isinstance(text_or_bytes, bytes)
            else text_or_bytes.encode("utf-8", "surrogatepass")
        )
        p.write_bytes(data)
        check_config([p], [])
        assert p.read_bytes() == data


@CI
@given(st.one_of(config_text, st.binary(max_size=64)))
@example('inherit: "\\uD800"\n')  # what the fuzzer found: UnicodeEncodeError, ValueError, OSError, TypeError
@example('inherit: "\\0"\n')
@example("inherit: '\n\n  '\n")
@example("inherit: " + "x" * 5000 + "\n")
@example("inherit: 5\n")
def test_fuzzed_yaml_configs(text_or_bytes):
    check_config_file(text_or_bytes)


@pytest.mark.slow
@SLOW
@given(st.one_of(config_text, st.binary(max_size=64)))
def test_fuzzed_yaml_configs_by_the_thousand(text_or_bytes):
    check_config_file(text_or_bytes)


# ---- PromptRetriever.retrieve() arguments --------------------------------------------------------------------
@pytest.fixture(scope="module")
def retriever():
    from tests.stub_encoder import stub_retriever

    return stub_retriever("unused", count=lambda s: len(s.split()))


query = st.one_of(
    text, st.sampled_from(["how do I reset my email", "\ud800", "   ", "reset " * 5000]), st.none(), st.integers(),
    st.binary(max_size=8), st.lists(text, max_size=2), st.floats(),
)  # fmt: skip
k_arg = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([10**30, 0, True, False, 1.0, 2.5, "3", None]),
    st.floats(),
    st.none(),
)


def check_retrieve(r, q, k) -> None:
    import numpy as np

    numpy_too = isinstance(k, int) and not isinstance(k, bool) and abs(k) < 2**63
    for kk in (k, np.int64(k)) if numpy_too else (k,):
        try:
            res = r.retrieve(q, k=kk)
        except (TypeError, ValueError) as e:
            assert str(e).strip() and "\n" not in str(e), repr(str(e))
            SEEN["retrieve: clear error"] += 1
            continue
        want = r.budget.k if kk is None else int(kk)
        assert len(res.demos) == len(res.scores) == min(want, len(r.pool))
        assert 0 <= res.prompt_demos <= len(res.demos) and isinstance(res.prompt, str)
        SEEN["retrieve: result"] += 1


@CI
@given(query, k_arg)
@example("reset my \ud800 email", 3)  # the tokenizer's nameless TypeError, before the check
def test_fuzzed_retrieve_arguments(retriever, q, k):
    check_retrieve(retriever, q, k)


@pytest.mark.slow
@SLOW
@given(query, k_arg)
def test_fuzzed_retrieve_arguments_by_the_thousand(retriever, q, k):
    check_retrieve(retriever, q, k)


def test_zz_report_outcomes():
    """The outcomes this run's fuzz cases reached (run last in the module): each property saw both sides."""
    print("fuzz outcomes:", dict(SEEN))
    sides = {"pool": ("rows accounted for", "clear error"), "config": ("loaded", "clear error")}
    for prop, (ok, error) in sides.items():
        if any(k.startswith(prop) for k in SEEN):  # a property that ran reached success and clear errors
            assert SEEN[f"{prop}: {ok}"] and SEEN[f"{prop}: {error}"], dict(SEEN)
