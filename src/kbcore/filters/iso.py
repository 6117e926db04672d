"""ISO-8601 instants for ``$before`` / ``$after``: one parser, the native one
(``parse_iso8601`` in ``cpp/string_dict.cpp``, exposed as ``_core.parse_iso8601``), so that an
operand and a stored string spelled the same way get the same double and compare equal.

When the native parser rejects a string, :func:`_reason` says why for the error message; it
computes no value, so it cannot make the two disagree (at worst a message is less precise).
"""

from __future__ import annotations

import math
import re

from .. import _core
from ..errors import InvalidArgumentError

_GRAMMAR = "expected YYYY-MM-DD, optionally followed by T and hh:mm[:ss[.fraction]] and an offset (Z or +hh:mm)"
_SHAPE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]+))?)?"
    r"([Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)?)?",
    re.ASCII,
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def parse_iso(text: str) -> float:
    """The instant of an ISO-8601 string as epoch seconds (native); ValueError with a reason."""
    try:
        t = _core.parse_iso8601(text)
    except (TypeError, UnicodeError):  # a str that is not valid Unicode (lone surrogates)
        t = None
    if t is None:
        raise ValueError(_reason(text))
    return t


def _reason(text: str) -> str:
    """Why ``text`` is not an ISO-8601 instant: the first field out of range, else the grammar."""
    m = _SHAPE.fullmatch(text)
    if m is None:
        return _GRAMMAR
    year, month, day = int(m[1]), int(m[2]), int(m[3])
    if not 1 <= month <= 12:
        return f"month {month} is out of range"
    dim = _DAYS_IN_MONTH[month - 1] + (month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0))
    if not 1 <= day <= dim:
        return f"day {day} is out of range for {year:04d}-{month:02d}"
    if m[4] is not None:
        hour, minute, second = int(m[4]), int(m[5]), int(m[6] or 0)
        for name, value, top in (("hour", hour, 24), ("minute", minute, 59), ("second", second, 60)):
            if value > top:
                return f"{name} {value} is out of range"
        if hour == 24 and (minute or second or (m[7] and int(m[7]))):
            return "hour 24 is only allowed as 24:00:00 (the end of the day)"
        tz = m[8]
        if tz is not None and tz not in ("Z", "z") and (int(tz[1:3]) > 23 or (len(tz) > 3 and int(tz[-2:]) > 59)):
            return f"offset {tz} is out of range"
    return _GRAMMAR


def iso8601_to_epoch(text: str) -> float:
    """Seconds since the Unix epoch (UTC) of an ISO-8601 date or date-time string.

    Accepted: ``YYYY-MM-DD`` (midnight UTC), optionally followed by ``T`` (or ``t`` or a
    space) and ``hh:mm``, ``hh:mm:ss`` or ``hh:mm:ss.fraction`` (``.`` or ``,``), optionally
    followed by ``Z`` / ``z`` or an offset ``+hh:mm``, ``+hhmm`` or ``+hh`` (no offset means
    UTC). Years 0000-9999 of the proleptic Gregorian calendar; ``24:00:00`` is the end of the
    day and second 60 (a leap second) is the first second of the next minute. This is the
    native parser the core applies to stored strings, so equal spellings give identical values.

    Raises :class:`~kbcore.errors.InvalidArgumentError` if ``text`` is not such a string.
    """
    if not isinstance(text, str):
        raise InvalidArgumentError(f"expected an ISO-8601 date or date-time string, got {type_name(text)}")
    try:
        return parse_iso(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"invalid ISO-8601 date-time {text!r}: {exc}") from None


def type_name(v: object) -> str:
    """The type of a rejected operand as messages name it ("None", "NaN", else the class name)."""
    if v is None:
        return "None"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return type(v).__name__
