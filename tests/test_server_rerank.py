"""The Dify server with a knowledge base's default reranker, over real HTTP: reranked when the
rerank service works; when it fails, still 200 with the first stage's order, every record's
metadata saying ``reranked: false`` with the reason, and one log line per burst."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx (pip install 'kbcore[test]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'kbcore[server]')")

from rerank_server import fake_rerank_server, relevance  # noqa: E402
from test_server import running  # noqa: E402

from kbcore import Engine  # noqa: E402
from kbcore.dify.server import create_app  # noqa: E402
from kbcore.rerankers import HttpReranker  # noqa: E402

KEY = "dify-test-key"
QUERY = "alpha delta"
TEXTS = [f"note {i}: " + " ".join(["alpha", "bravo", "delta", "echo"][: 1 + i % 4]) for i in range(10)]


def _post(url: str, top_k: int = 4) -> dict:
    r = httpx.post(
        f"{url}/retrieval",
        json={"knowledge_id": "kb", "query": QUERY, "retrieval_setting": {"top_k": top_k, "score_threshold": 0.0}},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_dify_answers_reranked_then_falls_back_to_the_first_stage_when_the_reranker_fails(tmp_path):
    with fake_rerank_server("cohere") as srv:
        engine = Engine(tmp_path / "data")
        rr = HttpReranker("rr", base_url=srv.url, api_key_env=None, max_retries=0)
        kb = engine.create_knowledge_base("kb", index="flat", reranker=rr)
        for i, t in enumerate(TEXTS):
            kb.ingest(text=t, document_id=f"d{i}")
        first = kb.retrieve(QUERY, top_k=4, rerank=False)
        try:
            with running(create_app(engine, [KEY])) as (url, log):
                ok = _post(url)["records"]
                assert len(srv.requests) == 1
                want = sorted((relevance(QUERY, t) for t in TEXTS), reverse=True)[:4]
                assert [r["score"] for r in ok] == want
                assert all("reranked" not in r["metadata"] for r in ok)

                srv.plan = [(503, {"message": "overloaded"})] * 3
                answers = [_post(url)["records"] for _ in range(3)]
                for records in answers:
                    assert [r["content"] for r in records] == [h.content for h in first]
                    assert [r["score"] for r in records] == [h.score for h in first]
                    for r in records:
                        assert r["metadata"]["reranked"] is False
                        assert "HTTP 503" in r["metadata"]["rerank_error"]
                        assert srv.url in r["metadata"]["rerank_error"]
                failures = [e for e in log.records if e.get("event") == "rerank_failed"]
                assert len(failures) == 1 and failures[0]["knowledge_id"] == "kb"  # once per burst

                srv.plan = [(200, b"not json")]
                garbage = _post(url)["records"]
                assert "not JSON" in garbage[0]["metadata"]["rerank_error"]
                assert [r["content"] for r in _post(url)["records"]] == [r["content"] for r in ok]  # healthy again
        finally:
            engine.close()


def test_a_default_that_cannot_be_built_here_answers_the_first_stage(tmp_path):
    data = tmp_path / "data"
    with Engine(data) as engine:
        kb = engine.create_knowledge_base("kb", index="flat", reranker=lambda q, texts: [0.0] * len(texts))
        for i, t in enumerate(TEXTS):
            kb.ingest(text=t, document_id=f"d{i}")
        first = kb.retrieve(QUERY, top_k=4, rerank=False)
    engine = Engine(data)  # reopened: the function is recorded by name only
    try:
        with running(create_app(engine, [KEY])) as (url, log):
            records = _post(url)["records"]
            assert [r["content"] for r in records] == [h.content for h in first]
            assert all(r["metadata"]["reranked"] is False for r in records)
            assert "cannot be built here" in records[0]["metadata"]["rerank_error"]
    finally:
        engine.close()
