"""Document structure and structure-aware chunking.

A parser that knows a file's structure returns, besides the text, its :class:`Section` s:
spans of the text with a heading path (``"Guide > Install"``, a sheet or slide name), a page
number when the format has pages, and for tables the header line(s) to repeat on every chunk.
:func:`join_parts` builds the text and the sections from a list of :class:`Part` s;
:func:`chunk_sections` cuts the text into chunks that respect them:

- a chunk never crosses a section boundary, except that neighbouring *text* sections shorter
  than ``min_section`` characters are merged (up to ``chunk_size``) so that a run of one-line
  sections does not become a run of one-line chunks; a merged chunk carries the first
  section's path and page;
- a text section longer than ``chunk_size`` is cut by :func:`kbcore.chunking.chunk_text`
  (paragraph, sentence - including the CJK ``。！？`` - and word boundaries, with overlap);
- a table is cut between rows: each chunk is the header followed by as many whole rows as fit
  in ``chunk_size`` (at least one); no overlap, so a row is in exactly one chunk. A single row
  longer than ``chunk_size`` is cut by ``chunk_text`` and the header repeated on each piece
  (the only case where a chunk holds part of a row). A header longer than half of
  ``chunk_size`` is not repeated: the table (header first) is cut into whole rows only.

Every chunk is a :class:`SectionChunk` (a :class:`~kbcore.chunking.Chunk` with ``section``
and ``page``). ``start`` / ``end`` are the chunk's span of the document text; the chunk text
is ``text[start:end]``, except for table chunks, whose text is the header, a newline and
``text[start:end]`` (the rows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .chunking import Chunk, Measure, check_chunk_params, check_chunking, chunk_text
from .errors import InvalidArgumentError

__all__ = ["Part", "Section", "SectionChunk", "join_parts", "chunk_sections", "SEPARATOR", "PATH_SEPARATOR"]

#: What separates two parts in the joined document text.
SEPARATOR = "\n\n"
#: What joins the headings of a heading path.
PATH_SEPARATOR = " > "


@dataclass(frozen=True, slots=True)
class Part:
    """One piece of a parsed document before joining: its text, heading path, page (1-based,
    when the format has pages), kind (``"text"`` or ``"table"``) and, for a table, its header
    (the text's first line(s), repeated on each chunk; the rest of the text is one row a line).
    """

    text: str
    path: str = ""
    page: int | None = None
    kind: str = "text"
    header: str | None = None


@dataclass(frozen=True, slots=True)
class Section:
    """A span ``[start, end)`` of a document's text with its heading path, page and kind; for a
    table, ``header`` is ``text[start:body]`` without its final newline and the rows are the
    lines of ``text[body:end]``."""

    start: int
    end: int
    path: str = ""
    page: int | None = None
    kind: str = "text"
    header: str | None = None
    body: int = -1


@dataclass(frozen=True, slots=True)
class SectionChunk(Chunk):
    """A chunk with the heading path (``section``) and page of the section it comes from."""

    section: str | None = None
    page: int | None = None


def join_parts(parts: Sequence[Part]) -> tuple[str, tuple[Section, ...]]:
    """(text, sections) of parts: the stripped non-empty parts joined by :data:`SEPARATOR`."""
    pieces: list[str] = []
    sections: list[Section] = []
    pos = 0
    for part in parts:
        body = part.text.strip()
        if not body:
            continue
        if pieces:
            pos += len(SEPARATOR)
        header = part.header.strip() if part.kind == "table" and part.header else None
        body_at = -1
        if header is not None:
            if not body.startswith(header + "\n"):
                raise InvalidArgumentError("a table part's text must start with its header line(s)")
            body_at = pos + len(header) + 1
        pieces.append(body)
        sections.append(Section(pos, pos + len(body), part.path, part.page, part.kind, header, body_at))
        pos += len(body)
    return SEPARATOR.join(pieces), tuple(sections)


def _shifted(chunks: list[Chunk], offset: int, header: str | None) -> list[tuple[str, int, int]]:
    prefix = header + "\n" if header else ""
    return [(prefix + c.text, c.start + offset, c.end + offset) for c in chunks]


def _table_chunks(
    text: str,
    start: int,
    end: int,
    header: str | None,
    size: int,
    measure: Measure,
    unit: str = "chars",
    separators: tuple[str, ...] = (),
    count_tokens: Callable[[Sequence[str]], Sequence[int]] | None = None,
) -> list[tuple[str, int, int]]:
    """Chunks of whole rows (the lines of ``text[start:end]``), each after ``header`` when given."""
    prefix = header + "\n" if header is not None else ""
    room = size - Measure(prefix, unit, count_tokens)(0, len(prefix))  # left for rows after the header and its newline
    out: list[tuple[str, int, int]] = []
    rows: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        nl = text.find("\n", pos, end)
        e = end if nl < 0 else nl
        if e > pos:
            rows.append((pos, e))
        pos = e + 1
    i = 0
    while i < len(rows):
        s, e = rows[i]
        if measure(s, e) > room:  # one row too long for a chunk: cut it, header on each piece
            piece = chunk_text(
                text[s:e],
                chunk_size=room,
                chunk_overlap=0,
                chunk_unit=unit,
                separators=separators,
                count_tokens=count_tokens,
            )
            out.extend(_shifted(piece, s, header))
            i += 1
            continue
        j = i
        while j + 1 < len(rows) and measure(s, rows[j + 1][1]) <= room:
            j += 1
        e = rows[j][1]
        out.append((prefix + text[s:e], s, e))
        i = j + 1
    return out


def _runs(sections: Sequence[Section], size: int, min_section: int, measure: Measure) -> list[list[Section]]:
    """Sections grouped into runs chunked together: small neighbouring text sections merge."""
    runs: list[list[Section]] = []
    for sec in sections:
        last = runs[-1] if runs else None
        if (
            last is not None
            and sec.kind == "text"
            and all(s.kind == "text" for s in last)
            and (measure(sec.start, sec.end) < min_section or measure(last[0].start, last[-1].end) < min_section)
            and measure(last[0].start, sec.end) <= size
        ):
            last.append(sec)
        else:
            runs.append([sec])
    return runs


def chunk_sections(
    text: str,
    sections: Sequence[Section],
    *,
    chunk_size: int = 500,
    chunk_overlap: int = 50,
    min_section: int | None = None,
    document_id: str = "",
    chunk_unit: str = "chars",
    separators: Sequence[str] | None = None,
    count_tokens: Callable[[Sequence[str]], Sequence[int]] | None = None,
) -> list[SectionChunk]:
    """Chunks of ``text`` that respect ``sections`` (see the module docstring).

    ``min_section`` defaults to a quarter of ``chunk_size``. ``chunk_unit`` / ``separators``
    as for :func:`~kbcore.chunking.chunk_text`: every size (chunks, table rows, headers,
    ``min_section``) is then measured in that unit (``count_tokens`` as there too). Text outside every section is not
    chunked (parsers cover the whole text). Complexity O(len(text)).
    """
    size, overlap = check_chunk_params(chunk_size, chunk_overlap)
    unit, seps = check_chunking(chunk_unit, separators)
    measure = Measure(text, unit, count_tokens if unit == "tokens" else None)
    if min_section is None:
        min_section = size // 4
    out: list[SectionChunk] = []
    for run in _runs(sections, size, min_section, measure):
        first = run[0]
        label = max(run, key=lambda sec: sec.end - sec.start)
        if first.kind == "table" and first.header is not None and first.body >= 0:
            if measure(first.start, first.body) <= size // 2:  # the header and its newline
                pieces = _table_chunks(
                    text, first.body, first.end, first.header, size, measure, unit, seps, count_tokens
                )
            else:  # a header wider than half a chunk is not repeated: whole rows only
                pieces = _table_chunks(text, first.start, first.end, None, size, measure, unit, seps, count_tokens)
        else:
            s, e = first.start, run[-1].end
            got = chunk_text(
                text[s:e],
                chunk_size=size,
                chunk_overlap=overlap,
                chunk_unit=unit,
                separators=seps,
                count_tokens=count_tokens,
            )
            pieces = _shifted(got, s, None)
        for piece, s, e in pieces:
            out.append(SectionChunk(piece, len(out), s, e, document_id, label.path or None, label.page))
    return out
