"""Embedders: the built-in hashing embedder, callables and the sentence-transformers wrapper."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest

from kbcore.embedders import (
    CallableEmbedder,
    HashingEmbedder,
    SentenceTransformerEmbedder,
    as_embedder,
    embedder_from_spec,
)
from kbcore.errors import InvalidArgumentError, InvalidTypeError


def test_hashing_vectors_are_unit_float32_and_deterministic():
    e = HashingEmbedder(dim=64)
    texts = ["Rotate the signing keys.", "", "the a of", "日本語のテキスト", "x" * 3000]
    v = e.embed(texts)
    assert v.dtype == np.float32 and v.shape == (5, 64)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(v, HashingEmbedder(dim=64).embed(texts))
    # batching does not change the result
    np.testing.assert_array_equal(v, np.vstack([e.embed([t]) for t in texts]))


def test_hashing_is_stable_across_processes():
    code = (
        "import numpy as np; from kbcore.embedders import HashingEmbedder; "
        "print(repr(HashingEmbedder(dim=16).embed(['key rotation policy']).tolist()))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": str(s)}
        ).stdout
        for s in (1, 2)
    }
    assert len(outs) == 1


def test_hashing_similarity_follows_shared_words():
    e = HashingEmbedder()
    q, near, far = e.embed(
        [
            "how to rotate signing keys",
            "Signing keys are rotated every 90 days.",
            "Lunch is served in the cafeteria at noon.",
        ]
    )
    assert q @ near > 0.3 > q @ far


def test_hashing_rejects_bad_arguments():
    with pytest.raises(InvalidArgumentError):
        HashingEmbedder(dim=0)
    with pytest.raises(InvalidArgumentError):
        HashingEmbedder(char_ngrams=(5, 3))
    with pytest.raises(InvalidTypeError):
        HashingEmbedder().embed("one string")
    with pytest.raises(InvalidTypeError):
        HashingEmbedder().embed([1, 2])


def test_spec_round_trip_rebuilds_the_same_embedder():
    e = HashingEmbedder(dim=32, char_ngrams=(2, 4), seed=7)
    again = embedder_from_spec(e.spec())
    np.testing.assert_array_equal(e.embed(["abc def"]), again.embed(["abc def"]))


def test_callable_embedder_probes_dim_and_validates_output():
    calls = []

    def fn(texts):
        calls.append(len(texts))
        return np.ones((len(texts), 8))

    e = as_embedder(fn)
    assert isinstance(e, CallableEmbedder) and e.dim == 8
    out = e.embed(["a", "b"])
    assert out.dtype == np.float32 and out.shape == (2, 8)
    bad = CallableEmbedder(lambda t: np.ones((len(t) + 1, 8)), dim=8)
    with pytest.raises(InvalidArgumentError, match="shape"):
        bad.embed(["a"])
    nan = CallableEmbedder(lambda t: np.full((len(t), 8), np.nan), dim=8)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        nan.embed(["a"])
    with pytest.raises(InvalidTypeError):
        as_embedder(42)


def test_sentence_transformer_wrapper_with_a_stub_model(monkeypatch):
    class Stub:
        def __init__(self, name, device=None):
            self.name = name

        def get_sentence_embedding_dimension(self):
            return 4

        def encode(self, texts, batch_size, convert_to_numpy, normalize_embeddings, show_progress_bar):
            assert normalize_embeddings
            return np.tile(np.array([1.0, 0, 0, 0], np.float32), (len(texts), 1))

    monkeypatch.setitem(sys.modules, "sentence_transformers", types.SimpleNamespace(SentenceTransformer=Stub))
    e = SentenceTransformerEmbedder("some/model")
    assert e.dim == 4 and e.spec()["model"] == "some/model"
    assert e.embed(["x", "y"]).shape == (2, 4)


def test_sentence_transformer_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(ImportError, match=r"kbcore\[st\]"):
        SentenceTransformerEmbedder("some/model")
