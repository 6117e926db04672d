"""Tables: ``.csv`` / ``.tsv`` (the standard library's :mod:`csv`) and ``.xlsx`` (openpyxl).

Each table becomes one table :class:`~kbcore.sections.Part`: its first non-empty row is the
header, rendered with the data rows as Markdown table rows (``| a | b |``); empty rows are
dropped and trailing empty cells trimmed. The structure-aware chunker then cuts the table
between rows and repeats the header on every chunk, so a chunk never holds half a row.

- **csv / tsv**: one section, named after the file; the text is decoded like plain text.
- **xlsx**: one section per worksheet with a cell, named after the sheet; cell values as
  computed when the file was last saved (``data_only``), dates in ISO 8601. Read in openpyxl's
  streaming read-only mode, after the zip limits of :func:`~kbcore.parsers.archive.check_zip`.
  Needs ``pip install 'kbcore[office]'``.

A table whose text would exceed :data:`MAX_TABLE_CHARS` characters, or with more than
:data:`MAX_EMPTY_RUN` empty rows in a row, is refused with a message saying so (nothing is
dropped silently).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError
from ..sections import Part
from .archive import MAX_OFFICE_UNPACKED, check_zip

__all__ = [
    "MAX_TABLE_CHARS",
    "MAX_RECORDS",
    "Record",
    "csv_parts",
    "xlsx_parts",
    "render_rows",
    "csv_records",
    "xlsx_records",
]

#: The most characters the rendered tables of one file may hold (64 Mi).
MAX_TABLE_CHARS = 64 << 20
#: The most consecutive empty rows a table may have (beyond: refused, see render_rows).
MAX_EMPTY_RUN = 10_000


def _name(filename: str | None) -> str:
    return repr(filename) if filename else "the input"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    elif isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        value = value.isoformat()
    return " ".join(str(value).split()).replace("|", "\\|")


def render_rows(rows: Iterable[Iterable[Any]], path: str, filename: str | None, budget: list[int]) -> Part | None:
    """The table part of ``rows`` (the first non-empty one is the header), or None when every
    row is empty. ``budget`` holds the characters left for this file (updated). More than
    :data:`MAX_EMPTY_RUN` empty rows in a row raise (a sheet padded with empty rows would
    otherwise cost time without end); lines are joined in blocks, so the memory is about the
    text's size, not a Python object per row."""
    blocks: list[str] = []
    lines: list[str] = []
    header: str | None = None
    empty = 0
    for n, row in enumerate(rows, 1):
        cells = [_cell(v) for v in row]
        while cells and not cells[-1]:
            cells.pop()
        if not cells:
            empty += 1
            if empty > MAX_EMPTY_RUN:
                raise InvalidArgumentError(
                    f"{_name(filename)}: table {path!r} has more than {MAX_EMPTY_RUN} empty rows in a row "
                    f"(from row {n - empty + 1}); delete the empty rows and ingest the file again"
                )
            continue
        empty = 0
        line = "| " + " | ".join(cells) + " |"
        budget[0] -= len(line) + 1
        if budget[0] < 0:
            raise InvalidArgumentError(
                f"{_name(filename)}: the tables hold more than {MAX_TABLE_CHARS} characters; split the file"
            )
        if header is None:
            header = line + "\n|" + " --- |" * len(cells)
            line = header
        lines.append(line)
        if len(lines) == 1024:
            blocks.append("\n".join(lines))
            lines.clear()
    if header is None:
        return None
    if lines:
        blocks.append("\n".join(lines))
    if blocks == [header]:  # a header alone is a one-line text, not a table
        return Part(header.split("\n", 1)[0], path)
    return Part("\n".join(blocks), path, kind="table", header=header)


def _lines(text: str) -> Iterator[str]:
    """The lines of ``text`` with their line ends, one at a time (csv.reader's input)."""
    pos, n = 0, len(text)
    while pos < n:
        nl = text.find("\n", pos)
        end = n if nl < 0 else nl + 1
        yield text[pos:end]
        pos = end


def csv_parts(text: str, filename: str | None, delimiter: str) -> list[Part]:
    """The table part of a decoded CSV / TSV file."""
    name = (filename or "table").rsplit("/", 1)[-1]
    try:
        part = render_rows(csv.reader(_lines(text), delimiter=delimiter), name, filename, [MAX_TABLE_CHARS])
    except csv.Error as exc:
        raise InvalidArgumentError(f"{_name(filename)}: not valid CSV ({exc})") from None
    return [part] if part is not None else []


def _openpyxl(filename: str | None) -> Any:
    try:
        import openpyxl
    except ImportError:
        raise ImportError(
            f"{_name(filename)} is an Excel workbook; reading it needs the optional extra: "
            "pip install 'kbcore[office]' (installs openpyxl)"
        ) from None
    return openpyxl


def xlsx_parts(data: bytes, filename: str | None) -> list[Part]:
    """One table part per non-empty worksheet of an ``.xlsx`` workbook."""
    openpyxl = _openpyxl(filename)
    check_zip(data, filename, "Excel workbook (.xlsx is a zip)", MAX_OFFICE_UNPACKED)
    parts: list[Part] = []
    budget = [MAX_TABLE_CHARS]
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
            # the declared dimension may be A1:XFD1048576; read only the cells that exist
            ws.reset_dimensions()
            try:
                part = render_rows(ws.iter_rows(values_only=True), ws.title, filename, budget)
            except InvalidArgumentError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise InvalidArgumentError(
                    f"{_name(filename)}: could not read sheet {ws.title!r} ({type(exc).__name__}: {exc})"
                ) from None
            if part is not None:
                parts.append(part)
    finally:
        wb.close()
    return parts


# -- one document per row ------------------------------------------------------------------

#: The most rows a file ingested row by row may hold (each row is a document; beyond: refused).
MAX_RECORDS = 100_000
_INT = re.compile(r"[+-]?\d{1,18}")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_RESERVED_KEYS = ("document_id", "file_id", "chunk_index", "filename", "pipeline_name", "archive")


@dataclass(frozen=True, slots=True)
class Record:
    """One row of a table ingested as its own document: ``key`` (the row's id, or its row
    number; for a workbook ``<sheet>/<id or number>``), ``text`` (one ``header: value`` line
    per non-empty cell) and ``fields`` (metadata key -> typed value of each non-empty cell)."""

    key: str
    text: str
    fields: dict[str, Any]


def _typed(value: Any) -> Any:
    """A cell as a metadata value: numbers and booleans kept, numeric text read as a number,
    dates as ISO 8601 text, empty as None."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 1 << 63 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    text = " ".join(str(value).split())
    if not text:
        return None
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        number = float(text)
        return number if math.isfinite(number) else text
    return text


def _column_kind(values: Iterable[Any]) -> str:
    """ "int", "float", "bool" when every non-empty value of a column is one, else "str"
    (a metadata column holds one type)."""
    kinds = {"bool" if isinstance(v, bool) else "int" if isinstance(v, int) else type(v).__name__ for v in values}
    kinds.discard("NoneType")
    if kinds <= {"int"} or kinds == {"bool"}:
        return kinds.pop() if kinds else "str"
    return "float" if kinds <= {"int", "float"} else "str"


def _keys(header: list[str]) -> list[str]:
    """Metadata keys of the header cells: an empty cell is ``column_<n>``; a reserved name
    (``document_id``, ``filename``, ``archive``...) or one starting with ``__`` / ``$`` gets
    the prefix ``col_``; a repeated name the suffix ``_2``, ``_3``..."""
    out: list[str] = []
    for j, name in enumerate(header):
        key = name or f"column_{j + 1}"
        if key in _RESERVED_KEYS or key.startswith(("__", "$")):
            key = "col_" + key
        base, n = key, 1
        while key in out:
            n += 1
            key = f"{base}_{n}"
        out.append(key)
    return out


def table_records(
    rows: Iterable[Iterable[Any]],
    filename: str | None,
    id_column: str | None,
    sheet: str | None,
    budget: list[int],
) -> list[Record]:
    """The records of one table (its first non-empty row the header); ``budget[0]`` holds the
    characters and ``budget[1]`` the rows left for the file (updated)."""
    where = f"{_name(filename)}" + (f" sheet {sheet!r}" if sheet is not None else "")
    header: list[str] | None = None
    raw: list[tuple[int, list[Any]]] = []
    empty = 0
    for n, row in enumerate(rows, 1):
        values = list(row)
        while values and (values[-1] is None or (isinstance(values[-1], str) and not values[-1].strip())):
            values.pop()
        if not values:
            empty += 1
            if empty > MAX_EMPTY_RUN:
                raise InvalidArgumentError(
                    f"{where} has more than {MAX_EMPTY_RUN} empty rows in a row (from row {n - empty + 1}); "
                    "delete the empty rows and ingest the file again"
                )
            continue
        empty = 0
        budget[0] -= sum(len(str(v)) + 2 for v in values)
        if budget[0] < 0:
            raise InvalidArgumentError(f"{_name(filename)}: the tables hold more than {MAX_TABLE_CHARS} characters")
        if header is None:
            header = [_cell(v).replace("\\|", "|") for v in values]
            continue
        budget[1] -= 1
        if budget[1] < 0:
            raise InvalidArgumentError(
                f"{_name(filename)} has more than {MAX_RECORDS} rows: too many to ingest one document per row; "
                "split the file, or ingest it without rows_as_documents"
            )
        raw.append((n, values))
    if header is None:
        return []
    keys = _keys(header)
    id_at: int | None = None
    if id_column is not None:
        if id_column not in header:
            raise InvalidArgumentError(f"{where}: no column {id_column!r} for the row ids; the columns are {header}")
        id_at = header.index(id_column)
    width = max([len(header)] + [len(v) for _, v in raw])
    keys += _keys(header + [""] * (width - len(header)))[len(header) :]
    header = header + [""] * (width - len(header))
    typed = [[_typed(v) for v in values] for _, values in raw]
    kinds = [_column_kind(t[j] for t in typed if j < len(t)) for j in range(width)]
    out: list[Record] = []
    seen: set[str] = set()
    for (n, values), cells in zip(raw, typed, strict=True):
        fields: dict[str, Any] = {}
        lines = []
        for j, v in enumerate(cells):
            if v is None:
                continue
            shown = _cell(values[j]).replace("\\|", "|")
            fields[keys[j]] = shown if kinds[j] == "str" else float(v) if kinds[j] == "float" else v
            lines.append(f"{header[j] or keys[j]}: {shown}")
        if id_at is not None:
            rid = _cell(values[id_at]).replace("\\|", "|") if id_at < len(values) else ""
            if not rid:
                raise InvalidArgumentError(f"{where}: row {n} has no value in the id column {id_column!r}")
        else:
            rid = str(n)
        key = rid if sheet is None else f"{sheet}/{rid}"
        if key in seen:
            raise InvalidArgumentError(f"{where}: the id {rid!r} of row {n} appears twice in column {id_column!r}")
        seen.add(key)
        out.append(Record(key, "\n".join(lines), fields))
    return out


def csv_records(text: str, filename: str | None, delimiter: str, id_column: str | None) -> list[Record]:
    """One record per data row of a decoded CSV / TSV file."""
    try:
        return table_records(
            csv.reader(_lines(text), delimiter=delimiter), filename, id_column, None, [MAX_TABLE_CHARS, MAX_RECORDS]
        )
    except csv.Error as exc:
        raise InvalidArgumentError(f"{_name(filename)}: not valid CSV ({exc})") from None


def xlsx_records(data: bytes, filename: str | None, id_column: str | None) -> list[Record]:
    """One record per data row of each non-empty worksheet of an ``.xlsx`` workbook."""
    openpyxl = _openpyxl(filename)
    check_zip(data, filename, "Excel workbook (.xlsx is a zip)", MAX_OFFICE_UNPACKED)
    budget = [MAX_TABLE_CHARS, MAX_RECORDS]
    out: list[Record] = []
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
            ws.reset_dimensions()
            try:
                out.extend(table_records(ws.iter_rows(values_only=True), filename, id_column, ws.title, budget))
            except InvalidArgumentError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise InvalidArgumentError(
                    f"{_name(filename)}: could not read sheet {ws.title!r} ({type(exc).__name__}: {exc})"
                ) from None
    finally:
        wb.close()
    return out
