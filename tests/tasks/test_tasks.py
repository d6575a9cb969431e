import gzip
import json

import numpy as np
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
    assert len(task.report.skipped) == 1 and "d.jsonl:4: empty output" in task.report.skipped[0]
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


@pytest.mark.skipif(not SHARED_DATA.exists(), reason="../shared/data not present")
def test_smcalflow_dialogue_cut_shares_no_dialogue_between_dev_and_locked():
    """configs/smcalflow.yaml cuts dev / locked by dialogue: no dialogue on both sides, dev at least
    data.eval_limit turns; the per-turn cut of the curve's folders (negative control) shares hundreds."""
    from epr.config import load_config
    from epr.reports.stats import eval_part

    cfg = load_config(["configs/smcalflow.yaml"], ["data.data_dir=" + str(SHARED_DATA)]).data
    assert cfg.eval_cut == "groups"
    t = get_task(cfg)
    _, ev = t.load()
    groups = t.groups(ev)

    def dialogues(cut):
        g = groups if cut == "groups" else None
        parts = [eval_part(len(ev), cfg.eval_limit, p, cfg.split_seed, g) for p in ("dev", "locked")]
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(ev)))  # the two parts are the split
        return [{groups[i] for i in part} for part in parts], parts

    (dev, locked), parts = dialogues("groups")
    assert not dev & locked and len(parts[0]) >= cfg.eval_limit and len(parts[1]) >= 1000
    (dev, locked), _ = dialogues("rows")
    assert len(dev & locked) > 300  # the old cut: 423 dialogues on both sides


def test_group_cut_keeps_groups_whole_and_rows_cut_is_unchanged():
    from epr.reports.stats import eval_part, seeded_subset

    groups = [str(i // 4) for i in range(40)]
    dev = eval_part(40, 10, "dev", 3, groups)
    locked = eval_part(40, 10, "locked", 3, groups)
    assert {groups[i] for i in dev}.isdisjoint({groups[i] for i in locked})
    assert len(dev) == 12 and len(locked) == 28  # whole groups of 4 until 10 rows are reached
    assert list(eval_part(40, 10, "dev", 3)) == list(seeded_subset(40, 10, 3))  # no groups: as before
    with pytest.raises(ValueError, match="3 group keys for 40 rows"):
        eval_part(40, 10, "dev", 3, groups[:3])


def test_split_pool_eval_draws_what_it_drew_before_the_shared_group_draw():
    rows = [RawRow(f"x{i}", f"y{i}", {"d": str(i // 3)}, f"f:{i}") for i in range(30)]
    _, ev = split_pool_eval(rows, 7, seed=1, group=lambda r: r.meta["d"])
    _, ev_rows = split_pool_eval(rows, 5, seed=0)
    assert [r.input for r in ev] == ["x12", "x13", "x14", "x21", "x22", "x23", "x24", "x25", "x26"]
    assert [r.input for r in ev_rows] == ["x6", "x10", "x18", "x19", "x28"]


# ---- rows that used to be merged, mangled or crash without naming where ---------------------------------------
def test_tsv_quotes_are_literal_and_never_join_lines(tmp_path):
    """TSV has no quoting (IANA text/tab-separated-values): a stray quote once merged the next lines into one field."""
    p = tmp_path / "q.tsv"
    p.write_text(
        'input\toutput\n"Hamlet is a play\tyes\nhow tall is he\tsix feet\nhe is 6 2"\ttall\nlast\trow\n'
    )
    rows = get_task(DataConfig(task="jsonl", path=str(p), eval_path=str(p))).rows_from_file(p)
    assert [(r.input, r.output) for r in rows] == [
        ('"Hamlet is a play', "yes"),
        ("how tall is he", "six feet"),
        ('he is 6 2"', "tall"),
        ("last", "row"),
    ]
    assert [r.where.rsplit(":", 1)[1] for r in rows] == ["2", "3", "4", "5"]


@pytest.mark.parametrize("name", ["up.CSV", "up.Tsv", "up.CSV.GZ"])
def test_suffix_case_does_not_matter(tmp_path, name):
    sep = "\t" if "tsv" in name.lower() else ","
    text = f"input{sep}output\n" + "".join(f"q{i}{sep}a{i}\n" for i in range(6))
    p = tmp_path / name
    if name.lower().endswith(".gz"):
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)
    pool, ev = get_task(DataConfig(task="jsonl", path=str(p), eval_size=1)).load()
    assert sorted(e.output for e in pool + ev) == [f"a{i}" for i in range(6)]


def test_csv_repeated_column_is_an_error(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("input,output,output\na,b,c\n")
    with pytest.raises(
        InputError, match=r"d.csv:1: the header names column\(s\) \['output'\] more than once"
    ):
        get_task(DataConfig(task="jsonl", path=str(p))).load()


def test_skips_name_the_line_not_the_row_count(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [json.dumps({"input": f"q{i}", "output": f"a{i}"}) for i in range(8)]
    p.write_text(
        rows[0] + "\n\n" + json.dumps({"input": "c", "output": ""}) + "\n" + "\n".join(rows[1:]) + "\n"
    )
    task = get_task(DataConfig(task="jsonl", path=str(p), eval_size=1))
    task.load()
    assert task.report.skipped == [f"{p}:3: empty output"]


def test_array_file_rows_named_by_element(tmp_path):
    p = tmp_path / "d.json"
    p.write_text(
        json.dumps([{"input": f"q{i}", "output": "" if i == 2 else f"a{i}"} for i in range(8)], indent=1)
    )
    task = get_task(DataConfig(task="jsonl", path=str(p), eval_size=1))
    task.load()
    assert task.report.skipped == [f"{p}: array element 3: empty output"]


def test_output_holding_the_end_marker_is_skipped_and_counted(tmp_path):
    p = tmp_path / "d.jsonl"
    rows = [{"input": f"q{i}", "output": f"a{i}"} for i in range(8)] + [
        {"input": "x", "output": "line1\nline2"}
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task(DataConfig(task="jsonl", path=str(p), eval_size=1))
    pool, ev = task.load()
    assert len(pool) + len(ev) == 8 and "line1" not in {e.output for e in pool + ev}
    assert task.report.skipped == [
        f"{p}:9: output holds the end marker '\\n' (the prompt format ends an answer there)"
    ]


def test_repeats_and_eval_pool_overlap_reported_not_dropped(tmp_path, caplog):
    p, e = tmp_path / "d.jsonl", tmp_path / "e.jsonl"
    p.write_text("".join(json.dumps({"input": f"q{i % 5}", "output": f"a{i % 5}"}) + "\n" for i in range(20)))
    e.write_text(
        json.dumps({"input": "q1", "output": "a1"})
        + "\n"
        + json.dumps({"input": "new", "output": "b"})
        + "\n"
    )
    task = get_task(DataConfig(task="jsonl", path=str(p), eval_path=str(e)))
    pool, ev = task.load()
    assert len(pool) == 20 and len(ev) == 2  # kept
    rep = task.report.to_json()
    assert rep["repeated_in_pool"] == 15 and rep["eval_in_pool"] == 1
    assert (
        f"1 of 2 evaluation rows are also in the pool (same input and output), e.g. {e}:1 (= {p}:2)"
        in caplog.text
    )


def test_input_field_equal_to_output_field_is_a_config_error():
    from epr.types import ConfigError

    with pytest.raises(ConfigError, match="both 'text'"):
        DataConfig(task="jsonl", input_field="text", output_field="text")


def _tqa_dir(tmp_path, rows):
    d = tmp_path / "truthfulqa"
    d.mkdir()
    (d / "truthfulqa.2021-10.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _tqa_row(q="Q?", correct=("Yes",), incorrect=("No",)):
    choices = [*correct, *incorrect]
    t = {"choices": choices, "labels": [1] * len(correct) + [0] * len(incorrect)}
    return {
        "question": q,
        "correct_answers": list(correct),
        "incorrect_answers": list(incorrect),
        "mc1_targets": t,
        "mc2_targets": t,
    }


@pytest.mark.parametrize(
    "bad,expect",
    [
        ({"correct_answers": "Yes it is"}, r"truthfulqa.2021-10.jsonl:2: field 'correct_answers' is str"),
        ({"correct_answers": ["A", {"x": 1}]}, r"jsonl:2: field 'correct_answers\[1\]' is an object"),
        ({"question": ["Q"]}, r"jsonl:2: field 'question' is an array"),
    ],
)
def test_truthfulqa_task_rows_checked(tmp_path, bad, expect):
    d = _tqa_dir(tmp_path, [_tqa_row("Q0?"), {**_tqa_row("Q1?"), **bad}])
    with pytest.raises(InputError, match=expect):
        get_task(DataConfig(task="truthfulqa", data_dir=str(d), eval_size=1)).load()


@pytest.mark.parametrize(
    "bad,expect",
    [
        ({"question": None}, "jsonl:2: field 'question' must be a non-empty text"),
        ({"correct_answers": "Yes"}, "jsonl:2: field 'correct_answers' must be a list"),
        ({"incorrect_answers": []}, "jsonl:2: question has no incorrect answers"),
        (
            {"mc1_targets": {"choices": ["a", "b"], "labels": [1]}},
            "jsonl:2: mc1_targets: 2 choices but labels",
        ),
        ({"mc2_targets": {"choices": ["a"], "labels": [0]}}, "jsonl:2: mc2_targets: labels must be 0/1"),
    ],
)
def test_truthfulqa_benchmark_rows_checked(tmp_path, bad, expect):
    from epr.truthfulqa.sets import load_tqa

    d = _tqa_dir(tmp_path, [_tqa_row("Q0?"), {**_tqa_row("Q1?"), **bad}])
    with pytest.raises(InputError, match=expect):
        load_tqa(str(d))


def test_smcalflow_turn_without_dialogue_named(tmp_path):
    d = tmp_path / "smcalflow"
    d.mkdir()
    rows = [{"input": f"u{i}", "output": f"(l{i})", "dialogue_id": f"d{i}"} for i in range(3)]
    rows.append({"input": "u", "output": "(l)"})
    (d / "smcalflow2.validation.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    )
    with pytest.raises(InputError, match=r"validation.jsonl.gz:4: missing field 'dialogue_id'"):
        get_task(DataConfig(task="smcalflow", data_dir=str(tmp_path), eval_size=1)).load()


class _HubSplit(list):
    column_names = ["question", "logical_form"]


def test_hub_rows_get_the_file_rows_checks(monkeypatch):
    import datasets

    rows = _HubSplit({"question": f"q{i}", "logical_form": f"[IN:X {i}]"} for i in range(6))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: rows)
    pool, _ = get_task(DataConfig(task="mtop")).load()
    assert [e.output for e in pool][:2] == ["[IN:X 0]", "[IN:X 1]"]
    rows[3] = {"question": "q3", "logical_form": 7}  # a number is text, as in a file
    pool, _ = get_task(DataConfig(task="mtop")).load()
    assert "7" in [e.output for e in pool]
    rows[3] = {"question": "q3", "logical_form": ["IN", "B"]}
    with pytest.raises(InputError, match=r"mtop\[train\]#3: field 'logical_form' is an array"):
        get_task(DataConfig(task="mtop")).load()
    monkeypatch.setattr(_HubSplit, "column_names", ["question", "parse"])
    with pytest.raises(InputError, match=r"has no column\(s\) \['logical_form'\]; its columns are"):
        get_task(DataConfig(task="mtop")).load()


def test_hub_revision_reaches_the_hub_and_unpinned_reads_warn(monkeypatch, caplog):
    import datasets

    seen = []
    rows = _HubSplit({"question": f"q{i}", "logical_form": f"[IN:X {i}]"} for i in range(6))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: seen.append(k.get("revision")) or rows)
    with caplog.at_level("WARNING"):
        get_task(DataConfig(task="mtop", hub_revision="abc123")).load()
    assert seen == ["abc123", "abc123"] and "unpinned" not in caplog.text
    get_task(DataConfig(task="mtop")).load()
    assert seen[2:] == [None, None] and "data.hub_revision=<commit>" in caplog.text


@pytest.mark.parametrize(
    "task,same,different",
    [
        (
            "mtop",
            ("[IN:GET_WEATHER [SL:LOCATION paris ] ]", "[IN:GET_WEATHER [SL:LOCATION new york city ] ]"),
            "[IN:GET_WEATHER [SL:DATE_TIME today ] ]",
        ),
        (
            "break",
            ("return flights ;return #1 from denver", "return cubes ;return #1 that are  red"),
            "return flights ;return number of #1",
        ),
        (
            "smcalflow",
            ('(Yield (Event.subject (?= "dinner")))', '(Yield (Event.subject (?= "lunch (at noon)")))'),
            '(Yield (Event.start (?= "dinner")))',
        ),
    ],
)
def test_skeleton_keeps_structure_and_drops_the_filled_in_text(task, same, different):
    t = get_task(DataConfig(task=task))
    a, b = (t.skeleton(y) for y in same)
    assert a == b and a  # the same structure, other content words
    assert t.skeleton(different) != a  # negative control: another structure
    assert get_task(DataConfig(task="jsonl", path="x.jsonl")).skeleton(same[0]) is None  # no structure known


@pytest.mark.skipif(not (SHARED_DATA / "break").exists(), reason="needs the shared BREAK data")
def test_break_skeleton_identifies_the_operators_of_real_qdmrs():
    pool, _ = get_task(DataConfig(task="break", data_dir=str(SHARED_DATA), eval_size=100)).load()
    t = get_task(DataConfig(task="break"))
    sks = [t.skeleton(e.output) for e in pool[:500]]
    assert sum("?" not in s for s in sks) >= 0.95 * len(sks)
    assert len(set(sks)) >= 50  # it separates structures rather than mapping most to one
