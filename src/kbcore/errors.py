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
