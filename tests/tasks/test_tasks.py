import gzip
import json

import pytest

from epr.config import DataConfig
from epr.tasks import get_task, split_pool_eval
from epr.tasks.base import RawRow
from epr.types import InputError
from tests.conftest import SHARED_DATA


def test_malformed_line_named(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"input": "a", "output": "b"}\n{"input": "c", "output": \n')
    with pytest.raises(InputError, match=r"d.jsonl:2: malformed JSON"):
        get_task(DataConfig(task="jsonl", path=str(p))).load()


def test_missing_field_named(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"input": "a", "output": "b"}\n{"input": "c"}\n')
    with pytest.raises(InputError, match=r"d.jsonl:2: missing field\(s\) \['output'\]"):
        get_task(DataConfig(task="jsonl", path=str(p))).load()


def test_empty_output_skipped_and_counted(tmp_path):
    rows = [{"input": f"q{i}", "output": "" if i == 3 else f"a{i}"} for i in range(10)]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(DataConfig(task="jsonl", path=str(p), eval_size=2))
    pool, ev = task.load()
    assert len(pool) + len(ev) == 9
    assert len(task.report.skipped) == 1 and "d.jsonl:#4: empty output" in task.report.skipped[0]
    assert [e.idx for e in pool] == list(range(len(pool)))


def test_many_skips_logged_a_few_then_summarised(tmp_path, caplog):
    rows = [{"input": f"q{i}", "output": "" if i % 2 else f"a{i}"} for i in range(40)]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(DataConfig(task="jsonl", path=str(p), eval_size=2))
    with caplog.at_level("WARNING"):
        task.load()
    assert len(task.report.skipped) == 20  # every row is still named in the report
    assert sum("skipping" in m for m in caplog.messages) == task.report.LOG_EACH
    assert any("kept 20 rows, skipped 20 (20 empty output)" in m for m in caplog.messages)
    assert task.report.to_json()["skipped_by_reason"] == {"empty output": 20}


def test_csv_missing_column(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("question,answer\nhi,there\n")
    with pytest.raises(InputError, match=r"missing column\(s\) \['input', 'output'\]"):
        get_task(DataConfig(task="jsonl", path=str(p))).load()
    pool, ev = get_task(
        DataConfig(task="jsonl", path=str(p), input_field="question", output_field="answer", eval_path=str(p))
    ).load()
    assert pool[0].input == "hi" and ev[0].output == "there"


def _csv_task(p):
    return get_task(
        DataConfig(task="jsonl", path=str(p), input_field="question", output_field="answer", eval_size=1)
    )


CSV_TEXT = "question,answer\nhow are you,fine\nqué tal,bien\nwhere,here\n"


@pytest.mark.parametrize("gz", [False, True])
def test_csv_with_byte_order_mark_loads_like_without(tmp_path, gz):
    plain, bom = tmp_path / "plain.csv", tmp_path / ("bom.csv.gz" if gz else "bom.csv")
    plain.write_text(CSV_TEXT, encoding="utf-8")
    data = b"\xef\xbb\xbf" + CSV_TEXT.encode("utf-8")
    bom.write_bytes(gzip.compress(data) if gz else data)
    a, b = ([(e.input, e.output) for part in _csv_task(f).load() for e in part] for f in (plain, bom))
    assert a == b and sorted(a) == [("how are you", "fine"), ("qué tal", "bien"), ("where", "here")]


def test_csv_non_utf8_byte_names_file_and_line(tmp_path):
    p = tmp_path / "d.csv"
    p.write_bytes(b"question,answer\nhow are you,fine\n" + "qué tal,bien\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"d.csv:3: not UTF-8: byte 0xe9 at column 3 .* must be UTF-8"):
        _csv_task(p).load()


def test_split_is_deterministic_and_keeps_groups_whole():
    rows = [RawRow(f"x{i}", f"y{i}", {"d": str(i // 3)}, f"f:{i}") for i in range(30)]
    a = split_pool_eval(rows, 7, seed=1, group=lambda r: r.meta["d"])
    b = split_pool_eval(rows, 7, seed=1, group=lambda r: r.meta["d"])
    assert a == b
    pool_groups = {r.meta["d"] for r in a[0]}
    assert pool_groups.isdisjoint({r.meta["d"] for r in a[1]}) and len(a[1]) >= 7


def test_demo_task_packaged():
    pool, ev = get_task(DataConfig(task="demo")).load()
    assert (len(pool), len(ev)) == (320, 80)


@pytest.mark.skipif(not SHARED_DATA.exists(), reason="../shared/data not present")
@pytest.mark.parametrize(
    "task,n_pool,n_eval",
    [("mtop", 15667, 2235), ("break", 6760, 1000), ("smcalflow", None, None), ("truthfulqa", None, None)],
)
def test_real_loaders(task, n_pool, n_eval):
    t = get_task(DataConfig(task=task, data_dir=str(SHARED_DATA)))
    pool, ev = t.load()
    if n_pool:
        assert (len(pool), len(ev)) == (n_pool, n_eval)
    elif task == "truthfulqa":  # every correct (q, a) pair, no question on both sides
        assert len(pool) + len(ev) == 2839  # SPEC 3.4: 2,839 pairs (2,837 distinct)
        assert {e.input for e in pool}.isdisjoint({e.input for e in ev}) and pool and ev
    else:  # SMCalFlow: 14,751 turns less the 1,255 flagged skip, split by dialogue
        assert len(pool) + len(ev) == 14751 - 1255 and len(t.report.skipped) == 1255
        assert {e.meta["dialogue_id"] for e in pool}.isdisjoint({e.meta["dialogue_id"] for e in ev})
