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
from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import InvalidArgumentError
from ..sections import Part
from .archive import MAX_OFFICE_UNPACKED, check_zip

__all__ = ["MAX_TABLE_CHARS", "csv_parts", "xlsx_parts", "render_rows"]

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
