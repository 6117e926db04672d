"""Splitting document text into overlapping chunks on paragraph, sentence and word boundaries.

:func:`chunk_text` measures ``chunk_size`` and ``chunk_overlap`` in characters (Python ``str``
code points). The text is cut into *units*: paragraphs (separated by a blank line); a paragraph
longer than ``chunk_size`` is cut into sentences; a sentence longer than ``chunk_size`` into
words; a word longer than ``chunk_size`` into pieces of exactly ``chunk_size`` characters.
Consecutive units are then packed greedily into chunks of at most ``chunk_size`` characters
(the span from the first unit's start to the last unit's end, separators included), and the
next chunk starts at the first unit that begins at or after ``end - chunk_overlap`` of the
previous chunk, so that neighbouring chunks share up to ``chunk_overlap`` characters of whole
units. Every chunk knows its span: ``chunk.text == text[chunk.start:chunk.end]``, and no chunk
starts or ends with whitespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidArgumentError, InvalidTypeError

__all__ = ["Chunk", "chunk_text", "check_chunk_params"]

# A blank line (possibly holding spaces) separates paragraphs.
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")
# A sentence ends with . ! ? (or their CJK forms), optionally followed by closing quotes or
# brackets; western marks need whitespace after them. Group 1 / 2 is the end of the sentence.
_SENTENCE = re.compile(r"([.!?][\"'\u201d\u2019)\]]*)\s+|([\u3002\uff01\uff1f])\s*")
_WORD = re.compile(r"\s+")
_LEVELS = (_PARAGRAPH, _SENTENCE, _WORD)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a document: its text, its position and its character span.

    ``text == source[start:end]`` where ``source`` is the document text that was chunked;
    ``index`` counts chunks from 0 in document order.
    """

    text: str
    index: int
    start: int
    end: int
    document_id: str = ""


def check_chunk_params(chunk_size: object, chunk_overlap: object) -> tuple[int, int]:
    """Validates ``chunk_size`` (>= 1) and ``chunk_overlap`` (0 <= overlap < chunk_size)."""
    for name, value in (("chunk_size", chunk_size), ("chunk_overlap", chunk_overlap)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidTypeError(f"{name} must be an integer, got {type(value).__name__}")
    assert isinstance(chunk_size, int) and isinstance(chunk_overlap, int)
    if chunk_size < 1:
        raise InvalidArgumentError(f"chunk_size must be at least 1 character, got {chunk_size}")
    if not 0 <= chunk_overlap < chunk_size:
        raise InvalidArgumentError(f"chunk_overlap must be in [0, chunk_size) = [0, {chunk_size}), got {chunk_overlap}")
    return chunk_size, chunk_overlap


def _trimmed(text: str, s: int, e: int) -> tuple[int, int]:
    piece = text[s:e]
    stripped = piece.lstrip()
    s += len(piece) - len(stripped)
    return s, s + len(stripped.rstrip())


def _split(text: str, s: int, e: int, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """Non-empty, whitespace-trimmed pieces of text[s:e] between matches of pattern."""
    out: list[tuple[int, int]] = []
    pos = s
    for m in pattern.finditer(text, s, e):
        cut = m.end(m.lastindex) if m.lastindex else m.start()  # keep sentence marks
        if cut > pos:
            a, b = _trimmed(text, pos, cut)
            if b > a:
                out.append((a, b))
        pos = max(pos, m.end())
    if pos < e:
        a, b = _trimmed(text, pos, e)
        if b > a:
            out.append((a, b))
    return out


def _units(text: str, s: int, e: int, level: int, size: int, out: list[tuple[int, int]]) -> None:
    if e - s <= size:
        out.append((s, e))
        return
    if level == len(_LEVELS):  # one token longer than a chunk: cut it into equal pieces
        out.extend((a, min(a + size, e)) for a in range(s, e, size))
        return
    for a, b in _split(text, s, e, _LEVELS[level]):
        _units(text, a, b, level + 1, size, out)


def chunk_text(text: str, *, chunk_size: int = 500, chunk_overlap: int = 50, document_id: str = "") -> list[Chunk]:
    """Splits ``text`` into chunks of at most ``chunk_size`` characters (see the module doc).

    Returns an empty list when the text is empty or only whitespace. Complexity O(len(text)).
    """
    if not isinstance(text, str):
        raise InvalidTypeError(f"text must be a str, got {type(text).__name__}")
    size, overlap = check_chunk_params(chunk_size, chunk_overlap)
    units: list[tuple[int, int]] = []
    s, e = _trimmed(text, 0, len(text))
    if e > s:
        _units(text, s, e, 0, size, units)
    chunks: list[Chunk] = []
    n = len(units)
    i = 0
    while i < n:
        start = units[i][0]
        j = i
        while j + 1 < n and units[j + 1][1] - start <= size:
            j += 1
        end = units[j][1]
        chunks.append(Chunk(text[start:end], len(chunks), start, end, document_id))
        if j + 1 >= n:
            break
        nxt = j + 1
        if overlap:
            k = j
            while k > i and units[k][0] >= end - overlap:
                k -= 1
            nxt = k + 1
            # the next chunk must reach past this one, so it may not start too early
            while nxt <= j and units[j + 1][1] - units[nxt][0] > size:
                nxt += 1
        i = nxt
    return chunks
