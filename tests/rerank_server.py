"""A fake ``/rerank`` service on 127.0.0.1 for the reranker tests: it speaks every
:data:`kbcore.rerankers.API_FORMATS` shape, scores a text by a fixed rule, and can be told to
answer garbage, wrong counts, errors or a sequence of statuses. Started and stopped by the test
(a context manager)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def relevance(query: str, text: str) -> float:
    """The fake model: the share of the query's words that the text contains, in [0, 1]."""
    words = set(query.lower().split())
    have = set(text.lower().split())
    return len(words & have) / len(words) if words else 0.0


def answer(fmt: str, query: str, texts: list[str]) -> Any:
    """A correct answer in ``fmt``'s shape, best first as the services sort it."""
    scored = sorted(((relevance(query, t), i) for i, t in enumerate(texts)), key=lambda p: (-p[0], p[1]))
    if fmt == "tei":
        return [{"index": i, "score": s} for s, i in scored]
    items = [{"index": i, "relevance_score": s} for s, i in scored]
    if fmt == "voyage":
        return {"object": "list", "data": items, "model": "m", "usage": {"total_tokens": 1}}
    return {"id": "x", "results": items, "meta": {"billed_units": {"search_units": 1}}}


class FakeRerankServer:
    """``url`` is the base URL; ``requests`` every request seen (path, headers, JSON body).

    ``plan``: a list of (status, body) consumed one per request (body: bytes, or a JSON-able
    object, or a function of the parsed request); when empty, a correct answer in ``fmt``."""

    def __init__(self, fmt: str = "cohere") -> None:
        self.fmt = fmt
        self.plan: list[tuple[int, Any]] = []
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
                with owner._lock:
                    owner.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    step = owner.plan.pop(0) if owner.plan else None
                if step is None:
                    texts = body.get("texts") if owner.fmt == "tei" else body.get("documents")
                    status, payload = 200, answer(owner.fmt, body["query"], texts)
                else:
                    status, payload = step
                    if callable(payload):
                        payload = payload(body)
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeRerankServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextlib.contextmanager
def fake_rerank_server(fmt: str = "cohere") -> Iterator[FakeRerankServer]:
    with FakeRerankServer(fmt) as srv:
        yield srv


def no_sleep(_: float) -> None:
    """Replaces the wait between retries."""


Sleep = Callable[[float], None]
