"""The HTTP transport (kbcore._http) through OpenAIEmbedder, against a hostile server on 127.0.0.1.

What a hostile or broken service must not achieve: receive the key on another origin through a
redirect, hold ``embed()`` past its deadline by dripping bytes, grow the client's memory past
``max_response_bytes``, or crash it with deeply nested JSON (issue 30, items 7 and 8).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hostile_http import HostileServer, drip, raw, respond

from kbcore._http import post_json
from kbcore.embedders import OpenAIEmbedder
from kbcore.errors import EmbedderError, EmbedderUnavailableError, KbcoreError

KEY = "sk-test-SECRET-transport-42"


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KBCORE_TEST_KEY", KEY)
    made: list[HostileServer] = []

    def make() -> HostileServer:
        made.append(HostileServer())
        return made[-1]

    yield make
    for s in made:
        s.close()


def embedder(server: HostileServer, **kw: Any) -> OpenAIEmbedder:
    kw.setdefault("api_key_env", "KBCORE_TEST_KEY")
    kw.setdefault("sleep", lambda s: None)
    return OpenAIEmbedder("m", base_url=f"{server.url}/v1", **kw)


def answer(n: int, dim: int = 3) -> bytes:
    return json.dumps({"data": [{"index": i, "embedding": [float(i + 1)] * dim} for i in range(n)]}).encode()


# -- item 7: credentials never cross origins ------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_origin_is_refused_and_the_key_never_reaches_it(servers, status):
    home, other = servers(), servers()
    other.behaviour = respond(200, answer(1))
    home.behaviour = respond(status, b"", {"Location": f"{other.url}/v1/embeddings"})
    with pytest.raises(EmbedderError, match="another origin") as info:
        embedder(home).embed(["a"])
    assert info.value.status == status and KEY not in str(info.value)
    assert not [r for r in other.requests if "authorization" in r["headers"]]
    assert not other.requests  # not followed at all


def test_a_same_origin_307_is_followed_with_method_body_and_key(servers):
    home = servers()
    home.script.append(respond(307, b"", {"Location": "/v2/embeddings"}))
    home.behaviour = respond(200, answer(2))
    out = embedder(home).embed(["a", "b"])
    assert out.shape == (2, 3)
    first, second = home.requests
    assert second["method"] == "POST" and second["path"] == "/v2/embeddings"
    assert second["headers"]["authorization"] == f"Bearer {KEY}" and second["body"] == first["body"]


def test_a_same_origin_302_that_would_turn_the_post_into_a_get_is_refused(servers):
    home = servers()
    home.behaviour = respond(302, b"", {"Location": "/elsewhere"})
    with pytest.raises(EmbedderError, match="turn the POST into a GET"):
        embedder(home).embed(["a"])
    assert len(home.requests) == 1


# -- item 8: an overall deadline, a byte cap, safe JSON --------------------------------------


@pytest.mark.parametrize(
    "prefix",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n",  # a body dripped a byte at a time
        b"HTTP/1.1 200 OK\r\nX-Slow: ",  # a header dripped a byte at a time
    ],
    ids=["body", "head"],
)
def test_a_server_dripping_bytes_cannot_hold_embed_past_its_deadline(servers, prefix):
    home = servers()
    home.behaviour = drip(prefix, every=0.05, for_seconds=30.0)
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailableError, match=r"deadline=1\.5 s") as info:
        embedder(home, timeout=1.0, deadline=1.5, max_retries=3).embed(["a"])
    took = time.monotonic() - t0
    assert took < 5.0, took  # 1.5 s plus scheduling slack; the drip alone would last 30 s
    assert info.value.endpoint == f"{home.url}/v1/embeddings"


def test_the_deadline_also_bounds_retries_and_their_waits(servers):
    home = servers()
    home.behaviour = respond(503, b"busy")
    slept: list[float] = []
    t0 = time.monotonic()
    with pytest.raises(EmbedderUnavailableError, match="deadline=0.5 s reached"):
        embedder(
            home, deadline=0.5, backoff=0.2, max_retries=50, sleep=lambda s: (slept.append(s), time.sleep(s))
        ).embed(["a"])
    assert time.monotonic() - t0 < 3.0 and len(home.requests) < 10


def test_an_announced_oversized_answer_is_refused_before_it_is_read(servers):
    home = servers()
    home.behaviour = raw(b"HTTP/1.1 200 OK\r\nContent-Length: 50000000\r\n\r\n" + b"[" * 1000)
    with pytest.raises(EmbedderError, match="50,000,000 bytes, more than max_response_bytes=1,048,576"):
        embedder(home, max_response_bytes=1 << 20).embed(["a"])
    assert len(home.requests) == 1  # not retried


def test_an_endless_chunked_answer_stops_at_max_response_bytes(servers):
    home = servers()

    def endless(server: HostileServer, conn: Any, request: dict[str, Any]) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
        for _ in range(200):  # 13 MB at most, then the server gives up
            if server.stop.is_set():
                return
            conn.sendall(chunk)

    home.behaviour = endless
    with pytest.raises(EmbedderError, match="larger than max_response_bytes=1,048,576"):
        embedder(home, max_response_bytes=1 << 20).embed(["a"])


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 200_000 + b"]" * 200_000,
        b'{"data": [{"index": 0, "embedding": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
    ],
    ids=["top-level", "inside-embedding"],
)
def test_deeply_nested_json_is_an_embedder_error_not_a_recursion_error(servers, body):
    home = servers()
    home.behaviour = respond(200, body)
    with pytest.raises(EmbedderError, match="nested too deeply"):
        embedder(home).embed(["a"])


def test_moderately_nested_embeddings_are_rejected_as_not_flat(servers):
    home = servers()
    deep = b"[" * 500 + b"1" + b"]" * 500  # parses as JSON; numpy cannot take it
    home.behaviour = respond(200, b'{"data": [{"index": 0, "embedding": ' + deep + b"}]}")
    with pytest.raises(EmbedderError, match="not a flat list of numbers"):
        embedder(home).embed(["a"])


# -- the post_json contract other clients build on -------------------------------------------


class ServiceError(KbcoreError, RuntimeError):
    def __init__(self, message: str, *, endpoint: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint, self.status = endpoint, status


class ServiceDownError(ServiceError, ConnectionError):
    pass


def call(url: str, **kw: Any) -> object:
    args: dict[str, Any] = dict(
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=2.0,
        deadline=5.0,
        max_retries=1,
        max_response_bytes=1 << 20,
        error=ServiceError,
        unavailable=ServiceDownError,
        scrub=lambda s: s.replace(KEY, "***"),
        sleep=lambda s: None,
    )
    args.update(kw)
    return post_json(url, {"q": "x"}, **args)


def test_post_json_returns_the_decoded_answer_and_sends_the_payload(servers):
    home = servers()
    home.behaviour = respond(200, b'{"ok": [1, 2]}')
    assert call(f"{home.url}/rerank") == {"ok": [1, 2]}
    (req,) = home.requests
    assert json.loads(req["body"]) == {"q": "x"} and req["headers"]["content-type"] == "application/json"


def test_post_json_raises_the_callers_classes_with_endpoint_and_status(servers):
    home = servers()
    home.behaviour = respond(503, json.dumps({"error": {"message": f"down, key {KEY}"}}).encode())
    with pytest.raises(ServiceDownError) as info:
        call(f"{home.url}/rerank")
    assert info.value.status == 503 and info.value.endpoint == f"{home.url}/rerank"
    assert "2 attempts" in str(info.value) and KEY not in str(info.value) and len(home.requests) == 2
    home.behaviour = respond(400, b'{"error": "bad query"}')
    with pytest.raises(ServiceError, match="HTTP 400: bad query") as info:
        call(f"{home.url}/rerank")
    assert type(info.value) is ServiceError and info.value.status == 400
    home.behaviour = respond(200, b"\xff\xfe not json")
    with pytest.raises(ServiceError, match="not JSON"):
        call(f"{home.url}/rerank")
