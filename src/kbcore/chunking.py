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

``chunk_unit="tokens"`` measures sizes in tokens instead: the number of tokens of a span is
counted with :func:`approx_token_spans` (a run of letters / digits, one CJK character, or one
other non-space symbol is a token: close to a WordPiece / SentencePiece count for English,
exact in spirit for Chinese / Japanese, where those tokenizers give about a token a
character). A word longer than ``chunk_size`` tokens is then cut every ``chunk_size`` tokens.

``separators``: literal strings tried, in the order given, before the built-in paragraph →
sentence → word cascade: a span longer than a chunk is cut at the first separator first, a
piece still too long at the next one, and so on. A separator is kept inside a chunk that
spans it and left out at a chunk's edge (like the blank line between paragraphs).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "Chunk",
    "chunk_text",
    "check_chunk_params",
    "check_chunking",
    "approx_token_spans",
    "Measure",
    "CHUNK_UNITS",
]

#: The units ``chunk_size`` / ``chunk_overlap`` may be measured in.
CHUNK_UNITS = ("chars", "tokens")
#: The most custom separators, and the longest one (characters).
MAX_SEPARATORS = 32
MAX_SEPARATOR_CHARS = 256

# A blank line (possibly holding spaces) separates paragraphs.
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")
# A sentence ends with . ! ? (or their CJK forms), optionally followed by closing quotes or
# brackets; western marks need whitespace after them. Group 1 / 2 is the end of the sentence.
_SENTENCE = re.compile(r"([.!?][\"'\u201d\u2019)\]]*)\s+|([\u3002\uff01\uff1f])\s*")
_WORD = re.compile(r"\s+")
_LEVELS = (_PARAGRAPH, _SENTENCE, _WORD)
# One approximate token: a CJK character (Han, kana, Hangul), a run of other letters / digits,
# or one other non-space character.
_CJK = "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_TOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+|[^\\w\\s]")


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


def check_chunking(chunk_unit: object, separators: object) -> tuple[str, tuple[str, ...]]:
    """Validates ``chunk_unit`` (one of :data:`CHUNK_UNITS`) and ``separators`` (None or a
    list / tuple of at most :data:`MAX_SEPARATORS` distinct non-empty strings, none longer
    than :data:`MAX_SEPARATOR_CHARS`); returns them normalised (separators as a tuple)."""
    if not isinstance(chunk_unit, str):
        raise InvalidTypeError(f"chunk_unit must be a str, got {type(chunk_unit).__name__}")
    if chunk_unit not in CHUNK_UNITS:
        raise InvalidArgumentError(f"unknown chunk_unit {chunk_unit!r}; expected one of {CHUNK_UNITS}")
    if separators is None:
        return chunk_unit, ()
    if isinstance(separators, str) or not isinstance(separators, (list, tuple)):
        raise InvalidTypeError(f"separators must be a list of str, got {type(separators).__name__}")
    if len(separators) > MAX_SEPARATORS:
        raise InvalidArgumentError(f"at most {MAX_SEPARATORS} separators, got {len(separators)}")
    for sep in separators:
        if not isinstance(sep, str):
            raise InvalidTypeError(f"each separator must be a str, got {type(sep).__name__}")
        if not sep or len(sep) > MAX_SEPARATOR_CHARS:
            raise InvalidArgumentError(
                f"a separator must hold 1 to {MAX_SEPARATOR_CHARS} characters, got {len(sep)}: {sep[:40]!r}"
            )
    if len(set(separators)) != len(separators):
        raise InvalidArgumentError(f"separators must be distinct, got {list(separators)!r}")
    return chunk_unit, tuple(separators)


def approx_token_spans(text: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of the approximate tokens of ``text`` (see the module doc):
    ``len(approx_token_spans(t))`` is the token count ``chunk_unit="tokens"`` uses."""
    return [m.span() for m in _TOKEN.finditer(text)]


class Measure:
    """Sizes of spans of one text: characters, or tokens (those that start in the span;
    prefix positions make every count O(log n)). With ``count_tokens`` (a tokenizer's
    ``texts -> token counts``), each approximate token weighs what the tokenizer counts for it
    (a word of three word pieces weighs 3), each distinct one tokenized once."""

    def __init__(
        self, text: str, unit: str, count_tokens: Callable[[Sequence[str]], Sequence[int]] | None = None
    ) -> None:
        self.tokens = unit == "tokens"
        spans = approx_token_spans(text) if self.tokens else []
        self.starts = [a for a, _ in spans]
        self.cum: list[int] | None = None
        if count_tokens is not None and spans:
            words = sorted({text[a:b] for a, b in spans})
            counts = list(count_tokens(words))
            if len(counts) != len(words):
                raise InvalidArgumentError(f"count_tokens returned {len(counts)} counts for {len(words)} texts")
            weight = dict(zip(words, (int(c) for c in counts), strict=True))
            cum = [0]
            for a, b in spans:
                cum.append(cum[-1] + weight[text[a:b]])
            self.cum = cum

    def __call__(self, s: int, e: int) -> int:
        if not self.tokens:
            return e - s
        i, j = bisect_left(self.starts, s), bisect_left(self.starts, e)
        return j - i if self.cum is None else self.cum[j] - self.cum[i]

    def pieces(self, text: str, s: int, e: int, size: int) -> list[tuple[int, int]]:
        """``text[s:e]`` (one word) cut into pieces of ``size`` characters or tokens."""
        if not self.tokens:
            return [(a, min(a + size, e)) for a in range(s, e, size)]
        first = bisect_left(self.starts, s)
        last = bisect_left(self.starts, e)
        if self.cum is None:
            cuts = [s] + self.starts[first + size : last : size] + [e]
        else:  # a new piece where the next token would take it past size (at least one token each)
            cuts, base = [s], self.cum[first]
            for k in range(first + 1, last):
                if self.cum[k + 1] - base > size:
                    cuts.append(self.starts[k])
                    base = self.cum[k]
            cuts.append(e)
        out = []
        for a, b in zip(cuts, cuts[1:]):
            a, b = _trimmed(text, a, b)
            if b > a:
                out.append((a, b))
        return out


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


def _units(
    text: str,
    s: int,
    e: int,
    level: int,
    size: int,
    out: list[tuple[int, int]],
    levels: tuple[re.Pattern[str], ...] = _LEVELS,
    measure: Measure | None = None,
) -> None:
    if (e - s if measure is None else measure(s, e)) <= size:
        out.append((s, e))
        return
    if level == len(levels):  # one token longer than a chunk: cut it into equal pieces
        if measure is None:
            out.extend((a, min(a + size, e)) for a in range(s, e, size))
        else:
            out.extend(measure.pieces(text, s, e, size))
        return
    for a, b in _split(text, s, e, levels[level]):
        _units(text, a, b, level + 1, size, out, levels, measure)


def chunk_text(
    text: str,
    *,
    chunk_size: int = 500,
    chunk_overlap: int = 50,
    document_id: str = "",
    chunk_unit: str = "chars",
    separators: Sequence[str] | None = None,
    count_tokens: Callable[[Sequence[str]], Sequence[int]] | None = None,
) -> list[Chunk]:
    """Splits ``text`` into chunks of at most ``chunk_size`` characters, or tokens with
    ``chunk_unit="tokens"``, cut first at ``separators`` when given (see the module doc).
    ``count_tokens`` (tokens only): a tokenizer's token count of each of a list of texts,
    e.g. an embedder's ``count_tokens``; each approximate token then weighs its count.

    Returns an empty list when the text is empty or only whitespace. Complexity O(len(text))
    (times log for tokens).
    """
    if not isinstance(text, str):
        raise InvalidTypeError(f"text must be a str, got {type(text).__name__}")
    size, overlap = check_chunk_params(chunk_size, chunk_overlap)
    unit, seps = check_chunking(chunk_unit, separators)
    levels = tuple(re.compile(re.escape(sep)) for sep in seps) + _LEVELS
    m = Measure(text, unit, count_tokens) if unit != "chars" else None
    units: list[tuple[int, int]] = []
    s, e = _trimmed(text, 0, len(text))
    if e > s:
        _units(text, s, e, 0, size, units, levels, m)
    if m is None:
        return _pack(text, units, size, overlap, document_id, lambda a, b: b - a)
    return _pack(text, units, size, overlap, document_id, m)


def _pack(
    text: str,
    units: list[tuple[int, int]],
    size: int,
    overlap: int,
    document_id: str,
    measure: Callable[[int, int], int],
) -> list[Chunk]:
    """Packs units greedily into chunks of at most ``size`` (as ``measure`` counts a span),
    with up to ``overlap`` of whole units shared by neighbours."""
    chunks: list[Chunk] = []
    n = len(units)
    i = 0
    while i < n:
        start = units[i][0]
        j = i
        while j + 1 < n and measure(start, units[j + 1][1]) <= size:
            j += 1
        end = units[j][1]
        chunks.append(Chunk(text[start:end], len(chunks), start, end, document_id))
        if j + 1 >= n:
            break
        nxt = j + 1
        if overlap:
            k = j
            while k > i and measure(units[k][0], end) <= overlap:
                k -= 1
            nxt = k + 1
            # the next chunk must reach past this one, so it may not start too early
            while nxt <= j and measure(units[nxt][0], units[j + 1][1]) > size:
                nxt += 1
        i = nxt
    return chunks
