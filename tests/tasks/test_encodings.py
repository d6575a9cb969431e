"""A data file in another encoding than UTF-8 is refused with its encoding named: from its byte-order mark
(UTF-16, UTF-32: the hint converts from that encoding, not from cp1252), from the NUL bytes of a BOM-less UTF-16
file, from the bytes of a cp1252 one. The file is never changed."""

from __future__ import annotations

import pytest

from tests.test_bad_input import GOOD, assert_clean_error, cli, own_sets

CSV = (
    "input,output\n" + "".join(f"{r['input']},{r['output']}\n" for r in GOOD) + "café au lait,COFFEE(lait)\n"
)


@pytest.mark.parametrize(
    "encoding,named,iconv",
    [
        (
            "utf-16",
            "UTF-16 (little-endian)",
            "iconv -f UTF-16 -t UTF-8",
        ),  # Python writes a BOM, little-endian
        ("utf-32", "UTF-32 (little-endian)", "iconv -f UTF-32 -t UTF-8"),
    ],
)
def test_utf16_csv_named_from_bom(encoding, named, iconv, tmp_path, capsys):
    """The reported case: a UTF-16 CSV got the UTF-8 error with the hint `iconv -f cp1252`."""
    p = tmp_path / "d.csv"
    p.write_bytes(CSV.encode(encoding))
    before = p.read_bytes()
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert_clean_error(rc, err, "d.csv", named, "byte-order mark", iconv)
    assert "cp1252" not in err
    assert p.read_bytes() == before


@pytest.mark.parametrize(
    "encoding,named", [("utf-16-be", "UTF-16 (big-endian)"), ("utf-32-be", "UTF-32 (big-endian)")]
)
def test_big_endian_bom_named(encoding, named, tmp_path, capsys):
    p = tmp_path / "d.jsonl"
    p.write_bytes(
        "\ufeff".encode(encoding)
        + "".join(f'{{"input": "{r["input"]}", "output": "x"}}\n' for r in GOOD).encode(encoding)
    )
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert_clean_error(rc, err, named)


@pytest.mark.parametrize("name", ["d.csv", "d.jsonl"])
def test_utf16_without_bom_hinted_by_its_nul_bytes(name, tmp_path, capsys):
    p = tmp_path / name
    text = (
        CSV
        if name.endswith(".csv")
        else "".join(f'{{"input": "{r["input"]}", "output": "x"}}\n' for r in GOOD)
    )
    p.write_bytes(text.encode("utf-16-le"))
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert_clean_error(rc, err, "NUL bytes", "UTF-16")


def test_cp1252_keeps_its_hint(tmp_path, capsys):
    p = tmp_path / "d.csv"
    p.write_bytes(CSV.encode("cp1252"))
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert_clean_error(rc, err, "not UTF-8: byte 0xe9", "iconv -f cp1252")


def test_utf8_with_bom_is_read(tmp_path, capsys):
    p = tmp_path / "d.csv"
    p.write_bytes(CSV.encode("utf-8-sig"))
    rc, err = cli(capsys, "run", "--until", "examples", *own_sets(tmp_path, p))
    assert rc == 0, err
