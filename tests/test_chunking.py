"""Chunking: sizes, spans, boundaries and overlap (kbcore.chunking)."""

from __future__ import annotations

import random

import pytest

from kbcore.chunking import chunk_text
from kbcore.errors import InvalidArgumentError, InvalidTypeError


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 9))) for _ in range(n))


def _document(seed: int) -> str:
    rng = random.Random(seed)
    paras = []
    for _ in range(rng.randint(1, 8)):
        sentences = [_words(rng, rng.randint(1, 40)).capitalize() + rng.choice(".!?") for _ in range(rng.randint(1, 6))]
        paras.append(" ".join(sentences))
    return "\n\n".join(paras)


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("size,overlap", [(80, 0), (120, 30), (500, 50), (40, 39)])
def test_chunks_are_spans_of_the_text_within_size(seed, size, overlap):
    text = _document(seed)
    chunks = chunk_text(text, chunk_size=size, chunk_overlap=overlap, document_id="d")
    assert chunks, "a non-empty text gives at least one chunk"
    for i, c in enumerate(chunks):
        assert c.index == i and c.document_id == "d"
        assert c.text == text[c.start : c.end]
        assert 0 < len(c.text) <= size
        assert c.text == c.text.strip()
    # every non-whitespace character is covered, spans advance, overlaps stay within the limit
    covered = set()
    for a, b in zip(chunks, chunks[1:]):
        assert b.start > a.start and b.end > a.end
        assert a.end - b.start <= overlap or b.start >= a.end
    for c in chunks:
        covered.update(range(c.start, c.end))
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace())


def test_paragraphs_are_preferred_over_sentences_and_words():
    p1 = "First paragraph. It has two sentences."
    p2 = "Second paragraph is here."
    text = f"{p1}\n\n{p2}"
    chunks = chunk_text(text, chunk_size=len(p1) + 3, chunk_overlap=0)
    assert [c.text for c in chunks] == [p1, p2]


def test_a_long_paragraph_splits_on_sentence_boundaries():
    s = ["Alpha beta gamma.", "Delta epsilon zeta!", "Eta theta iota?"]
    chunks = chunk_text(" ".join(s), chunk_size=20, chunk_overlap=0)
    assert [c.text for c in chunks] == s


def test_a_long_sentence_splits_on_words_and_a_long_word_is_cut():
    chunks = chunk_text("aaaa bbbb cccc dddd", chunk_size=9, chunk_overlap=0)
    assert [c.text for c in chunks] == ["aaaa bbbb", "cccc dddd"]
    chunks = chunk_text("x" * 25, chunk_size=10, chunk_overlap=0)
    assert [c.text for c in chunks] == ["x" * 10, "x" * 10, "x" * 5]


def test_overlap_repeats_whole_trailing_words():
    text = " ".join(f"w{i:02d}" for i in range(20))  # 20 words of 3 chars
    chunks = chunk_text(text, chunk_size=23, chunk_overlap=8)
    for a, b in zip(chunks, chunks[1:]):
        assert 0 < a.end - b.start <= 8
        assert text[b.start - 1] == " "  # starts on a word boundary


def test_empty_and_whitespace_text_give_no_chunks():
    assert chunk_text("") == []
    assert chunk_text(" \n\n\t ") == []


@pytest.mark.parametrize("size,overlap", [(0, 0), (10, 10), (10, -1), (5, 7)])
def test_bad_sizes_raise(size, overlap):
    with pytest.raises(InvalidArgumentError):
        chunk_text("abc", chunk_size=size, chunk_overlap=overlap)


def test_bad_types_raise():
    with pytest.raises(InvalidTypeError):
        chunk_text(b"abc")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        chunk_text("abc", chunk_size=10.0)  # type: ignore[arg-type]
