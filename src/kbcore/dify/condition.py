"""Dify's ``metadata_condition`` as a kbcore ``where``, with the semantics of Dify's own filter.

Dify (1.12) filters its own knowledge bases in SQL over the documents' JSON metadata
(``DatasetRetrieval.process_metadata_filter_func``): a condition whose value is null is skipped,
a comparison with a missing field is NULL (the row does not match, ``is not`` / ``≠`` /
``not in`` included), ``is`` / ``=`` compare the stored value as text when the operand is a
string and as a number when it is a number, and ``in`` / ``not in`` split a comma-joined
string. :func:`dify_condition_to_where` reproduces that on kbcore's typed metadata; see
docs/dify.md for each operator next to the ``where`` it becomes.

Every parser here is linear in its input: the number grammar is checked by hand, without a
regular expression, and strings are checked for lone surrogates (which cannot be UTF-8)
before they reach the native filter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidArgumentError
from ..filters.iso import parse_iso, type_name
from ..filters.where import coerce_numpy

__all__ = ["dify_condition_to_where"]

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
#: Longest string read as a number (a longer one is text; no real number is this long).
_MAX_NUMBER_CHARS = 400
#: Most conditions in one metadata_condition, and field names in one condition (Dify's UI
#: sends a handful; the cap bounds the filter the native core evaluates per row).
MAX_CONDITIONS = 256
MAX_NAMES = 64
#: Half-width of the window in which a stored ISO date-time "is" a Unix-seconds operand.
_INSTANT_TOLERANCE = 1e-6

_DIFY_OPS = {
    "contains": "contains",
    "not contains": "not contains",
    "does not contain": "not contains",
    "start with": "start with",
    "starts with": "start with",
    "end with": "end with",
    "ends with": "end with",
    "is": "is",
    "is not": "is not",
    "in": "in",
    "not in": "not in",
    "empty": "empty",
    "is empty": "empty",
    "not empty": "not empty",
    "is not empty": "not empty",
    "null": "null",
    "is null": "null",
    "not null": "not null",
    "is not null": "not null",
    "=": "is",
    "==": "is",
    "≠": "is not",
    "!=": "is not",
    ">": ">",
    "<": "<",
    "≥": "≥",
    ">=": "≥",
    "≤": "≤",
    "<=": "≤",
    "before": "before",
    "after": "after",
}
_NO_VALUE = frozenset({"empty", "not empty", "null", "not null"})
_NUMERIC = {">": "$gt", "<": "$lt", "≥": "$gte", "≤": "$lte"}
_TEXT = {
    "contains": "$contains",
    "not contains": "$not_contains",
    "start with": "$starts_with",
    "end with": "$ends_with",
}
_OPS_TEXT = (
    "contains, not contains, start with, end with, is, is not, in, not in, empty, not empty, "
    "null, not null, =, ≠ (!=), >, <, ≥ (>=), ≤ (<=), before, after"
)


# ----------------------------------------------------------------------------------------------
# scalars


def _check_text(text: str, what: str) -> str:
    """``text`` if it is valid Unicode (encodable as UTF-8), else InvalidArgumentError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"{what} contains a lone surrogate (U+{ord(text[exc.start]):04X} at position "
            f"{exc.start}), which is not valid Unicode"
        ) from None
    return text


def _is_digits(s: str, i: int, j: int) -> bool:
    return i < j and s[i:j].isascii() and s[i:j].isdigit()


def _number_shape(s: str) -> bool:
    """Whether ``s`` is ``[+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?``; one
    pass, no backtracking."""
    n = len(s)
    i = 1 if n and s[0] in "+-" else 0
    e = n
    for k in range(i, n):
        if s[k] in "eE":
            e = k
            break
    if e < n:
        k = e + 1
        if k < n and s[k] in "+-":
            k += 1
        if not _is_digits(s, k, n):
            return False
    mantissa = s[i:e]
    whole, dot, frac = mantissa.partition(".")
    if whole and not _is_digits(whole, 0, len(whole)):
        return False
    if frac and not _is_digits(frac, 0, len(frac)):
        return False
    return bool(whole) or (bool(dot) and bool(frac))


def _parse_number(text: str) -> int | float | None:
    """The number spelled by ``text`` (surrounding spaces allowed), or None: an int when it
    fits int64, else a float; None for non-numbers, inf / NaN spellings and overlong text."""
    s = text.strip()
    if not s or len(s) > _MAX_NUMBER_CHARS or not _number_shape(s):
        return None
    digits = s.lstrip("+-")
    if digits.isdigit() and len(digits) <= 19:
        v = int(s)
        if _INT64_MIN <= v <= _INT64_MAX:
            return v
    f = float(s)  # never raises on this grammar; overflow gives inf
    return f if math.isfinite(f) else None


def _finite(value: float, op: str) -> int | float:
    """A number the filter language accepts: ints beyond int64 become floats; inf, NaN and
    ints beyond the float range are InvalidArgumentError."""
    if isinstance(value, int):
        value = int(value)
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
        try:
            return float(value)
        except OverflowError:
            raise InvalidArgumentError(
                f'"{op}": the integer operand ({value.bit_length()} bits) is out of range'
            ) from None
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f'"{op}" needs a finite number, got {value!r}')
    return value


def _is_number(v: Any) -> bool:
    return type(v) is not bool and isinstance(v, (int, float))


def _number(value: Any, op: str) -> int | float:
    if _is_number(value):
        return _finite(value, op)
    if isinstance(value, str):
        n = _parse_number(value)
        if n is not None:
            return n
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise InvalidArgumentError(f'"{op}" compares numbers, but {shown!r} is not a number')
    raise InvalidArgumentError(f'"{op}" compares numbers, got {type_name(value)}')


def _number_text(n: float) -> list[str]:
    """How Dify's text comparison spells a stored number (JSON text): 3 -> "3", 2.5 -> "2.5",
    2.0 -> "2.0" (and "2", the same number written as an integer)."""
    if isinstance(n, int):
        return [str(n)]
    out = [repr(n)]
    if n.is_integer() and abs(n) < 1e16:
        out.append(str(int(n)))
    return out


def _text(value: Any, op: str) -> str:
    if isinstance(value, str):
        return str(value)
    if _is_number(value):
        return _number_text(_finite(value, op))[0]
    raise InvalidArgumentError(f'"{op}" needs a string value, got {type_name(value)}')


# ----------------------------------------------------------------------------------------------
# dates


def _iso_of(seconds: float, op: str) -> str:
    try:
        dt = datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        raise InvalidArgumentError(f'"{op}": timestamp {seconds!r} is out of range') from None
    text = f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}"
    if dt.microsecond:
        text += f".{dt.microsecond:06d}"
    return text + "Z"


def _instant(value: Any, op: str) -> tuple[str, int | float]:
    """(ISO-8601 string, Unix seconds) of a Dify date operand: ISO text or Unix seconds."""
    if isinstance(value, str):
        n = _parse_number(value)
        if n is None:
            text = value.strip()
            try:
                return text, parse_iso(text)
            except ValueError as exc:
                shown = text if len(text) <= 40 else text[:40] + "..."
                raise InvalidArgumentError(
                    f'"{op}" needs an ISO-8601 date/date-time or Unix seconds; {shown!r}: {exc}'
                ) from None
        value = n
    if _is_number(value):
        value = _finite(value, op)
        return _iso_of(float(value), op), value
    raise InvalidArgumentError(
        f'"{op}" needs an ISO-8601 date/date-time string or Unix seconds, got {type_name(value)}'
    )


def _instant_window(seconds: float) -> tuple[str, str] | None:
    """ISO-8601 bounds a microsecond either side of ``seconds``; None out of range."""
    try:
        return (_iso_of(seconds - _INSTANT_TOLERANCE, "is"), _iso_of(seconds + _INSTANT_TOLERANCE, "is"))
    except InvalidArgumentError:
        return None


# ----------------------------------------------------------------------------------------------
# one condition on one field


def _always(field: str) -> dict:
    return {"$or": [{field: {"$exists": True}}, {field: {"$exists": False}}]}


def _never(field: str) -> dict:
    return {"$and": [{field: {"$exists": True}}, {field: {"$exists": False}}]}


def _any_of(parts: list[dict]) -> dict:
    return parts[0] if len(parts) == 1 else {"$or": parts}


def _is(field: str, value: Any) -> dict:
    """Dify's ``is`` / ``=``: text equality for a string operand (a stored number matches its
    JSON spelling), numeric equality for a number (a stored ISO date-time matches the same
    instant: Dify's UI sends dates as Unix seconds)."""
    if isinstance(value, bool):
        return {field: {"$eq": value}}
    if isinstance(value, str):
        parts: list[dict[str, Any]] = [{field: {"$eq": value}}]
        n = _parse_number(value)
        if n is not None and value in _number_text(n):
            parts.append({field: {"$eq": n}})
        return _any_of(parts)
    if _is_number(value):
        n = _finite(value, "is")
        parts = [{field: {"$eq": n}}, {field: {"$in": _number_text(n)}}]
        window = _instant_window(float(n))
        if window is not None:  # a stored ISO date-time at that instant
            lo, hi = window
            parts.append({"$and": [{field: {"$after": lo}}, {field: {"$before": hi}}]})
        return {"$or": parts}
    raise InvalidArgumentError(f'"is" needs a string, number or boolean value, got {type_name(value)}')


def _is_not(field: str, value: Any) -> dict:
    """Dify's ``is not`` / ``≠``: the field is present and differs (SQL: NULL != x is not
    true)."""
    if isinstance(value, bool):
        return {"$and": [{field: {"$exists": True}}, {field: {"$ne": value}}]}
    if isinstance(value, str):
        parts = [{field: {"$exists": True}}, {field: {"$ne": value}}]
        n = _parse_number(value)
        if n is not None and value in _number_text(n):
            parts.append({field: {"$ne": n}})
        return {"$and": parts}
    if _is_number(value):
        # Dify compares the stored value as a number: numbers and dates other than it match
        n = _finite(value, "is not")
        parts = [{field: {"$lt": n}}, {field: {"$gt": n}}]
        window = _instant_window(float(n))
        if window is not None:  # a stored ISO date-time at another instant
            lo, hi = window
            parts += [{field: {"$before": lo}}, {field: {"$after": hi}}]
        return {"$or": parts}
    raise InvalidArgumentError(f'"is not" needs a string, number or boolean value, got {type_name(value)}')


def _items(value: Any, op: str) -> list[str]:
    """Dify's ``in`` operand as the list of texts it compares: a comma-joined string split
    and stripped (empty pieces dropped), a list's items as text, a single number as one."""
    if isinstance(value, str):
        pieces = [s.strip() for s in value.split(",")]
        return [s for s in pieces if s]
    if isinstance(value, (list, tuple)):
        out: list[str] = []
        for i, v in enumerate(value):
            v = coerce_numpy(v)
            if v is None:
                continue
            if isinstance(v, bool):
                out.append(str(v))  # Dify compares str(item): "True"
            elif isinstance(v, str) or _is_number(v):
                out.append(_check_text(_text(v, op), f"item {i}"))
            else:
                raise InvalidArgumentError(f'"{op}" needs strings or numbers, got an item of type {type_name(v)}')
        return out
    if _is_number(value):
        return [_text(value, op)]
    raise InvalidArgumentError(f'"{op}" needs a list or a comma-separated string, got {type_name(value)}')


def _in(field: str, value: Any, op: str) -> dict:
    texts = list(dict.fromkeys(_items(value, op)))
    if not texts:  # Dify: `field in []` is false, `field not in []` is true
        return _never(field) if op == "in" else _always(field)
    numbers = list(dict.fromkeys(n for t in texts if (n := _parse_number(t)) is not None))
    parts: list[dict[str, Any]]
    if op == "in":
        parts = [{field: {"$in": texts}}]
        if numbers:
            parts.append({field: {"$in": numbers}})
        return _any_of(parts)
    parts = [{field: {"$exists": True}}, {field: {"$nin": texts}}]
    if numbers:
        parts.append({field: {"$nin": numbers}})
    return {"$and": parts}


def _one(field: str, op: str, value: Any) -> dict:
    """The where dict of one Dify condition (with a non-null value) on one field."""
    if op == "empty":
        return {field: {"$empty": True}}
    if op == "not empty":
        return {field: {"$empty": False}}
    if op == "null":
        return {field: {"$exists": False}}
    if op == "not null":
        return {field: {"$exists": True}}
    if isinstance(value, str):
        _check_text(value, "the value")
    if op in _TEXT:
        return {field: {_TEXT[op]: _text(value, op)}}
    if op == "is":
        return _is(field, value)
    if op == "is not":
        return _is_not(field, value)
    if op in _NUMERIC:
        return {field: {_NUMERIC[op]: _number(value, op)}}
    if op in ("in", "not in"):
        return _in(field, value, op)
    # before / after: the stored value may be an ISO-8601 string (kbcore's date convention)
    # or Unix seconds (how Dify stores its own "time" metadata); either form may match
    text, seconds = _instant(value, op)
    iso_key, num_key = ("$before", "$lt") if op == "before" else ("$after", "$gt")
    return {"$or": [{field: {iso_key: text}}, {field: {num_key: seconds}}]}


# ----------------------------------------------------------------------------------------------
# the condition object


def _names(cond: Mapping[str, Any], path: str) -> list[str]:
    names = cond.get("name")
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not names:
        got = "an empty list" if isinstance(names, (list, tuple)) else type_name(names)
        raise InvalidArgumentError(
            f'{path}["name"]: expected a field name or a non-empty list of field names, got {got}'
        )
    if len(names) > MAX_NAMES:
        raise InvalidArgumentError(f'{path}["name"]: at most {MAX_NAMES} field names, got {len(names)}')
    for j, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(
                f'{path}["name"]: field names must be non-empty strings, got '
                f"{type_name(name) if not isinstance(name, str) else 'an empty string'}"
                + (f" at position {j}" if len(names) > 1 else "")
            )
        _check_text(name, f'{path}["name"]')
        if name.startswith("$"):
            raise InvalidArgumentError(f'{path}["name"]: field names cannot start with "$", got {name!r}')
    return [str(n) for n in names]


def _operator(cond: Mapping[str, Any], path: str) -> str:
    raw = cond.get("comparison_operator")
    if not isinstance(raw, str):
        raise InvalidArgumentError(f'{path}["comparison_operator"]: expected a string, got {type_name(raw)}')
    op = _DIFY_OPS.get(" ".join(raw.split()).lower())
    if op is None:
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        shown = shown.encode("utf-8", "backslashreplace").decode("utf-8")
        raise InvalidArgumentError(
            f'{path}["comparison_operator"]: unknown operator {shown!r}; expected one of {_OPS_TEXT}'
        )
    return op


def _condition(cond: Any, path: str) -> dict | None:
    """The where of one condition, or None when Dify would skip it (a null value)."""
    if not isinstance(cond, Mapping):
        raise InvalidArgumentError(f"{path}: expected an object, got {type_name(cond)}")
    names = _names(cond, path)
    op = _operator(cond, path)
    value = coerce_numpy(cond.get("value"))
    if value is None and op not in _NO_VALUE:
        return None  # Dify skips a condition whose value the user left empty
    try:
        per_field = [_one(name, op, value) for name in names]
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{path}: {exc}") from None
    return _any_of(_flat("$or", per_field))


def _flat(key: str, wheres: list[dict]) -> list[dict]:
    out: list[dict] = []
    for w in wheres:
        if list(w) == [key]:
            out.extend(w[key])
        else:
            out.append(w)
    return out


def _logical(mc: Mapping[str, Any], root: str) -> str:
    logical = mc.get("logical_operator")
    if logical is None:
        return "and"
    if not isinstance(logical, str) or logical.strip().lower() not in ("and", "or"):
        shown = repr(logical) if not isinstance(logical, str) or len(logical) <= 40 else "..."
        raise InvalidArgumentError(
            f'{root}["logical_operator"]: expected "and" or "or", got '
            f"{shown.encode('utf-8', 'backslashreplace').decode('utf-8')}"
        )
    return logical.strip().lower()


def dify_condition_to_where(metadata_condition: Mapping[str, Any] | None) -> dict | None:
    """Translates Dify's External Knowledge API ``metadata_condition`` into a ``where`` dict.

    ``{"logical_operator": "and" | "or", "conditions": [{"name": str | [str, ...],
    "comparison_operator": str, "value": ...}, ...]}`` -> a dict for
    :func:`kbcore.filters.compile_where`, or ``None`` when there is nothing to filter on (no
    condition object, no / null / empty ``conditions``, or only conditions with a null value,
    which Dify skips). A ``name`` list applies the condition to any of the fields (OR).

    The semantics are those of Dify's own metadata filter, operator by operator in
    docs/dify.md: a missing field never matches a comparison (``is not``, ``≠``, ``not in``,
    ``not contains`` included); ``is`` / ``=`` with a string compare text (a stored number
    matches its spelling, ``"3"`` matches 3) and with a number compare numbers (a stored
    ISO-8601 date-time matches the same instant given as Unix seconds); ``in`` / ``not in``
    take a list or a comma-joined string, and an empty one matches nothing / everything;
    ``>``, ``<``, ``≥``, ``≤`` take numbers or numeric strings; ``before`` / ``after`` take
    an ISO-8601 date-time or Unix seconds and match stored ISO strings and stored Unix
    seconds. Operator names ignore case and extra spaces; ``!=``, ``>=``, ``<=``, ``==`` are
    accepted too.

    Raises :class:`~kbcore.errors.InvalidArgumentError` naming the condition when an operator
    is unknown, a value cannot apply, a number is out of range, a string is not valid
    Unicode (a lone surrogate), or there are more than ``MAX_CONDITIONS`` (256) conditions
    or ``MAX_NAMES`` (64) names in one condition; an HTTP layer answers 400.
    """
    if metadata_condition is None:
        return None
    root = "metadata_condition"
    if not isinstance(metadata_condition, Mapping):
        raise InvalidArgumentError(f"{root}: expected an object, got {type_name(metadata_condition)}")
    conditions = metadata_condition.get("conditions")
    if conditions is None:
        return None
    if not isinstance(conditions, (list, tuple)):
        raise InvalidArgumentError(f'{root}["conditions"]: expected a list of conditions, got {type_name(conditions)}')
    if not conditions:
        return None
    if len(conditions) > MAX_CONDITIONS:
        raise InvalidArgumentError(f'{root}["conditions"]: at most {MAX_CONDITIONS} conditions, got {len(conditions)}')
    key = "$" + _logical(metadata_condition, root)
    parts = []
    for i, cond in enumerate(conditions):
        part = _condition(cond, f'{root}["conditions"][{i}]')
        if part is not None:
            parts.append(part)
    if not parts:
        return None
    parts = _flat(key, parts)
    return parts[0] if len(parts) == 1 else {key: parts}
