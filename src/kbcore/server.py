"""Dify's External Knowledge API over kbcore knowledge bases: ``POST /retrieval``.

Start it with ``kbcore serve --data ./kb-data --api-key KEY`` (``pip install 'kbcore[server]'``),
then register ``http://HOST:PORT`` as an external knowledge API in Dify and use a knowledge
base's name as the "external knowledge ID".

Request (JSON)::

    {"knowledge_id": "docs", "query": "how do I rotate keys?",
     "retrieval_setting": {"top_k": 5, "score_threshold": 0.5},
     "metadata_condition": {"logical_operator": "and",
                            "conditions": [{"name": "team", "comparison_operator": "is",
                                            "value": "infra"}]}}

Response: ``{"records": [{"content", "score", "title", "metadata"}, ...]}``, best first.
``score`` is the engine's score in [0, 1] (see :mod:`kbcore.engine`); records scoring below
``score_threshold`` are dropped here, on the server. ``title`` is the document's ``title``
metadata if it has one, else its filename, else its document id. ``metadata`` is always an
object: the chunk's metadata (``document_id``, ``file_id``, ``chunk_index``, ``filename``,
``pipeline_name`` and the user's fields).

``metadata_condition`` is translated by :func:`kbcore.filters.dify_condition_to_where` and
evaluated natively; an operator that cannot apply is a 400, never silently ignored.

Errors are ``{"error_code": int, "error_msg": str}`` with these codes:

====  ======  =====================================================================
code  status  meaning
====  ======  =====================================================================
1001  403     missing or malformed ``Authorization: Bearer <key>`` header (Dify)
1002  403     the key is not one of the configured keys (Dify)
2001  404     no knowledge base named ``knowledge_id`` (Dify)
3000  400     empty body: Dify's registration probe (the key is valid)
3001  400     malformed request (not JSON, a missing or mistyped field, a limit)
3002  400     ``metadata_condition`` cannot be applied (unknown operator, bad value)
3003  413     the request body is larger than the limit
5000  500     unexpected server error (logged with its traceback)
5002  502     the query embedder failed (its service refused the request or answered garbage)
5003  503     the query embedder's service is unreachable or overloaded: try again later
====  ======  =====================================================================

Every error is logged as one JSON line on the ``kbcore.server`` logger (Dify may hide a
non-200 reply from its user, so the log is where the reason is found), with the request id
that is also sent back in the ``X-Request-Id`` header. Keys are compared in constant time
and never logged.

Concurrency: retrievals run on a thread pool (the engine releases the GIL in native search);
a knowledge base changed by another process (``kbcore ingest`` while the server runs) is
reloaded at most every ``refresh_interval`` seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import math
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import EmbedderError, EmbedderUnavailableError, InvalidArgumentError, InvalidTypeError, NotFoundError
from .filters import compile_where, dify_condition_to_where

__all__ = [
    "API_KEYS_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_TOP_K",
    "add_serve_parser",
    "create_app",
    "parse_api_keys",
    "serve",
]

#: Environment variable holding API keys, separated by commas or whitespace.
API_KEYS_ENV = "KBCORE_API_KEYS"
#: Default request body limit (bytes).
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Default largest ``top_k`` a request may ask for.
DEFAULT_MAX_TOP_K = 100
#: Default seconds between checks for changes made by other processes.
DEFAULT_REFRESH_INTERVAL = 1.0

log = logging.getLogger("kbcore.server")

# error codes (see the module docstring)
E_AUTH_HEADER = 1001
E_AUTH_KEY = 1002
E_NO_KNOWLEDGE = 2001
E_EMPTY_BODY = 3000
E_BAD_REQUEST = 3001
E_BAD_CONDITION = 3002
E_TOO_LARGE = 3003
E_INTERNAL = 5000
E_EMBEDDER = 5002
E_EMBEDDER_UNAVAILABLE = 5003


class _ApiError(Exception):
    """An error reply: HTTP status, error code and message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


# -- keys ------------------------------------------------------------------------------------


def parse_api_keys(
    keys: Iterable[str] | None = None, env: Mapping[str, str] | None = None
) -> list[str]:
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
            raise InvalidArgumentError(
                f"no API key configured: pass --api-key KEY or set {API_KEYS_ENV}"
            )
        self._digests = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]

    def __contains__(self, token: str) -> bool:
        d = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        ok = False
        for ref in self._digests:
            ok |= hmac.compare_digest(d, ref)
        return ok


def _bearer_token(header: str | None) -> str:
    if header is None or not header.strip():
        raise _ApiError(
            403,
            E_AUTH_HEADER,
            "missing Authorization header; expected 'Authorization: Bearer <api-key>'",
        )
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise _ApiError(
            403,
            E_AUTH_HEADER,
            "invalid Authorization header format; expected 'Authorization: Bearer <api-key>'",
        )
    return token


# -- request parsing -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    knowledge_id: str
    query: str
    top_k: int
    score_threshold: float
    where: dict | None


def _type_name(v: Any) -> str:
    return {type(None): "null", bool: "boolean", str: "string", list: "array", dict: "object"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__
    )


def _parse_request(body: bytes, max_top_k: int) -> _Request:
    if not body.strip():
        raise _ApiError(
            400,
            E_EMPTY_BODY,
            "empty request body; the API key is valid. POST a JSON object with knowledge_id, "
            "query and retrieval_setting {top_k, score_threshold}",
        )
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _ApiError(400, E_BAD_REQUEST, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _ApiError(
            400, E_BAD_REQUEST, f"the request body must be a JSON object, got {_type_name(data)}"
        )

    kid = data.get("knowledge_id")
    if not isinstance(kid, str) or not kid.strip():
        got = "nothing" if kid is None else repr(kid) if isinstance(kid, str) else _type_name(kid)
        raise _ApiError(400, E_BAD_REQUEST, f"knowledge_id must be a non-empty string, got {got}")
    query = data.get("query")
    if not isinstance(query, str):
        got = "nothing" if query is None else _type_name(query)
        raise _ApiError(400, E_BAD_REQUEST, f"query must be a string, got {got}")
    if not query.strip():
        raise _ApiError(400, E_BAD_REQUEST, "query is empty")

    setting = data.get("retrieval_setting")
    if setting is None:
        setting = {}
    if not isinstance(setting, dict):
        raise _ApiError(
            400, E_BAD_REQUEST, f"retrieval_setting must be an object, got {_type_name(setting)}"
        )
    top_k = setting.get("top_k", 5)
    if top_k is None:
        top_k = 5
    if isinstance(top_k, float) and top_k.is_integer():
        top_k = int(top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise _ApiError(
            400,
            E_BAD_REQUEST,
            f"retrieval_setting.top_k must be an integer, got {_type_name(top_k)}",
        )
    if top_k < 1:
        raise _ApiError(
            400, E_BAD_REQUEST, f"retrieval_setting.top_k must be at least 1, got {top_k}"
        )
    if top_k > max_top_k:
        raise _ApiError(
            400,
            E_BAD_REQUEST,
            f"retrieval_setting.top_k is {top_k}; this server allows at most {max_top_k} "
            "(kbcore serve --max-top-k)",
        )
    threshold = setting.get("score_threshold", 0.0)
    if threshold is None:
        threshold = 0.0
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not math.isfinite(threshold)
    ):
        raise _ApiError(
            400,
            E_BAD_REQUEST,
            f"retrieval_setting.score_threshold must be a number, got {_type_name(threshold)}",
        )
    if not 0.0 <= threshold <= 1.0:
        raise _ApiError(
            400,
            E_BAD_REQUEST,
            f"retrieval_setting.score_threshold must be within [0, 1], got {threshold}",
        )

    try:
        where = dify_condition_to_where(data.get("metadata_condition"))
        if where is not None:
            compile_where(where)  # every filter error is reported here, as a condition error
    except (InvalidArgumentError, InvalidTypeError) as exc:
        raise _ApiError(400, E_BAD_CONDITION, str(exc)) from None
    return _Request(kid, query, top_k, float(threshold), where)


# -- the service -----------------------------------------------------------------------------


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
    return json.dumps(
        _finite(payload),
        ensure_ascii=False,
        allow_nan=False,
        default=_json_default,
        separators=(",", ":"),
    ).encode("utf-8")


def _title(meta: Mapping[str, Any], document_id: str) -> str:
    for key in ("title", "filename"):
        v = meta.get(key)
        if isinstance(v, str) and v.strip():
            return v
    return document_id


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
    ) -> None:
        if (
            isinstance(max_body_bytes, bool)
            or not isinstance(max_body_bytes, int)
            or max_body_bytes < 1024
        ):
            raise InvalidArgumentError(
                f"max_body_bytes must be an integer >= 1024, got {max_body_bytes!r}"
            )
        if isinstance(max_top_k, bool) or not isinstance(max_top_k, int) or max_top_k < 1:
            raise InvalidArgumentError(f"max_top_k must be a positive integer, got {max_top_k!r}")
        if not isinstance(refresh_interval, (int, float)) or refresh_interval < 0:
            raise InvalidArgumentError(f"refresh_interval must be >= 0, got {refresh_interval!r}")
        self.engine = engine
        self.keys = _KeyRing(keys)
        self.max_body_bytes = max_body_bytes
        self.max_top_k = max_top_k
        self.refresh_interval = float(refresh_interval)
        self._refreshed: dict[str, float] = {}
        self._refresh_lock = threading.Lock()

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

    def retrieve(self, req: _Request) -> list[dict[str, Any]]:
        """Runs on a worker thread."""
        try:
            kb = self.engine.get_knowledge_base(req.knowledge_id)
            self._maybe_refresh(kb)
        except NotFoundError:
            raise _ApiError(
                404, E_NO_KNOWLEDGE, f"knowledge base {req.knowledge_id!r} does not exist"
            ) from None
        try:
            hits = kb.retrieve(
                req.query, top_k=req.top_k, score_threshold=req.score_threshold, filters=req.where
            )
        except NotFoundError:
            raise _ApiError(
                404, E_NO_KNOWLEDGE, f"knowledge base {req.knowledge_id!r} does not exist"
            ) from None
        except (InvalidArgumentError, InvalidTypeError) as exc:
            raise _ApiError(400, E_BAD_REQUEST, str(exc)) from None
        except EmbedderUnavailableError as exc:  # the embedding service is down or overloaded
            raise _ApiError(503, E_EMBEDDER_UNAVAILABLE, f"the query embedder is unavailable: {exc}") from None
        except EmbedderError as exc:
            raise _ApiError(502, E_EMBEDDER, f"the query embedder failed: {exc}") from None
        records = []
        for h in hits:
            score = min(max(float(h.score), 0.0), 1.0)
            if score < req.score_threshold:  # the engine applies it too; the contract is ours
                continue
            meta = dict(h.metadata) if isinstance(h.metadata, Mapping) else {}
            records.append(
                {
                    "content": h.content,
                    "score": score,
                    "title": _title(meta, h.document_id),
                    "metadata": meta,
                }
            )
        records.sort(key=lambda r: -r["score"])
        return records


def _log_error(
    request_id: str,
    err: _ApiError,
    *,
    client: str | None,
    knowledge_id: str | None,
    started: float,
    exc_text: str | None = None,
) -> None:
    record: dict[str, Any] = {
        "event": "retrieval_error",
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
    log.log(logging.ERROR if err.status >= 500 else logging.WARNING, _dumps(record).decode("utf-8"))


def create_app(
    engine: Any,
    api_keys: Sequence[str],
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_top_k: int = DEFAULT_MAX_TOP_K,
    refresh_interval: float = DEFAULT_REFRESH_INTERVAL,
) -> Any:
    """A Starlette app serving Dify's External Knowledge API over ``engine`` (an
    :class:`~kbcore.Engine` or a data directory). ``api_keys``: the accepted bearer keys (at
    least one). Needs ``pip install 'kbcore[server]'``."""
    try:
        from starlette.applications import Starlette
        from starlette.concurrency import run_in_threadpool
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the Dify server needs Starlette and uvicorn: pip install 'kbcore[server]' ({exc})"
        ) from None

    if isinstance(engine, (str, os.PathLike)):
        from .engine import Engine

        engine = Engine(engine)
    service = _Service(
        engine,
        list(api_keys),
        max_body_bytes=max_body_bytes,
        max_top_k=max_top_k,
        refresh_interval=refresh_interval,
    )

    def reply(status: int, payload: Any, request_id: str) -> Response:
        return Response(
            _dumps(payload),
            status_code=status,
            media_type="application/json",
            headers={"X-Request-Id": request_id},
        )

    async def read_body(request: Request) -> bytes:
        limit = service.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise _ApiError(
                413, E_TOO_LARGE, f"the request body is {int(declared)} bytes; the limit is {limit}"
            )
        parts: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _ApiError(
                    413, E_TOO_LARGE, f"the request body is larger than the limit of {limit} bytes"
                )
            parts.append(chunk)
        return b"".join(parts)

    async def retrieval(request: Request) -> Response:
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:16]
        client = request.client.host if request.client else None
        knowledge_id = None
        try:
            token = _bearer_token(request.headers.get("authorization"))
            if token not in service.keys:
                raise _ApiError(403, E_AUTH_KEY, "authorization failed: the API key is not valid")
            req = _parse_request(await read_body(request), service.max_top_k)
            knowledge_id = req.knowledge_id
            records = await run_in_threadpool(service.retrieve, req)
        except _ApiError as err:
            _log_error(request_id, err, client=client, knowledge_id=knowledge_id, started=started)
            return reply(err.status, {"error_code": err.code, "error_msg": err.message}, request_id)
        except Exception as exc:  # noqa: BLE001 - any failure must still answer and be logged
            err = _ApiError(
                500,
                E_INTERNAL,
                f"internal error ({type(exc).__name__}); see the server log, "
                f"request id {request_id}",
            )
            _log_error(
                request_id,
                err,
                client=client,
                knowledge_id=knowledge_id,
                started=started,
                exc_text="".join(traceback.format_exception(exc)),
            )
            return reply(500, {"error_code": E_INTERNAL, "error_msg": err.message}, request_id)
        if log.isEnabledFor(logging.INFO):
            log.info(
                _dumps(
                    {
                        "event": "retrieval",
                        "request_id": request_id,
                        "client": client,
                        "knowledge_id": knowledge_id,
                        "top_k": req.top_k,
                        "records": len(records),
                        "duration_ms": round((time.perf_counter() - started) * 1000.0, 3),
                    }
                ).decode("utf-8")
            )
        return reply(200, {"records": records}, request_id)

    async def health(request: Request) -> Response:
        return reply(200, {"status": "ok"}, uuid.uuid4().hex[:16])

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        detail = getattr(exc, "detail", None) or "error"
        request_id = uuid.uuid4().hex[:16]
        err = _ApiError(
            status,
            status,
            f"{detail}: {request.method} {request.url.path} (the Dify endpoint is POST /retrieval)",
        )
        _log_error(
            request_id,
            err,
            client=request.client.host if request.client else None,
            knowledge_id=None,
            started=time.perf_counter(),
        )
        return reply(status, {"error_code": status, "error_msg": err.message}, request_id)

    app = Starlette(
        routes=[
            Route("/retrieval", retrieval, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error},
    )
    app.state.kbcore_engine = engine
    return app


# -- running ---------------------------------------------------------------------------------


class _JsonLines(logging.Formatter):
    """kbcore.server records are JSON already; other records (uvicorn's) are wrapped."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.name == log.name and msg.startswith("{"):
            return msg
        return _dumps(
            {"event": "log", "logger": record.name, "level": record.levelname, "message": msg}
        ).decode("utf-8")


def _configure_logging(level: str) -> None:
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
    log_level: str = "info",
    embedder: Any = None,
) -> None:
    """Serves the knowledge bases in ``data`` with uvicorn until interrupted.

    ``embedder`` is the engine's default (see :class:`~kbcore.engine.Engine`): knowledge bases
    rebuild the embedder their manifest records, this one serves those built with a custom one.
    """
    try:
        import uvicorn
    except ImportError:
        raise ImportError(
            "kbcore serve needs uvicorn and Starlette: pip install 'kbcore[server]'"
        ) from None
    from .engine import Engine

    engine = Engine(data, embedder=embedder or None)
    app = create_app(
        engine,
        api_keys,
        max_body_bytes=max_body_bytes,
        max_top_k=max_top_k,
        refresh_interval=refresh_interval,
    )
    _configure_logging(log_level)
    names = engine.knowledge_bases()
    log.info(
        _dumps(
            {
                "event": "start",
                "data": engine.path,
                "knowledge_bases": names,
                "url": f"http://{host}:{port}/retrieval",
                "keys": len(api_keys),
            }
        ).decode("utf-8")
    )
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level.lower(),
            access_log=False,
            log_config=None,
        )
    finally:
        engine.close()


def add_serve_parser(sub: Any) -> argparse.ArgumentParser:
    """Adds the ``serve`` subcommand to the ``kbcore`` command line."""
    p = sub.add_parser(
        "serve",
        help="serve knowledge bases over Dify's External Knowledge API (POST /retrieval)",
        description="Serves the knowledge bases of a data directory over Dify's External "
        f"Knowledge API. Keys come from --api-key and from ${API_KEYS_ENV} (comma separated); "
        "prefer the variable, command lines are visible to other users.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"an accepted bearer key (repeatable; also ${API_KEYS_ENV})",
    )
    p.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help="data directory of the knowledge bases (default $KBCORE_HOME or ./kb-data)",
    )
    p.add_argument(
        "--max-top-k",
        type=int,
        default=DEFAULT_MAX_TOP_K,
        help=f"largest top_k a request may ask for (default {DEFAULT_MAX_TOP_K})",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"request body limit in bytes (default {DEFAULT_MAX_BODY_BYTES})",
    )
    p.add_argument(
        "--refresh-interval",
        type=float,
        default=DEFAULT_REFRESH_INTERVAL,
        help="seconds between checks for changes by other processes (0: never)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    from .embedders import add_embedder_arguments

    add_embedder_arguments(p)
    p.set_defaults(func=_cmd_serve)
    return p


def _cmd_serve(args: argparse.Namespace) -> int:
    from .embedders import embedder_from_cli_args
    from .engine import default_data_dir

    try:
        keys = parse_api_keys(args.api_key)
        _KeyRing(keys)
        embedder = embedder_from_cli_args(args)
    except (ImportError, InvalidArgumentError) as exc:
        print(f"kbcore serve: {exc}", file=sys.stderr)
        return 2
    try:
        serve(
            args.data or default_data_dir(),
            keys,
            host=args.host,
            port=args.port,
            max_body_bytes=args.max_body_bytes,
            max_top_k=args.max_top_k,
            refresh_interval=args.refresh_interval,
            log_level=args.log_level,
            embedder=embedder,
        )
    except (ImportError, InvalidArgumentError) as exc:
        print(f"kbcore serve: {exc}", file=sys.stderr)
        return 2
    return 0
