"""OpenAIEmbedder against a fake OpenAI-compatible server on 127.0.0.1 (stopped by each test).

The fake answers ``POST .../embeddings`` with a deterministic vector per input text (seeded by
the text) and can be scripted to fail, stall or answer garbage, so batching, retries, timeouts,
error messages and response validation are checked against what was actually sent.
"""

from __future__ import annotations

import base64
import email.utils
import json
import socket
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

from kbcore.embedders import OpenAIEmbedder
from kbcore.errors import EmbedderError, EmbedderUnavailableError, InvalidArgumentError, InvalidTypeError

KEY = "sk-test-SECRET-0123456789abcdef"
DIM = 8


def vector_of(text: str, dim: int = DIM) -> np.ndarray:
    """The fake's embedding of ``text`` (what a correct client must hand back, in input order)."""
    return np.random.default_rng(zlib.crc32(text.encode("utf-8"))).standard_normal(dim)


class Reply:
    """One scripted answer: status, headers, body (bytes or a JSON-able object), optional stall."""

    def __init__(
        self, status: int = 200, body: Any = None, headers: dict[str, str] | None = None, stall: float = 0.0
    ) -> None:
        self.status, self.body, self.headers, self.stall = status, body, headers or {}, stall


class FakeOpenAI:
    """A tiny threaded OpenAI-compatible embeddings server; ``script`` entries are consumed in
    order (a Reply or a function ``(payload) -> Reply``), then every request gets a valid answer."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[Reply | Callable[[dict[str, Any]], Reply]] = []
        self.dim = DIM
        self.shuffle = True
        self.stop = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                payload = json.loads(raw)
                parts = urlsplit(self.path)
                fake.requests.append(
                    {
                        "path": parts.path,
                        "query": parse_qs(parts.query),
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "payload": payload,
                    }
                )
                action = fake.script.pop(0) if fake.script else None
                reply = action(payload) if callable(action) else action
                if reply is None:
                    reply = Reply(body=fake.valid(payload))
                if reply.stall and fake.stop.wait(reply.stall):
                    return
                body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    for k, v in {"Content-Type": "application/json", **reply.headers}.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up (timeout): nothing to answer
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def valid(self, payload: dict[str, Any], dim: int | None = None) -> dict[str, Any]:
        dim = dim or payload.get("dimensions") or self.dim
        items = [
            {"object": "embedding", "index": i, "embedding": vector_of(t, dim).tolist()}
            for i, t in enumerate(payload["input"])
        ]
        if self.shuffle:  # the index field, not the list order, is authoritative
            items = items[1::2] + items[0::2]
        return {
            "object": "list",
            "data": items,
            "model": payload.get("model"),
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KBCORE_TEST_KEY", KEY)
    server = FakeOpenAI()
    yield server
    server.close()


class Sleeps(list):
    """A fake time.sleep that records the delays."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make(fake: FakeOpenAI, **kw: Any) -> OpenAIEmbedder:
    kw.setdefault("api_key_env", "KBCORE_TEST_KEY")
    kw.setdefault("sleep", Sleeps())
    return OpenAIEmbedder("test-embed", base_url=f"{fake.url}/v1", **kw)


def expected(texts: list[str], dim: int = DIM) -> np.ndarray:
    return np.vstack([vector_of(t, dim) for t in texts]).astype(np.float32)


# -- requests ------------------------------------------------------------------------------


def test_texts_are_split_into_requests_of_batch_size_and_come_back_in_input_order(fake):
    texts = [f"text number {i} ü" for i in range(10)]
    e = make(fake, batch_size=4)
    out = e.embed(texts)
    assert out.dtype == np.float32 and out.shape == (10, DIM)
    np.testing.assert_array_equal(out, expected(texts))
    assert [r["payload"]["input"] for r in fake.requests] == [texts[0:4], texts[4:8], texts[8:10]]
    first = fake.requests[0]
    assert first["path"] == "/v1/embeddings"
    assert first["payload"]["model"] == "test-embed" and "dimensions" not in first["payload"]
    assert first["headers"]["authorization"] == f"Bearer {KEY}"
    assert "api-key" not in first["headers"]


def test_dim_is_learned_from_the_first_response_or_probed_once(fake):
    e = make(fake)
    assert e.known_dim is None
    assert e.dim == DIM  # probe
    assert len(fake.requests) == 1 and e.known_dim == DIM
    e.embed(["a"])
    assert e.dim == DIM and len(fake.requests) == 2


def test_dimensions_is_sent_and_then_required_of_the_response(fake):
    e = make(fake, dimensions=5)
    assert e.dim == 5 and not fake.requests  # known without a request
    out = e.embed(["x", "y"])
    assert out.shape == (2, 5) and fake.requests[0]["payload"]["dimensions"] == 5
    fake.script.append(lambda p: Reply(body=fake.valid(p, dim=6)))
    with pytest.raises(EmbedderError, match=r"6-dimensional embeddings, expected 5 \(from dimensions=5\)"):
        e.embed(["z"])


def test_a_later_batch_of_another_dimension_is_rejected(fake):
    e = make(fake, batch_size=2)
    fake.script += [None, lambda p: Reply(body=fake.valid(p, dim=7))]
    with pytest.raises(EmbedderError, match="7-dimensional embeddings, expected 8") as info:
        e.embed(["a", "b", "c"])
    assert fake.url in str(info.value)


def test_empty_input_sends_nothing_when_dim_is_known(fake):
    e = make(fake, dim=DIM)
    assert e.embed([]).shape == (0, DIM) and not fake.requests


def test_api_key_env_none_sends_no_authorization(fake):
    e = make(fake, api_key_env=None)
    e.embed(["a"])
    assert "authorization" not in fake.requests[0]["headers"]


def test_unicode_texts_reach_the_server_unchanged(fake):
    texts = ["naïve café", "日本語のテキスト", "emoji 🚀", ""]
    out = make(fake).embed(texts)
    assert fake.requests[0]["payload"]["input"] == texts
    np.testing.assert_array_equal(out, expected(texts))


def test_normalize_makes_unit_vectors(fake):
    out = make(fake, normalize=True).embed(["a", "b"])
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)


def test_base64_embeddings_are_decoded(fake):
    def b64(p: dict[str, Any]) -> Reply:
        data = [
            {"index": i, "embedding": base64.b64encode(vector_of(t).astype("<f4").tobytes()).decode()}
            for i, t in enumerate(p["input"])
        ]
        return Reply(body={"data": data})

    fake.script.append(b64)
    np.testing.assert_array_equal(make(fake).embed(["p", "q"]), expected(["p", "q"]))


def test_azure_deployment_url_api_version_and_api_key_header(fake):
    e = OpenAIEmbedder.azure(
        fake.url, "my-deployment", api_version="2024-10-21", api_key_env="KBCORE_TEST_KEY", sleep=Sleeps()
    )
    assert e.endpoint == f"{fake.url}/openai/deployments/my-deployment/embeddings?api-version=2024-10-21"
    np.testing.assert_array_equal(e.embed(["hello"]), expected(["hello"]))
    req = fake.requests[0]
    assert req["path"] == "/openai/deployments/my-deployment/embeddings"
    assert req["query"] == {"api-version": ["2024-10-21"]}
    assert req["headers"]["api-key"] == KEY and "authorization" not in req["headers"]
    assert req["payload"]["model"] == "my-deployment"


def test_base_url_forms(fake):
    assert make(fake).endpoint == f"{fake.url}/v1/embeddings"
    e = OpenAIEmbedder("m", base_url=f"{fake.url}/v1/embeddings/", api_version="v9")
    assert e.endpoint == f"{fake.url}/v1/embeddings?api-version=v9"
    assert OpenAIEmbedder("m").endpoint == "https://api.openai.com/v1/embeddings"


# -- retries -------------------------------------------------------------------------------


def test_429_and_503_are_retried_with_exponential_backoff_and_jitter(fake):
    sleeps = Sleeps()
    e = make(fake, backoff=0.1, max_backoff=10, sleep=sleeps)
    fake.script += [
        Reply(503, {"error": {"message": "overloaded"}}),
        Reply(429, {"error": "slow down"}),
        Reply(502, b"bad gateway"),
    ]
    np.testing.assert_array_equal(e.embed(["a"]), expected(["a"]))
    assert len(fake.requests) == 4 and len(sleeps) == 3
    for attempt, s in enumerate(sleeps):  # backoff * 2**attempt minus up to 25 % jitter
        assert 0.75 * 0.1 * 2**attempt <= s <= 0.1 * 2**attempt


def test_backoff_is_capped_by_max_backoff(fake):
    sleeps = Sleeps()
    e = make(fake, backoff=1.0, max_backoff=1.5, max_retries=4, sleep=sleeps)
    fake.script += [Reply(500, {})] * 4
    e.embed(["a"])
    assert len(sleeps) == 4 and all(s <= 1.5 for s in sleeps) and sleeps[-1] >= 0.75 * 1.5


@pytest.mark.parametrize(
    "headers,wait",
    [
        ({"Retry-After": "2"}, 2.0),
        ({"Retry-After": "0.5"}, 0.5),
        ({"retry-after-ms": "150", "Retry-After": "9"}, 0.15),
    ],
)
def test_retry_after_is_honoured(fake, headers, wait):
    sleeps = Sleeps()
    fake.script.append(Reply(429, {"error": {"message": "rate limited"}}, headers=headers))
    make(fake, sleep=sleeps).embed(["a"])
    assert sleeps == [pytest.approx(wait)]


def test_retry_after_as_an_http_date_is_honoured(fake):
    sleeps = Sleeps()
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    fake.script.append(Reply(503, {}, headers={"Retry-After": when}))
    make(fake, sleep=sleeps).embed(["a"])
    assert len(sleeps) == 1 and 25 <= sleeps[0] <= 31


def test_a_retry_after_beyond_max_retry_after_fails_at_once(fake):
    sleeps = Sleeps()
    fake.script.append(Reply(429, {"error": {"message": "quota"}}, headers={"Retry-After": "3600"}))
    with pytest.raises(EmbedderUnavailableError, match="retry after 3600 s") as info:
        make(fake, sleep=sleeps, max_retry_after=60).embed(["a"])
    assert not sleeps and len(fake.requests) == 1 and info.value.status == 429


def test_persistent_503_gives_up_with_an_unavailable_error_naming_the_endpoint(fake):
    sleeps = Sleeps()
    fake.script += [Reply(503, {"error": {"message": "model loading"}})] * 3
    with pytest.raises(EmbedderUnavailableError) as info:
        make(fake, max_retries=2, sleep=sleeps).embed(["a", "b"])
    err = info.value
    assert isinstance(err, ConnectionError) and isinstance(err, OSError) and isinstance(err, EmbedderError)
    msg = str(err)
    assert f"{fake.url}/v1/embeddings" in msg and "3 attempts" in msg and "HTTP 503: model loading" in msg
    assert err.status == 503 and err.endpoint == f"{fake.url}/v1/embeddings"
    assert len(fake.requests) == 3 and len(sleeps) == 2


def test_a_stalled_request_times_out_and_is_retried(fake):
    fake.script.append(Reply(stall=5.0))
    t0 = time.monotonic()
    out = make(fake, timeout=0.3).embed(["a"])
    assert time.monotonic() - t0 < 4.0
    np.testing.assert_array_equal(out, expected(["a"]))
    assert len(fake.requests) == 2


def test_timeouts_on_every_attempt_are_reported(fake):
    fake.script += [Reply(stall=5.0)] * 2
    with pytest.raises(EmbedderUnavailableError, match=r"2 attempts: no answer within timeout=0.2 s") as info:
        make(fake, timeout=0.2, max_retries=1).embed(["a"])
    assert fake.url in str(info.value)


def test_connection_refused_is_retried_then_reported(monkeypatch):
    monkeypatch.setenv("KBCORE_TEST_KEY", KEY)
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    sleeps = Sleeps()
    e = OpenAIEmbedder(
        "m", base_url=f"http://127.0.0.1:{port}/v1", api_key_env="KBCORE_TEST_KEY", max_retries=2, sleep=sleeps
    )
    with pytest.raises(EmbedderUnavailableError, match="cannot connect") as info:
        e.embed(["a"])
    assert f"http://127.0.0.1:{port}/v1/embeddings" in str(info.value)
    assert e.requests_sent == 3 and len(sleeps) == 2 and KEY not in str(info.value)


# -- errors that are not retried, and the key ----------------------------------------------


def test_401_is_not_retried_and_the_key_never_appears(fake):
    sleeps = Sleeps()
    fake.script.append(
        Reply(401, {"error": {"message": f"Incorrect API key provided: {KEY}.", "type": "invalid_request_error"}})
    )
    e = make(fake, sleep=sleeps)
    with pytest.raises(EmbedderError) as info:
        e.embed(["a"])
    err = info.value
    assert not isinstance(err, EmbedderUnavailableError) and isinstance(err, RuntimeError)
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    assert "HTTP 401" in str(err) and f"{fake.url}/v1/embeddings" in str(err) and "***" in str(err)
    assert KEY not in text
    assert KEY not in repr(e) and KEY not in json.dumps(e.spec())
    assert len(fake.requests) == 1 and not sleeps and err.status == 401


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_client_errors_fail_at_once_with_the_server_message(fake, status):
    fake.script.append(Reply(status, {"object": "error", "message": "model 'test-embed' not found"}))
    with pytest.raises(EmbedderError, match=rf"HTTP {status}: model 'test-embed' not found"):
        make(fake).embed(["a"])
    assert len(fake.requests) == 1


def test_a_missing_key_variable_fails_at_first_use_not_at_construction(fake, monkeypatch):
    monkeypatch.delenv("KBCORE_ABSENT_KEY", raising=False)
    e = make(fake, api_key_env="KBCORE_ABSENT_KEY")  # constructing is fine
    with pytest.raises(EmbedderError, match="environment variable KBCORE_ABSENT_KEY, which is not set") as info:
        e.embed(["a"])
    assert fake.url in str(info.value) and not fake.requests


def test_a_rotated_key_is_used_by_the_next_request(fake, monkeypatch):
    e = make(fake)
    e.embed(["a"])
    monkeypatch.setenv("KBCORE_TEST_KEY", "sk-rotated")
    e.embed(["b"])
    assert [r["headers"]["authorization"] for r in fake.requests] == [f"Bearer {KEY}", "Bearer sk-rotated"]


# -- invalid responses ---------------------------------------------------------------------


def _items(p: dict[str, Any], dim: int = DIM) -> list[dict[str, Any]]:
    return [{"index": i, "embedding": vector_of(t, dim).tolist()} for i, t in enumerate(p["input"])]


BAD = {
    "one embedding too few": (lambda p: {"data": _items(p)[:-1]}, "1 embeddings for 2 inputs"),
    "one too many": (lambda p: {"data": _items(p) + _items(p)[:1]}, "3 embeddings for 2 inputs"),
    "NaN": (
        lambda p: b'{"data": [{"index": 0, "embedding": [0.1, NaN]}, {"index": 1, "embedding": [1, 2]}]}',
        "embedding 0 contains NaN or infinite",
    ),
    "Infinity": (
        lambda p: b'{"data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [Infinity, 2]}]}',
        "embedding 1 contains NaN or infinite",
    ),
    "ragged": (
        lambda p: {"data": [{"index": 0, "embedding": [1.0, 2.0]}, {"index": 1, "embedding": [1.0]}]},
        "different lengths",
    ),
    "duplicate index": (
        lambda p: {"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [2.0]}]},
        "index 0 appears twice",
    ),
    "index out of range": (
        lambda p: {"data": [{"index": 0, "embedding": [1.0]}, {"index": 2, "embedding": [2.0]}]},
        "index 2, expected 0..1",
    ),
    "strings": (
        lambda p: {"data": [{"index": 0, "embedding": ["a"]}, {"index": 1, "embedding": ["b"]}]},
        "not a flat list of numbers",
    ),
    "nested": (
        lambda p: {"data": [{"index": 0, "embedding": [[1.0]]}, {"index": 1, "embedding": [[2.0]]}]},
        "not a flat list of numbers",
    ),
    "no data": (lambda p: {"object": "list"}, "no 'data' list"),
    "not JSON": (lambda p: b"<html>proxy error</html>", "not JSON"),
    "no embedding": (lambda p: {"data": [{"index": 0}, {"index": 1}]}, "item 0 has no 'embedding'"),
    "empty vectors": (
        lambda p: {"data": [{"index": 0, "embedding": []}, {"index": 1, "embedding": []}]},
        "empty embeddings",
    ),
    "too large for float32": (
        lambda p: {"data": [{"index": 0, "embedding": [1e300]}, {"index": 1, "embedding": [1.0]}]},
        "float32 range",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_responses_are_rejected_naming_the_endpoint(fake, case):
    body, message = BAD[case]
    fake.script.append(lambda p: Reply(body=body(p)))
    with pytest.raises(EmbedderError, match="invalid response from") as info:
        make(fake).embed(["a", "b"])
    assert message in str(info.value) and f"{fake.url}/v1/embeddings" in str(info.value)
    assert len(fake.requests) == 1  # a bad answer is not retried


# -- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"base_url": "ftp://example.com/v1"}, "http:// or https://"),
        ({"base_url": "http://user:pw@example.com/v1"}, "must not contain credentials"),
        ({"base_url": ""}, "non-empty URL"),
        ({"batch_size": 0}, "batch_size"),
        ({"timeout": 0}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
        ({"dimensions": 0}, "dimensions"),
        ({"dimensions": 8, "dim": 9}, "contradicts"),
        ({"auth_header": "cookie"}, "auth_header"),
        ({"backoff": float("nan")}, "backoff"),
    ],
)
def test_bad_arguments_are_rejected_at_construction(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        OpenAIEmbedder("m", **kwargs)


def test_bad_texts_are_rejected_before_any_request(fake):
    e = make(fake)
    with pytest.raises(InvalidTypeError):
        e.embed("one string")
    with pytest.raises(InvalidTypeError):
        e.embed(["a", 3])
    assert not fake.requests
