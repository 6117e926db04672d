"""``kbcore serve`` caps the request head (issue 30, item 12), with either HTTP parser uvicorn
may use: h11 (pure Python, the default without extras) and httptools (``uvicorn[standard]``),
which buffers an unfinished head without limit: a client with no key sending one endless
header grew the server by 195 MB in a second before the cap.

A real server on 127.0.0.1 (tests/test_server.py's ``running``) gets an endless head; the
connection must be answered 431 (or 400 from h11) and closed after about ``max_head_bytes``,
with the server's memory (this process: the server runs in a thread) bounded.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest

pytest.importorskip("uvicorn", reason="the server needs uvicorn (pip install 'kbcore[server]')")

from test_server import KEYS, running  # noqa: E402 - after the importorskip

from kbcore.dify.server import (  # noqa: E402
    DEFAULT_MAX_HEAD_BYTES,  # noqa: E402
    create_app,
    uvicorn_config,
)
from kbcore.engine import Engine  # noqa: E402
from kbcore.errors import InvalidArgumentError  # noqa: E402

MB = 1 << 20


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(params=["h11", "httptools"])
def parser(request, monkeypatch):
    if request.param == "httptools":
        pytest.importorskip("httptools", reason="uvicorn's httptools parser is not installed (pip install httptools)")
    else:  # make uvicorn's httptools protocol unimportable, so kbcore falls back to h11
        monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.httptools_impl", None)
    return request.param


@pytest.fixture
def url(parser, tmp_path):
    with Engine(tmp_path) as engine:
        engine.create_knowledge_base("kb").ingest(text="Keys rotate every ninety days.", document_id="k")
        app = create_app(engine, KEYS)
        with running(app, header_timeout=30) as (address, _):
            yield address


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc/self/status")
@pytest.mark.parametrize("shape", ["one endless header", "endless headers"])
def test_an_endless_request_head_is_refused_and_closed_with_bounded_memory(url, shape):
    before = _rss_mb()
    sent = 0
    refused = None
    with _connect(url) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        piece = b"a" * 65536 if shape == "one endless header" else (b"X-H: " + b"a" * 65523 + b"\r\n")
        t0 = time.monotonic()
        try:
            while sent < 128 * MB and time.monotonic() - t0 < 20:
                s.sendall(piece)
                sent += len(piece)
        except OSError as exc:  # reset / broken pipe: the server closed the connection
            refused = exc
        try:
            reply = s.recv(4096)
        except OSError:
            reply = b""
    grown = _rss_mb() - before
    assert refused is not None, f"the server took {sent / MB:.0f} MB of request head"
    assert sent < 16 * MB, sent  # the cap (64 KiB) plus what the sockets' buffers hold
    assert reply == b"" or reply.startswith((b"HTTP/1.1 431", b"HTTP/1.1 400")), reply[:80]
    assert grown < 32, f"the server grew by {grown:.0f} MB"


def test_heads_and_bodies_within_the_limits_are_served(url):
    big = "X-Fill: " + "b" * (DEFAULT_MAX_HEAD_BYTES - 1024)
    payload = json.dumps(
        {"knowledge_id": "kb", "query": "keys " + "x" * 600_000, "retrieval_setting": {"top_k": 1}}
    ).encode()
    with _connect(url) as s:  # a large head, then a large body in the same packets
        s.sendall(
            b"POST /retrieval HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {KEYS[0]}\r\n{big}\r\n".encode()
            + f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


@pytest.mark.parametrize("bad", [0, 1023, 1.5, True, "64k"])
def test_a_bad_max_head_bytes_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="max_head_bytes"):
        uvicorn_config(object(), max_head_bytes=bad)
