"""POST JSON to a remote service with bounded time, bounded memory and no credential leaks.

The transport shared by the HTTP clients (:mod:`kbcore.embedders.openai`, the rerank client):
standard library only (``urllib``, so ``HTTP(S)_PROXY`` keep working), imported on first use.

What it guarantees, whatever the server does:

- **Time.** ``deadline`` seconds bound the whole call: connecting, sending, every retry and its
  wait, and reading the answer. Every socket operation waits at most
  ``min(timeout, time left)``, so a server that drips a byte at a time cannot stretch the call.
- **Memory.** At most ``max_response_bytes`` of body are read (a larger ``Content-Length`` is
  refused before reading); headers are bounded by :mod:`http.client` (100 lines of 64 KiB).
- **Credentials.** Redirects are followed only to the same origin (scheme, host, port) and only
  when they keep the method and body (307 / 308); any other redirect is refused with ``error``,
  so a key in the headers never reaches another origin.
- **Parsing.** The answer must be JSON in UTF-8; nesting deeper than the interpreter can parse
  (``RecursionError``) is ``error``, never a crash of the caller.

Retries: connection errors, timeouts and HTTP 408 / 409 / 429 / 5xx (:data:`RETRY_STATUSES`) are
retried up to ``max_retries`` times with exponential backoff, or after the ``Retry-After`` /
``retry-after-ms`` the server asks for (refused at once beyond ``max_retry_after``), as long as
the deadline allows.
"""

from __future__ import annotations

import io
import json
import math
import random
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

from .errors import InvalidArgumentError, KbcoreError

__all__ = [
    "post_json",
    "RETRY_STATUSES",
    "DEFAULT_TIMEOUT",
    "DEFAULT_DEADLINE",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "origin",
]

#: HTTP statuses that are retried: request timeout, conflict/lock, rate limit, server errors.
RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
#: Seconds one socket operation (connect, send, one read) may wait.
DEFAULT_TIMEOUT = 60.0
#: Seconds a whole call may take, retries and waits included.
DEFAULT_DEADLINE = 300.0
#: Bytes of response body read at most (64 MiB: 2,048 float vectors of 3,072 dimensions as JSON).
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
_MAX_ERROR_CHARS = 300
_MAX_ERROR_BYTES = 64 * 1024
_READ_CHUNK = 64 * 1024
_MAX_REDIRECTS = 5


def _new(cls: type[KbcoreError], message: str, *, endpoint: str, status: int | None = None) -> KbcoreError:
    """``cls(message, endpoint=, status=)``: the error classes callers pass take these (like
    :class:`~kbcore.errors.EmbedderError`), which the base class does not declare."""
    return cls(message, endpoint=endpoint, status=status)  # type: ignore[call-arg]


def origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of ``url``, with the scheme's default port filled in."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


class _Deadline:
    """The instant (``time.monotonic``) a call must be over by, and the per-operation timeout."""

    def __init__(self, seconds: float, timeout: float) -> None:
        self.seconds = seconds
        self.timeout = timeout
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def op_timeout(self) -> float:
        """Seconds the next socket operation may wait; TimeoutError once the deadline passed."""
        left = self.left()
        if left <= 0:
            raise TimeoutError(f"deadline={self.seconds:g} s reached")
        return min(self.timeout, left)


class _DeadlineReader(io.RawIOBase):
    """A socket's read side where each ``recv`` waits at most ``min(timeout, time left)``.

    Wraps the socket's own unbuffered ``makefile("rb")``, which keeps the descriptor open until
    the response is closed even after :mod:`http.client` closes the connection."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._deadline.op_timeout())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _DeadlineSocket:
    """Wraps a connected socket so :mod:`http.client` reads and writes under a deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: Any) -> None:
        self._sock.settimeout(self._deadline.op_timeout())
        self._sock.sendall(data)

    def makefile(self, mode: str = "r", *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"unsupported mode {mode!r}")
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _handlers(deadline: _Deadline, endpoint: str, error: type[KbcoreError]) -> list[Any]:
    import http.client
    import urllib.request

    class HTTPConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.timeout = deadline.op_timeout()
            super().connect()
            self.sock = _DeadlineSocket(self.sock, deadline)

    class HTTPSConnection(http.client.HTTPSConnection):
        def connect(self) -> None:
            self.timeout = deadline.op_timeout()
            super().connect()
            self.sock = _DeadlineSocket(self.sock, deadline)

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(HTTPConnection, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(HTTPSConnection, req, context=getattr(self, "_context", None))

    class RedirectHandler(urllib.request.HTTPRedirectHandler):
        max_redirections = _MAX_REDIRECTS

        def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
            if origin(newurl) != origin(req.full_url) or code not in (307, 308):
                fp.close()  # refused: release the connection now
            if origin(newurl) != origin(req.full_url):
                raise _new(
                    error,
                    f"{endpoint} redirected (HTTP {code}) to another origin, {_origin_text(newurl)}; "
                    "not followed, so that credentials never leave the configured origin "
                    "(set the base URL to where the service really is)",
                    endpoint=endpoint,
                    status=code,
                )
            if code not in (307, 308):
                raise _new(
                    error,
                    f"{endpoint} redirected (HTTP {code}) to {newurl}, which would turn the POST into "
                    "a GET; not followed (set the base URL to where the service really is)",
                    endpoint=endpoint,
                    status=code,
                )
            return urllib.request.Request(
                newurl,
                data=req.data,
                headers={**req.headers, **req.unredirected_hdrs},
                origin_req_host=req.origin_req_host,
                method=req.get_method(),
            )

    return [HTTPHandler(), HTTPSHandler(), RedirectHandler()]


def _origin_text(url: str) -> str:
    scheme, host, port = origin(url)
    return f"{scheme}://{host}:{port}" if port is not None else f"{scheme}://{host}"


def _retry_after(headers: Any) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000.0
            if math.isfinite(value) and value >= 0:
                return value
        except ValueError:
            pass
    ra = headers.get("retry-after")
    if ra is None:
        return None
    ra = ra.strip()
    try:
        value = float(ra)
        return value if math.isfinite(value) and value >= 0 else None
    except ValueError:
        pass
    import email.utils

    try:
        when = email.utils.parsedate_to_datetime(ra)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_detail(exc: Any) -> str:
    """A short, single-line reason from an HTTP error body (the service's message if JSON)."""
    try:
        raw = exc.read(_MAX_ERROR_BYTES)
    except Exception:  # noqa: BLE001 - the body is only decoration for the message
        raw = b""
    text = raw.decode("utf-8", "replace").strip() if raw else ""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        obj = None
    message = None
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("message", obj.get("detail")))
        if isinstance(err, dict):
            message = err.get("message") or err.get("code")
        elif err is not None:
            message = err if isinstance(err, str) else str(err)
    detail = str(message) if message else (text or str(getattr(exc, "reason", "") or ""))
    detail = " ".join(detail.split())
    if len(detail) > _MAX_ERROR_CHARS:
        detail = detail[:_MAX_ERROR_CHARS] + "..."
    return detail


def _read_capped(resp: Any, cap: int, endpoint: str, error: type[KbcoreError]) -> bytes:
    length = resp.headers.get("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > cap:
        raise _new(
            error,
            f"the answer of {endpoint} announces {int(length):,} bytes, more than max_response_bytes={cap:,}",
            endpoint=endpoint,
            status=resp.status,
        )
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = resp.read1(_READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > cap:
            raise _new(
                error,
                f"the answer of {endpoint} is larger than max_response_bytes={cap:,}",
                endpoint=endpoint,
                status=resp.status,
            )
        chunks.append(chunk)


def parse_json(raw: bytes, endpoint: str, error: type[KbcoreError]) -> object:
    """``raw`` as JSON; ``error`` for anything else (not UTF-8, not JSON, nested too deeply)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise _new(error, f"invalid response from {endpoint}: JSON nested too deeply", endpoint=endpoint) from None
    except ValueError:
        snippet = " ".join(raw[:120].decode("utf-8", "replace").split())
        raise _new(
            error, f"invalid response from {endpoint}: not JSON (starts with {snippet!r})", endpoint=endpoint
        ) from None


def post_json(
    url: str,
    payload: object,
    *,
    headers: Mapping[str, str],
    timeout: float,
    deadline: float,
    max_retries: int,
    max_response_bytes: int,
    error: type[KbcoreError],
    unavailable: type[KbcoreError],
    scrub: Callable[[str], str] | None = None,
    what: str | None = None,
    backoff: float = 0.5,
    max_backoff: float = 20.0,
    max_retry_after: float = 60.0,
    sleep: Callable[[float], None] | None = None,
    rng: random.Random | None = None,
    on_request: Callable[[], None] | None = None,
) -> object:
    """POST ``payload`` as JSON to ``url`` and return the decoded JSON answer.

    ``headers`` are sent as given (add the credentials here; they never go to another origin).
    ``timeout``: seconds per socket operation; ``deadline``: seconds for the whole call, retries
    and waits included; ``max_retries``: retries after the first attempt; ``max_response_bytes``:
    the largest body read. ``error`` / ``unavailable`` are the exception classes raised (called
    as ``cls(message, endpoint=url, status=...)``): ``unavailable`` when the service stayed
    unreachable, overloaded or too slow, ``error`` when it refused the request (another 4xx),
    redirected away, or answered something too large or not JSON. ``scrub`` removes secrets from
    server text before it goes into a message. ``what`` names the request in messages
    (default: ``"request to URL"``). ``backoff`` / ``max_backoff`` / ``max_retry_after`` /
    ``sleep`` / ``rng`` tune the waits between retries (seconds; ``sleep`` and ``rng`` for
    tests); ``on_request`` is called once per attempt sent.
    """
    import urllib.error
    import urllib.request

    clean = scrub if scrub is not None else (lambda s: s)
    where = what or f"request to {url}"
    wait_fn = sleep if sleep is not None else time.sleep
    rand = rng if rng is not None else random.Random()
    limit = _Deadline(deadline, timeout)
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    send_headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
    opener = urllib.request.build_opener(*_handlers(limit, url, error))
    attempts = max_retries + 1
    last = ""
    last_status: int | None = None
    attempt = 0
    for attempt in range(attempts):
        wait: float | None = None
        request = urllib.request.Request(url, data=body, headers=send_headers, method="POST")
        if on_request is not None:
            on_request()
        try:
            if limit.left() <= 0:
                raise TimeoutError
            with opener.open(request, timeout=limit.op_timeout()) as resp:
                raw = _read_capped(resp, max_response_bytes, url, error)
            return parse_json(raw, url, error)
        except KbcoreError:
            raise
        except urllib.error.HTTPError as exc:
            status = int(exc.code)
            detail = clean(_error_detail(exc))
            exc.close()
            last, last_status = f"HTTP {status}{': ' + detail if detail else ''}", status
            if status not in RETRY_STATUSES:
                raise _new(error, f"{where} failed: {last}", endpoint=url, status=status) from None
            wait = _retry_after(exc.headers)
            if wait is not None and wait > max_retry_after:
                raise _new(
                    unavailable,
                    f"{where} failed: {last}; the service asks to retry after {wait:.0f} s, "
                    f"more than max_retry_after={max_retry_after:g} s",
                    endpoint=url,
                    status=status,
                ) from None
        except TimeoutError:
            last, last_status = _timeout_text(limit), None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                last = _timeout_text(limit)
            else:
                last = f"cannot connect: {clean(str(reason))}"
            last_status = None
        except (ConnectionError, OSError) as exc:  # reset mid-response, bad status line...
            last, last_status = f"connection failed: {clean(str(exc) or type(exc).__name__)}", None
        except Exception as exc:  # noqa: BLE001 - http.client's protocol errors are not OSError
            last, last_status = f"connection failed: {type(exc).__name__}: {clean(str(exc))}", None
        if attempt + 1 >= attempts:
            break
        if wait is None:
            wait = min(max_backoff, backoff * (2.0**attempt))
            wait *= 1.0 - 0.25 * rand.random()
        if wait >= limit.left():
            break
        wait_fn(wait)
    done = attempt + 1
    tries = f"{done} attempt{'s' if done != 1 else ''}"
    if done < attempts:
        tries += f" (deadline={deadline:g} s reached)"
    raise _new(unavailable, f"{where} failed after {tries}: {last}", endpoint=url, status=last_status)


def _timeout_text(limit: _Deadline) -> str:
    if limit.left() <= 0:
        return f"no complete answer within deadline={limit.seconds:g} s"
    return f"no answer within timeout={limit.timeout:g} s"


def service_url(base_url: Any, route: str, example: str) -> str:
    """``base_url`` checked (http or https, a host, no credentials in it) with ``/route``
    appended unless its path already ends so. ``example`` is a valid base URL, quoted in the
    error."""
    parts = _base_url_parts(base_url, example)
    path = parts.path.rstrip("/")
    if not path.endswith("/" + route):
        path += "/" + route
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _base_url_parts(base_url: Any, example: str) -> SplitResult:
    if not isinstance(base_url, str) or not base_url.strip():
        raise InvalidArgumentError(f"base_url must be a non-empty URL, got {base_url!r}")
    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgumentError(
            f"base_url must be an http:// or https:// URL with a host, got {base_url!r} (e.g. {example})"
        )
    if parts.username is not None or parts.password is not None:
        raise InvalidArgumentError(
            "base_url must not contain credentials (user:password@); the key is read from the "
            "environment variable named by api_key_env"
        )
    return parts
