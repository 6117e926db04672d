"""The embedder registry: one place maps a manifest spec's kind to the class that rebuilds it."""

from __future__ import annotations

import numpy as np
import pytest

import kbcore.embedders as emb
from kbcore.errors import InvalidArgumentError, InvalidTypeError


class _Const:
    """A toy embedder kind: every text maps to the same unit vector."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def spec(self) -> dict:
        return {"kind": "test-const", "dim": self.dim}

    @classmethod
    def from_spec(cls, spec: dict) -> _Const:
        return cls(int(spec["dim"]))

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), np.float32)
        out[:, 0] = 1.0
        return out


@pytest.fixture
def registered():
    emb.register_embedder("test-const", _Const.from_spec)
    yield
    emb._REGISTRY.pop("test-const", None)


def test_a_registered_kind_is_recorded_and_rebuilt(registered):
    spec = emb.embedder_to_spec(_Const(6))
    assert spec == {"kind": "test-const", "dim": 6}
    again = emb.embedder_from_spec(spec)
    assert isinstance(again, _Const) and again.dim == 6


def test_an_unregistered_kind_is_not_rebuilt():
    assert emb.embedder_to_spec(_Const(6)) is None
    with pytest.raises(InvalidArgumentError, match="unknown embedder kind 'test-const'"):
        emb.embedder_from_spec({"kind": "test-const", "dim": 6})


@pytest.mark.parametrize("kind", ["", "custom", "none", 3])
def test_reserved_or_empty_kinds_cannot_be_registered(kind):
    with pytest.raises(InvalidArgumentError):
        emb.register_embedder(kind, _Const.from_spec)  # type: ignore[arg-type]


def test_a_builder_must_be_callable():
    with pytest.raises(InvalidTypeError):
        emb.register_embedder("test-other", None)  # type: ignore[arg-type]


def test_every_builtin_kind_has_one_builder_in_its_own_module():
    for kind, cls in {
        "hashing": emb.HashingEmbedder,
        "openai": emb.OpenAIEmbedder,
        "minilm": emb.MiniLMEmbedder,
        "e5": emb.E5Embedder,
        "sentence-transformers": emb.SentenceTransformerEmbedder,
    }.items():
        assert emb._REGISTRY[kind] == cls.from_spec
        assert cls.__module__ != "kbcore.embedders"
    assert tuple(emb._REGISTRY)[: len(emb.SPEC_KINDS)] == emb.SPEC_KINDS


def test_a_name_builds_through_the_registry():
    hashing = emb.as_embedder("hashing")
    assert isinstance(hashing, emb.HashingEmbedder) and hashing.spec() == emb.HashingEmbedder().spec()
