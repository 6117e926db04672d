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
- **pdf**: the text of every page (pypdf), pages separated by blank lines, within a parse
  budget of decoded page content and time (see :func:`parse`).

Every parser takes time linear in its input (tests/test_parsing_linear.py).

Structured formats also return :class:`~kbcore.sections.Section` s (``ParsedDocument.sections``,
see :mod:`kbcore.sections` and ``docs/formats.md``): Markdown and HTML headings, PDF pages, and
the office formats of :mod:`kbcore.parsers` (``.docx``, ``.pptx``, ``.xlsx``, ``.odt``, ``.epub``
with the extra ``kbcore[office]``; ``.csv`` / ``.tsv`` with the standard library). A ``.zip`` holds several
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

__all__ = [
    "ParsedDocument",
    "parse",
    "parse_archive",
    "parse_records",
    "detect_format",
    "FORMATS",
    "EXTENSIONS",
    "LEGACY",
    "DEFAULT_PDF_MAX_CONTENT_BYTES",
    "DEFAULT_TIME_LIMIT",
]

#: The formats :func:`parse` understands (``zip``: :func:`parse_archive`).
FORMATS = ("text", "markdown", "html", "jsonl", "pdf", "docx", "pptx", "xlsx", "csv", "tsv", "zip", "epub", "odt")

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
    ".odt": "odt",
    ".epub": "epub",
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


_BLANK_LINES = re.compile(r"\n{3,}")  # a run matches once from its first newline: linear


def _normalise(text: str) -> str:
    """Unix newlines, no trailing spaces on lines, at most one blank line in a row."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    # Per-line rstrip, not re.sub(r"[^\S\n]+\n"): that pattern rescans a long run of spaces
    # from each of its positions (quadratic; str.rstrip strips the same str.isspace set).
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


#: Decoded bytes of page content one PDF may make the text extractor read, summed over its
#: pages (a content stream shared by many pages counts once per page, as it is read per page).
DEFAULT_PDF_MAX_CONTENT_BYTES = 128 * 1024 * 1024
#: Seconds the parsing of one PDF or HTML document may take (the other formats are linear
#: and fast: 1 MB in well under a second).
DEFAULT_TIME_LIMIT = 60.0

# -- markdown ------------------------------------------------------------------------------

# Every pattern and scan here is linear in the text: no pattern can rescan an unbounded span
# from many start positions (the regexes they replace, e.g. ``<!--.*?-->``, ``\[([^\]]+)\]``
# or the lazy heading group, took quadratic or cubic time on unclosed or long constructs).
_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)  # anchored: one start, one scan
_MD_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+", re.MULTILINE)  # the prefix; the rest is per line
_MD_FENCE = re.compile(r"^[ \t]*(```|~~~).*$", re.MULTILINE)  # backtracks within one line only
_MD_CODE = re.compile(r"`([^`\n]+)`")  # a failed scan stops at the next backtick or newline
_MD_REF_START = re.compile(r"^ {0,3}\[", re.MULTILINE)
_MD_MARKER = re.compile(r"[*_~]")
_NEWLINE = re.compile(r"\n")
_MD_EMPHASIS_MARKERS = ("**", "__", "*", "_", "~~")  # tried in this order at one position
_MD_CLOSERS = {m: re.compile(r"(?<=\S)(?=" + re.escape(m) + ")") for m in _MD_EMPHASIS_MARKERS}


class _NextFrom:
    """``text.find(needle, start)`` for non-decreasing ``start``, in linear total time."""

    def __init__(self, text: str, needle: str) -> None:
        self.text, self.needle = text, needle
        self.start = 0
        self.found = -2  # nothing looked up yet

    def __call__(self, start: int) -> int:
        if self.found == -1 or (self.found >= start and self.start <= start):
            return self.found
        self.start, self.found = start, self.text.find(self.needle, start)
        return self.found


def _strip_comments(text: str) -> str:
    """``<!--.*?-->`` (DOTALL) removed; one forward scan."""
    out: list[str] = []
    pos = 0
    while True:
        i = text.find("<!--", pos)
        j = text.find("-->", i + 4) if i >= 0 else -1
        if j < 0:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos:i])
        pos = j + 3


def _strip_bracketed(text: str, opener: str, min_label: int) -> str:
    r"""``OPENER([^\]]*)\]\([^)]*\)`` replaced by its label (images: ``![``, links: ``[``)."""
    out: list[str] = []
    pos = 0
    close_bracket = _NextFrom(text, "]")
    close_paren = _NextFrom(text, ")")
    i = text.find(opener)
    while i >= 0:
        start = i + len(opener)
        j = close_bracket(start)
        if j < 0:
            break  # no "]" left: no later opener can match either
        if j - start >= min_label and text.startswith("(", j + 1):
            k = close_paren(j + 2)
            if k < 0:
                break  # no ")" left after this "](": nor after any later one
            out.append(text[pos:i])
            out.append(text[start:j])
            pos = k + 1
            i = text.find(opener, pos)
            continue
        i = text.find(opener, i + 1)
    out.append(text[pos:])
    return "".join(out)


def _strip_ref_definitions(text: str) -> str:
    r"""``^ {0,3}\[[^\]]+\]:[ \t]+\S+.*$`` (MULTILINE) removed; one forward scan."""
    out: list[str] = []
    pos = 0
    close_bracket = _NextFrom(text, "]")
    n = len(text)
    failed = -1  # a "]:" already known to lack a target (starts on many lines may share it)
    for m in _MD_REF_START.finditer(text):
        if m.start() < pos:
            continue
        j = close_bracket(m.end())
        if j < 0:
            break  # no "]" left: no later line can hold a definition
        if j == m.end() or j == failed or not text.startswith(":", j + 1):
            continue
        k = j + 2
        while k < n and text[k] in " \t":
            k += 1
        if k == j + 2 or k == n or text[k].isspace():
            failed = j
            continue
        eol = text.find("\n", k)
        out.append(text[pos : m.start()])
        pos = n if eol < 0 else eol
    out.append(text[pos:])
    return "".join(out)


def _strip_headings(text: str) -> str:
    r"""``^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$`` (MULTILINE) replaced by the heading text."""
    out: list[str] = []
    pos = 0
    for m in _MD_HEADING.finditer(text):
        eol = text.find("\n", m.end())
        eol = len(text) if eol < 0 else eol
        out.append(text[pos : m.start()])
        out.append(text[m.end() : eol].rstrip(" \t").rstrip("#").rstrip(" \t"))
        pos = eol
    out.append(text[pos:])
    return "".join(out)


def _strip_emphasis(text: str) -> str:
    r"""``(\*\*|__|\*|_|~~)(?=\S)(.+?)(?<=\S)\1`` replaced by the emphasised text.

    The same leftmost, first-alternative, shortest matches as that pattern, found with sorted
    closer positions instead of a scan to the end of the line from every unclosed marker."""
    import bisect

    closers = {m: [c.start() for c in rx.finditer(text)] for m, rx in _MD_CLOSERS.items()}
    newlines = [m.start() for m in _NEWLINE.finditer(text)]
    n = len(text)
    out: list[str] = []
    pos = 0
    live = [m for m in _MD_EMPHASIS_MARKERS if closers[m]]
    candidates = _MD_MARKER
    at = candidates.search(text)
    while at is not None and live:
        i = at.start()
        nxt = i + 1
        for marker in live:
            k = i + len(marker)
            if not text.startswith(marker, i) or k >= n or text[k].isspace():
                continue
            found = closers[marker]
            c = bisect.bisect_left(found, k + 1)
            if c == len(found):  # no closer left: this marker matches nowhere after here
                live = [m for m in live if m != marker]
                candidates = re.compile("[" + re.escape("".join({m[0] for m in live}) or "*") + "]")
                continue
            j = found[c]
            line_end = bisect.bisect_left(newlines, k)
            if line_end < len(newlines) and newlines[line_end] < j:
                continue
            out.append(text[pos:i])
            out.append(text[k:j])
            pos = nxt = j + len(marker)
            break
        at = candidates.search(text, nxt)
    out.append(text[pos:])
    return "".join(out)


def _markdown(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _FRONT_MATTER.sub("", text)
    text = _strip_comments(text)
    text = _strip_bracketed(text, "![", 0)
    text = _strip_bracketed(text, "[", 1)
    text = _strip_ref_definitions(text)
    text = _strip_headings(text)
    text = _MD_FENCE.sub("", text)
    text = _strip_emphasis(text)
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


_SPACES = re.compile(r"\s+")
_COMMENT_END = re.compile(r"--\s*>")  # html.parser's comment end; a failed try stops at the next non-space


class _TimeLimitError(Exception):
    """Internal: a parser ran past its ``time_limit`` (turned into InvalidArgumentError)."""


class _VisibleText(HTMLParser):
    def __init__(self, time_limit: float = DEFAULT_TIME_LIMIT) -> None:
        super().__init__(convert_charrefs=True)
        import time

        self._clock = time.monotonic
        self._time_limit = time_limit
        self._end = time.monotonic() + time_limit
        self.parts: list[str] = []
        self.title: list[str] = []
        self._skip: list[str] = []  # open tags whose content is invisible
        self._in_title = False
        self._pre = 0
        self.headings: list[tuple[int, str]] = []  # (level, visible title) of each <h1>-<h6>
        self._heading = 0  # the level of the open heading, 0 outside one
        self._heading_text: list[str] = []

    def _tick(self) -> None:
        # html.parser (before CPython's fix of CVE-2025-6069) rescans unclosed constructs
        # from each "<": quadratic on crafted input, so the time is bounded here, where every
        # construct it reports passes.
        if self._clock() > self._end:
            raise _TimeLimitError(f"parsing took more than time_limit={self._time_limit:g} s")

    def handle_comment(self, data: str) -> None:
        self._tick()

    def handle_decl(self, decl: str) -> None:
        self._tick()

    def handle_pi(self, data: str) -> None:
        self._tick()

    def unknown_decl(self, data: str) -> None:
        self._tick()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tick()
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
        if len(tag) == 2 and tag[0] == "h" and tag[1] in "123456":
            self._heading, self._heading_text = int(tag[1]), []

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tick()
        if not self._skip and tag == "br":
            self.parts.append("\n")
        elif not self._skip and tag in _BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        self._tick()
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
        if self._heading and tag == f"h{self._heading}":
            title = " ".join("".join(self._heading_text).split())
            if title:
                self.headings.append((self._heading, title))
            self._heading = 0

    def handle_data(self, data: str) -> None:
        self._tick()
        if self._in_title:
            self.title.append(data)
        elif not self._skip:
            self.parts.append(data if self._pre else _SPACES.sub(" ", data))
            if self._heading:
                self._heading_text.append(data)


def _defuse_html(text: str) -> str:
    """``text`` with the constructs that can never close escaped, for every ``html.parser`` pass.

    Every "<" after the last ">" starts a construct that never closes: html.parser shows it
    as text, after rescanning to the end from each one (quadratic); as "&lt;" it is the
    same text, found in one pass. Likewise every "<!--" after the last comment end ("--",
    spaces, ">") never closes.
    """
    last = text.rfind(">")
    if "<" in text[last + 1 :]:
        text = text[: last + 1] + text[last + 1 :].replace("<", "&lt;")
    close = max((m.end() for m in _COMMENT_END.finditer(text)), default=0)
    if "<!--" in text[close:]:
        text = text[:close] + text[close:].replace("<!--", "&lt;!--")
    return text


def _html(
    text: str,
    filename: str | None = None,
    time_limit: float = DEFAULT_TIME_LIMIT,
    headings: list[tuple[int, str]] | None = None,
) -> tuple[str, str | None]:
    """The visible text and the title of an HTML page; ``headings``, when given, receives the
    (level, visible title) of its ``<h1>``-``<h6>`` in document order (one pass for both)."""
    text = _defuse_html(text)
    parser = _VisibleText(time_limit)
    try:
        parser.feed(text)
        parser.close()
    except _TimeLimitError as exc:
        raise InvalidArgumentError(
            f"{_name(filename)}: the HTML exceeds its parse budget: {exc} (a document crafted to be "
            "costly, or raise the limit: parse(..., time_limit=...))"
        ) from None
    if headings is not None:
        headings.extend(parser.headings)
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


_PDF_CHECK_EVERY = 256  # content-stream operators between two looks at the clock


class _PdfBudgetError(Exception):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def _page_content_bytes(page: Any) -> int:
    """Decoded bytes of a page's content streams (pypdf decodes and caches each stream once)."""
    contents = page.get("/Contents")
    if contents is None:
        return 0
    contents = contents.get_object()
    items = contents if isinstance(contents, list) else [contents]
    total = 0
    for item in items:
        obj = item.get_object()
        get_data = getattr(obj, "get_data", None)
        if get_data is not None:
            total += len(get_data())
    return total


def _pdf(
    data: bytes, filename: str | None, max_content_bytes: int, time_limit: float
) -> tuple[list[str], list[tuple[int, int, str]]]:
    try:
        import pypdf
    except ImportError:
        raise ImportError(
            f"{_name(filename)} is a PDF; reading PDF needs the optional extra: "
            "pip install 'kbcore[pdf]' (installs pypdf)"
        ) from None
    import io
    import logging
    import time

    logging.getLogger("pypdf").setLevel(logging.ERROR)
    end = time.monotonic() + time_limit
    calls = 0

    def check_time(*_: Any) -> None:
        nonlocal calls
        calls += 1
        if calls % _PDF_CHECK_EVERY == 0 and time.monotonic() > end:
            raise _PdfBudgetError(f"its text extraction took more than time_limit={time_limit:g} s")

    content = 0
    pages: list[str] = []
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                reader.decrypt("")
            except Exception:  # noqa: BLE001 - pypdf raises several types here
                pass
        for number, page in enumerate(reader.pages, 1):  # sizes first: refuse before extracting
            content += _page_content_bytes(page)
            if content > max_content_bytes:
                raise _PdfBudgetError(
                    f"the content of its pages 1-{number} decodes to {content:,} bytes, more than "
                    f"pdf_max_content_bytes={max_content_bytes:,}"
                )
            if time.monotonic() > end:
                raise _PdfBudgetError(f"reading it took more than time_limit={time_limit:g} s")
        for page in reader.pages:
            if time.monotonic() > end:
                raise _PdfBudgetError(f"its text extraction took more than time_limit={time_limit:g} s")
            pages.append(page.extract_text(visitor_operand_before=check_time) or "")
    except _PdfBudgetError as exc:
        raise InvalidArgumentError(
            f"{_name(filename)}: the PDF exceeds its parse budget: {exc.what} (a PDF crafted to be costly, "
            "or raise the limit: parse(..., pdf_max_content_bytes=..., time_limit=...))"
        ) from None
    except Exception as exc:  # noqa: BLE001 - pypdf's errors are not one hierarchy
        raise InvalidArgumentError(f"{_name(filename)}: could not read the PDF ({type(exc).__name__}: {exc})") from None
    from .parsers.structure import pdf_outline

    return [_normalise(p) for p in pages], pdf_outline(reader)


# -- entry point ---------------------------------------------------------------------------


def parse(
    data: bytes,
    *,
    filename: str | None = None,
    format: str | None = None,
    pdf_max_content_bytes: int = DEFAULT_PDF_MAX_CONTENT_BYTES,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> ParsedDocument:
    """Parses the bytes of one file into text (see the module docstring).

    A PDF has a parse budget: its pages' content may decode to at most
    ``pdf_max_content_bytes`` bytes in total (default 128 MiB; a stream shared by many pages
    counts for each); the parsing of a PDF or HTML document may take at most ``time_limit``
    seconds (default 60); beyond either, InvalidArgumentError naming the file and the limit."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if (
        isinstance(pdf_max_content_bytes, bool)
        or not isinstance(pdf_max_content_bytes, int)
        or pdf_max_content_bytes < 1
    ):
        raise InvalidArgumentError(f"pdf_max_content_bytes must be a positive integer, got {pdf_max_content_bytes!r}")
    if (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, (int, float))
        or not time_limit > 0
        or time_limit == float("inf")
    ):
        raise InvalidArgumentError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
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

        parts = pdf_parts(*_pdf(data, filename, pdf_max_content_bytes, float(time_limit)))
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

            headings: list[tuple[int, str]] = []
            text, title = _html(raw, filename, float(time_limit), headings)
            parts = html_parts(headings, text)
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


def _epub(data: bytes, filename: str | None) -> list[Part]:
    from .parsers.epub import epub_parts

    return epub_parts(data, filename)


def _odt(data: bytes, filename: str | None) -> list[Part]:
    from .parsers.odt import odt_parts

    return odt_parts(data, filename)


_STRUCTURED = {"docx": _docx, "pptx": _pptx, "xlsx": _xlsx, "epub": _epub, "odt": _odt}


def parse_records(
    data: bytes, *, filename: str | None = None, format: str | None = None, id_column: str | None = None
) -> list[Any]:
    """The rows of a spreadsheet of records (``.csv`` / ``.tsv`` / ``.xlsx``) as
    :class:`kbcore.parsers.tables.Record` s, one per non-empty data row (the first non-empty
    row of each table is the header): what ``ingest(..., rows_as_documents=True)`` stores as
    one document each. ``id_column`` names the header of the column holding each row's id
    (distinct and non-empty), else a row is named by its number. Other formats, an empty file
    or a file without a data row raise InvalidArgumentError."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"expected bytes, got {type(data).__name__}")
    if id_column is not None and (not isinstance(id_column, str) or not id_column):
        raise InvalidArgumentError(f"id_column must be a non-empty str, got {id_column!r}")
    data = bytes(data)
    if format is not None and format not in FORMATS:
        raise InvalidArgumentError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if not data.strip():
        raise InvalidArgumentError(f"{_name(filename)} is empty: there is nothing to ingest")
    fmt = format or detect_format(filename, data)
    from .parsers.tables import csv_records, xlsx_records

    if fmt == "xlsx":
        records = xlsx_records(data, filename, id_column)
    elif fmt in ("csv", "tsv"):
        records = csv_records(_decode(data, filename, fmt), filename, "," if fmt == "csv" else "\t", id_column)
    else:
        raise InvalidArgumentError(f"{_name(filename)} is {fmt}: one document per row needs a .csv, .tsv or .xlsx file")
    if not records:
        raise InvalidArgumentError(f"{_name(filename)} has no data row (only a header, or nothing)")
    return records


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
