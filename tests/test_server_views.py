"""Views of the Dify server (``kbcore serve --views``), over real HTTP on 127.0.0.1: a knowledge
id scoping several knowledge bases with a fixed filter (ANDed with Dify's condition), search
type, top-k cap, score floor, context window and its own keys; and the start-up checks of a
views file. Expected answers come from ``Engine.retrieve`` with the same settings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx (pip install 'kbcore[test]')")
pytest.importorskip("starlette", reason="the server needs Starlette (pip install 'kbcore[server]')")
pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'kbcore[server]')")

from test_server import running  # noqa: E402 - after the skips

from kbcore import Engine  # noqa: E402
from kbcore.dify.server import create_app  # noqa: E402
from kbcore.dify.views import load_views  # noqa: E402
from kbcore.errors import InvalidArgumentError  # noqa: E402

ADMIN = "admin-key-0123456789"
TEAM_A = ["team-a-key-1", "team-a-key-2"]
TEAM_B = "team-b-key-1"
ENV = {"TEAM_A_KEYS": ",".join(TEAM_A), "TEAM_B_KEYS": TEAM_B}
TOPICS = ["keys", "backups", "deploys", "alerts", "billing", "hiring"]

VIEWS = {
    "views": {
        "team-a": {
            "knowledge_bases": ["handbook", "wiki"],
            "filter": {"team": "a"},
            "search_type": "hybrid",
            "top_k_max": 3,
            "score_floor": 0.2,
            "api_keys_env": "TEAM_A_KEYS",
            "context_window": 1,
        },
        "team-b": {"knowledge_bases": ["wiki"], "filter": {"team": "b"}, "api_keys_env": "TEAM_B_KEYS"},
        "everything": {"knowledge_bases": ["handbook", "wiki"]},
    }
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("views"))
    for name in ("handbook", "wiki"):
        kb = engine.create_knowledge_base(name, index="flat", chunk_size=80, chunk_overlap=0)
        for i, topic in enumerate(TOPICS):
            paras = [f"{name} page {i} paragraph {p}: how the {t} work here." for p, t in enumerate(TOPICS)]
            kb.ingest(
                text="\n\n".join(paras), document_id=f"{name}-{i}", metadata={"team": "ab"[i % 2], "topic": topic}
            )
    ctx = engine.create_knowledge_base("ctx", index="flat", chunk_size=80, chunk_overlap=0, context_window=1)
    pc = engine.create_knowledge_base("pc", index="flat", index_type="parent_child", parent_chunk_size=400)
    for kb in (ctx, pc):
        kb.ingest(text="\n\n".join(f"Paragraph {p}: how the {t} work here, in detail." for p, t in enumerate(TOPICS)))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def url(engine, monkeypatch_module):
    for k, v in ENV.items():
        monkeypatch_module.setenv(k, v)
    app = create_app(engine, [ADMIN], views=VIEWS)
    with running(app) as (u, _):
        yield u


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _post(url, key, knowledge_id, query="how do backups work", top_k=10, threshold=0.0, condition=None):
    body = {
        "knowledge_id": knowledge_id,
        "query": query,
        "retrieval_setting": {"top_k": top_k, "score_threshold": threshold},
    }
    if condition is not None:
        body["metadata_condition"] = condition
    return httpx.post(f"{url}/retrieval", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=10)


def test_a_view_answers_as_engine_retrieve_with_its_settings(url, engine):
    resp = _post(url, TEAM_A[1], "team-a", top_k=10, threshold=0.0)
    assert resp.status_code == 200, resp.text
    records = resp.json()["records"]
    want = engine.retrieve(
        ["handbook", "wiki"],
        "how do backups work",
        3,  # top_k_max caps Dify's 10
        filters={"team": "a"},
        search_type="hybrid",
        score_threshold=0.2,
        context_window=1,
    )
    assert [(r["metadata"]["knowledge_base"], r["metadata"]["document_id"], r["content"]) for r in records] == [
        (h.metadata["knowledge_base"], h.document_id, h.content) for h in want
    ]
    assert 0 < len(records) <= 3
    assert all(r["metadata"]["team"] == "a" and r["score"] >= 0.2 for r in records)
    assert all(len(r["metadata"]["context_chunks"]) >= 2 for r in records)


def test_dify_condition_is_anded_with_the_view_filter(url):
    cond = {
        "logical_operator": "and",
        "conditions": [{"name": ["topic"], "comparison_operator": "is", "value": "keys"}],
    }
    records = _post(url, TEAM_A[0], "team-a", condition=cond).json()["records"]
    assert records and all(r["metadata"]["topic"] == "keys" and r["metadata"]["team"] == "a" for r in records)
    cond_b = {"logical_operator": "and", "conditions": [{"name": ["team"], "comparison_operator": "is", "value": "b"}]}
    assert _post(url, TEAM_A[0], "team-a", condition=cond_b).json()["records"] == []  # cannot widen the view


def test_view_keys_open_their_view_only(url):
    def code(resp):
        return resp.status_code, resp.json().get("error_code")

    assert code(_post(url, TEAM_B, "team-a")) == (403, 1002)
    assert code(_post(url, TEAM_A[0], "team-b")) == (403, 1002)
    assert code(_post(url, TEAM_A[0], "handbook")) == (403, 1002)  # not the knowledge bases by name
    assert code(_post(url, TEAM_A[0], "everything")) == (403, 1002)  # a view without keys: server keys
    assert code(_post(url, "not-a-key", "team-a")) == (403, 1002)
    assert code(_post(url, ADMIN, "team-a")) == (403, 1002)  # a view with keys: those only
    assert code(_post(url, ADMIN, "no-such-id")) == (404, 2001)
    assert _post(url, ADMIN, "everything").status_code == 200
    assert _post(url, ADMIN, "handbook").status_code == 200
    recs = _post(url, TEAM_B, "team-b").json()["records"]
    assert recs and {r["metadata"]["team"] for r in recs} == {"b"}
    assert {r["metadata"]["knowledge_base"] for r in recs} == {"wiki"}


def test_a_view_over_two_knowledge_bases_merges_them(url):
    recs = _post(url, ADMIN, "everything", top_k=12).json()["records"]
    assert {r["metadata"]["knowledge_base"] for r in recs} == {"handbook", "wiki"}
    assert {r["metadata"]["merged_by"] for r in recs} == {"score"}
    scores = [r["score"] for r in recs]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize(
    "views, message",
    [
        ({"views": {"x": {"knowledge_bases": ["handbook", "nope"]}}}, "view 'x': knowledge base 'nope' does not exist"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "top_k": 3}}}, "view 'x': unknown field 'top_k'"),
        ({"views": {"x": {"knowledge_bases": "wiki"}}}, "view 'x': field 'knowledge_bases'"),
        ({"views": {"x": {"knowledge_bases": []}}}, "view 'x': field 'knowledge_bases'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "top_k_max": 0}}}, "view 'x': field 'top_k_max'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "top_k_max": True}}}, "view 'x': field 'top_k_max'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "score_floor": 2}}}, "view 'x': field 'score_floor'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "search_type": "fuzzy"}}}, "view 'x': field 'search_type'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "filter": {"year": {"$near": 3}}}}}, "view 'x': field 'filter'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "filter": [1]}}}, "view 'x': field 'filter'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "context_window": -1}}}, "view 'x': field 'context_window'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "api_keys_env": "UNSET_VAR_H11"}}}, "'UNSET_VAR_H11'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "reranker": "no-such-kind"}}}, "view 'x': field 'reranker'"),
        ({"views": {"x": {"knowledge_bases": ["wiki"], "reranker": 3}}}, "view 'x': field 'reranker'"),
        ({"views": {"x": ["wiki"]}}, "view 'x': must be an object"),
        ({"view": {}}, '{"views"'),
    ],
)
def test_a_bad_view_stops_the_app_at_creation(engine, views, message):
    with pytest.raises(InvalidArgumentError) as info:
        create_app(engine, [ADMIN], views=views)
    assert message in str(info.value)


def test_load_views_reads_a_file_and_names_it(tmp_path, engine):
    path = tmp_path / "views.json"
    path.write_text(json.dumps(VIEWS))
    views = load_views(path, knowledge_bases=engine, env=ENV)
    assert views["team-a"].keys == tuple(TEAM_A) and views["everything"].keys is None
    path.write_text("{not json")
    with pytest.raises(InvalidArgumentError, match="views.json"):
        load_views(path, knowledge_bases=engine, env=ENV)


def test_kbcore_serve_refuses_a_bad_views_file(tmp_path, engine):
    path = tmp_path / "views.json"
    path.write_text(json.dumps({"views": {"team-z": {"knowledge_bases": ["ghost"]}}}))
    proc = subprocess.run(
        [sys.executable, "-m", "kbcore", "serve", "--data", str(engine.path), "--api-key", ADMIN, "--views", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "view 'team-z'" in proc.stderr and "'ghost' does not exist" in proc.stderr


def test_a_knowledge_base_is_served_with_its_own_context_window_and_parents(url, engine):
    rec = _post(url, ADMIN, "ctx", query="deploys", top_k=1).json()["records"][0]
    want = engine["ctx"].retrieve("deploys", 1)[0]
    assert rec["content"] == want.content and len(want.metadata["context_chunks"]) >= 2
    rec = _post(url, ADMIN, "pc", query="deploys", top_k=1).json()["records"][0]
    child = engine["pc"].retrieve("deploys", 1)[0]
    assert rec["content"] == child.content and len(rec["content"]) > 256


def test_a_view_reranks_its_merged_list_once_and_falls_back_when_the_reranker_fails(engine):
    from rerank_server import fake_rerank_server, relevance

    from kbcore.rerankers import HttpReranker, reranker_spec

    with fake_rerank_server("cohere") as srv:
        spec = reranker_spec(HttpReranker("rr", base_url=srv.url, api_key_env=None, max_retries=0))
        views = {"views": {"both": {"knowledge_bases": ["handbook", "wiki"], "reranker": spec}}}
        query = "how do backups work"
        with running(create_app(engine, [ADMIN], views=views)) as (url, _):
            records = _post(url, ADMIN, "both", query=query, top_k=4).json()["records"]
            assert len(srv.requests) == 1  # one rerank call over the merged candidates
            assert {r["metadata"]["knowledge_base"] for r in records} <= {"handbook", "wiki"}
            assert [r["score"] for r in records] == sorted(
                (relevance(query, r["content"]) for r in records), reverse=True
            )
            srv.plan = [(503, {"message": "overloaded"})]
            fallback = _post(url, ADMIN, "both", query=query, top_k=4).json()["records"]
            first = engine.retrieve(["handbook", "wiki"], query, 4, rerank=False)
            assert [r["content"] for r in fallback] == [h.content for h in first]
            assert all(r["metadata"]["reranked"] is False and "503" in r["metadata"]["rerank_error"] for r in fallback)
