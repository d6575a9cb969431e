"""Reading a data file's rows (JSONL, a JSON array, CSV, TSV; ``.gz`` too) and turning their input and output
values into text, naming the file and line of anything malformed. :mod:`epr.tasks.base` builds tasks on it."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from epr.artifacts import nul_hint, open_text, read_jsonl_lines
from epr.types import InputError

__all__ = ["read_table", "field_text", "text_fields"]


def read_table(
    path: str | Path, input_field: str, output_field: str, hint: str = ""
) -> Iterable[tuple[dict[str, Any], str]]:
    """Rows of a JSONL (or JSON array) or CSV/TSV file (UTF-8, a leading byte-order mark allowed; ``.gz`` too) as
    (dict, 'file:line'), the input and output fields as text (:func:`field_text`).

    CSV goes through the ``csv`` module's dialect rules: quoted fields may hold commas, quotes (doubled) and
    newlines. TSV is read as IANA's text/tab-separated-values defines it: one record per line, no quoting, so a
    quote in a field is a quote (``he is 6'2"``) and can never join lines into one row. A record with more or fewer
    fields than the header (an unquoted comma in a field) raises ``InputError`` naming the file and line instead of
    cutting the row. So do missing or repeated columns, bytes that are not UTF-8, an empty file, and an input or
    output that is an object, an array or NaN. The suffix decides the format, in any case (``.CSV``, ``.Tsv.GZ``)."""
    path = Path(path)
    name = path.name.lower().removesuffix(".gz")
    n = 0
    header_only = False
    if name.endswith((".csv", ".tsv")):
        tsv = name.endswith(".tsv")
        with open_text(path, newline="") as f:
            reader = (
                csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, strict=True)
                if tsv
                else csv.reader(f, delimiter=",", strict=True)
            )
            start = 1  # the line where the record being read starts
            try:
                cols = next(reader, None)
                if cols is None:
                    raise InputError(
                        f"{path}: empty file; expected a header line naming the columns, then rows"
                    )
                missing = [c for c in (input_field, output_field) if c not in cols]
                if missing:
                    raise InputError(
                        f"{path}: missing column(s) {missing}; columns are {cols}{nul_hint(''.join(cols))}{hint}"
                    )
                repeated = sorted({c for c in cols if cols.count(c) > 1})
                if repeated:
                    raise InputError(
                        f"{path}:1: the header names column(s) {repeated} more than once; which one holds the "
                        "data would be a guess: rename or drop the extra ones"
                    )
                header_only = True
                while True:
                    start = reader.line_num + 1
                    rec = next(reader, None)
                    if rec is None:
                        break
                    if not rec:
                        continue  # a blank line
                    if len(rec) != len(cols):
                        fix = (
                            "a field must not hold a tab (TSV has no quoting: write CSV to quote fields)"
                            if tsv
                            else 'a field holding the delimiter must be quoted (e.g. "wake me at 7, am"), a quote '
                            "doubled"
                        )
                        raise InputError(
                            f"{path}:{start}: {len(rec)} fields, the header has {len(cols)} ({cols}); {fix}"
                        )
                    row = dict(zip(cols, rec))
                    where = f"{path}:{start}"
                    yield text_fields(row, (input_field, output_field), where), where
                    n += 1
            except csv.Error as e:
                # the record that failed starts at `start`; the reader may have read to the end of the file
                if "field larger than field limit" in str(e):
                    why = (
                        "a field longer than the csv module's limit: usually a quote opened in this record and "
                        "never closed, which makes the rest of the file one field"
                    )
                elif tsv:
                    why = "TSV has no quoting"
                else:
                    why = 'quote fields as RFC 4180 does: a quote inside a quoted field is doubled ("")'
                raise InputError(
                    f"{path}:{start}: not valid {'TSV' if tsv else 'CSV'} in the record starting here ({e}); {why}"
                ) from None
    else:
        rows = read_jsonl_lines(
            path, required=(input_field, output_field), numbers_as_written=True, hint=hint
        )
        for where, row in rows:
            yield text_fields(row, (input_field, output_field), where), where
            n += 1
    if n == 0:
        what = "a header line and no rows" if header_only else "no rows (an empty file)"
        raise InputError(f"{path}: {what}; expected rows with the fields {input_field!r}, {output_field!r}")


def field_text(value: Any, where: str, field: str) -> str | None:
    """An input or output value as text: a string as it is, a number or a boolean as JSON writes it (``3``, ``2.5``,
    ``true``; an integer of any kind, numpy's too, in digits), null as None (an empty value, skipped and counted).
    An object, an array, bytes, NaN/Infinity, any other type, or a string that cannot be UTF-8 (a lone surrogate
    escape) raise ``InputError`` naming ``where`` and ``field``. (Data files keep their numbers as written:
    :func:`read_table` reads ``3.50`` as the text ``3.50``.)"""
    import json
    import math
    import numbers

    if value is None or isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, numbers.Integral):
        text = str(int(value))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"{where}: field {field!r} is {value} (not a number); give a number or a text")
        text = json.dumps(value)
    else:
        kind = (
            "an object"
            if isinstance(value, dict)
            else "an array"
            if isinstance(value, (list, tuple))
            else f"of type {type(value).__name__}"
        )
        hint = "decode it to a str first" if isinstance(value, (bytes, bytearray)) else "write it as a string"
        raise InputError(
            f"{where}: field {field!r} is {kind} ({json.dumps(value, default=repr)[:60]}); expected a text (or a "
            f"number): {hint} if it is meant as one"
        )
    if text is not None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(
                f"{where}: field {field!r} holds {text[e.start]!r} at character {e.start + 1}, a lone surrogate "
                "(an escape such as \\ud800 without its pair); it cannot be written as UTF-8: fix the text"
            ) from None
    return text


def text_fields(row: dict[str, Any], fields: Sequence[str], where: str) -> dict[str, Any]:
    return {**row, **{k: field_text(row[k], where, k) for k in fields}}
