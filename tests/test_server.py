"""The Dify External Knowledge API server (kbcore.dify.server), tested over real HTTP on 127.0.0.1.

A uvicorn server runs in a thread on a free loopback port for the module; httpx talks to it.
Covered: each error code (1001, 1002, 2001 and ours), Dify's registration probe, the response
contract (sorted records, scores in [0, 1], threshold, metadata objects, titles), every Dify
operator of metadata_condition against hand-computed expectations, the limits, the JSON error
log, and a bounded concurrent load in which every reply must belong to its request. The
``kbcore serve`` command is started once as a subprocess. Only the built-in offline embedder
is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import pytest

httpx = pytest.importorskip("httpx", reason="the server tests need httpx (pip install 'kbcore[test]')")
pytest.importorskip("starlette", reason="the server needs Starlette (pip install 'kbcore[server]')")
uvicorn = pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'kbcore[server]')")

from kbcore import Engine
from kbcore.dify.server import create_app, parse_api_keys, uvicorn_config

KEYS = ["key-one-0123456789", "key-two-abcdefghij"]
MAX_TOP_K = 50
MAX_BODY = 4096


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp())


#: The "ops" corpus: one chunk per document; the metadata every operator test is computed on.
DOCS = {
    "a": {
        "text": "# Key rotation\n\nRotate the signing keys every ninety days.",
        "filename": "rotation.md",
        "metadata": {
            "team": "infra",
            "title": "Key rotation",
            "year": 2021,
            "tags": ["security", "ops"],
            "created": "2021-03-01T00:00:00Z",
            "ts": _epoch("2021-03-01T00:00:00Z"),
            "note": "",
            "published": "2024-01-15",
        },
    },
    "b": {
        "text": "The west region runs its own ingress controllers.",
        "filename": "west.md",
        "metadata": {
            "team": "infra-west",
            "year": 2022,
            "tags": ["ops"],
            "created": "2022-06-15",
            "ts": _epoch("2022-06-15T00:00:00Z"),
            "note": "urgent",
            "version": "2.0",
        },
    },
    "c": {
        "text": "Search relevance is measured with nDCG at ten.",
        "filename": "search.txt",
        "metadata": {
            "team": "search",
            "year": 2023,
            "created": "2023-01-10T12:00:00+02:00",
            "ts": _epoch("2023-01-10T10:00:00Z"),
            "level": 3,
        },
    },
    "d": {
        "text": "<html><body><p>Quality reviews of ranking models.</p></body></html>",
        "filename": "quality.html",
        "metadata": {
            "team": "Search Quality",
            "year": 2024,
            "tags": ["search", "ml"],
            "created": "2024-02-29",
            "ts": _epoch("2024-02-29T00:00:00Z"),
            "note": "n/a",
        },
    },
    "e": {
        "text": "Miscellaneous notes without a file name.",
        "filename": None,
        "metadata": {"year": 2020, "tags": ["misc"], "note": ""},
    },
}
ALL = set(DOCS)

#: Words that appear in exactly one document of the "load" knowledge base each.
LOAD_WORDS = [
    "aurora",
    "basalt",
    "cobalt",
    "dolphin",
    "ember",
    "fjord",
    "granite",
    "harbor",
    "iris",
    "juniper",
    "kelp",
    "lantern",
    "meadow",
    "nectar",
    "obsidian",
    "pepper",
    "quartz",
    "raven",
    "saffron",
    "tundra",
]


class _ListHandler(logging.Handler):
    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.records: list[dict] = []
        self._mutex = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._mutex:
            self.records.append(json.loads(record.getMessage()))

    def by_request(self, request_id: str) -> list[dict]:
        with self._mutex:
            return [r for r in self.records if r.get("request_id") == request_id]


@contextlib.contextmanager
def running(app, level=logging.WARNING, **limits):
    """Serves ``app`` with uvicorn (kbcore's uvicorn_config) on 127.0.0.1 in a thread; yields
    (url, log handler); stops the server on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn_config(app, log_level="error", **limits))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    handler = _ListHandler(level)
    logger = logging.getLogger("kbcore.server")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(level)
    thread.start()
    deadline = time.monotonic() + 10
    try:
        while not srv.started:
            assert time.monotonic() < deadline, "the server did not start"
            assert thread.is_alive(), "the server thread died"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}", handler
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("kb-data")
    engine = Engine(data)
    ops = engine.create_knowledge_base("ops", index="flat")
    for doc_id, d in DOCS.items():
        if d["filename"]:
            ops.ingest(
                d["text"].encode(),
                document_id=doc_id,
                filename=d["filename"],
                metadata=d["metadata"],
            )
        else:
            ops.ingest(text=d["text"], document_id=doc_id, metadata=d["metadata"])
    assert len(ops) == len(DOCS)
    load = engine.create_knowledge_base("load")
    for i, word in enumerate(LOAD_WORDS):
        load.ingest(
            text=f"Document {i} is about the {word} and nothing else.",
            document_id=f"w{i}",
            metadata={"word": word},
        )

    app = create_app(engine, KEYS, max_body_bytes=MAX_BODY, max_top_k=MAX_TOP_K)
    try:
        with running(app) as (url, handler):
            yield url, handler
    finally:
        engine.close()


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    with httpx.Client(base_url=url, timeout=10, headers={"Authorization": f"Bearer {KEYS[0]}"}) as c:
        yield c


def body(query="keys", knowledge_id="ops", top_k=10, threshold=0.0, condition=None, **extra) -> dict:
    b = {
        "knowledge_id": knowledge_id,
        "query": query,
        "retrieval_setting": {"top_k": top_k, "score_threshold": threshold},
    }
    if condition is not None:
        b["metadata_condition"] = condition
    b.update(extra)
    return b


def error_of(resp, status: int, code: int) -> str:
    assert resp.status_code == status, resp.text
    data = resp.json()
    assert set(data) == {"error_code", "error_msg"}
    assert data["error_code"] == code
    assert isinstance(data["error_msg"], str) and data["error_msg"]
    return data["error_msg"]


def docs_of(resp) -> set[str]:
    assert resp.status_code == 200, resp.text
    return {r["metadata"]["document_id"] for r in resp.json()["records"]}


# -- authorisation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        f"Bearer:{KEYS[0]}",
        "Basic a2V5OnZhbHVl",
        f"Token {KEYS[0]}",
        f"Bearer {KEYS[0]} extra",
    ],
)
def test_missing_or_malformed_authorization_is_403_1001(server, header):
    url, _ = server
    headers = {} if header is None else {"Authorization": header}
    resp = httpx.post(f"{url}/retrieval", json=body(), headers=headers)
    msg = error_of(resp, 403, 1001)
    assert "Bearer" in msg


@pytest.mark.parametrize("key", ["wrong", KEYS[0] + "x", KEYS[0][:-1], KEYS[1].upper()])
def test_wrong_key_is_403_1002(server, key):
    url, _ = server
    resp = httpx.post(f"{url}/retrieval", json=body(), headers={"Authorization": f"Bearer {key}"})
    error_of(resp, 403, 1002)


@pytest.mark.parametrize("key", KEYS)
def test_every_configured_key_is_accepted_and_scheme_is_case_insensitive(server, key):
    url, _ = server
    for scheme in ("Bearer", "bearer"):
        resp = httpx.post(f"{url}/retrieval", json=body(), headers={"Authorization": f"{scheme} {key}"})
        assert resp.status_code == 200, resp.text


def test_authorization_is_checked_before_the_body(server):
    url, _ = server
    resp = httpx.post(f"{url}/retrieval", content=b"not json", headers={"Authorization": "Bearer nope"})
    error_of(resp, 403, 1002)


def test_keys_come_from_arguments_and_the_environment_without_duplicates():
    env = {"KBCORE_API_KEYS": "k2, k3\nk1"}
    assert parse_api_keys(["k1"], env=env) == ["k1", "k2", "k3"]
    assert parse_api_keys([], env={}) == []
    with pytest.raises(ValueError):
        parse_api_keys(["a b"], env={})
    with pytest.raises(ValueError, match="no API key"):
        create_app(Engine.__new__(Engine), [])


# -- Dify's registration probe and request errors --------------------------------------------


def test_registration_probe_with_valid_key_and_no_body_is_400_not_403_or_404(server, client):
    resp = client.post("/retrieval")
    msg = error_of(resp, 400, 3000)
    assert "key is valid" in msg
    resp = client.post("/retrieval", content=b"", headers={"Content-Type": "application/json"})
    error_of(resp, 400, 3000)


def test_registration_probe_with_a_wrong_key_is_403(server):
    url, _ = server
    error_of(httpx.post(f"{url}/retrieval", headers={"Authorization": "Bearer nope"}), 403, 1002)


def test_unknown_knowledge_id_is_404_2001(client):
    for kid in ("missing", "../ops", "ops/..", "a b"):
        msg = error_of(client.post("/retrieval", json=body(knowledge_id=kid)), 404, 2001)
        assert kid in msg


@pytest.mark.parametrize(
    "payload, fragment",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"query": "x"}).encode(), "knowledge_id"),
        (json.dumps({"knowledge_id": 3, "query": "x"}).encode(), "knowledge_id"),
        (json.dumps({"knowledge_id": "ops"}).encode(), "query"),
        (json.dumps(body(retrieval_setting=[])).encode(), "retrieval_setting"),
        (json.dumps(body(top_k="5")).encode(), "top_k"),
        (json.dumps(body(top_k=0)).encode(), "top_k"),
        (json.dumps(body(top_k=True)).encode(), "top_k"),
        (json.dumps(body(threshold=1.5)).encode(), "score_threshold"),
        (json.dumps(body(threshold="high")).encode(), "score_threshold"),
    ],
)
def test_malformed_requests_are_400_3001_with_a_message(client, payload, fragment):
    msg = error_of(client.post("/retrieval", content=payload), 400, 3001)
    assert fragment in msg


def test_body_over_the_limit_is_413(client):
    big = body(query="x" * (MAX_BODY + 10))
    error_of(client.post("/retrieval", json=big), 413, 3003)

    def chunks():  # no Content-Length: the limit is enforced while streaming
        for _ in range(MAX_BODY // 512 + 2):
            yield b" " * 512

    error_of(client.post("/retrieval", content=chunks()), 413, 3003)


def test_wrong_path_and_method_answer_json_errors(client):
    resp = client.get("/retrieval")
    assert resp.status_code == 405 and resp.json()["error_code"] == 405
    resp = client.post("/nothing-here", json=body())
    assert resp.status_code == 404 and resp.json()["error_code"] == 404
    assert client.get("/health").json() == {"status": "ok"}


def test_every_error_is_logged_as_one_json_line_with_the_request_id(server, client):
    _, logs = server
    cases = [
        (httpx.post(f"{server[0]}/retrieval", json=body()), 1001),
        (
            httpx.post(f"{server[0]}/retrieval", json=body(), headers={"Authorization": "Bearer bad"}),
            1002,
        ),
        (client.post("/retrieval"), 3000),
        (client.post("/retrieval", json=body(knowledge_id="nope")), 2001),
        (
            client.post(
                "/retrieval",
                json=body(condition={"conditions": [{"name": "year", "comparison_operator": "like", "value": 1}]}),
            ),
            3002,
        ),
    ]
    for resp, code in cases:
        rid = resp.headers["x-request-id"]
        records = logs.by_request(rid)
        assert len(records) == 1, (code, records)
        rec = records[0]
        assert rec["event"] == "retrieval_error"
        assert rec["error_code"] == code and rec["status"] == resp.status_code
        assert rec["error_msg"] == resp.json()["error_msg"]
        assert rec["client"] == "127.0.0.1"
        for key in KEYS:
            assert key not in json.dumps(rec)
    nope = logs.by_request(cases[3][0].headers["x-request-id"])[0]
    assert nope["knowledge_id"] == "nope"


# -- the response contract -------------------------------------------------------------------


def test_records_are_sorted_scored_titled_and_carry_metadata_objects(client):
    resp = client.post("/retrieval", json=body(query="rotate the signing keys"))
    records = resp.json()["records"]
    assert resp.headers["content-type"].startswith("application/json")
    assert {r["metadata"]["document_id"] for r in records} == ALL
    assert records[0]["metadata"]["document_id"] == "a"
    scores = [r["score"] for r in records]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)
    titles = {r["metadata"]["document_id"]: r["title"] for r in records}
    assert titles == {
        "a": "Key rotation",
        "b": "west.md",
        "c": "search.txt",
        "d": "quality.html",
        "e": "e",
    }
    for r in records:
        assert set(r) == {"content", "score", "title", "metadata"}
        assert isinstance(r["metadata"], dict)
        meta = r["metadata"]
        assert meta["file_id"] == meta["document_id"] and meta["chunk_index"] == 0
        assert r["content"]
    by_id = {r["metadata"]["document_id"]: r for r in records}
    assert by_id["a"]["metadata"]["tags"] == ["security", "ops"]
    assert by_id["a"]["metadata"]["year"] == 2021
    assert "Rotate the signing keys" in by_id["a"]["content"]


def test_top_k_limits_and_score_threshold_is_applied_on_the_server(client):
    everything = client.post("/retrieval", json=body(query="rotate the signing keys")).json()["records"]
    assert len(client.post("/retrieval", json=body(top_k=2)).json()["records"]) == 2
    cut = (everything[0]["score"] + everything[1]["score"]) / 2
    kept = client.post("/retrieval", json=body(query="rotate the signing keys", threshold=cut)).json()["records"]
    assert [r["metadata"]["document_id"] for r in kept] == ["a"]
    assert all(r["score"] >= cut for r in kept)
    assert client.post("/retrieval", json=body(threshold=1.0)).json() == {"records": []}
    null_setting = body()
    null_setting["retrieval_setting"] = {"top_k": 3, "score_threshold": None}
    assert len(client.post("/retrieval", json=null_setting).json()["records"]) == 3


@pytest.mark.parametrize(
    "condition",
    [
        "absent",
        None,
        {},
        {"logical_operator": "and"},
        {"logical_operator": "and", "conditions": None},
        {"logical_operator": "or", "conditions": []},
    ],
)
def test_absent_or_empty_metadata_condition_means_no_filter(client, condition):
    b = body()
    if condition != "absent":
        b["metadata_condition"] = condition
    assert docs_of(client.post("/retrieval", json=b)) == ALL


# -- every Dify operator ---------------------------------------------------------------------


def cond(name, op, value=None, **extra):
    c = {"name": name, "comparison_operator": op}
    if value is not None:
        c["value"] = value
    c.update(extra)
    return c


OPERATOR_CASES = [
    # text
    ("contains substring", [cond("team", "contains", "infra")], "and", {"a", "b"}),
    ("contains list member", [cond("tags", "contains", "ops")], "and", {"a", "b"}),
    ("not contains", [cond("team", "not contains", "infra")], "and", {"c", "d"}),
    ("start with", [cond("team", "start with", "Search")], "and", {"d"}),
    ("end with", [cond("team", "end with", "west")], "and", {"b"}),
    # equality
    ("is", [cond("team", "is", "search")], "and", {"c"}),
    ("is not", [cond("team", "is not", "search")], "and", {"a", "b", "d"}),  # e lacks team
    ("in list", [cond("team", "in", ["infra", "search"])], "and", {"a", "c"}),
    ("in comma string", [cond("team", "in", "infra, search")], "and", {"a", "c"}),
    ("not in", [cond("team", "not in", ["infra", "search"])], "and", {"b", "d"}),
    # presence
    ("empty", [cond("note", "empty")], "and", {"a", "c", "e"}),
    ("not empty", [cond("note", "not empty")], "and", {"b", "d"}),
    ("null", [cond("note", "null")], "and", {"c"}),
    ("not null", [cond("note", "not null")], "and", {"a", "b", "d", "e"}),
    # numbers
    ("=", [cond("year", "=", 2022)], "and", {"b"}),
    ("= numeric string", [cond("year", "=", "2022")], "and", {"b"}),
    ("≠", [cond("year", "≠", 2022)], "and", {"a", "c", "d", "e"}),
    (">", [cond("year", ">", 2022)], "and", {"c", "d"}),
    ("<", [cond("year", "<", 2022)], "and", {"a", "e"}),
    ("≥", [cond("year", "≥", 2022)], "and", {"b", "c", "d"}),
    ("≤", [cond("year", "≤", 2022)], "and", {"a", "b", "e"}),
    (">= alias", [cond("year", ">=", "2023")], "and", {"c", "d"}),
    # dates: ISO strings stored, ISO or Unix seconds given; Unix seconds stored
    ("before ISO", [cond("created", "before", "2022-01-01")], "and", {"a"}),
    ("after ISO", [cond("created", "after", "2022-01-01T00:00:00Z")], "and", {"b", "c", "d"}),
    ("after offset", [cond("created", "after", "2023-01-10T11:00:00+01:00")], "and", {"d"}),
    ("before on seconds", [cond("ts", "before", "2022-01-01T00:00:00Z")], "and", {"a"}),
    (
        "after seconds value",
        [cond("ts", "after", _epoch("2022-06-15T00:00:00Z"))],
        "and",
        {"c", "d"},
    ),
    # combinations
    ("name list", [cond(["team", "note"], "contains", "ur")], "and", {"b"}),
    ("or", [cond("team", "is", "search"), cond("year", ">", 2023)], "or", {"c", "d"}),
    ("and", [cond("tags", "contains", "ops"), cond("year", "≥", 2022)], "and", {"b"}),
    ("case and spaces", [cond("team", "  Start   With ", "infra")], "AND", {"a", "b"}),
    # Dify 1.12: a comparison with a missing field is never true (SQL NULL), "not" ones included
    ("is not skips missing", [cond("note", "is not", "urgent")], "and", {"a", "d", "e"}),
    ("≠ skips missing", [cond("ts", "≠", _epoch("2021-03-01T00:00:00Z"))], "and", {"b", "c", "d"}),
    ("not in skips missing", [cond("note", "not in", "urgent")], "and", {"a", "d", "e"}),
    ("not contains skips missing", [cond("note", "not contains", "x")], "and", {"a", "b", "d", "e"}),
    # in / not in with Dify's comma-joined string; an empty one: nothing / everything
    ("in comma-joined", [cond("team", "in", "infra,search")], "and", {"a", "c"}),
    ("in empty string", [cond("team", "in", "")], "and", set()),
    ("not in empty string", [cond("team", "not in", "")], "and", ALL),
    ("in empty string or", [cond("team", "in", ""), cond("year", "<", 2021)], "or", {"e"}),
    ("in numbers as text", [cond("year", "in", "2020,2024")], "and", {"d", "e"}),
    # automatic (LLM) filtering sends strings: text equality, a stored number by its spelling
    ("= text 2.0", [cond("version", "=", "2.0")], "and", {"b"}),
    ("is text 3 on a number", [cond("level", "is", "3")], "and", {"c"}),
    ("is not text 3 on a number", [cond("level", "is not", "3")], "and", set()),
    ("≠ text 2.0", [cond("version", "≠", "2.0")], "and", set()),
    # Dify's UI sends dates as Unix seconds; a stored ISO date is the same instant
    ("is seconds on ISO date", [cond("published", "is", 1705276800)], "and", {"a"}),
    ("is seconds other day", [cond("published", "is", 1705276800 + 86400)], "and", set()),
    ("is not seconds on ISO date", [cond("published", "is not", 1705276800 + 1)], "and", {"a"}),
    ("is seconds on seconds", [cond("ts", "is", _epoch("2022-06-15T00:00:00Z"))], "and", {"b"}),
    # a condition whose value the user left empty is skipped, as Dify does
    ("null value skipped", [{"name": "team", "comparison_operator": "is", "value": None}], "and", ALL),
    (
        "null value skipped in and",
        [{"name": ["team"], "comparison_operator": "contains", "value": None}, cond("year", ">", 2022)],
        "and",
        {"c", "d"},
    ),
    ("empty needs no value", [{"name": "note", "comparison_operator": "empty", "value": None}], "and", {"a", "c", "e"}),
]


@pytest.mark.parametrize(
    "conditions, logical, expected",
    [c[1:] for c in OPERATOR_CASES],
    ids=[c[0] for c in OPERATOR_CASES],
)
def test_every_dify_operator_filters_exactly(client, conditions, logical, expected):
    mc = {"logical_operator": logical, "conditions": conditions}
    resp = client.post("/retrieval", json=body(condition=mc))
    assert docs_of(resp) == expected


@pytest.mark.parametrize(
    "mc, fragment",
    [
        ({"conditions": [cond("year", "like", 1)]}, "unknown operator"),
        ({"conditions": [cond("year", ">", "abc")]}, ">"),
        ({"conditions": [cond("created", "before", "yesterday")]}, "before"),
        ({"conditions": [cond("", "is", "x")]}, "name"),
        ({"logical_operator": "xor", "conditions": [cond("team", "is", "x")]}, "logical_operator"),
        ({"conditions": {"name": "team"}}, "conditions"),
        ("team = infra", "metadata_condition"),
    ],
)
def test_operators_that_cannot_apply_are_400_3002_never_dropped(client, mc, fragment):
    msg = error_of(client.post("/retrieval", json=body(condition=mc)), 400, 3002)
    assert fragment in msg


# -- concurrency -----------------------------------------------------------------------------


def test_concurrent_load_loses_and_mixes_up_nothing(server):
    url, _ = server
    n_requests, concurrency = 320, 32

    def plan(i: int) -> tuple[dict, dict, int]:
        """(headers, body, expected status) of request i: mostly good, some 403 and 404."""
        j = i % len(LOAD_WORDS)
        word = LOAD_WORDS[j]
        b = body(
            query=f"tell me about the {word}",
            knowledge_id="load",
            top_k=3,
            condition={"conditions": [cond("word", "is", word)]},
        )
        if i % 16 == 5:
            return {"Authorization": "Bearer wrong"}, b, 403
        if i % 16 == 11:
            b["knowledge_id"] = f"missing-{i}"
            return {"Authorization": f"Bearer {KEYS[i % 2]}"}, b, 404
        return {"Authorization": f"Bearer {KEYS[i % 2]}"}, b, 200

    async def run() -> list[tuple[int, httpx.Response]]:
        sem = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as ac:

            async def one(i: int):
                headers, b, _ = plan(i)
                async with sem:
                    return i, await ac.post("/retrieval", json=b, headers=headers)

            return await asyncio.gather(*(one(i) for i in range(n_requests)))

    started = time.perf_counter()
    results = asyncio.run(run())
    elapsed = time.perf_counter() - started
    assert len(results) == n_requests
    assert sorted(i for i, _ in results) == list(range(n_requests))
    request_ids = set()
    for i, resp in results:
        _, b, status = plan(i)
        assert resp.status_code == status, (i, resp.text)
        request_ids.add(resp.headers["x-request-id"])
        if status == 403:
            assert resp.json()["error_code"] == 1002
            continue
        if status == 404:
            assert b["knowledge_id"] in resp.json()["error_msg"]
            continue
        word = LOAD_WORDS[i % len(LOAD_WORDS)]
        records = resp.json()["records"]
        assert len(records) == 1, (i, records)
        assert records[0]["metadata"]["document_id"] == f"w{i % len(LOAD_WORDS)}"
        assert records[0]["metadata"]["word"] == word
        assert word in records[0]["content"]
    assert len(request_ids) == n_requests
    assert elapsed < 30


# -- the command line ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kbcore_serve_command_serves_with_keys_from_the_environment(tmp_path):
    data = tmp_path / "kb-data"
    with Engine(data) as engine:
        kb = engine.create_knowledge_base("handbook")
        kb.ingest(
            text="Rotate the API keys every ninety days.",
            document_id="keys",
            metadata={"team": "infra"},
        )
    port = _free_port()
    env = dict(os.environ, KBCORE_API_KEYS="env-key-1,env-key-2")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kbcore",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data",
            str(data),
            "--log-level",
            "warning",
            "--refresh-interval",
            "0.2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "kbcore serve did not start"
            time.sleep(0.05)
        auth = {"Authorization": "Bearer env-key-2"}
        error_of(httpx.post(f"{url}/retrieval", headers=auth), 400, 3000)
        error_of(httpx.post(f"{url}/retrieval", headers={"Authorization": "Bearer x"}), 403, 1002)
        resp = httpx.post(
            f"{url}/retrieval",
            headers=auth,
            json=body(
                query="how often are keys rotated?",
                knowledge_id="handbook",
                top_k=3,
                condition={"conditions": [cond("team", "is", "infra")]},
            ),
        )
        records = resp.json()["records"]
        assert [r["metadata"]["document_id"] for r in records] == ["keys"]
        assert records[0]["title"] == "keys"
        # a write by another process (this one) is seen after the refresh interval
        with Engine(data) as engine:
            engine.get_knowledge_base("handbook").ingest(
                text="Backups run nightly at two.",
                document_id="backups",
                metadata={"team": "infra"},
            )
        time.sleep(0.3)
        resp = httpx.post(
            f"{url}/retrieval",
            headers=auth,
            json=body(query="when do backups run?", knowledge_id="handbook", top_k=1),
        )
        assert resp.json()["records"][0]["metadata"]["document_id"] == "backups"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    codes = [r.get("error_code") for r in lines if r.get("event") == "retrieval_error"]
    assert codes == [3000, 1002], err
    assert "env-key" not in err


@pytest.mark.parametrize(("flags", "mmap"), [([], True), (["--no-mmap"], False)])
def test_kbcore_serve_passes_no_mmap_to_the_engine(tmp_path, monkeypatch, flags, mmap):
    from kbcore import cli
    from kbcore.dify import server as srv

    seen: dict = {}
    monkeypatch.setattr(srv, "serve", lambda data, keys, **kw: seen.update(kw, data=data))
    assert cli.main(["serve", "--api-key", "k1", "--data", str(tmp_path), *flags]) == 0
    assert seen["mmap"] is mmap and seen["data"] == str(tmp_path)


def test_kbcore_serve_refuses_to_start_without_a_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KBCORE_API_KEYS"}
    proc = subprocess.run(
        [sys.executable, "-m", "kbcore", "serve", "--data", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "no API key" in proc.stderr


# -- what Dify 1.12 sends --------------------------------------------------------------------


@pytest.mark.parametrize("path", ["//retrieval", "/retrieval/", "///retrieval//"])
def test_an_endpoint_registered_with_a_trailing_slash_is_served(server, path):
    # Dify posts to f"{endpoint}/retrieval": "http://host:8000/" gives "//retrieval";
    # http.client sends the path exactly as given
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    auth = {"Authorization": f"Bearer {KEYS[0]}"}

    def post(payload: bytes) -> tuple[int, dict]:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request("POST", path, body=payload, headers=auth)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    status, data = post(b"")  # Dify's registration probe: no body
    assert (status, data["error_code"]) == (400, 3000)
    status, data = post(json.dumps(body()).encode())
    assert status == 200
    assert {r["metadata"]["document_id"] for r in data["records"]} == ALL


def test_a_blank_query_finds_no_records_with_200(client):
    for query in ("   ", "\t\n", ""):
        resp = client.post("/retrieval", json=body(query=query))
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"records": []}
    error_of(client.post("/retrieval", json=body(query=" ", knowledge_id="nope")), 404, 2001)


def test_top_k_above_the_limit_is_clamped_and_logged(server, client):
    _, logs = server
    resp = client.post("/retrieval", json=body(knowledge_id="load", top_k=MAX_TOP_K + 1000))
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["records"]) == len(LOAD_WORDS)  # every chunk: 20 < MAX_TOP_K
    (rec,) = logs.by_request(resp.headers["x-request-id"])
    assert rec["event"] == "top_k_clamped"
    assert rec["requested_top_k"] == MAX_TOP_K + 1000 and rec["top_k"] == MAX_TOP_K


def test_top_k_null_means_difys_default_of_5(client):
    b = body(knowledge_id="load")
    b["retrieval_setting"] = {"top_k": None, "score_threshold": 0.0}
    assert len(client.post("/retrieval", json=b).json()["records"]) == 5


def test_the_request_dify_builds_is_served(server):
    # ExternalDatasetService.fetch_external_knowledge_retrieval: data=json.dumps(params), a
    # Content-Type header, metadata_condition from MetadataCondition.model_dump()
    url, _ = server
    params = {
        "retrieval_setting": {"top_k": 3, "score_threshold": 0.0},
        "query": "rotate keys",
        "knowledge_id": "ops",
        "metadata_condition": {
            "logical_operator": "and",
            "conditions": [
                {"name": ["team"], "comparison_operator": "start with", "value": "infra"},
                {"name": ["year"], "comparison_operator": "≥", "value": 2021},
                {"name": ["note"], "comparison_operator": "is", "value": None},
            ],
        },
    }
    resp = httpx.post(
        f"{url}/retrieval",
        content=json.dumps(params),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEYS[1]}"},
    )
    assert docs_of(resp) == {"a", "b"}


# -- hardening: nothing stalls the server, nothing is a 500 ----------------------------------

TIMEOUT = 1.0  # body and header timeouts of the hardened server


@pytest.fixture(scope="module")
def hardened(tmp_path_factory):
    """A server with the default body limit (1 MiB) and one-second body / header timeouts;
    logs at INFO."""
    engine = Engine(tmp_path_factory.mktemp("kb-hard"))
    kb = engine.create_knowledge_base("ops", index="flat")
    kb.ingest(
        text="Rotate the signing keys every ninety days.", document_id="a", metadata={"team": "infra", "year": 2021}
    )
    kb.ingest(
        text="Search relevance is measured with nDCG.", document_id="b", metadata={"team": "search", "year": 2023}
    )
    app = create_app(engine, KEYS, body_timeout=TIMEOUT)
    try:
        with running(app, logging.INFO, header_timeout=TIMEOUT, keep_alive_timeout=1) as srv:
            yield srv
    finally:
        engine.close()


def _post(url: str, payload: bytes, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{url}/retrieval", content=payload, timeout=timeout, headers={"Authorization": f"Bearer {KEYS[0]}"}
    )


def _raw(**fields) -> bytes:
    """A request body; ensure_ascii keeps lone surrogates as \\ud800 escapes, as a client
    would send them."""
    b = {"knowledge_id": "ops", "query": "keys", "retrieval_setting": {"top_k": 5}}
    b.update(fields)
    return json.dumps(b, ensure_ascii=True).encode("ascii")


def _mc(op, value, name="year") -> dict:
    return {"metadata_condition": {"conditions": [cond(name, op, value)]}}


HOSTILE = [
    ("value 10**400 >", _raw(**_mc(">", 10**400)), 400, 3002),
    ("value 10**400 is", _raw(**_mc("is", 10**400)), 400, 3002),
    ("value -10**400 before", _raw(**_mc("before", -(10**400))), 400, 3002),
    ("value '1'*400 >", _raw(**_mc(">", "1" * 400)), 400, 3002),
    ("value '1'*400 is", _raw(**_mc("is", "1" * 400)), 200, None),
    ("value 5000 digits >", _raw(**_mc(">", "1" * 5000)), 400, 3002),
    ("value 5000 digits =", _raw(**_mc("=", "1" * 5000)), 200, None),
    ("value 5000 digits in", _raw(**_mc("in", "1" * 5000)), 200, None),
    ("value 20000 digits+x before", _raw(**_mc("before", "9" * 20000 + "x")), 400, 3002),
    ("long ISO fraction", _raw(**_mc("after", "2024-01-01T00:00:00." + "1" * 30000)), 200, None),
    (
        "JSON number of 5000 digits",
        b'{"knowledge_id":"ops","query":"q","retrieval_setting":{"top_k":' + b"1" * 5000 + b"}}",
        400,
        3001,
    ),
    ("score_threshold 10**400", _raw(retrieval_setting={"top_k": 3, "score_threshold": 10**400}), 400, 3001),
    (
        "score_threshold 1e999",
        (b'{"knowledge_id":"ops","query":"q","retrieval_setting":{"score_threshold":1e999}}'),
        400,
        3001,
    ),
    ("top_k 10**400 is clamped", _raw(retrieval_setting={"top_k": 10**400}), 200, None),
    ("top_k -10**400", _raw(retrieval_setting={"top_k": -(10**400)}), 400, 3001),
    (
        "JSON nested 100000 deep",
        b'{"knowledge_id":"ops","query":"q","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        400,
        3001,
    ),
    (
        "condition nested 100000 deep",
        b'{"knowledge_id":"ops","query":"q",'
        b'"metadata_condition":' + b'{"conditions":[' * 50_000 + b"]}" * 50_000 + b"}",
        400,
        3001,
    ),
    ("surrogate in a value", _raw(**_mc("is", "\ud800", "team")), 400, 3002),
    ("surrogate in an in list", _raw(**_mc("in", ["x", "a\udc00"], "team")), 400, 3002),
    ("surrogate in a field name", _raw(**_mc("is", "x", "te\ud83dam")), 400, 3002),
    ("surrogate in knowledge_id", _raw(knowledge_id="ops\ud800"), 400, 3001),
    ("surrogate in query", _raw(query="keys \udfff"), 400, 3001),
    (
        "surrogate in an operator",
        _raw(metadata_condition={"conditions": [{"name": "team", "comparison_operator": "is\ud800", "value": "x"}]}),
        400,
        3002,
    ),
    ("invalid UTF-8", b'{"knowledge_id":"ops\xff","query":"q"}', 400, 3001),
]


@pytest.mark.parametrize("payload, status, code", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_a_4xx_json_error_with_its_code_never_a_500(hardened, payload, status, code):
    url, logs = hardened
    resp = _post(url, payload)
    assert resp.headers["content-type"].startswith("application/json"), resp.text
    if code is None:
        assert resp.status_code == status, resp.text
        assert "records" in resp.json()
    else:
        error_of(resp, status, code)
    for rec in logs.by_request(resp.headers["x-request-id"]):
        assert rec.get("status", 0) < 500 and "exception" not in rec, rec


def _health_latencies(url: str, stop: threading.Event) -> list[float]:
    out = []
    with httpx.Client(base_url=url, timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            out.append(time.perf_counter() - t0)
            time.sleep(0.02)
    return out


def _during(url: str, work) -> tuple[object, list[float]]:
    """Runs ``work()`` while a second thread times /health; (work's result, latencies)."""
    stop = threading.Event()
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_health_latencies(url, stop)))
    thread.start()
    try:
        time.sleep(0.1)
        out = work()
        time.sleep(0.1)
    finally:
        stop.set()
        thread.join(30)
    return out, result[0]


def test_health_answers_while_a_40_kb_hostile_body_is_handled(hardened):
    url, _ = hardened
    payload = _raw(**_mc(">", "9" * 40_000 + "x"))  # 40 KB: 15.9 s of /health stall before
    assert len(payload) > 40_000
    (resp, latencies) = _during(url, lambda: _post(url, payload))
    error_of(resp, 400, 3002)
    print(f"40 KB body: /health max {max(latencies) * 1000:.1f} ms over {len(latencies)} calls")
    assert latencies and max(latencies) < 1.0


def test_parsing_runs_off_the_event_loop(hardened, monkeypatch):
    # a parse that takes 1.5 s (slept, so only an event loop it runs on would be blocked)
    import kbcore.dify.server as srv

    real = srv.parse_request

    def slow(body, max_top_k):
        time.sleep(1.5)
        return real(body, max_top_k)

    monkeypatch.setattr(srv, "parse_request", slow)
    url, _ = hardened
    (resp, latencies) = _during(url, lambda: _post(url, _raw()))
    assert resp.status_code == 200
    print(f"1.5 s parse: /health max {max(latencies) * 1000:.1f} ms")
    assert max(latencies) < 0.75


def _wait_for(logs, event: str, deadline: float) -> dict | None:
    while time.monotonic() < deadline:
        with logs._mutex:
            found = [r for r in logs.records if r.get("event") == event]
        if found:
            return found[-1]
        time.sleep(0.02)
    return None


def test_a_client_that_disconnects_mid_body_is_logged_as_a_disconnect_not_a_500(hardened):
    url, logs = hardened
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(
            b"POST /retrieval HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {KEYS[0]}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"knowledge_id":'
        )
        time.sleep(0.2)
    rec = _wait_for(logs, "client_disconnect", time.monotonic() + 5)
    assert rec is not None and rec["client"] == "127.0.0.1"
    with logs._mutex:
        assert not [r for r in logs.records if r.get("status", 0) >= 500]


def _stalled_clients(host: str, port: int, n: int) -> list[tuple[socket.socket, str]]:
    socks = []
    for i in range(n):
        s = socket.create_connection((host, port), timeout=10)
        kind = ("silent", "half head", "half body")[i % 3]
        if kind == "half head":
            s.sendall(b"POST /retrieval HTTP/1.1\r\nHost: x\r\n")
        elif kind == "half body":
            s.sendall(
                b"POST /retrieval HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {KEYS[0]}\r\nContent-Length: 500\r\n\r\n".encode()
                + b'{"knowledge_id": "ops", '
            )
        socks.append((s, kind))
    return socks


def _closed_after(s: socket.socket, started: float) -> tuple[float, bytes]:
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            return time.monotonic() - started, data
        data += chunk


def test_forty_stalled_clients_are_closed_by_the_timeouts_and_health_still_answers(hardened):
    url, _ = hardened
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    socks = _stalled_clients(host, int(port), 40)
    try:
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        closed = [(kind, *_closed_after(s, started)) for s, kind in socks]
    finally:
        for s, _ in socks:
            s.close()
    worst = max(t for _, t, _ in closed)
    print(f"40 stalled clients: all closed after {worst:.2f} s (timeouts {TIMEOUT} s)")
    assert worst < TIMEOUT + 4
    for kind, _, data in closed:
        if kind == "half body":
            assert data.startswith(b"HTTP/1.1 408"), data[:80]
            assert b'"error_code":3004' in data
        else:
            assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:80]


def test_connections_beyond_the_cap_get_503_until_the_stalled_ones_time_out(tmp_path):
    with Engine(tmp_path) as engine:
        engine.create_knowledge_base("kb")
        app = create_app(engine, KEYS)
        with running(app, max_connections=8, header_timeout=TIMEOUT) as (url, _):
            host, port = url.removeprefix("http://").split(":")
            idle = [socket.create_connection((host, int(port))) for _ in range(10)]
            try:
                time.sleep(0.2)
                assert httpx.get(f"{url}/health", timeout=5).status_code == 503
                time.sleep(TIMEOUT + 1.0)  # the header timeout closes the idle ones
                assert httpx.get(f"{url}/health", timeout=5).status_code == 200
            finally:
                for s in idle:
                    s.close()


def test_a_keep_alive_connection_dribbling_its_next_head_is_closed(tmp_path):
    # the first request outlives the first header deadline; a byte of the next head cancels
    # uvicorn's keep-alive timeout, so only a re-armed header timeout can close the connection
    with Engine(tmp_path) as engine:
        engine.create_knowledge_base("kb").ingest(text="Keys rotate.", document_id="k")
        app = create_app(engine, KEYS, body_timeout=5)
        with running(app, header_timeout=TIMEOUT, keep_alive_timeout=5) as (url, _):
            host, port = url.removeprefix("http://").split(":")
            payload = json.dumps(body(knowledge_id="kb")).encode()
            with socket.create_connection((host, int(port)), timeout=15) as s:
                s.sendall(
                    b"POST /retrieval HTTP/1.1\r\nHost: x\r\n"
                    + f"Authorization: Bearer {KEYS[0]}\r\n".encode()
                    + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload[:5]
                )
                time.sleep(TIMEOUT + 0.3)  # past the first header deadline, mid-request
                s.sendall(payload[5:])
                first = s.recv(65536)
                assert first.startswith(b"HTTP/1.1 200"), first[:80]
                s.sendall(b"GET /health HTTP/1.1\r\nHo")
                started = time.monotonic()
                elapsed, rest = _closed_after(s, started)
    assert elapsed < TIMEOUT + 3, elapsed
    assert not rest.startswith(b"HTTP/1.1 200")


def test_error_replies_stay_valid_json_for_strings_that_are_not_unicode():
    from kbcore.dify.server import _dumps

    out = _dumps({"error_msg": "knowledge base 'a\udc80' does not exist", "n": float("nan")})
    assert json.loads(out) == {"error_msg": "knowledge base 'a\udc80' does not exist", "n": None}
    assert out.isascii()


def test_the_public_import_paths_work():
    import kbcore.dify
    import kbcore.filters
    from kbcore.dify import condition, server

    assert kbcore.filters.dify_condition_to_where is condition.dify_condition_to_where
    assert kbcore.dify.dify_condition_to_where is condition.dify_condition_to_where
    for name in ("create_app", "serve", "parse_api_keys"):
        assert getattr(kbcore.dify, name) is getattr(server, name)
