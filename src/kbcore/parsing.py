"""Turning files into plain text: plain text, Markdown, HTML, JSON lines and PDF.

:func:`parse` takes the bytes of a file and returns a :class:`ParsedDocument` with its text.
The format comes from ``format=`` if given, else from the file name's extension, else from the
content (``%PDF-`` is PDF, a leading ``<!doctype html`` / ``<html`` is HTML, anything else that
decodes is plain text). An unknown extension, bytes that do not decode, an empty file and a
file without any text raise :class:`~kbcore.errors.InvalidArgumentError` (a ``ValueError``)
naming the file and the problem. PDF needs the optional extra ``pip install 'kbcore[pdf]'``
(pypdf); without it a PDF raises ``ImportError`` saying so.

- **text**: decoded (UTF-8, or UTF-16/32 with a byte-order mark), line endings normalised.
- **markdown**: front matter, link targets, image URLs, emphasis markers, heading hashes and
  HTML comments are removed; the words, code and line structure stay.
- **html**: the visible text (``html.parser`` from the standard library): scripts, styles,
  templates, ``<head>`` (except ``<title>``) and elements marked ``hidden`` are dropped; block
  elements become paragraph breaks.
- **jsonl**: one JSON value per line: a string, or an object whose ``text`` (else ``content``,
  else ``page_content``) is the text, prefixed by its ``title`` if it has one. The records are
  joined as paragraphs of one document.
- **pdf**: the text of every page (pypdf), pages separated by blank lines.

Structured formats also return :class:`~kbcore.sections.Section` s (``ParsedDocument.sections``,
see :mod:`kbcore.sections` and ``docs/formats.md``): Markdown and HTML headings, PDF pages, and
the office formats of :mod:`kbcore.parsers` (``.docx``, ``.pptx``, ``.xlsx`` with the extra
``kbcore[office]``; ``.csv`` / ``.tsv`` with the standard library). A ``.zip`` holds several
documents: :func:`parse_archive` parses it. Legacy ``.doc`` / ``.xls`` / ``.ppt`` are refused
with a message saying to convert them.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from .errors import InvalidArgumentError
from .sections import Part, Section, join_parts

__all__ = ["ParsedDocument", "parse", "parse_archive", "detect_format", "FORMATS", "EXTENSIONS", "LEGACY"]

#: The formats :func:`parse` understands (``zip``: :func:`parse_archive`).
FORMATS = ("text", "markdown", "html", "jsonl", "pdf", "docx", "pptx", "xlsx", "csv", "tsv", "zip")

#: File extensions (lower case, with the dot) and their format.
EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".log": "text",
    ".rst": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".mdown": "markdown",
    ".mkd": "markdown",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
    ".xlsm": "xlsx",
    ".csv": "csv",
    ".tsv": "tsv",
    ".zip": "zip",
}

#: Legacy binary Office extensions, refused, with the modern format to convert them to.
LEGACY = {".doc": ".docx", ".xls": ".xlsx", ".ppt": ".pptx"}


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """The text of one parsed file, its format, (when the file has one) its title and (for
    structured formats) its sections, spans of ``text`` in order."""

    text: str
    format: str
    title: str | None = None
    sections: tuple[Section, ...] = ()


def _name(filename: str | None) -> str:
    return repr(filename) if filename else "the input"


def detect_format(filename: str | None, data: bytes) -> str:
    """The format of a file from its name's extension, else from its first bytes."""
    if filename:
        ext = os.path.splitext(filename)[1].lower()
        if ext:
            fmt = EXTENSIONS.get(ext)
            if fmt is None and ext in LEGACY:
                raise InvalidArgumentError(
                    f"{_name(filename)}: the legacy binary {ext} format is not supported; "
                    f"convert the file to {LEGACY[ext]} (e.g. Save As in Office or LibreOffice) and ingest that"
                )
            if fmt is None:
                known = ", ".join(sorted(EXTENSIONS))
                raise InvalidArgumentError(
                    f"{_name(filename)}: unsupported file type {ext!r}; supported extensions: "
                    f"{known} (or pass format= one of {', '.join(FORMATS)})"
                )
            return fmt
    head = data[:1024].lstrip()
    if head.startswith(b"%PDF-"):
        return "pdf"
    low = head[:64].lower()
    if low.startswith(codecs.BOM_UTF8):
        low = low[len(codecs.BOM_UTF8) :]
    if low.startswith(b"<!doctype html") or low.startswith(b"<html"):
        return "html"
    return "text"


_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_META_CHARSET = re.compile(rb"<meta[^>]+charset=[\"']?([A-Za-z0-9_.:-]+)", re.IGNORECASE)


def _decode(data: bytes, filename: str | None, fmt: str) -> str:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            unit = 4 if "32" in encoding else 2 if "16" in encoding else 1
            if (len(data) - len(bom)) % unit:
                raise InvalidArgumentError(
                    f"{_name(filename)}: starts with a {encoding} byte-order mark but its length is "
                    f"not a multiple of {unit} bytes: not {encoding} text"
                )
            try:
                return data[len(bom) :].decode(encoding)
            except UnicodeDecodeError as exc:
                raise InvalidArgumentError(
                    f"{_name(filename)}: bytes are not valid {encoding} (byte {exc.start + len(bom)})"
                ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if fmt == "html":  # honour a declared charset
            m = _META_CHARSET.search(data[:4096])
            if m:
                try:
                    return data.decode(m.group(1).decode("ascii"))
                except (LookupError, UnicodeDecodeError):
                    pass
        raise InvalidArgumentError(
            f"{_name(filename)}: the bytes are not valid UTF-8 text (invalid byte at offset "
            f"{exc.start}); convert the file to UTF-8, or give the right file type"
        ) from None
    if "\x00" in text:
        raise InvalidArgumentError(
            f"{_name(filename)}: contains NUL bytes, so it looks binary rather than {fmt}; give a supported file type"
        )
    return text


def _normalise(text: str) -> str:
    """Unix newlines, no trailing spaces on lines, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[^\S\n]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


# -- markdown ------------------------------------------------------------------------------

_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)
_MD_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_MD_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MD_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]+\S+.*$", re.MULTILINE)
_MD_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$", re.MULTILINE)
_MD_FENCE = re.compile(r"^[ \t]*(```|~~~).*$", re.MULTILINE)
_MD_EMPHASIS = re.compile(r"(\*\*|__|\*|_|~~)(?=\S)(.+?)(?<=\S)\1")
_MD_CODE = re.compile(r"`([^`\n]+)`")


def _markdown(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _FRONT_MATTER.sub("", text)
    text = _MD_COMMENT.sub("", text)
    text = _MD_IMAGE.sub(r"\1", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_REF_DEF.sub("", text)
    text = _MD_HEADING.sub(r"\1", text)
    text = _MD_FENCE.sub("", text)
    text = _MD_EMPHASIS.sub(r"\2", text)
    text = _MD_CODE.sub(r"\1", text)
    return _normalise(text)


# -- html ----------------------------------------------------------------------------------

_SKIP = {"script", "style", "noscript", "template", "svg", "math", "iframe", "object", "head"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_BLOCK = {
    "address",
    "article",
    "aside",
    "blockquote",
    "dd",
    "div",
    "dl",
    "dt",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "tr",
    "ul",
    "caption",
    "details",
    "summary",
    "body",
    "html",
}


class _VisibleText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: list[str] = []
        self._skip: list[str] = []  # open tags whose content is invisible
        self._in_title = False
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
            return
        if self._skip:
            if tag == self._skip[-1] and tag not in _VOID:
                self._skip.append(tag)
            return
        hidden = any(
            k == "hidden"
            or (k == "aria-hidden" and (v or "").lower() == "true")
            or (k == "style" and re.search(r"display\s*:\s*none", v or "", re.I))
            for k, v in attrs
        )
        if (tag in _SKIP or hidden) and tag not in _VOID:
            self._skip.append(tag)
            return
        if tag == "br":
            self.parts.append("\n")
        elif tag in _BLOCK or tag in ("td", "th"):
            self.parts.append("\n\n" if tag in _BLOCK else " ")
        if tag == "pre":
            self._pre += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self._skip and tag == "br":
            self.parts.append("\n")
        elif not self._skip and tag in _BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
            return
        if self._skip:
            if tag == self._skip[-1]:
                self._skip.pop()
            return
        if tag in _BLOCK:
            self.parts.append("\n\n")
        if tag == "pre" and self._pre:
            self._pre -= 1

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title.append(data)
        elif not self._skip:
            self.parts.append(data if self._pre else re.sub(r"\s+", " ", data))


def _html(text: str) -> tuple[str, str | None]:
    parser = _VisibleText()
    parser.feed(text)
    parser.close()
    body = "".join(parser.parts)
    body = "\n".join(line.strip() for line in body.replace("\r", "").split("\n"))
    body = _normalise(body)
    title = " ".join("".join(parser.title).split()) or None
    if title and not body.startswith(title):
        body = f"{title}\n\n{body}" if body else title
    return body, title


# -- json lines ----------------------------------------------------------------------------


def _jsonl(text: str, filename: str | None) -> str:
    out: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgumentError(f"{_name(filename)}: line {lineno} is not valid JSON ({exc.msg})") from None
        if isinstance(value, str):
            piece = value
        elif isinstance(value, dict):
            body = next((value[k] for k in ("text", "content", "page_content") if k in value), None)
            if not isinstance(body, str):
                raise InvalidArgumentError(
                    f"{_name(filename)}: line {lineno} has no string field 'text', 'content' or 'page_content'"
                )
            title = value.get("title")
            piece = f"{title}\n{body}" if isinstance(title, str) and title.strip() else body
        else:
            raise InvalidArgumentError(
                f"{_name(filename)}: line {lineno} must be a JSON string or object, got {type(value).__name__}"
            )
        piece = piece.strip()
        if piece:
            out.append(piece)
    return _normalise("\n\n".join(out))


# -- pdf -----------------------------------------------------------------------------------


def _pdf(data: bytes, filename: str | None) -> tuple[list[str], list[tuple[int, int, str]]]:
    try:
        import pypdf
    except ImportError:
        raise ImportError(
            f"{_name(filename)} is a PDF; reading PDF needs the optional extra: "
            "pip install 'kbcore[pdf]' (installs pypdf)"
        ) from None
    import io
    import logging

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                reader.decrypt("")
            except Exception:  # noqa: BLE001 - pypdf raises several types here
                pass
        pages = [page.extract_text() or "" for page in reader.pages]
    except Exception as exc:  # noqa: BLE001 - pypdf's errors are not one hierarchy
        raise InvalidArgumentError(f"{_name(filename)}: could not read the PDF ({type(exc).__name__}: {exc})") from None
    from .parsers.structure import pdf_outline

    return [_normalise(p) for p in pages], pdf_outline(reader)


# -- entry point ---------------------------------------------------------------------------


def parse(data: bytes, *, filename: str | None = None, format: str | None = None) -> ParsedDocument:
    """Parses the bytes of one file into text (see the module docstring)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if format is not None and format not in FORMATS:
        raise InvalidArgumentError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    fmt = format or detect_format(filename, data)
    if not data.strip():
        raise InvalidArgumentError(f"{_name(filename)} is empty: there is nothing to ingest")
    title = None
    parts: list[Part] | None = None
    if fmt == "zip":
        raise InvalidArgumentError(
            f"{_name(filename)} is a zip archive, which holds several documents: parse it with parse_archive()"
        )
    if fmt == "pdf":
        from .parsers.structure import pdf_parts

        parts = pdf_parts(*_pdf(data, filename))
    elif fmt in _STRUCTURED:
        parts = _STRUCTURED[fmt](data, filename)
    else:
        raw = _decode(data, filename, fmt)
        if fmt == "markdown":
            from .parsers.structure import markdown_parts

            parts = markdown_parts(raw, _markdown)
            text = _markdown(raw) if parts is None else ""
        elif fmt == "html":
            from .parsers.structure import html_parts

            text, title = _html(raw)
            parts = html_parts(raw, text)
        elif fmt == "jsonl":
            text = _jsonl(raw, filename)
        elif fmt in ("csv", "tsv"):
            from .parsers.tables import csv_parts

            parts = csv_parts(raw, filename, "," if fmt == "csv" else "\t")
        else:
            text = _normalise(raw)
    sections: tuple[Section, ...] = ()
    if parts is not None:
        text, sections = join_parts(parts)
    if not text.strip():
        raise InvalidArgumentError(f"{_name(filename)} ({fmt}) contains no text: there is nothing to ingest")
    return ParsedDocument(text, fmt, title, sections)


def _docx(data: bytes, filename: str | None) -> list[Part]:
    from .parsers.office import docx_parts

    return docx_parts(data, filename)


def _pptx(data: bytes, filename: str | None) -> list[Part]:
    from .parsers.office import pptx_parts

    return pptx_parts(data, filename)


def _xlsx(data: bytes, filename: str | None) -> list[Part]:
    from .parsers.tables import xlsx_parts

    return xlsx_parts(data, filename)


_STRUCTURED = {"docx": _docx, "pptx": _pptx, "xlsx": _xlsx}


def parse_archive(data: bytes, *, filename: str | None = None) -> Any:
    """The documents of a ``.zip`` archive: a :class:`kbcore.parsers.archive.ParsedArchive`
    (its members parsed by :func:`parse`, each with its path inside the archive, and the
    skipped members with the reason). Refuses the whole archive on a bad member."""
    from .parsers.archive import parse_archive as _parse_archive

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"expected bytes, got {type(data).__name__}")
    if not data:
        raise InvalidArgumentError(f"{_name(filename)} is empty: there is nothing to ingest")
    return _parse_archive(bytes(data), filename, parse, EXTENSIONS, LEGACY)
