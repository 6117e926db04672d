"""Exceptions raised by kbcore.

Every class subclasses :class:`KbcoreError` and the builtin that matches the problem, so
``except ValueError`` and ``except kbcore.errors.KbcoreError`` both work.
"""

from __future__ import annotations

__all__ = [
    "KbcoreError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "NotFoundError",
    "FormatError",
    "StorageError",
    "EmbedderError",
    "EmbedderUnavailableError",
    "RerankerError",
    "RerankerUnavailableError",
]


class KbcoreError(Exception):
    """Base class of every kbcore error."""


class InvalidArgumentError(KbcoreError, ValueError):
    """An argument has the right type but a value the operation cannot accept."""


class InvalidTypeError(KbcoreError, TypeError):
    """An argument has a type (or dtype) the operation cannot accept."""


class NotFoundError(KbcoreError, KeyError):
    """An id, document or knowledge base that the operation needs does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class FormatError(KbcoreError, OSError):
    """A persisted file is truncated, corrupted, not a kbcore file, or of a newer format."""


class StorageError(KbcoreError, OSError):
    """The operating system refused a read or write."""


class EmbedderError(KbcoreError, RuntimeError):
    """An embedder (a model or an embedding service) could not turn texts into vectors.

    Raised for a service's refusal (HTTP 400/401/403/404...), a malformed or inconsistent
    response (wrong count, order, dimension, NaN), or a missing API key variable. It is a
    ``RuntimeError``: the caller's arguments were fine, the embedder failed. ``endpoint`` is
    the URL concerned (or None) and ``status`` the HTTP status (or None).
    """

    def __init__(self, message: str, *, endpoint: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status


class EmbedderUnavailableError(EmbedderError, ConnectionError):
    """An embedding service stayed unreachable or overloaded after every retry.

    Connection refused or reset, timeouts, and HTTP 408/409/429/5xx once the retries ran out
    (or a ``Retry-After`` longer than the embedder is willing to wait). It is also a
    ``ConnectionError`` (an ``OSError``): the failure is transient and on the way to the
    service, so a server may answer 503 and a caller may try again later.
    """


class RerankerError(KbcoreError, RuntimeError):
    """A reranker (a cross-encoder or a ``/rerank`` service) could not score the candidates.

    Raised for a service's refusal (HTTP 400/401/403/404...), a malformed or inconsistent
    response (wrong count, an index missing or repeated, NaN), a missing API key variable, or
    a reranker that returned something that is not one finite score per text. ``endpoint`` is
    the URL concerned (or None) and ``status`` the HTTP status (or None).
    """

    def __init__(self, message: str, *, endpoint: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status


class RerankerUnavailableError(RerankerError, ConnectionError):
    """A rerank service stayed unreachable or overloaded after every retry (connection errors,
    timeouts, HTTP 408/409/429/5xx): transient, on the way to the service."""
