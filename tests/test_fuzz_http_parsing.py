"""Fuzzing (hypothesis) of the embedder client against a hostile server and of the parsers on
adversarial text (issue 30).

- OpenAIEmbedder against a raw-socket server on 127.0.0.1 (tests/hostile_http.py) answering
  generated garbage: random status lines and bytes, wrong counts, deep nesting, huge
  announced lengths, drips, redirects to the same or another origin. Every call ends within
  its deadline with vectors of the right shape or an ``EmbedderError``, never another
  exception, the key never appears in a message, and no request with the key reaches the
  other origin.
- ``parse`` on generated text and bytes in every format: a ParsedDocument or
  InvalidArgumentError, never another exception.

Seeds are fixed (``derandomize``) and budgets small; a longer run:
``KBCORE_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz_http_parsing.py``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np
import pytest
from hostile_http import HostileServer, drip, raw, respond
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kbcore.embedders import OpenAIEmbedder
from kbcore.errors import EmbedderError, InvalidArgumentError
from kbcore.parsing import FORMATS, parse

EXAMPLES = int(os.environ.get("KBCORE_FUZZ_EXAMPLES", "60"))
SEED = int(os.environ.get("KBCORE_FUZZ_SEED", "20261205"))
KEY = "sk-fuzz-SECRET-0042"
DEADLINE = 1.0


def fuzz(examples: int = EXAMPLES):
    def wrap(fn):
        fn = settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize="KBCORE_FUZZ_SEED" not in os.environ,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )(fn)
        return seed(SEED)(fn)

    return wrap


# -- the embedder client against a hostile server --------------------------------------------


@pytest.fixture(scope="module")
def hostile():
    home, other = HostileServer(), HostileServer()
    other.behaviour = respond(200, b'{"data": [{"index": 0, "embedding": [1.0]}]}')
    yield home, other
    home.close()
    other.close()


def _json_body(draw: Any, n: int) -> bytes:
    kind = draw(st.sampled_from(["valid", "count", "nested", "types", "index", "huge-number", "deep"]))
    dim = draw(st.integers(1, 4))
    items: list[Any] = [{"index": i, "embedding": [0.5] * dim} for i in range(n)]
    if kind == "count":
        items = items[: draw(st.integers(0, max(0, n - 1)))] + items[: draw(st.integers(0, 2))]
    elif kind == "nested":
        depth = draw(st.integers(1, 3000))
        return b'{"data": [{"index": 0, "embedding": ' + b"[" * depth + b"1" + b"]" * depth + b"}]}"
    elif kind == "types":
        items[0]["embedding"] = draw(
            st.one_of(
                st.none(),
                st.text(max_size=5),
                st.booleans(),
                st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
            )
        )
    elif kind == "index":
        items[0]["index"] = draw(st.one_of(st.integers(-3, n + 3), st.text(max_size=2), st.none()))
    elif kind == "huge-number":
        return b'{"data": [{"index": 0, "embedding": [1e999, ' + b"9" * draw(st.integers(1, 5000)) + b"]}]}"
    elif kind == "deep":
        return b"[" * draw(st.integers(1, 100_000))
    return json.dumps({"data": items}).encode()


@st.composite
def behaviours(draw: Any, other_url: str, n: int) -> Any:
    kind = draw(st.sampled_from(["json", "garbage", "status", "length", "drip", "redirect", "close"]))
    if kind == "json":
        return respond(200, _json_body(draw, n))
    if kind == "garbage":
        return raw(draw(st.binary(max_size=300)))
    if kind == "status":
        status = draw(st.sampled_from([200, 204, 301, 400, 401, 404, 408, 413, 429, 500, 502, 503, 599]))
        return respond(status, draw(st.binary(max_size=100)), {"Retry-After": draw(st.sampled_from(["0", "1e9", "x"]))})
    if kind == "length":
        return raw(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(draw(st.integers(0, 10**12))).encode() + b"\r\n\r\n{")
    if kind == "drip":
        prefix = draw(st.sampled_from([b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: "]))
        return drip(prefix, every=0.05, for_seconds=3 * DEADLINE)
    if kind == "redirect":
        status = draw(st.sampled_from([301, 302, 303, 307, 308]))
        where = draw(st.sampled_from([other_url + "/v1/embeddings", "/v2/embeddings", "//evil.invalid/x"]))
        return respond(status, b"", {"Location": where})
    return raw(b"")


@fuzz(examples=max(10, EXAMPLES // 2))
@given(data=st.data())
def test_the_embedder_survives_a_hostile_server(hostile, monkeypatch, data):
    home, other = hostile
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("KBCORE_FUZZ_KEY", KEY)
    n = data.draw(st.integers(1, 3))
    home.script[:] = [data.draw(behaviours(other.url, n)) for _ in range(data.draw(st.integers(1, 3)))]
    home.behaviour = respond(503, b"")
    other.requests.clear()
    e = OpenAIEmbedder(
        "m",
        base_url=f"{home.url}/v1",
        api_key_env="KBCORE_FUZZ_KEY",
        timeout=0.5,
        deadline=DEADLINE,
        max_retries=2,
        max_response_bytes=1 << 20,
        sleep=lambda s: None,
    )
    t0 = time.monotonic()
    try:
        out = e.embed([f"text {i}" for i in range(n)])
    except EmbedderError as exc:
        assert KEY not in str(exc)
    else:
        assert out.dtype == np.float32 and out.shape[0] == n and np.isfinite(out).all()
    assert time.monotonic() - t0 < DEADLINE + 2.0
    assert not [r for r in other.requests if KEY in json.dumps(r["headers"])]


# -- the parsers on adversarial text ---------------------------------------------------------

_MARKUP = [
    "<",
    ">",
    "</",
    "<!--",
    "-->",
    "<p>",
    "<a ",
    "<script>",
    "&#",
    "&amp",
    "*",
    "_",
    "~~",
    "`",
    "#",
    "[",
    "]",
    "(",
    ")",
    "![",
    "]: ",
    "\n",
    "\r",
    " ",
    "\t",
    "\x0b",
    "\u3000",
    "\x00",
    "\ud800",
    "{",
    "}",
    '"',
    "\\",
    "é",
]


# The formats that are text (the binary ones: the random-bytes test below).
_TEXT_EXTENSIONS = {"text": "txt", "markdown": "md", "html": "html", "jsonl": "jsonl", "csv": "csv", "tsv": "tsv"}
assert set(_TEXT_EXTENSIONS) <= set(FORMATS)


@fuzz()
@given(
    text=st.lists(st.one_of(st.sampled_from(_MARKUP), st.text(max_size=5)), max_size=60).map("".join),
    fmt=st.sampled_from(sorted(_TEXT_EXTENSIONS)),
)
def test_parse_gives_a_document_or_invalid_argument_on_adversarial_text(text, fmt):
    try:
        data = text.encode("utf-8", "surrogatepass")
        doc = parse(data, filename=f"fuzz.{_TEXT_EXTENSIONS[fmt]}")
    except InvalidArgumentError:
        return
    assert doc.format == fmt and doc.text == doc.text.strip() and doc.text


@fuzz()
@given(data=st.binary(max_size=400), fmt=st.sampled_from(list(FORMATS) + [None]))
def test_parse_gives_a_document_or_invalid_argument_on_random_bytes(data, fmt):
    try:
        doc = parse(data, format=fmt)
    except InvalidArgumentError:
        return
    assert doc.text
