"""Dify's External Knowledge API over kbcore knowledge bases: ``POST /retrieval``.

Start it with ``kbcore serve --data ./kb-data --api-key KEY`` (``pip install 'kbcore[server]'``),
then register ``http://HOST:PORT`` as an external knowledge API in Dify and use a knowledge
base's name as the "external knowledge ID". Dify posts to ``{endpoint}/retrieval``; an
endpoint registered with a trailing slash gives ``//retrieval``, which is served too (repeated
slashes in the path are collapsed).

Request (JSON, what Dify 1.12 sends)::

    {"knowledge_id": "docs", "query": "how do I rotate keys?",
     "retrieval_setting": {"top_k": 5, "score_threshold": 0.5},
     "metadata_condition": {"logical_operator": "and",
                            "conditions": [{"name": ["team"], "comparison_operator": "is",
                                            "value": "infra"}]}}

With ``views`` (``kbcore serve --views FILE``, :mod:`kbcore.dify.views`) a knowledge id may
also name a view: one or several knowledge bases under a fixed filter (ANDed with Dify's
condition), search type, top-k cap, score floor and context window, readable with that view's
own keys only; the views file is checked in full at start.

Response: ``{"records": [{"content", "score", "title", "metadata"}, ...]}``, best first.
``score`` is the engine's score in [0, 1]; records scoring below ``score_threshold`` are
dropped here. ``title`` is the document's ``title`` metadata, else its filename, else its
document id. ``metadata`` is always an object (the chunk's metadata). ``top_k`` above
``--max-top-k`` is clamped (and logged); a query of only whitespace finds nothing (200, no
records). ``metadata_condition`` follows Dify's own filter (docs/dify.md).

Errors are ``{"error_code": int, "error_msg": str}`` with these codes:

====  ======  =====================================================================
code  status  meaning
====  ======  =====================================================================
1001  403     missing or malformed ``Authorization: Bearer <key>`` header (Dify)
1002  403     the key is not one of the configured keys (Dify), or may not read this id
2001  404     no knowledge base named ``knowledge_id`` (Dify)
3000  400     empty body: Dify's registration probe (the key is valid)
3001  400     malformed request (not JSON, too deep, a missing or mistyped field)
3002  400     ``metadata_condition`` cannot be applied (unknown operator, bad value)
3003  413     the request body is larger than the limit
3004  408     the request body did not arrive within the body timeout
5000  500     unexpected server error (logged with its traceback)
5020  502     the query embedder failed (its service refused the request or answered garbage)
5031  503     the query embedder's service is unreachable or overloaded: try again later
====  ======  =====================================================================

A knowledge base with a default reranker (docs/rerankers.md) is reranked. When the reranker
fails (its service is down, refuses, or answers garbage) the answer is still 200, in the first
stage's order and with its scores, and every record's metadata says so: ``"reranked": false``
and ``"rerank_error"`` (the reason, at most 300 characters, naming the endpoint, never a key).
The failure is logged as ``rerank_failed`` once per burst (:data:`RERANK_LOG_INTERVAL`).

Every error is logged as one JSON line on the ``kbcore.server`` logger, with the request id
that is also sent back in the ``X-Request-Id`` header. Keys are compared in constant time and
never logged. A client that disconnects before its body arrived is logged as
``client_disconnect`` (no reply can reach it).

Concurrency and limits: the event loop only reads bodies and writes replies; parsing, the
filter translation and the retrieval run on a worker thread, so one expensive request never
delays another (or ``/health``). A body must arrive within ``body_timeout`` seconds, a
connection must send its request headers within ``header_timeout`` seconds and in at most
``max_head_bytes`` bytes (else 431 and closed, whichever HTTP parser uvicorn uses), idle keep-alive
connections close after ``keep_alive_timeout`` seconds, and at most ``max_connections``
connections are served at once (uvicorn answers 503 beyond). A knowledge base changed by
another process is reloaded at most every ``refresh_interval`` seconds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import os
import threading
import time
import traceback
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import (
    EmbedderError,
    EmbedderUnavailableError,
    InvalidArgumentError,
    InvalidTypeError,
    NotFoundError,
    RerankerError,
)
from .request import (
    E_AUTH_HEADER,
    E_AUTH_KEY,
    E_BAD_REQUEST,
    E_EMBEDDER_FAILED,
    E_EMBEDDER_UNAVAILABLE,
    E_INTERNAL,
    E_NO_KNOWLEDGE,
    E_TIMEOUT,
    E_TOO_LARGE,
    ApiError,
    Request,
    parse_request,
)
from .views import View, load_views

__all__ = [
    "API_KEYS_ENV",
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_KEEP_ALIVE_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_HEAD_BYTES",
    "DEFAULT_MAX_TOP_K",
    "DEFAULT_REFRESH_INTERVAL",
    "create_app",
    "parse_api_keys",
    "serve",
    "uvicorn_config",
]

#: Environment variable holding API keys, separated by commas or whitespace.
API_KEYS_ENV = "KBCORE_API_KEYS"
#: Default request body limit (bytes).
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Default largest ``top_k`` served (larger requests are clamped to it).
DEFAULT_MAX_TOP_K = 100
#: Default seconds between checks for changes made by other processes.
DEFAULT_REFRESH_INTERVAL = 1.0
#: Default seconds a client has to send its whole request body.
DEFAULT_BODY_TIMEOUT = 10.0
#: Default seconds a new connection has to send its request headers.
DEFAULT_HEADER_TIMEOUT = 10.0
#: Default seconds an idle keep-alive connection stays open.
DEFAULT_KEEP_ALIVE_TIMEOUT = 5
#: Default most connections served at once.
DEFAULT_MAX_CONNECTIONS = 256
#: Default largest request head (request line and headers, bytes): a connection sending more
#: before its head is complete gets 431 and is closed.
DEFAULT_MAX_HEAD_BYTES = 64 * 1024

log = logging.getLogger("kbcore.server")


# -- keys ------------------------------------------------------------------------------------


def parse_api_keys(keys: Iterable[str] | None = None, env: Mapping[str, str] | None = None) -> list[str]:
    """The configured API keys: ``keys`` plus those in ``$KBCORE_API_KEYS`` (comma or
    whitespace separated), without duplicates, in order. Raises ``InvalidArgumentError`` for an
    empty key or one with whitespace inside."""
    env = os.environ if env is None else env
    out: list[str] = []
    items = list(keys or [])
    raw = env.get(API_KEYS_ENV, "")
    items += [k for k in raw.replace(",", " ").split() if k]
    for k in items:
        if not isinstance(k, str) or not k.strip():
            raise InvalidArgumentError("an API key is empty")
        k = k.strip()
        if any(c.isspace() for c in k):
            raise InvalidArgumentError("an API key contains whitespace")
        if k not in out:
            out.append(k)
    return out


class _KeyRing:
    """Constant-time membership test: SHA-256 digests compared with hmac.compare_digest, every
    configured key checked, so neither the key length nor which key matched leaks through
    timing."""

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise InvalidArgumentError(f"no API key configured: pass --api-key KEY or set {API_KEYS_ENV}")
        self._digests = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]

    def __contains__(self, token: str) -> bool:
        d = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        ok = False
        for ref in self._digests:
            ok |= hmac.compare_digest(d, ref)
        return ok


def _bearer_token(header: str | None) -> str:
    if header is None or not header.strip():
        raise ApiError(
            403,
            E_AUTH_HEADER,
            "missing Authorization header; expected 'Authorization: Bearer <api-key>'",
        )
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise ApiError(
            403,
            E_AUTH_HEADER,
            "invalid Authorization header format; expected 'Authorization: Bearer <api-key>'",
        )
    return token


# -- JSON out --------------------------------------------------------------------------------


def _json_default(v: Any) -> Any:
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    if hasattr(v, "tolist"):
        return v.tolist()
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    return str(v)


def _finite(v: Any) -> Any:
    """JSON has no NaN / Infinity: those become null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _dumps(payload: Any) -> bytes:
    """Compact UTF-8 JSON; a string that is not valid Unicode (a lone surrogate) is escaped
    (``\\ud800``) instead of failing, so an error about such input can still be sent."""
    clean = _finite(payload)
    text = json.dumps(clean, ensure_ascii=False, allow_nan=False, default=_json_default, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(
            clean,
            ensure_ascii=True,
            allow_nan=False,
            default=_json_default,
            separators=(",", ":"),
        ).encode("ascii")


def _title(meta: Mapping[str, Any], document_id: str) -> str:
    for key in ("title", "filename"):
        v = meta.get(key)
        if isinstance(v, str) and v.strip():
            return v
    return document_id


def _log(level: int, event: str, **fields: Any) -> None:
    if log.isEnabledFor(level):
        log.log(level, _dumps({"event": event, **fields}).decode("utf-8"))


def _log_error(
    request_id: str,
    err: ApiError,
    *,
    client: str | None,
    knowledge_id: str | None,
    started: float,
    exc_text: str | None = None,
) -> None:
    record: dict[str, Any] = {
        "request_id": request_id,
        "status": err.status,
        "error_code": err.code,
        "error_msg": err.message,
        "client": client,
        "knowledge_id": knowledge_id,
        "duration_ms": round((time.perf_counter() - started) * 1000.0, 3),
    }
    if exc_text:
        record["exception"] = exc_text
    _log(logging.ERROR if err.status >= 500 else logging.WARNING, "retrieval_error", **record)


# -- the service -----------------------------------------------------------------------------

#: Seconds between two ``rerank_failed`` log lines of one knowledge base (a burst of failures
#: logs its first one, then one line per interval counting the ones in between).
RERANK_LOG_INTERVAL = 60.0
_MAX_REASON_CHARS = 300


def _short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= _MAX_REASON_CHARS else one[:_MAX_REASON_CHARS] + "..."


class _BurstLog:
    """Logs a reranker's failure once per burst: the first failure of a knowledge base, then at
    most one line per ``interval`` seconds with the number of failures it stood for."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, int]] = {}  # kb -> (last log time, failures since)

    def failed(self, kb_name: str, reason: str) -> bool:
        """Counts a failure; logs it when due. Returns whether a line was written."""
        now = time.monotonic()
        with self._lock:
            last, missed = self._state.get(kb_name, (-math.inf, 0))
            if now - last < self.interval:
                self._state[kb_name] = (last, missed + 1)
                return False
            self._state[kb_name] = (now, 0)
        _log(
            logging.WARNING,
            "rerank_failed",
            knowledge_id=kb_name,
            error=reason,
            suppressed=missed,
            action="answered with the first stage's order (metadata reranked=false)",
        )
        return True


def _check_limit(name: str, value: Any, low: float, *, integer: bool) -> None:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value >= low:
        what = "an integer" if integer else "a number"
        raise InvalidArgumentError(f"{name} must be {what} >= {low}, got {value!r}")


class _Service:
    """The framework-independent part: keys, engine, refresh throttling, retrieval."""

    def __init__(
        self,
        engine: Any,
        keys: Sequence[str],
        *,
        max_body_bytes: int,
        max_top_k: int,
        refresh_interval: float,
        body_timeout: float,
        views: Mapping[str, View] | None = None,
    ) -> None:
        _check_limit("max_body_bytes", max_body_bytes, 1024, integer=True)
        _check_limit("max_top_k", max_top_k, 1, integer=True)
        _check_limit("refresh_interval", refresh_interval, 0, integer=False)
        _check_limit("body_timeout", body_timeout, 0.001, integer=False)
        self.engine = engine
        self.keys = _KeyRing(keys)
        self.views = dict(views or {})
        self.view_keys = {kid: _KeyRing(v.keys) for kid, v in self.views.items() if v.keys is not None}
        self.max_body_bytes = max_body_bytes
        self.max_top_k = max_top_k
        self.refresh_interval = float(refresh_interval)
        self.body_timeout = float(body_timeout)
        self._refreshed: dict[str, float] = {}
        self._refresh_lock = threading.Lock()
        self._rerank_log = _BurstLog(RERANK_LOG_INTERVAL)

    def _maybe_refresh(self, kb: Any) -> None:
        if self.refresh_interval <= 0:
            return
        now = time.monotonic()
        with self._refresh_lock:
            last = self._refreshed.get(kb.name)
            if last is not None and now - last < self.refresh_interval:
                return
            self._refreshed[kb.name] = now
        kb.refresh()

    def known(self, token: str) -> bool:
        """Whether ``token`` is a server key or the key of some view (every ring checked)."""
        ok = token in self.keys
        for ring in self.view_keys.values():
            ok |= token in ring
        return ok

    def handle(self, body: bytes, token: str | None = None) -> tuple[Request, list[dict[str, Any]]]:
        """Parses, translates and retrieves: all the CPU work of one request. Runs on a worker
        thread. Raises ApiError. ``token`` (None: a server key) decides which knowledge ids
        it may read: a view's keys read that view only."""
        req = parse_request(body, self.max_top_k)
        try:
            view = self.views.get(req.knowledge_id)
            ring = self.keys if view is None or view.keys is None else self.view_keys[view.knowledge_id]
            if token is not None and token not in ring:
                raise ApiError(403, E_AUTH_KEY, f"authorization failed: the API key may not read {req.knowledge_id!r}")
            return req, (self.retrieve(req) if view is None else self.retrieve_view(req, view))
        except ApiError as err:
            err.knowledge_id = req.knowledge_id
            raise

    def retrieve_view(self, req: Request, view: View) -> list[dict[str, Any]]:
        """A view's request: its knowledge bases merged (:meth:`Engine.retrieve`), its filter
        ANDed with Dify's, its search type, top-k cap, score floor and context window."""
        top_k = req.top_k if view.top_k_max is None else min(req.top_k, view.top_k_max)
        threshold = max(req.score_threshold, view.score_floor)
        parts = [w for w in (view.filter, req.where) if w]
        where = None if not parts else parts[0] if len(parts) == 1 else {"$and": parts}
        try:
            for name in view.knowledge_bases:
                self._maybe_refresh(self.engine.get_knowledge_base(name))
            if not req.query.strip():
                return []
            opts = {
                "score_threshold": threshold,
                "filters": where,
                "search_type": view.search_type,
                "context_window": view.context_window,
            }
            names = list(view.knowledge_bases)
            rerank_error = None
            try:
                hits = self.engine.retrieve(names, req.query, top_k, rerank=view.reranker, **opts)
            except RerankerError as exc:  # as for a knowledge base: the first stage's answer
                rerank_error = _short(str(exc))
                self._rerank_log.failed(view.knowledge_id, rerank_error)
                hits = getattr(exc, "first_stage", None)
                if hits is None:
                    hits = self.engine.retrieve(names, req.query, top_k, rerank=False, **opts)
        except NotFoundError as exc:
            raise ApiError(404, E_NO_KNOWLEDGE, f"view {view.knowledge_id!r}: {exc}") from None
        except (InvalidArgumentError, InvalidTypeError) as exc:
            raise ApiError(400, E_BAD_REQUEST, str(exc)) from None
        except EmbedderUnavailableError as exc:
            raise ApiError(503, E_EMBEDDER_UNAVAILABLE, f"the query embedder is unavailable: {exc}") from None
        except EmbedderError as exc:
            raise ApiError(502, E_EMBEDDER_FAILED, f"the query embedder failed: {exc}") from None
        return _records(hits, threshold, rerank_error)  # in the merged order (by score, or by rank)

    def retrieve(self, req: Request) -> list[dict[str, Any]]:
        missing = ApiError(404, E_NO_KNOWLEDGE, f"knowledge base {req.knowledge_id!r} does not exist")
        try:
            kb = self.engine.get_knowledge_base(req.knowledge_id)
            self._maybe_refresh(kb)
            if not req.query.strip():
                return []  # nothing to match: what any retrieval finds for a blank query
            rerank_error = None
            try:
                hits = kb.retrieve(req.query, top_k=req.top_k, score_threshold=req.score_threshold, filters=req.where)
            except RerankerError as exc:  # a chatbot prefers the unreranked answer to none
                rerank_error = _short(str(exc))
                self._rerank_log.failed(kb.name, rerank_error)
                hits = getattr(exc, "first_stage", None)
                if hits is None:
                    hits = kb.retrieve(
                        req.query,
                        top_k=req.top_k,
                        score_threshold=req.score_threshold,
                        filters=req.where,
                        rerank=False,
                    )
        except NotFoundError:
            raise missing from None
        except (InvalidArgumentError, InvalidTypeError) as exc:
            raise ApiError(400, E_BAD_REQUEST, str(exc)) from None
        except EmbedderUnavailableError as exc:  # the embedding service is down or overloaded
            raise ApiError(503, E_EMBEDDER_UNAVAILABLE, f"the query embedder is unavailable: {exc}") from None
        except EmbedderError as exc:
            raise ApiError(502, E_EMBEDDER_FAILED, f"the query embedder failed: {exc}") from None
        records = _records(hits, req.score_threshold, rerank_error)
        records.sort(key=lambda r: -r["score"])
        return records


def _records(hits: Sequence[Any], threshold: float, rerank_error: str | None = None) -> list[dict[str, Any]]:
    """Dify records of hits scoring at least ``threshold``, in the hits' order; with
    ``rerank_error``, each says it was not reranked and why."""
    records = []
    for h in hits:
        score = min(max(float(h.score), 0.0), 1.0)
        if score < threshold:  # the engine applies it too; the contract is ours
            continue
        meta = dict(h.metadata) if isinstance(h.metadata, Mapping) else {}
        if rerank_error is not None:
            meta["reranked"] = False
            meta["rerank_error"] = rerank_error
        records.append(
            {
                "content": h.content,
                "score": score,
                "title": _title(meta, h.document_id),
                "metadata": meta,
            }
        )
    return records


# -- HTTP ------------------------------------------------------------------------------------


def _collapse_slashes(app: Any) -> Any:
    """ASGI wrapper: ``//retrieval`` (an endpoint registered with a trailing slash) and
    ``/retrieval/`` are ``/retrieval``."""

    async def wrapped(scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            path = scope.get("path", "")
            if "//" in path or (len(path) > 1 and path.endswith("/")):
                clean = "/" + "/".join(p for p in path.split("/") if p)
                scope = dict(scope, path=clean, raw_path=clean.encode("latin-1", "replace"))
        await app(scope, receive, send)

    return wrapped


def _reply(status: int, payload: Any, request_id: str, *, close: bool = False) -> Any:
    from starlette.responses import Response

    headers = {"X-Request-Id": request_id}
    if close:
        headers["Connection"] = "close"
    return Response(_dumps(payload), status_code=status, media_type="application/json", headers=headers)


async def _read_body(request: Any, service: _Service) -> bytes:
    """The body, within the size limit and the body timeout (ApiError 413 / 408)."""
    import anyio

    limit = service.max_body_bytes
    declared = (request.headers.get("content-length") or "").strip()
    too_large = declared.isascii() and declared.isdigit() and (len(declared) > 15 or int(declared) > limit)
    if too_large:
        raise ApiError(413, E_TOO_LARGE, f"the request body is {declared[:20]} bytes; the limit is {limit}")
    parts: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(service.body_timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, E_TOO_LARGE, f"the request body is over the limit of {limit} bytes")
                parts.append(chunk)
    except TimeoutError:
        raise ApiError(408, E_TIMEOUT, f"the request body did not arrive within {service.body_timeout:g} s") from None
    return b"".join(parts)


def _retrieval_endpoint(service: _Service) -> Any:
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect

    async def retrieval(request: Any) -> Any:
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:16]
        client = request.client.host if request.client else None
        knowledge_id = None
        try:
            token = _bearer_token(request.headers.get("authorization"))
            if not service.known(token):
                raise ApiError(403, E_AUTH_KEY, "authorization failed: the API key is not valid")
            body = await _read_body(request, service)
            req, records = await run_in_threadpool(service.handle, body, token)
        except ApiError as err:
            knowledge_id = err.knowledge_id
            _log_error(request_id, err, client=client, knowledge_id=knowledge_id, started=started)
            close = err.code == E_TIMEOUT  # a stalled client: do not wait for the rest
            payload = {"error_code": err.code, "error_msg": err.message}
            return _reply(err.status, payload, request_id, close=close)
        except ClientDisconnect:
            _log(
                logging.INFO,
                "client_disconnect",
                request_id=request_id,
                client=client,
                duration_ms=round((time.perf_counter() - started) * 1000.0, 3),
            )
            return _reply(
                400, {"error_code": E_BAD_REQUEST, "error_msg": "client disconnected"}, request_id, close=True
            )
        except Exception as exc:  # noqa: BLE001 - any failure must still answer and be logged
            internal = ApiError(
                500, E_INTERNAL, f"internal error ({type(exc).__name__}); see the server log, request id {request_id}"
            )
            _log_error(
                request_id,
                internal,
                client=client,
                knowledge_id=knowledge_id,
                started=started,
                exc_text="".join(traceback.format_exception(exc)),
            )
            return _reply(500, {"error_code": E_INTERNAL, "error_msg": internal.message}, request_id)
        _log_success(request_id, client, req, len(records), started)
        return _reply(200, {"records": records}, request_id)

    return retrieval


def _log_success(request_id: str, client: str | None, req: Request, n: int, started: float) -> None:
    if req.requested_top_k != req.top_k:
        _log(
            logging.WARNING,
            "top_k_clamped",
            request_id=request_id,
            client=client,
            knowledge_id=req.knowledge_id,
            requested_top_k=req.requested_top_k,
            top_k=req.top_k,
        )
    _log(
        logging.INFO,
        "retrieval",
        request_id=request_id,
        client=client,
        knowledge_id=req.knowledge_id,
        top_k=req.top_k,
        records=n,
        duration_ms=round((time.perf_counter() - started) * 1000.0, 3),
    )


async def _health(request: Any) -> Any:
    return _reply(200, {"status": "ok"}, uuid.uuid4().hex[:16])


async def _http_error(request: Any, exc: Exception) -> Any:
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "error"
    request_id = uuid.uuid4().hex[:16]
    path = request.url.path[:200]
    err = ApiError(status, status, f"{detail}: {request.method} {path} (the Dify endpoint is POST /retrieval)")
    client = request.client.host if request.client else None
    _log_error(request_id, err, client=client, knowledge_id=None, started=time.perf_counter())
    return _reply(status, {"error_code": status, "error_msg": err.message}, request_id)


def create_app(
    engine: Any,
    api_keys: Sequence[str],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_top_k: int = DEFAULT_MAX_TOP_K,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    views: str | os.PathLike[str] | Mapping[str, Any] | None = None,
) -> Any:
    """An ASGI app serving Dify's External Knowledge API over ``engine`` (an
    :class:`~kbcore.Engine` or a data directory). ``api_keys``: the accepted bearer keys (at
    least one). ``views``: a views file or its content (:mod:`kbcore.dify.views`), checked
    against the engine's knowledge bases now. Raises InvalidArgumentError for no key, a bad
    limit or a bad view; ImportError without ``pip install 'kbcore[server]'``. The Starlette
    app is ``app.starlette``."""
    try:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the Dify server needs Starlette and uvicorn: pip install 'kbcore[server]' ({exc})"
        ) from None

    if isinstance(engine, (str, os.PathLike)):
        from ..engine import Engine

        engine = Engine(engine)
    checked = None if views is None else load_views(views, knowledge_bases=engine)
    service = _Service(
        engine,
        list(api_keys),
        max_body_bytes=max_body_bytes,
        max_top_k=max_top_k,
        refresh_interval=refresh_interval,
        body_timeout=body_timeout,
        views=checked,
    )
    starlette = Starlette(
        routes=[
            Route("/retrieval", _retrieval_endpoint(service), methods=["POST"]),
            Route("/health", _health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
    )
    starlette.state.kbcore_engine = engine
    starlette.state.kbcore_views = service.views
    app = _collapse_slashes(starlette)
    app.starlette = starlette
    app.state = starlette.state
    return app


# -- running ---------------------------------------------------------------------------------


def _header_timeout_protocol(seconds: float, max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES) -> type:
    """uvicorn's HTTP protocol class, closing a connection whose next request head is not
    complete ``seconds`` after it connected or after its last response (uvicorn itself waits
    forever for a head, and a byte of one cancels its keep-alive timeout), or that sends more
    than ``max_head_bytes`` bytes before its head is complete (uvicorn's httptools parser
    buffers a head without limit; h11's limit is set by :func:`uvicorn_config` too)."""
    base: type
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol

    class _Protocol(base):
        _kbcore_timer: Any = None
        _kbcore_head_bytes = 0  # bytes received since the last complete head or response

        def data_received(self, data: bytes) -> None:
            waiting = self.cycle is None or self.cycle.response_complete
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # a head was completed: its size was within the cap
                self._kbcore_head_bytes = 0
            elif waiting and not self.transport.is_closing():
                self._kbcore_head_bytes += len(data)
                if self._kbcore_head_bytes > max_head_bytes:
                    _log(
                        logging.INFO,
                        "head_too_large",
                        client=(self.client or ("?",))[0],
                        max_head_bytes=max_head_bytes,
                    )
                    self.transport.write(
                        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                        b"content-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
                        b"content-length: 31\r\n\r\nthe request head is too large.\n"
                    )
                    self.transport.close()

        def _kbcore_arm(self) -> None:
            if self._kbcore_timer is not None:
                self._kbcore_timer.cancel()
            self._kbcore_timer = self.loop.call_later(seconds, self._kbcore_head_timeout)

        def _kbcore_head_timeout(self) -> None:
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and not self.transport.is_closing():
                _log(logging.INFO, "header_timeout", client=(self.client or ("?",))[0])
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._kbcore_arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._kbcore_arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._kbcore_timer is not None:
                self._kbcore_timer.cancel()
            super().connection_lost(exc)

    return _Protocol


def uvicorn_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    keep_alive_timeout: int = DEFAULT_KEEP_ALIVE_TIMEOUT,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
) -> Any:
    """The ``uvicorn.Config`` that :func:`serve` runs ``app`` with: a connection cap
    (``limit_concurrency``: 503 beyond it), the keep-alive timeout, a header timeout and a
    request head size cap (``max_head_bytes``: 431 and closed beyond it)."""
    import uvicorn

    _check_limit("max_connections", max_connections, 1, integer=True)
    _check_limit("keep_alive_timeout", keep_alive_timeout, 1, integer=True)
    _check_limit("header_timeout", header_timeout, 0.001, integer=False)
    _check_limit("max_head_bytes", max_head_bytes, 1024, integer=True)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
        log_config=None,
        http=_header_timeout_protocol(float(header_timeout), int(max_head_bytes)),
        h11_max_incomplete_event_size=int(max_head_bytes),
        limit_concurrency=max_connections,
        timeout_keep_alive=keep_alive_timeout,
    )


class _JsonLines(logging.Formatter):
    """kbcore.server records are JSON already; other records (uvicorn's) are wrapped."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.name == log.name and msg.startswith("{"):
            return msg
        return _dumps({"event": "log", "logger": record.name, "level": record.levelname, "message": msg}).decode(
            "utf-8"
        )


def _configure_logging(level: str) -> None:
    import sys

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonLines())
    for name in (log.name, "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.propagate = False
        lg.setLevel(level.upper())


def serve(
    data: str | os.PathLike[str],
    api_keys: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_top_k: int = DEFAULT_MAX_TOP_K,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    keep_alive_timeout: int = DEFAULT_KEEP_ALIVE_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    log_level: str = "info",
    embedder: Any = None,
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
    views: str | os.PathLike[str] | None = None,
    mmap: bool = True,
) -> None:
    """Serves the knowledge bases in ``data`` with uvicorn until interrupted. Raises
    InvalidArgumentError for no key or a bad limit, ImportError without uvicorn.

    Knowledge bases rebuild the embedder their manifest records; ``embedder`` (the engine's
    default) serves those built with a custom one. ``mmap`` is the engine's
    (:class:`kbcore.engine.Engine`): False copies each index checkpoint into memory."""
    try:
        import uvicorn
    except ImportError:
        raise ImportError("kbcore serve needs uvicorn and Starlette: pip install 'kbcore[server]'") from None
    from ..engine import Engine

    _KeyRing(api_keys)
    engine = Engine(data, embedder=embedder, mmap=mmap)
    try:
        app = create_app(
            engine,
            api_keys,
            max_body_bytes=max_body_bytes,
            max_top_k=max_top_k,
            refresh_interval=refresh_interval,
            body_timeout=body_timeout,
            views=views,
        )
        config = uvicorn_config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            max_connections=max_connections,
            keep_alive_timeout=keep_alive_timeout,
            header_timeout=header_timeout,
            max_head_bytes=max_head_bytes,
        )
        _configure_logging(log_level)
        _log(
            logging.INFO,
            "start",
            data=str(engine.path),
            knowledge_bases=engine.knowledge_bases(),
            url=f"http://{host}:{port}/retrieval",
            keys=len(api_keys),
            views=sorted(app.starlette.state.kbcore_views),
        )
        uvicorn.Server(config).run()
    finally:
        engine.close()
