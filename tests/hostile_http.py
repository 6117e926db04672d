"""A hostile HTTP server on 127.0.0.1 for the client tests (stopped by each test).

Each accepted connection reads the request head and body, then hands the socket to a scripted
behaviour: answer garbage, drip bytes, redirect, answer deep JSON, close at once... The server
records every request (method, path, lower-cased headers, body) so a test can check what the
client sent where.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

Behaviour = Callable[["HostileServer", socket.socket, dict[str, Any]], None]


class HostileServer:
    """Accepts connections on 127.0.0.1 and answers each with ``behaviour`` (or ``script``
    entries in order, then ``behaviour``)."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour
        self.script: list[Behaviour] = []
        self.requests: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        try:
            request = self._read_request(conn)
            if request is None:
                return
            self.requests.append(request)
            behaviour = self.script.pop(0) if self.script else self.behaviour
            if behaviour is not None:
                behaviour(self, conn, request)
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _read_request(conn: socket.socket) -> dict[str, Any] | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        need = int(headers.get("content-length", "0"))
        while len(rest) < need:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        return {"method": method, "path": path, "headers": headers, "body": rest}

    def wait(self, seconds: float) -> bool:
        """Sleeps ``seconds`` unless the server is stopping (then True at once)."""
        return self.stop.wait(seconds)

    def close(self) -> None:
        self.stop.set()
        self._accept.join(timeout=5)
        self._sock.close()
        for t in self._threads:
            t.join(timeout=5)


def respond(status: int, body: bytes, headers: dict[str, str] | None = None) -> Behaviour:
    """A complete answer with a Content-Length."""

    def run(server: HostileServer, conn: socket.socket, request: dict[str, Any]) -> None:
        head = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    return run


def drip(prefix: bytes, byte: bytes = b" ", every: float = 0.05, for_seconds: float = 30.0) -> Behaviour:
    """Sends ``prefix``, then one ``byte`` every ``every`` seconds for up to ``for_seconds``."""

    def run(server: HostileServer, conn: socket.socket, request: dict[str, Any]) -> None:
        conn.sendall(prefix)
        end = time.monotonic() + for_seconds
        while time.monotonic() < end and not server.wait(every):
            conn.sendall(byte)

    return run


def raw(data: bytes) -> Behaviour:
    """Sends ``data`` as is and closes."""

    def run(server: HostileServer, conn: socket.socket, request: dict[str, Any]) -> None:
        conn.sendall(data)

    return run
