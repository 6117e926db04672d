"""Word and PowerPoint files: ``.docx`` (python-docx) and ``.pptx`` (python-pptx).

Both are zips; :func:`~kbcore.parsers.archive.check_zip` checks their limits before the
library opens them. Both need ``pip install 'kbcore[office]'``.

- **docx**: the body in document order. A paragraph styled ``Title`` or ``Heading N`` starts a
  section whose heading path is the titles of the enclosing headings (``"Guide > Install"``);
  list paragraphs (a ``List ...`` style or Word numbering) become ``- item`` lines; a table
  becomes a table section of Markdown rows (first row the header, merged cells once, cell
  line breaks as spaces).
- **pptx**: one section per slide (path ``"Slide N: title"``, ``page`` N): the text of its
  shapes in order (groups included, tables as Markdown rows), then its speaker notes after a
  ``Notes:`` line.
"""

from __future__ import annotations

import importlib
import io
import re
from typing import Any

from ..errors import InvalidArgumentError
from ..sections import PATH_SEPARATOR, Part
from .archive import MAX_OFFICE_UNPACKED, check_zip

__all__ = ["docx_parts", "pptx_parts"]

_HEADING = re.compile(r"heading (\d)$", re.IGNORECASE)


def _name(filename: str | None) -> str:
    return repr(filename) if filename else "the input"


def _load(module: str, package: str, what: str, filename: str | None) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"{_name(filename)} is a {what}; reading it needs the optional extra: "
            f"pip install 'kbcore[office]' (installs {package})"
        ) from None


def _cell_text(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table_part(rows: list[list[str]], path: str) -> Part | None:
    rows = [r for r in rows if any(r)]
    if not rows:
        return None
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    if len(lines) == 1:
        return Part(lines[0], path)
    header = lines[0] + "\n|" + " --- |" * len(rows[0])
    return Part("\n".join([header, *lines[1:]]), path, kind="table", header=header)


def _docx_table(table: Any) -> list[list[str]]:
    rows = []
    for row in table.rows:
        cells, last = [], None
        for cell in row.cells:
            if last is not None and cell._tc is last:  # a merged cell repeats; keep it once
                continue
            last = cell._tc
            cells.append(_cell_text(cell.text))
        rows.append(cells)
    return rows


def _is_list(paragraph: Any, style: str) -> bool:
    if style.lower().startswith("list"):
        return True
    ppr = paragraph._p.pPr
    return ppr is not None and ppr.numPr is not None


def docx_parts(data: bytes, filename: str | None) -> list[Part]:
    """The sections of a ``.docx`` file (see the module docstring)."""
    docx = _load("docx", "python-docx", "Word document", filename)
    check_zip(data, filename, "Word document (.docx is a zip)", MAX_OFFICE_UNPACKED)
    try:
        document = docx.Document(io.BytesIO(data))
        blocks = list(document.iter_inner_content())
    except Exception as exc:  # noqa: BLE001 - python-docx / lxml / zipfile raise unrelated types
        raise InvalidArgumentError(
            f"{_name(filename)}: could not read the Word document ({type(exc).__name__}: {exc})"
        ) from None
    parts: list[Part] = []
    heads: list[tuple[int, str]] = []
    lines: list[str] = []

    def path() -> str:
        return PATH_SEPARATOR.join(t for _, t in heads)

    def flush() -> None:
        if lines:
            parts.append(Part("\n".join(lines), path()))
            lines.clear()

    try:
        for block in blocks:
            if hasattr(block, "rows"):  # a table
                flush()
                part = _table_part(_docx_table(block), path())
                if part is not None:
                    parts.append(part)
                continue
            text = block.text.strip()
            if not text:
                continue
            style = (block.style.name if block.style is not None else "") or ""
            m = _HEADING.match(style)
            level = 0 if style.lower() == "title" else int(m.group(1)) if m else None
            if level is not None:
                flush()
                while heads and heads[-1][0] >= level:
                    heads.pop()
                heads.append((level, " ".join(text.split())))
                lines.append(text)
            elif _is_list(block, style):
                lines.append("- " + text)
            else:
                lines.append(text)
        flush()
    except Exception as exc:  # noqa: BLE001
        raise InvalidArgumentError(
            f"{_name(filename)}: could not read the Word document ({type(exc).__name__}: {exc})"
        ) from None
    return parts


def _shape_lines(shape: Any, out: list[str]) -> None:
    if getattr(shape, "shape_type", None) is not None and hasattr(shape, "shapes"):  # a group
        for inner in shape.shapes:
            _shape_lines(inner, out)
        return
    if getattr(shape, "has_table", False):
        rows = [[_cell_text(c.text) for c in row.cells] for row in shape.table.rows]
        part = _table_part(rows, "")
        if part is not None:
            out.append(part.text)
        return
    if getattr(shape, "has_text_frame", False):
        text = shape.text_frame.text.strip()
        if text:
            out.append(text)


def pptx_parts(data: bytes, filename: str | None) -> list[Part]:
    """One section per slide of a ``.pptx`` file, with its notes (see the module docstring)."""
    pptx = _load("pptx", "python-pptx", "PowerPoint presentation", filename)
    check_zip(data, filename, "PowerPoint presentation (.pptx is a zip)", MAX_OFFICE_UNPACKED)
    parts: list[Part] = []
    try:
        deck = pptx.Presentation(io.BytesIO(data))
        for n, slide in enumerate(deck.slides, 1):
            lines: list[str] = []
            for shape in slide.shapes:
                _shape_lines(shape, lines)
            title_shape = slide.shapes.title
            title = " ".join(title_shape.text.split()) if title_shape is not None and title_shape.has_text_frame else ""
            if slide.has_notes_slide:
                notes = slide.notes_slide.notes_text_frame
                note = notes.text.strip() if notes is not None else ""
                if note:
                    lines.append("Notes:\n" + note)
            if lines:
                parts.append(Part("\n".join(lines), f"Slide {n}: {title}" if title else f"Slide {n}", page=n))
    except Exception as exc:  # noqa: BLE001 - python-pptx / lxml / zipfile raise unrelated types
        raise InvalidArgumentError(
            f"{_name(filename)}: could not read the PowerPoint presentation ({type(exc).__name__}: {exc})"
        ) from None
    return parts
