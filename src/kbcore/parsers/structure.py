"""The structure of text formats: Markdown and HTML headings, PDF pages.

- **markdown**: ATX headings (``#`` to ``######``, outside code fences and front matter) start
  sections; each section (its heading line included) is cleaned by the Markdown cleaner of
  :mod:`kbcore.parsing`, and its path is the titles of the enclosing headings. Setext
  (underlined) headings are plain text. A page marker, a line ``<!-- PAGE:n -->`` (n from 1;
  the marker LangBot's parsers put in the text of a PDF), starts a section on page ``n`` with
  the path in force; the text after it, up to the next marker, is on that page. A file
  without a heading or page marker has no sections.
- **html**: ``<h1>`` to ``<h6>`` start sections. The headings' visible text is collected here
  and found, in order, as whole lines of the visible text that :mod:`kbcore.parsing` extracts;
  a heading that is not found there (hidden, say) starts no section (after 64 such, the
  search stops: each costs a scan of the text).
- **pdf**: one section per page with text, ``page`` the 1-based page number; when the PDF
  has an outline (bookmarks), a page's path is the outline path in force on it (the path of
  its first bookmark, else the one before the page).

The cleaners are passed in, so this module does not import :mod:`kbcore.parsing`.
:class:`PartBuilder` gathers the parts of formats read block by block (EPUB, OpenDocument text).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from ..sections import PATH_SEPARATOR, Part
from .tables import MAX_TABLE_CHARS, render_rows

__all__ = ["markdown_parts", "html_parts", "pdf_parts", "pdf_outline", "PartBuilder", "MAX_HEADINGS"]

#: Headings beyond this many in one file start no further section (bounds the search).
MAX_HEADINGS = 10_000
# HTML headings not found in the visible text before the search for more stops.
_MAX_MISSES = 64

_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]|$)")
_PAGE = re.compile(r" {0,3}<!--[ \t]*PAGE:[ \t]*0*([1-9][0-9]{0,8})[ \t]*-->[ \t]*")
_FENCE = re.compile(r"[ \t]*(```|~~~)")


class _Path:
    """The heading path: a stack of (level, title). A level-0 title (a chapter title from a
    table of contents) is replaced by a heading of the same text rather than enclosing it."""

    def __init__(self) -> None:
        self.heads: list[tuple[int, str]] = []

    def push(self, level: int, title: str) -> str:
        while self.heads and self.heads[-1][0] >= level:
            self.heads.pop()
        if self.heads == [(0, title)]:  # the chapter's own title: not nested in itself
            self.heads.clear()
        self.heads.append((level, title))
        return self.path()

    def path(self) -> str:
        return PATH_SEPARATOR.join(t for _, t in self.heads if t)


def markdown_parts(raw: str, clean: Callable[[str], str]) -> list[Part] | None:
    """The sections of a Markdown file, or None when it has no heading and no page marker."""
    lines = raw.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    if lines and lines[0].strip() == "---":  # front matter: skip to its closing line
        for j in range(1, len(lines)):
            if lines[j].strip() == "---":
                i = j + 1
                break
    # (heading level, 0 for none; page; lines); front matter dropped
    blocks: list[tuple[int, int | None, list[str]]] = [(0, None, [])]
    fence: str | None = None
    page: int | None = None
    for line in lines[i:]:
        f = _FENCE.match(line)
        if f:
            fence = None if fence == f.group(1) else (fence or f.group(1))
        m = None if fence or f else _ATX.match(line)
        p = None if fence or f or m else _PAGE.fullmatch(line)
        if m and len(blocks) <= MAX_HEADINGS:
            blocks.append((len(m.group(1)), page, [line]))
        elif p and len(blocks) <= MAX_HEADINGS:
            page = int(p.group(1))
            blocks.append((0, page, []))
        else:
            blocks[-1][2].append(line)
    if len(blocks) == 1:
        return None
    parts: list[Part] = []
    path = _Path()
    current = ""
    for level, on_page, block in blocks:
        if level:
            title = " ".join(clean(block[0]).split())
            current = path.push(level, title)
        text = clean("\n".join(block))
        if text.strip():
            parts.append(Part(text, current, page=on_page))
    return parts


def _line_at(text: str, title: str, pos: int) -> int:
    """The first index >= pos where ``title`` is a whole line of ``text``, else -1."""
    i = text.find(title, pos)
    while i >= 0:
        end = i + len(title)
        if (i == 0 or text[i - 1] == "\n") and (end == len(text) or text[end] == "\n"):
            return i
        i = text.find(title, i + 1)
    return -1


def html_parts(headings: list[tuple[int, str]], text: str) -> list[Part] | None:
    """The sections of an HTML page whose visible text is ``text`` and whose headings are
    ``headings`` ((level, visible title) in document order), or None without headings."""
    cuts: list[tuple[int, int, str]] = []
    pos, misses = 0, 0
    for level, title in headings[:MAX_HEADINGS]:
        i = _line_at(text, title, pos)
        if i >= 0:
            cuts.append((i, level, title))
            pos = i + len(title)
        else:
            misses += 1  # each miss scans the rest of the text: a few only
            if misses > _MAX_MISSES:
                break
    if not cuts:
        return None
    parts = [Part(text[: cuts[0][0]])]
    path = _Path()
    for k, (i, level, title) in enumerate(cuts):
        end = cuts[k + 1][0] if k + 1 < len(cuts) else len(text)
        parts.append(Part(text[i:end], path.push(level, title)))
    return parts


def pdf_outline(reader: Any) -> list[tuple[int, int, str]]:
    """(0-based page, level from 1, title) of a pypdf reader's outline entries, in outline
    order; empty when the PDF has none or it cannot be read."""
    marks: list[tuple[int, int, str]] = []

    def walk(items: Any, level: int) -> None:
        for item in items:
            if len(marks) >= MAX_HEADINGS:
                return
            if isinstance(item, list):
                walk(item, level + 1)
                continue
            try:
                page = reader.get_destination_page_number(item)
            except Exception:  # noqa: BLE001 - a broken bookmark names no page
                continue
            title = " ".join(str(getattr(item, "title", "") or "").split())
            if page is not None and page >= 0 and title:
                marks.append((page, level, title))

    try:
        walk(reader.outline, 1)
    except Exception:  # noqa: BLE001 - pypdf's errors are not one hierarchy; no outline then
        return []
    return marks


def pdf_parts(pages: list[str], outline: Sequence[tuple[int, int, str]] = ()) -> list[Part]:
    """One section per page (1-based ``page``), with the outline's path in force on it."""
    by_page: dict[int, list[tuple[int, str]]] = {}
    for page, level, title in sorted(outline, key=lambda m: m[0]):
        by_page.setdefault(page, []).append((level, title))
    path = _Path()
    current = ""
    parts = []
    for n, text in enumerate(pages):
        marks = by_page.get(n, [])
        first = ""
        for level, title in marks:
            current = path.push(level, title)
            first = first or current
        parts.append(Part(text, first or current, page=n + 1))
    return parts


class PartBuilder:
    """The parts of a document read block by block: lines gathered under the current heading
    path, made into a text part at each heading and table.
    Tables share one character budget per file (:func:`~kbcore.parsers.tables.render_rows`)."""

    def __init__(self, filename: str | None) -> None:
        self.filename = filename
        self.parts: list[Part] = []
        self._path = _Path()
        self.lines: list[str] = []
        self.budget = [MAX_TABLE_CHARS]

    def path(self) -> str:
        """The current heading path (``"Guide > Install"``)."""
        return self._path.path()

    def flush(self) -> None:
        """Makes the gathered lines a text part under the current path."""
        if self.lines:
            self.parts.append(Part("\n".join(self.lines), self.path()))
            self.lines.clear()

    def heading(self, level: int, text: str) -> None:
        """Starts a section: ``text`` at ``level`` (from 1) ends the enclosed ones and is its
        first line."""
        self.flush()
        self._path.push(level, text)
        self.lines.append(text)

    def chapter(self, title: str | None) -> None:
        """Starts a chapter: the path is its ``title`` (level 0), or empty."""
        self.flush()
        self._path.heads = [(0, title)] if title else []

    def table(self, rows: Any) -> None:
        """Adds the table part of ``rows`` (an iterable of cell lists), if any row has text."""
        self.flush()
        part = render_rows(rows, self.path(), self.filename, self.budget)
        if part is not None:
            self.parts.append(part)
