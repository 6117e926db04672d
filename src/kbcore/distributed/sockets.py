"""The socket scatter path: each shard serves read-only queries on its own socket.

With ``transport="socket"`` every shard actor, asked once by the driver
(``ShardActor.serve_socket``), starts a :class:`ShardServer` in its own process: a listening
socket plus one thread per connection. A Unix-domain socket (the abstract namespace on Linux,
else a private temporary directory) when the driver runs on the same Ray node, TCP on the
node's IP address otherwise. The driver (:class:`SocketScatter`) keeps its connections; a
query writes the packed request (:func:`~.transport.pack_request`) to every shard's socket
first, then waits for the answers with ``poll`` and a deadline (no busy polling), and the
caller decodes them (:func:`~.transport.unpack_reply`) and merges as on the other paths. It
is an *accelerator* of the actor path, never a replacement:

- only read-only queries travel over it (``_COMPILED_METHODS`` on the driver; the server
  refuses any other method); writes take the actor path;
- a shard's own error (bad filter, storage error) comes back pickled and is re-raised as
  the actor path raises it; the connection stays usable;
- any system failure (connection refused, reset, EOF, a timeout, a malformed answer) closes
  that shard's connections, forgets its address and returns ``None``: the caller repeats the
  call on the actor path, which owns the retry, the timeout naming the shard and
  ``allow_partial``. After an actor-path call the caller asks :meth:`SocketScatter.refresh`
  to fetch the address of every shard that answered again (a restarted actor is a new
  process with a new server) and reconnects.

Frames (both directions): an 8-byte little-endian length, then that many bytes, the first
of which is the frame kind. Client to server: ``H`` + token (the first frame, once), ``Q`` +
a packed request, ``N`` (a no-op round trip). Server to client: ``K`` (token accepted),
``R`` + a packed reply, ``E`` + a pickled exception (a shard's own error), ``F`` (the answer
cannot travel here: use the actor path). A server closes a connection, with a logged error,
on a wrong token, an oversize (> ``max_frame``) or empty frame, an unknown kind, a request it
cannot decode, a method it does not serve, or a frame cut short; the shard itself never
stops for a bad frame.

Security: a random 32-byte token, handed to the driver through the Ray actor call, must be
the first frame of every connection (compared in constant time); a Unix-domain peer must also
run as this process's user (``SO_PEERCRED`` on Linux). TCP listens on the node's IP address
only (``127.0.0.1`` for a machine-local Ray).
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import pickle
import secrets
import select
import shutil
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["ShardServer", "SocketScatter", "connect", "MAX_FRAME", "AVAILABLE", "open_fds"]

#: Whether this platform has what the socket transport needs (Unix-domain sockets, poll).
AVAILABLE = hasattr(socket, "AF_UNIX") and hasattr(select, "poll")

_log = logging.getLogger(__name__)

_HEADER = struct.Struct("<Q")
_HLEN = _HEADER.size
MAX_FRAME = 1 << 30  # bytes: the largest request a server reads (1 GiB)
_MAX_CONNECTIONS = 64  # per server: each holds one thread
_HANDSHAKE_TIMEOUT = 10.0  # seconds a new connection has to send its token
_REFRESH_PAUSE = 1.0  # seconds between two address fetches for one shard
_MAX_IDLE = 8  # idle connections the driver keeps per shard
_MAX_OPEN = 32  # connections the driver opens per shard (more concurrent calls: actor path)
_SCRATCH = 1 << 16  # bytes: the receive buffer of one connection
_TOKEN_BYTES = 32

HELLO, QUERY, NOOP = b"H", b"Q", b"N"
ACCEPTED, REPLY, ERROR, FALLBACK = b"K", b"R", b"E", b"F"


def _frame(kind: bytes, body: bytes = b"") -> bytes:
    return _HEADER.pack(1 + len(body)) + kind + body


def _fd_id(sock: socket.socket) -> tuple[int, int]:
    """(descriptor, inode) of an open socket: what :func:`open_fds` checks later."""
    fd = sock.fileno()
    return fd, os.fstat(fd).st_ino


def open_fds(ids: Iterable[tuple[int, int]]) -> int:
    """How many of the (descriptor, inode) pairs are still open sockets in this process (a
    descriptor closed, or reused for another file, does not count)."""
    n = 0
    for fd, ino in ids:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if st.st_ino == ino and stat.S_ISSOCK(st.st_mode):
            n += 1
    return n


class _ProtocolError(Exception):
    """A frame this end cannot accept: the connection is closed."""


class ShardServer:
    """The serving side in a shard's process: a listener and one thread per connection.

    ``handle(method, args)`` answers one request as bytes (the actor's ``call`` followed by
    ``pack_reply``); it runs on the connection's thread, concurrently with the actor's own
    calls, exactly as the actor's threaded calls run. ``methods`` are the only ones served;
    ``decode`` turns a request's bytes into (method, args) (default: a pickle of them).
    """

    def __init__(
        self,
        handle: Callable[[str, tuple[Any, ...]], bytes],
        methods: Iterable[str],
        *,
        decode: Callable[[memoryview], tuple[str, tuple[Any, ...]]] | None = None,
        family: str,
        host: str = "127.0.0.1",
        max_frame: int = MAX_FRAME,
    ) -> None:
        """Binds the socket and starts the listener. ``family`` is ``"unix"`` or ``"tcp"``
        (on ``host``). Raises ``OSError`` if the socket cannot be bound and
        :class:`~kbcore.errors.InvalidArgumentError` for another ``family``."""
        if family not in ("unix", "tcp"):
            raise InvalidArgumentError(f"family must be 'unix' or 'tcp', got {family!r}")
        self._handle = handle
        self._decode = decode if decode is not None else pickle.loads
        self._methods = frozenset(methods)
        self.family = family
        self.max_frame = int(max_frame)
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._fds: set[tuple[int, int]] = set()  # every socket this server opened (for socket_fds)
        self._closed = False
        self._tmpdir: str | None = None
        self.rejected = 0  # connections closed for a wrong token, peer or bad frame
        self.served = 0  # requests answered
        if family == "unix":
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            if sys.platform.startswith("linux"):
                address: Any = f"\0kbcore-shard-{os.getpid()}-{secrets.token_hex(8)}"
            else:  # pragma: no cover - no abstract namespace: a private directory instead
                self._tmpdir = tempfile.mkdtemp(prefix="kbsock")
                address = os.path.join(self._tmpdir, "s")
        else:
            listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            address = (host, 0)
        try:
            listener.bind(address)
            listener.listen(_MAX_CONNECTIONS)
        except BaseException:
            listener.close()
            self._remove_tmpdir()
            raise
        self._listener = listener
        self._fds.add(_fd_id(listener))
        self.address: Any = listener.getsockname() if family == "tcp" else address
        if family == "tcp":
            self.address = tuple(self.address[:2])
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._accept_loop, name="kbcore-shard-socket", daemon=True)
        self._thread.start()

    def _remove_tmpdir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def describe(self) -> dict[str, Any]:
        """What a driver needs to connect: family, address and token."""
        return {"family": self.family, "address": self.address, "token": self.token, "pid": os.getpid()}

    # -- accepting ------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        poller = select.poll()
        poller.register(self._listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            try:
                events = poller.poll()
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            if self._closed or any(fd == self._wake_r for fd, _ in events):
                return
            try:
                conn, _ = self._listener.accept()
            except OSError as exc:
                if self._closed:
                    return
                _log.error("shard socket: accept failed: %s", exc)
                time.sleep(0.05)
                continue
            with self._lock:
                if self._closed or len(self._conns) >= _MAX_CONNECTIONS:
                    self.rejected += 1
                    _log.error("shard socket: refusing a connection (%d open)", len(self._conns))
                    conn.close()
                    continue
                thread = threading.Thread(
                    target=self._serve, args=(conn,), name="kbcore-shard-socket-conn", daemon=True
                )
                self._conns[conn] = thread
                if len(self._fds) > 4 * _MAX_CONNECTIONS:  # forget the sockets closed since
                    self._fds = {p for p in self._fds if open_fds([p])}
                self._fds.add(_fd_id(conn))
            thread.start()

    def _peer_ok(self, conn: socket.socket) -> bool:
        if self.family != "unix" or not hasattr(socket, "SO_PEERCRED"):
            return True
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return uid == os.getuid()

    # -- one connection -------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        reader = _Reader(conn, _HLEN + 1 + _TOKEN_BYTES)  # until the token: nothing larger
        try:
            if self.family == "tcp":
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self._peer_ok(conn):
                raise _ProtocolError("the peer runs as another user")
            conn.settimeout(_HANDSHAKE_TIMEOUT)
            hello = reader.frame()
            if hello is None or hello[:1] != HELLO or not hmac.compare_digest(bytes(hello[1:]), self.token):
                raise _ProtocolError("the first frame is not the shard's token")
            conn.settimeout(None)
            reader.max_frame = self.max_frame
            conn.sendall(_frame(ACCEPTED))
            while True:
                body = reader.frame()
                if body is None:
                    return  # the driver closed the connection
                kind = body[:1]
                if kind == NOOP:
                    conn.sendall(_frame(REPLY))
                    continue
                if kind != QUERY:
                    raise _ProtocolError(f"unknown frame kind {bytes(kind)!r}")
                try:
                    method, args = self._decode(body[1:])
                except Exception as exc:  # noqa: BLE001 - any undecodable request
                    raise _ProtocolError(f"undecodable request ({type(exc).__name__})") from None
                if method not in self._methods or not isinstance(args, tuple):
                    raise _ProtocolError(f"method {method!r} is not served on this socket")
                self._answer(conn, method, args)
        except _ProtocolError as exc:
            with self._lock:
                self.rejected += 1
            _log.error("shard socket: closing a connection: %s", exc)
        except OSError as exc:  # reset by the peer, or closed by stop()
            if not self._closed:
                _log.debug("shard socket: connection ended: %s", exc)
        except Exception:  # noqa: BLE001 - never let a connection take the shard down
            _log.exception("shard socket: unexpected error on a connection")
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def _answer(self, conn: socket.socket, method: str, args: tuple[Any, ...]) -> None:
        try:
            reply = self._handle(method, args)
            kind = REPLY
        except Exception as exc:  # noqa: BLE001 - a shard's own error travels to the driver
            try:
                reply, kind = pickle.dumps(exc, protocol=5), ERROR
                pickle.loads(reply)  # the driver must be able to rebuild it
            except Exception:  # noqa: BLE001 - an error that does not pickle: ask for the actor path
                reply, kind = b"", FALLBACK
        with self._lock:  # counted before the driver can see the answer
            self.served += 1
        head = _HEADER.pack(1 + len(reply)) + kind
        if len(reply) <= _SCRATCH:
            conn.sendall(head + reply)
        else:
            _send_parts(conn, [head, reply])

    # -- stopping and statistics ----------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Open connections, live serving threads, sockets of this server still open in this
        process (:func:`open_fds`), requests served and connections rejected."""
        with self._lock:
            conns = len(self._conns)
            fds = set(self._fds)
        threads = sum(t.name.startswith("kbcore-shard-socket") for t in threading.enumerate())
        return {
            "listening": not self._closed,
            "connections": conns,
            "threads": threads,
            "socket_fds": open_fds(fds),
            "served": self.served,
            "rejected": self.rejected,
        }

    def stop(self, timeout: float = 5.0) -> dict[str, Any]:
        """Closes the listener and every connection, joins the threads; returns :meth:`stats`."""
        with self._lock:
            already, self._closed = self._closed, True
            conns = list(self._conns.items())
        if not already:
            os.write(self._wake_w, b"x")
            self._thread.join(timeout)
            self._listener.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._remove_tmpdir()
        for conn, _ in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in recv
            except OSError:
                pass
        for _, thread in conns:
            thread.join(timeout)
        return self.stats()


class _Reader:
    """Reads frames from a blocking socket through one reusable buffer."""

    def __init__(self, sock: socket.socket, max_frame: int) -> None:
        self.sock = sock
        self.max_frame = max_frame
        self.buf = bytearray(_SCRATCH)
        self.start = 0
        self.end = 0

    def _fill(self, need: int) -> bool:
        """Until ``need`` bytes are buffered from ``start``; False on a clean EOF before any."""
        if self.start + need > len(self.buf):
            have = self.end - self.start
            grown = bytearray(max(need, _SCRATCH)) if need > len(self.buf) else self.buf
            grown[:have] = self.buf[self.start : self.end]
            self.buf, self.start, self.end = grown, 0, have
        view = memoryview(self.buf)
        while self.end - self.start < need:
            n = self.sock.recv_into(view[self.end :])
            if n == 0:
                if self.end == self.start:
                    return False
                raise _ProtocolError(f"a frame cut short ({self.end - self.start} of {need} bytes)")
            self.end += n
        return True

    def frame(self) -> memoryview | None:
        """The next frame's body (valid until the next call), or None at a clean EOF."""
        if self.start == self.end:
            self.start = self.end = 0
            if len(self.buf) > _SCRATCH:
                self.buf = bytearray(_SCRATCH)  # do not keep a large request's buffer
        if not self._fill(_HLEN):
            return None
        (length,) = _HEADER.unpack_from(self.buf, self.start)
        if length == 0 or length > self.max_frame:
            raise _ProtocolError(f"frame length {length} is outside 1..{self.max_frame}")
        if not self._fill(_HLEN + length):
            raise _ProtocolError("a frame cut short")  # pragma: no cover - _fill raises first
        body = memoryview(self.buf)[self.start + _HLEN : self.start + _HLEN + length]
        self.start += _HLEN + length
        return body


def _send_parts(sock: socket.socket, parts: list[bytes]) -> None:
    """Sends every part (one ``sendmsg`` when the kernel takes them all) on a blocking socket."""
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        n = sock.sendmsg(views)
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


def connect(desc: dict[str, Any], timeout: float) -> socket.socket:
    """A connection to the server ``desc`` (:meth:`ShardServer.describe`), token accepted,
    non-blocking. Raises ``OSError`` (``ConnectionError`` if the token is refused)."""
    family = socket.AF_UNIX if desc["family"] == "unix" else socket.AF_INET
    address = desc["address"]
    if desc["family"] == "tcp" and ":" in str(address[0]):
        family = socket.AF_INET6
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(address if desc["family"] == "unix" else tuple(address))
        if desc["family"] == "tcp":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(_frame(HELLO, desc["token"]))
        ack = b""
        while len(ack) < _HLEN + 1:
            got = sock.recv(_HLEN + 1 - len(ack))
            if not got:
                raise ConnectionRefusedError(errno.ECONNREFUSED, "the shard refused the token")
            ack += got
        if ack != _frame(ACCEPTED):
            raise ConnectionRefusedError(errno.EPROTO, f"unexpected handshake answer {ack!r}")
        sock.setblocking(False)
        return sock
    except BaseException:
        sock.close()
        raise


class _Shard:
    """The driver's view of one shard's server: its address and idle connections."""

    __slots__ = ("desc", "idle", "open", "next_refresh", "last_error")

    def __init__(self) -> None:
        self.desc: dict[str, Any] | None = None
        self.idle: list[_Conn] = []
        self.open = 0  # connections handed out or idle
        self.next_refresh = 0.0
        self.last_error: str | None = None


class _Conn:
    """One connection plus the receive state of the call using it."""

    __slots__ = ("sock", "fd", "buf", "got", "need", "out")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray(_SCRATCH)
        self.got = 0
        self.need = 0
        self.out: memoryview | None = None  # what is left to send of the request


class SocketScatter:
    """The driver side: connections to every shard's server, kept between calls.

    ``fetch(shards)`` returns {shard: server description} for those shards (the actors'
    ``serve_socket``), missing the ones that did not answer; it is called at construction
    and by :meth:`refresh`. Thread safety: :meth:`call` may be called from any thread; each
    call takes its own connection per shard (opening one if none is idle).
    """

    def __init__(self, n: int, fetch: Callable[[list[int]], dict[int, dict[str, Any]]], *, timeout: float) -> None:
        self._n = n
        self._fetch = fetch
        self._timeout = timeout
        self._lock = threading.Lock()
        self._shards = [_Shard() for _ in range(n)]
        self._closed = False
        self.fallbacks = 0  # calls that went to the actor path
        self.reconnects = 0  # addresses fetched again after a failure
        self.connects = 0  # connections opened
        self.last_error: str | None = None
        self._update(fetch(list(range(n))))

    @property
    def ready(self) -> bool:
        """Whether every shard's address is known (a call would try the sockets)."""
        return all(s.desc is not None for s in self._shards)

    def _update(self, got: dict[int, dict[str, Any]]) -> None:
        with self._lock:
            for i, desc in got.items():
                self._shards[i].desc = desc

    # -- connections ----------------------------------------------------------------------
    def _take(self, i: int) -> _Conn | None:
        s = self._shards[i]
        with self._lock:
            if self._closed or s.desc is None:
                return None
            if s.idle:
                return s.idle.pop()
            if s.open >= _MAX_OPEN:
                return None  # that many calls at once: this one takes the actor path
            desc = s.desc
            s.open += 1
        try:
            conn = _Conn(connect(desc, self._timeout))
        except OSError as exc:
            with self._lock:
                s.open -= 1
            self._fail(i, f"connecting: {type(exc).__name__}: {exc}")
            return None
        with self._lock:
            self.connects += 1
        return conn

    def _give(self, i: int, conn: _Conn) -> None:
        s = self._shards[i]
        with self._lock:
            if not self._closed and s.desc is not None and len(s.idle) < _MAX_IDLE:
                s.idle.append(conn)
                return
            s.open -= 1
        conn.sock.close()

    def _drop(self, i: int, conn: _Conn) -> None:
        with self._lock:
            self._shards[i].open -= 1
        conn.sock.close()

    def _fail(self, i: int, why: str) -> None:
        """Shard ``i`` failed: forget its address and close its idle connections."""
        s = self._shards[i]
        with self._lock:
            s.desc = None
            idle, s.idle = s.idle, []
            s.open -= len(idle)
            s.last_error = why
            self.last_error = f"shard {i}: {why}"
        for c in idle:
            c.sock.close()

    # -- the query path -------------------------------------------------------------------
    def call(self, request: bytes, timeout: float, *, kind: bytes = QUERY) -> list[bytes] | None:
        """Sends ``request`` to every shard and returns their packed replies in shard order,
        or ``None`` if the caller must use the actor path (an address unknown, or a system
        failure, which also forgets that shard's address). Re-raises a shard's own error."""
        conns = self.begin(request, kind=kind)
        if conns is None:
            return None
        return self.finish(conns, timeout)

    def begin(self, request: bytes, *, kind: bytes = QUERY) -> list[_Conn] | None:
        """The first half of :meth:`call`: takes a connection per shard and writes the
        request to each (as far as the kernel takes it now)."""
        conns: list[_Conn] = []
        for i in range(self._n):
            c = self._take(i)
            if c is None:
                for j, cj in enumerate(conns):
                    self._give(j, cj)
                self.fallbacks += 1
                return None
            conns.append(c)
        frame = _frame(kind, request)
        for i, c in enumerate(conns):
            c.got = c.need = 0
            try:
                n = c.sock.send(frame)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                self._abort(conns, i, f"sending: {type(exc).__name__}: {exc}")
                return None
            c.out = memoryview(frame)[n:] if n < len(frame) else None
        return conns

    def finish(self, conns: list[_Conn], timeout: float) -> list[bytes] | None:
        """The second half of :meth:`call`: waits for every reply."""
        deadline = time.monotonic() + timeout
        poller = select.poll()
        by_fd: dict[int, int] = {}
        for i, c in enumerate(conns):
            poller.register(c.fd, select.POLLIN | (select.POLLOUT if c.out is not None else 0))
            by_fd[c.fd] = i
        replies: list[Any] = [None] * len(conns)
        left = len(conns)
        shard_error: BaseException | None = None
        fallback = False
        while left:
            ms = int((deadline - time.monotonic()) * 1000) + 1
            if ms <= 0:
                late = next(i for i, r in enumerate(replies) if r is None)
                self._abort(conns, late, f"no answer within {timeout:g} s")
                return None
            try:
                events = poller.poll(ms)
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            for fd, ev in events:
                i = by_fd[fd]
                c = conns[i]
                try:
                    if c.out is not None and ev & select.POLLOUT:
                        n = c.sock.send(c.out)
                        c.out = c.out[n:] if n < len(c.out) else None
                        if c.out is None:
                            poller.modify(fd, select.POLLIN)
                    if not ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                        continue
                    done = self._receive(c)
                except BlockingIOError:
                    continue
                except (OSError, _ProtocolError) as exc:
                    self._abort(conns, i, f"receiving: {type(exc).__name__}: {exc}")
                    return None
                if done is None:
                    continue
                poller.unregister(fd)
                left -= 1
                status, body = done
                if status == REPLY:
                    replies[i] = body
                elif status == ERROR:
                    replies[i] = b""
                    try:
                        err = pickle.loads(body)
                    except Exception:  # noqa: BLE001 - cannot rebuild it here: the actor path can
                        fallback = True
                        continue
                    shard_error = shard_error or err
                elif status == FALLBACK:
                    replies[i] = b""
                    fallback = True
                else:
                    self._abort(conns, i, f"unexpected frame kind {status!r}")
                    return None
        for i, c in enumerate(conns):
            self._give(i, c)
        if shard_error is not None:
            raise shard_error
        if fallback:
            self.fallbacks += 1
            return None
        return replies

    @staticmethod
    def _receive(c: _Conn) -> tuple[bytes, bytes] | None:
        """Reads what is there; the (kind, body) of a complete reply, else None."""
        view = memoryview(c.buf)
        n = c.sock.recv_into(view[c.got :])
        if n == 0:
            raise _ProtocolError("the shard closed the connection")
        c.got += n
        if not c.need:
            if c.got < _HLEN + 1:
                return None
            c.need = _HLEN + _HEADER.unpack_from(c.buf)[0]
            if c.need > len(c.buf):  # a large answer: one buffer of its size
                grown = bytearray(c.need)
                grown[: c.got] = c.buf[: c.got]
                c.buf = grown
                view = memoryview(c.buf)
                while c.got < c.need:
                    try:
                        n = c.sock.recv_into(view[c.got :])
                    except BlockingIOError:
                        return None
                    if n == 0:
                        raise _ProtocolError("the shard closed the connection")
                    c.got += n
        if c.got < c.need:
            return None
        if c.got > c.need:
            raise _ProtocolError("more bytes than one reply")
        kind = bytes(c.buf[_HLEN : _HLEN + 1])
        if c.need > _SCRATCH:
            body: bytes = memoryview(c.buf)[_HLEN + 1 : c.need]  # type: ignore[assignment]  # its own buffer
            c.buf = bytearray(_SCRATCH)
        else:
            body = bytes(c.buf[_HLEN + 1 : c.need])
        return kind, body

    def _abort(self, conns: list[_Conn], failed: int, why: str) -> None:
        """A system failure at shard ``failed``: its address is forgotten; every connection
        with a reply still in flight is closed (its stream is no longer in step)."""
        self.fallbacks += 1
        self._fail(failed, why)
        for i, c in enumerate(conns):
            if i != failed and c.need and c.got == c.need:
                self._give(i, c)
            else:
                self._drop(i, c)

    # -- recovery and shutdown ------------------------------------------------------------
    def refresh(self, shards: Iterable[int]) -> None:
        """Fetches the address of each of ``shards`` whose address is unknown (at most once
        per second per shard): called after an actor-path call those shards answered."""
        now = time.monotonic()
        want = []
        with self._lock:
            if self._closed:
                return
            for i in shards:
                s = self._shards[i]
                if s.desc is None and now >= s.next_refresh:
                    s.next_refresh = now + _REFRESH_PAUSE
                    want.append(i)
        if not want:
            return
        try:
            got = self._fetch(want)
        except Exception as exc:  # noqa: BLE001 - the next actor-path call tries again
            self.last_error = f"fetching addresses: {type(exc).__name__}: {exc}"
            return
        self.reconnects += len(got)
        self._update(got)

    def fds(self) -> list[tuple[int, int]]:
        """(descriptor, inode) of each idle connection (for leak tests, :func:`open_fds`)."""
        with self._lock:
            return [_fd_id(c.sock) for s in self._shards for c in s.idle]

    def close(self) -> None:
        """Closes every idle connection; connections in use close when their call ends."""
        with self._lock:
            self._closed = True
            idle = [c for s in self._shards for c in s.idle]
            for s in self._shards:
                s.idle = []
                s.open = 0
        for c in idle:
            c.sock.close()
