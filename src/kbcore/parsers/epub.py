"""E-books: ``.epub`` (EbookLib reads the container, lxml the chapters' XHTML).

An EPUB is a zip: :func:`~kbcore.parsers.archive.check_zip` checks its limits (members,
unpacked size, ratio) before EbookLib opens it. The chapters are read in reading order (the
spine), the navigation document skipped. In each chapter, ``h1`` - ``h6`` start sections whose
heading path is the titles of the enclosing headings (``"Chapter 2 > Setup"``); the text before
a chapter's first heading takes the chapter's title from the table of contents (a heading
equal to that title replaces it). Paragraphs and
other blocks become lines, list items ``- item`` lines, and a table a table section of Markdown
rows (its first row the header), bounded like a spreadsheet's
(:func:`~kbcore.parsers.tables.render_rows`). Needs ``pip install 'kbcore[office]'``.
"""

from __future__ import annotations

import importlib
import io
from typing import Any

from ..errors import InvalidArgumentError
from ..sections import Part
from .archive import MAX_OFFICE_UNPACKED, check_zip
from .structure import PartBuilder

__all__ = ["epub_parts"]

_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
#: Elements whose text is never content.
_SKIP = frozenset({"script", "style", "head", "title", "nav", "svg", "math", "template"})
#: Elements that hold blocks: their children are walked, not their text taken whole.
_BLOCKS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "dd", "details", "div", "dl", "dt",
        "figcaption", "figure", "footer", "header", "hr", "li", "main", "ol", "p", "pre", "section",
        "table", "ul", *_HEADINGS,
    }
)  # fmt: skip


def _name(filename: str | None) -> str:
    return repr(filename) if filename else "the input"


def _load(filename: str | None) -> tuple[Any, Any]:
    try:
        return importlib.import_module("ebooklib.epub"), importlib.import_module("lxml.html")
    except ImportError:
        raise ImportError(
            f"{_name(filename)} is an EPUB book; reading it needs the optional extra: "
            "pip install 'kbcore[office]' (installs EbookLib)"
        ) from None


def _text(el: Any) -> str:
    return " ".join(el.text_content().split())


def _tag(el: Any) -> str:
    tag = el.tag
    if not isinstance(tag, str):  # a comment or processing instruction
        return ""
    return tag.rsplit("}", 1)[-1].lower()


def _has_blocks(el: Any) -> bool:
    return any(_tag(c) in _BLOCKS for c in el.iterdescendants())


class _Book(PartBuilder):
    """The parts of a book being read, with the heading path of the current chapter."""

    def walk(self, el: Any, bullet: str = "") -> None:
        for child in el.iterchildren():
            tag = _tag(child)
            if not tag or tag in _SKIP:
                continue
            if tag in _HEADINGS:
                text = _text(child)
                if text:
                    self.heading(_HEADINGS[tag], text)
            elif tag == "table":
                self.table(self._rows(child))
            elif tag in ("ul", "ol"):
                self.walk(child, "- ")
            elif tag in _BLOCKS and _has_blocks(child):
                own = " ".join((child.text or "").split())
                if own:
                    self.lines.append(bullet + own if tag == "li" else own)
                self.walk(child, bullet if tag == "li" else "")
            else:
                text = _text(child)
                if text:
                    self.lines.append(bullet + text if tag == "li" else text)

    @staticmethod
    def _rows(table: Any) -> Any:
        for tr in table.iter():
            if _tag(tr) == "tr":
                yield [_text(c) for c in tr.iterchildren() if _tag(c) in ("td", "th")]


def _toc_titles(toc: Any, out: dict[str, str]) -> dict[str, str]:
    """href (without fragment) -> title of the first table-of-contents entry pointing there."""
    for entry in toc:
        if isinstance(entry, tuple) and len(entry) == 2:  # (Section, [children])
            head, children = entry
            href, title = getattr(head, "href", None), getattr(head, "title", None)
            if href and title:
                out.setdefault(href.split("#", 1)[0], title)
            _toc_titles(children, out)
        else:
            href, title = getattr(entry, "href", None), getattr(entry, "title", None)
            if href and title:
                out.setdefault(href.split("#", 1)[0], title)
    return out


def epub_parts(data: bytes, filename: str | None) -> list[Part]:
    """The sections of an ``.epub`` book (see the module docstring)."""
    epub, html = _load(filename)
    check_zip(data, filename, "EPUB book (.epub is a zip)", MAX_OFFICE_UNPACKED)
    book = _Book(filename)
    try:
        doc = epub.read_epub(io.BytesIO(data), {"ignore_ncx": False})
        titles = _toc_titles(doc.toc, {})
        for idref, _linear in doc.spine:
            item = doc.get_item_with_id(idref)
            if item is None or isinstance(item, epub.EpubNav) or "nav" in (getattr(item, "properties", None) or ()):
                continue
            content = item.get_content()
            if not content or not content.strip():
                continue
            root = html.document_fromstring(content)
            book.chapter(" ".join((titles.get(item.get_name()) or "").split()) or None)
            body = root.find(".//body")
            book.walk(root if body is None else body)
        book.flush()
    except InvalidArgumentError:
        raise
    except Exception as exc:  # noqa: BLE001 - EbookLib / lxml / zipfile raise unrelated types
        raise InvalidArgumentError(
            f"{_name(filename)}: could not read the EPUB book ({type(exc).__name__}: {exc})"
        ) from None
    return book.parts
