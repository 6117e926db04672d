"""Question-answer pairs: the rows of a ``.csv`` / ``.tsv`` / ``.jsonl`` / ``.xlsx`` file.

:func:`read_qa` returns one :class:`QAPair` per data row. CSV, TSV and XLSX: the first
non-empty row is the header and names the columns (matched case-insensitively, surrounding
spaces ignored); XLSX reads the first worksheet with a cell, in openpyxl's read-only mode
after the zip limits of :func:`~kbcore.parsers.archive.check_zip`. JSON lines: one object a
line, the columns are its keys. Empty rows (every cell empty) and blank lines are skipped.

Every problem raises :class:`~kbcore.errors.InvalidArgumentError` naming the file and the row
(1-based, counting the header row, as a spreadsheet shows it; the line for JSON lines): a
missing column, an empty question or answer, a cell that is not text or a number, a line that
is not a JSON object, more than :data:`MAX_QA_ROWS` rows or :data:`MAX_EMPTY_RUN` empty rows in
a row. Nothing is returned unless every row is good.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from .archive import MAX_OFFICE_UNPACKED, check_zip
from .tables import MAX_EMPTY_RUN, _lines, _openpyxl

__all__ = ["QAPair", "QA_FORMATS", "MAX_QA_ROWS", "qa_format", "read_qa"]

#: The file types :func:`read_qa` reads.
QA_FORMATS = ("csv", "tsv", "jsonl", "xlsx")
#: The most question-answer rows one file may hold.
MAX_QA_ROWS = 1_000_000


@dataclass(frozen=True, slots=True)
class QAPair:
    """One question-answer row: its row number in the file, the question and the answer."""

    row: int
    question: str
    answer: str


def _name(filename: str | None) -> str:
    return repr(filename) if filename else "the QA input"


def qa_format(filename: str | None, format: str | None) -> str:
    """The QA file type from ``format=`` or the file name's extension."""
    if format is not None:
        fmt = format.lower().lstrip(".")
        if fmt == "json_lines" or fmt == "ndjson":
            fmt = "jsonl"
    else:
        ext = (filename or "").rsplit(".", 1)[-1].lower() if filename and "." in filename else ""
        fmt = {"ndjson": "jsonl", "tab": "tsv"}.get(ext, ext)
    if fmt not in QA_FORMATS:
        raise InvalidArgumentError(
            f"{_name(filename)}: question-answer pairs are read from {', '.join(QA_FORMATS)} files, "
            f"got {fmt or 'no extension'!r} (pass format=)"
        )
    return fmt


def _cell(value: Any, filename: str | None, row: int, column: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidArgumentError(
            f"{_name(filename)} row {row}: column {column!r} must hold text, got {type(value).__name__}"
        )
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return str(value).strip()


def _pairs(rows: Iterable[tuple[int, dict[str, Any]]], filename: str | None, q_col: str, a_col: str) -> list[QAPair]:
    out: list[QAPair] = []
    for row, record in rows:
        if q_col not in record or a_col not in record:
            missing = q_col if q_col not in record else a_col
            raise InvalidArgumentError(f"{_name(filename)} row {row}: no column {missing!r}")
        question = _cell(record[q_col], filename, row, q_col)
        answer = _cell(record[a_col], filename, row, a_col)
        if not question:
            raise InvalidArgumentError(f"{_name(filename)} row {row}: the question ({q_col!r}) is empty")
        if not answer:
            raise InvalidArgumentError(f"{_name(filename)} row {row}: the answer ({a_col!r}) is empty")
        out.append(QAPair(row, question, answer))
        if len(out) > MAX_QA_ROWS:
            raise InvalidArgumentError(f"{_name(filename)}: more than {MAX_QA_ROWS:,} question-answer rows")
    if not out:
        raise InvalidArgumentError(f"{_name(filename)}: no question-answer rows")
    return out


def _table_records(
    rows: Iterable[Iterable[Any]], filename: str | None, q_col: str, a_col: str
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, {column: value}) of the data rows of a table; the header names the
    columns (lower-cased, stripped); the two wanted columns must be in it."""
    header: dict[str, int] | None = None
    empty_run = 0
    for number, cells in enumerate(rows, 1):
        values = list(cells)
        if all(v is None or (isinstance(v, str) and not v.strip()) for v in values):
            empty_run += 1
            if empty_run > MAX_EMPTY_RUN:
                raise InvalidArgumentError(
                    f"{_name(filename)}: more than {MAX_EMPTY_RUN:,} empty rows in a row (row {number})"
                )
            continue
        empty_run = 0
        if header is None:
            names = [str(v).strip().lower() if v is not None else "" for v in values]
            header = {}
            for i, n in enumerate(names):
                if n and n not in header:
                    header[n] = i
            for want in (q_col, a_col):
                if want not in header:
                    raise InvalidArgumentError(
                        f"{_name(filename)} row {number} (the header): no column {want!r}; the columns are "
                        f"{[n for n in names if n]} (choose them with question_column= / answer_column=)"
                    )
            continue
        yield number, {n: (values[i] if i < len(values) else None) for n, i in header.items()}


def _jsonl_records(text: str, filename: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InvalidArgumentError(f"{_name(filename)} line {number}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise InvalidArgumentError(
                f"{_name(filename)} line {number}: must be a JSON object, got {type(obj).__name__}"
            )
        yield number, {str(k).strip().lower(): v for k, v in obj.items()}


def _xlsx_rows(data: bytes, filename: str | None) -> Iterator[tuple[Any, ...]]:
    openpyxl = _openpyxl(filename)
    check_zip(data, filename, "Excel workbook (.xlsx is a zip)", MAX_OFFICE_UNPACKED)
    try:
        wb = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as exc:  # noqa: BLE001 - openpyxl raises many unrelated types on bad files
        raise InvalidArgumentError(
            f"{_name(filename)}: could not read the workbook ({type(exc).__name__}: {exc})"
        ) from None
    try:
        for ws in wb.worksheets:
            if not hasattr(ws, "iter_rows"):
                continue
            ws.reset_dimensions()  # the declared dimension may be A1:XFD1048576
            rows = ws.iter_rows(values_only=True)
            first = next(rows, None)
            if first is None:
                continue
            yield first
            yield from rows
            return
    finally:
        wb.close()


def read_qa(
    data: bytes,
    *,
    filename: str | None = None,
    format: str | None = None,
    question_column: str = "question",
    answer_column: str = "answer",
) -> list[QAPair]:
    """The question-answer rows of a file's bytes (see the module docstring)."""
    for what, col in (("question_column", question_column), ("answer_column", answer_column)):
        if not isinstance(col, str) or not col.strip():
            raise InvalidArgumentError(f"{what} must be a non-empty str, got {col!r}")
    q_col, a_col = question_column.strip().lower(), answer_column.strip().lower()
    if q_col == a_col:
        raise InvalidArgumentError(f"question_column and answer_column are both {question_column!r}")
    fmt = qa_format(filename, format)
    if fmt == "xlsx":
        return _pairs(_table_records(_xlsx_rows(data, filename), filename, q_col, a_col), filename, q_col, a_col)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(f"{_name(filename)}: not UTF-8 text ({exc})") from None
    if fmt == "jsonl":
        return _pairs(_jsonl_records(text, filename), filename, q_col, a_col)
    reader = csv.reader(_lines(text), delimiter="\t" if fmt == "tsv" else ",")
    try:
        return _pairs(_table_records(reader, filename, q_col, a_col), filename, q_col, a_col)
    except csv.Error as exc:
        raise InvalidArgumentError(f"{_name(filename)}: not valid {fmt.upper()} ({exc})") from None
