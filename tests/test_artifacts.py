"""epr.artifacts: reading a user's JSONL file (UTF-8 with or without a byte-order mark, gzip, bad bytes)."""

import gzip
import json

import pytest

from epr.artifacts import read_jsonl
from epr.types import InputError

ROWS = [{"input": f"qué {i}", "output": f"a{i}"} for i in range(4)]
TEXT = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS)


def test_byte_order_mark_is_accepted(tmp_path):
    plain, bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    plain.write_bytes(TEXT.encode("utf-8"))
    bom.write_bytes(b"\xef\xbb\xbf" + TEXT.encode("utf-8"))
    assert list(read_jsonl(bom, required=("input", "output"))) == list(read_jsonl(plain)) == ROWS


def test_byte_order_mark_is_accepted_in_gz(tmp_path):
    p = tmp_path / "bom.jsonl.gz"
    p.write_bytes(gzip.compress(b"\xef\xbb\xbf" + TEXT.encode("utf-8")))
    assert list(read_jsonl(p)) == ROWS


@pytest.mark.parametrize("gz", [False, True])
def test_non_utf8_byte_names_file_line_and_column(tmp_path, gz):
    lines = TEXT.encode("utf-8").splitlines(keepends=True)
    lines[2] = b'{"input": "caf\xe9", "output": "x"}\n'  # latin-1 e-acute on line 3, column 15
    data = b"".join(lines)
    p = tmp_path / ("d.jsonl.gz" if gz else "d.jsonl")
    p.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(InputError) as e:
        list(read_jsonl(p))
    msg = str(e.value)
    offset = len(lines[0]) + len(lines[1]) + 14
    assert msg.startswith(f"{p}:3: not UTF-8: byte 0xe9 at column 15 (byte offset {offset})"), msg
    assert "must be UTF-8" in msg


def test_malformed_line_still_named_after_a_byte_order_mark(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + TEXT.encode("utf-8") + b'{"input": \n')
    with pytest.raises(InputError, match=r"d.jsonl:5: malformed JSON"):
        list(read_jsonl(p))


# ---- ChunkStore: the one chunk cache ------------------------------------------------------------------------


def test_chunk_store_resumes_and_never_serves_another_key_or_input(tmp_path):
    from epr.cache import ChunkStore

    calls = []

    def double(part):
        calls.append(list(part))
        if part == [5, 6] and len(calls) == 3:  # the first time chunk 2 is reached: killed
            raise KeyboardInterrupt
        return [2 * x for x in part]

    items = [1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(KeyboardInterrupt):
        ChunkStore(tmp_path, {"lm": "a"}).map(items, 2, double)
    calls.clear()
    assert ChunkStore(tmp_path, {"lm": "a"}).map(items, 2, double) == [2, 4, 6, 8, 10, 12, 14]
    assert calls == [[5, 6], [7]]  # resumed: the two finished chunks were not recomputed

    calls.clear()  # other inputs in the same chunk positions: recomputed, never served
    assert ChunkStore(tmp_path, {"lm": "a"}).map([1, 2, 3, 9], 2, double) == [2, 4, 6, 18]
    assert calls == [[3, 9]]

    calls.clear()  # another key (e.g. another LM or dtype): everything recomputed, old chunks removed
    other = ChunkStore(tmp_path, {"lm": "b"})
    assert not list(tmp_path.glob("chunk-*.json"))
    assert other.map(items[:2], 2, double) == [2, 4] and calls == [[1, 2]]

    other.path(0).write_text("{half a chunk")  # a corrupt chunk is recomputed, not an error
    calls.clear()
    assert other.map(items[:2], 2, double) == [2, 4] and calls == [[1, 2]]


def test_chunk_store_rejects_a_function_that_drops_rows(tmp_path):
    from epr.cache import ChunkStore

    with pytest.raises(RuntimeError, match="gave 1 rows for 2 items"):
        ChunkStore(tmp_path, {}).map([1, 2], 2, lambda part: part[:1])
