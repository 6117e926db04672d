"""OpenDocument text: ``.odt`` (odfdo).

An ``.odt`` is a zip: :func:`~kbcore.parsers.archive.check_zip` checks its limits before odfdo
opens it, and a file whose declared type is not OpenDocument text (a spreadsheet or a
presentation renamed) is refused. The body is read in document order: a heading (``text:h``)
starts a section whose heading path is the titles of the enclosing headings (``"Guide >
Install"``); paragraphs become lines, list items ``- item`` lines, and a table a table section
of Markdown rows (its first row the header; merged cells once), bounded like a spreadsheet's
(:func:`~kbcore.parsers.tables.render_rows`). Repetition counts in the XML (``text:s``
spaces, repeated rows and cells) are never expanded beyond what the text needs: a run of
spaces is one space, a row at most :data:`MAX_COLUMNS` cells, an empty row repeated at most
:data:`~kbcore.parsers.tables.MAX_EMPTY_RUN` times. Needs ``pip install 'kbcore[office]'``.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Iterator
from typing import Any

from ..errors import InvalidArgumentError
from ..sections import Part
from .archive import MAX_OFFICE_UNPACKED, check_zip
from .structure import PartBuilder
from .tables import MAX_EMPTY_RUN

__all__ = ["MAX_COLUMNS", "odt_parts"]

#: The most cells of a table row that are read (the rest, if any has text, refuses the file).
MAX_COLUMNS = 1024
_MIMETYPE = "application/vnd.oasis.opendocument.text"
#: Inline elements that stand for white space.
_SPACES = frozenset({"text:s", "text:tab", "text:line-break", "text:soft-page-break"})
_ROW_GROUPS = frozenset({"table:table-header-rows", "table:table-rows", "table:table-row-group"})


def _name(filename: str | None) -> str:
    return repr(filename) if filename else "the input"


def _load(filename: str | None) -> Any:
    try:
        return importlib.import_module("odfdo")
    except ImportError:
        raise ImportError(
            f"{_name(filename)} is an OpenDocument text; reading it needs the optional extra: "
            "pip install 'kbcore[office]' (installs odfdo)"
        ) from None


def _inline(el: Any, out: list[str]) -> None:
    if el.text:
        out.append(el.text)
    for child in el.children:
        if child.tag in _SPACES:
            out.append(" ")
        else:
            _inline(child, out)
        if child.tail:
            out.append(child.tail)


def _text(el: Any) -> str:
    out: list[str] = []
    _inline(el, out)
    return " ".join("".join(out).split())


def _repeat(el: Any, attr: str) -> int:
    value = el.get_attribute(attr)
    try:
        return max(1, int(value)) if value is not None else 1
    except (TypeError, ValueError):
        return 1


class _Doc(PartBuilder):
    """The parts of a document being read, with the current heading path."""

    def walk(self, el: Any, bullet: str = "") -> None:
        for child in el.children:
            tag = child.tag
            if tag == "text:h":
                text = _text(child)
                if text:
                    self.heading(_repeat(child, "text:outline-level"), text)
            elif tag == "text:p":
                text = _text(child)
                if text:
                    self.lines.append(bullet + text)
            elif tag == "text:list":
                self.walk(child, "- ")
            elif tag == "table:table":
                self.table(self._rows(child))
            elif tag in ("office:annotation", "text:tracked-changes", "text:sequence-decls"):
                continue
            else:  # sections, list items, indexes, frames: their blocks in order
                self.walk(child, bullet)

    def _rows(self, table: Any) -> Iterator[list[str]]:
        for child in table.children:
            if child.tag in _ROW_GROUPS:
                yield from self._rows(child)
            elif child.tag == "table:table-row":
                cells = self._cells(child)
                times = _repeat(child, "table:number-rows-repeated")
                for _ in range(min(times, MAX_EMPTY_RUN) if not any(cells) else times):
                    yield cells

    def _cells(self, row: Any) -> list[str]:
        cells: list[str] = []
        for cell in row.children:
            if cell.tag == "table:covered-table-cell":  # a merged cell: its text is in the first
                continue
            if cell.tag != "table:table-cell":
                continue
            text = _text(cell).replace("|", "\\|")
            times = _repeat(cell, "table:number-columns-repeated")
            room = MAX_COLUMNS - len(cells)
            if times > room and text:
                raise InvalidArgumentError(
                    f"{_name(self.filename)}: a table row has more than {MAX_COLUMNS} cells; split the table"
                )
            cells.extend([text] * min(times, room))
        return cells


def odt_parts(data: bytes, filename: str | None) -> list[Part]:
    """The sections of an ``.odt`` document (see the module docstring)."""
    odfdo = _load(filename)
    check_zip(data, filename, "OpenDocument text (.odt is a zip)", MAX_OFFICE_UNPACKED)
    doc = _Doc(filename)
    try:
        document = odfdo.Document(io.BytesIO(data))
        mimetype = document.mimetype
        if mimetype != _MIMETYPE:
            raise InvalidArgumentError(
                f"{_name(filename)}: not an OpenDocument text (its type is {mimetype!r}); only .odt is read"
            )
        doc.walk(document.body)
        doc.flush()
    except InvalidArgumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - odfdo / lxml / zipfile raise unrelated types
        raise InvalidArgumentError(
            f"{_name(filename)}: could not read the OpenDocument text ({type(exc).__name__}: {exc})"
        ) from None
    return doc.parts
