"""The ``where`` filter language: validation and compilation to the IR the native core evaluates.

See ``docs/filter-ir.md`` for the grammar, the semantics and the IR. In short,
:func:`compile_where` turns a Chroma-style ``where`` dict into an immutable tree of tuples::

    ("and", (node, ...)) | ("or", (node, ...)) | ("cmp", field, op, value)

The output is canonical: the keys of every dict are visited in sorted order (dicts are
unordered collections, so two equal dicts compile to the same IR), nested ``and`` in ``and`` and
``or`` in ``or`` are flattened, a single-child ``and`` / ``or`` is replaced by its child, and
duplicate ``$in`` / ``$nin`` items are dropped (first occurrence kept). Lists keep their order.

:func:`dify_condition_to_where` translates the ``metadata_condition`` of Dify's External
Knowledge API into a ``where`` dict; :func:`iso8601_to_epoch` is the date-time parser used by
``$before`` / ``$after`` (its grammar is the contract for the native parser of stored values).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from . import _core
from .errors import InvalidArgumentError

__all__ = ["Node", "compile_where", "dify_condition_to_where", "iso8601_to_epoch", "native_filter"]

#: A compiled filter node (see the module docstring).
Node = tuple

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1

_NUMBER_OPS = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
_SCALAR_OPS = {"$eq": "eq", "$ne": "ne"}
_LIST_OPS = {"$in": "in", "$nin": "nin"}
_STR_OPS = {
    "$contains": "contains",
    "$not_contains": "not_contains",
    "$starts_with": "starts_with",
    "$ends_with": "ends_with",
}
_BOOL_OPS = {"$exists": "exists", "$empty": "empty"}
_TIME_OPS = {"$before": "before", "$after": "after"}
_ALL_OPS = (
    tuple(_SCALAR_OPS) + tuple(_NUMBER_OPS) + tuple(_LIST_OPS) + tuple(_STR_OPS)
    + tuple(_BOOL_OPS) + tuple(_TIME_OPS)
)
_OPS_TEXT = ", ".join(_ALL_OPS)


# ----------------------------------------------------------------------------------------------
# errors with a path, built only when something fails


class _FilterError(Exception):
    """Internal: a message plus the path segments collected while unwinding (innermost first)."""

    __slots__ = ("message", "segments")

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.segments: list[object] = []


def _format_path(root: str, segments_innermost_first: list[object]) -> str:
    parts = [root]
    for seg in reversed(segments_innermost_first):
        if isinstance(seg, str):
            parts.append(f"[{json.dumps(seg, ensure_ascii=False)}]")
        elif isinstance(seg, int):
            parts.append(f"[{seg}]")
        else:
            parts.append(f"[{seg!r}]")
    return "".join(parts)


def _type_name(v: object) -> str:
    if v is None:
        return "None"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return type(v).__name__


# ----------------------------------------------------------------------------------------------
# operand normalisation


def _coerce_numpy(v: Any) -> Any:
    """numpy scalars become the matching Python scalar; anything else is returned unchanged."""
    mod = type(v).__module__
    if mod == "numpy":
        import numpy as np

        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.floating):
            return float(v)
        if isinstance(v, np.str_):
            return str(v)
    return v


def _check_int(v: int, op: str) -> int:
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise _FilterError(f"{op}: the integer {v} does not fit in int64")
    return v


def _number(v: Any, op: str) -> int | float:
    t = type(v)
    if t is int:
        return _check_int(v, op)
    if t is float:
        if math.isnan(v):
            raise _FilterError(f"{op} expects a number, got NaN")
        return v
    if t is not bool:
        c = _coerce_numpy(v)
        if c is not v and type(c) is not bool:
            return _number(c, op)
        if isinstance(v, int) and not isinstance(v, bool):  # an int subclass (IntEnum ...)
            return _check_int(int(v), op)
        if isinstance(v, float):
            return _number(float(v), op)
    raise _FilterError(f"{op} expects a number, got {_type_name(v)}")


def _scalar(v: Any, op: str) -> str | int | float | bool:
    t = type(v)
    if t is str or t is bool:
        return v
    if t is int:
        return _check_int(v, op)
    if t is float:
        if math.isnan(v):
            raise _FilterError(f"{op} expects a str, int, float or bool, got NaN")
        return v
    c = _coerce_numpy(v)
    if c is not v:
        return _scalar(c, op)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _number(v, op)
    raise _FilterError(f"{op} expects a str, int, float or bool, got {_type_name(v)}")


def _string(v: Any, op: str) -> str:
    if type(v) is str:
        return v
    if isinstance(v, str):
        return str(v)
    raise _FilterError(f"{op} expects a str, got {_type_name(v)}")


def _boolean(v: Any, op: str) -> bool:
    if type(v) is bool:
        return v
    c = _coerce_numpy(v)
    if type(c) is bool:
        return c
    raise _FilterError(f"{op} expects a bool (true or false), got {_type_name(v)}")


def _item_kind(item: Any) -> str | None:
    """"str", "bool" or "number" for a valid $in item (numpy scalars included), else None."""
    item = _coerce_numpy(item)
    if isinstance(item, str):
        return "str"
    if isinstance(item, bool):
        return "bool"
    if isinstance(item, int) or (isinstance(item, float) and not math.isnan(item)):
        return "number"
    return None


def _items(v: Any, op: str) -> tuple:
    if not isinstance(v, (list, tuple)):
        raise _FilterError(f"{op} expects a non-empty list, got {_type_name(v)}")
    if not v:
        raise _FilterError(f"{op} expects a non-empty list, got an empty list")
    kind = _item_kind(v[0])
    if kind is None:
        raise _FilterError(f"{op} expects items that are str, int, float or bool; "
                           f"item 0 is {_type_name(v[0])}")
    out: list = []
    seen: set = set()
    for i, item in enumerate(v):
        if _item_kind(item) != kind:
            first = {"str": "a str", "bool": "a bool", "number": "a number"}[kind]
            raise _FilterError(
                f"{op} expects items that are all str, all bool or all numbers; item 0 is "
                f"{first} but item {i} is {_type_name(item)}"
            )
        item = _coerce_numpy(item)
        if kind == "str":
            item = str(item)
        elif kind == "bool":
            item = bool(item)
        elif isinstance(item, int):
            item = int(item)
            if not _INT64_MIN <= item <= _INT64_MAX:
                raise _FilterError(f"{op}: item {i}, the integer {item}, does not fit in int64")
        else:
            item = float(item)
        # 1 and 1.0 are the same number; a bool never meets a number here (one kind per list)
        if item not in seen:
            seen.add(item)
            out.append(item)
    return tuple(out)


# ----------------------------------------------------------------------------------------------
# ISO-8601


_ISO_RE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]+))?)?"
    r"([Zz]|[+-][0-9]{2}(?::?[0-9]{2})?)?)?",
    re.ASCII,
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _parse_iso(text: str) -> float:
    """The instant of an ISO-8601 string as epoch seconds; raises ValueError with a reason.

    The arithmetic mirrors ``parse_iso8601`` in ``cpp/string_dict.cpp`` operation for
    operation (Python floats are IEEE doubles), so the operand of ``$before`` / ``$after`` and
    a stored string spelled the same way get the same double and compare equal.
    """
    m = _ISO_RE.fullmatch(text)
    if m is None:
        raise ValueError(
            "expected YYYY-MM-DD, optionally followed by T and hh:mm[:ss[.fraction]] and an "
            "offset (Z or +hh:mm)"
        )
    year, month, day = int(m[1]), int(m[2]), int(m[3])
    if not 1 <= month <= 12:
        raise ValueError(f"month {month} is out of range")
    dim = _DAYS_IN_MONTH[month - 1]
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        dim = 29
    if not 1 <= day <= dim:
        raise ValueError(f"day {day} is out of range for {year:04d}-{month:02d}")
    secs = float(_days_from_civil(year, month, day)) * 86400.0
    if m[4] is None:
        return secs
    hour, minute = int(m[4]), int(m[5])
    second = int(m[6]) if m[6] is not None else 0
    frac = 0.0
    if m[7]:
        scale = 0.1
        for ch in m[7]:
            frac += (ord(ch) - 48) * scale
            scale /= 10
    if hour > 24:
        raise ValueError(f"hour {hour} is out of range")
    if minute > 59:
        raise ValueError(f"minute {minute} is out of range")
    if second > 60:  # 60: a leap second, counted as the first second of the next minute
        raise ValueError(f"second {second} is out of range")
    if hour == 24 and (minute != 0 or second != 0 or frac != 0):
        raise ValueError("hour 24 is only allowed as 24:00:00 (the end of the day)")
    secs += hour * 3600.0 + minute * 60.0 + second + frac
    tz = m[8]
    if tz is None or tz == "Z" or tz == "z":
        return secs
    oh = int(tz[1:3])
    om = int(tz[-2:]) if len(tz) > 3 else 0
    if oh > 23 or om > 59:
        raise ValueError(f"offset {tz} is out of range")
    sign = 1 if tz[0] == "+" else -1
    return secs - sign * (oh * 3600.0 + om * 60.0)


def iso8601_to_epoch(text: str) -> float:
    """Seconds since the Unix epoch (UTC) of an ISO-8601 date or date-time string.

    Accepted: ``YYYY-MM-DD`` (midnight UTC), optionally followed by ``T`` (or ``t`` or a
    space) and ``hh:mm``, ``hh:mm:ss`` or ``hh:mm:ss.fraction`` (``.`` or ``,``), optionally
    followed by ``Z`` / ``z`` or an offset ``+hh:mm``, ``+hhmm`` or ``+hh`` (no offset means
    UTC). Years 0000-9999 of the proleptic Gregorian calendar; ``24:00:00`` is the end of the
    day and second 60 (a leap second) is the first second of the next minute. This is the
    grammar the native core uses for stored strings, and the double is computed with the same
    IEEE operations, so equal spellings give bit-identical values.

    Raises :class:`~kbcore.errors.InvalidArgumentError` if ``text`` is not such a string.
    """
    if not isinstance(text, str):
        raise InvalidArgumentError(
            f"expected an ISO-8601 date or date-time string, got {_type_name(text)}"
        )
    try:
        return _parse_iso(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"invalid ISO-8601 date-time {text!r}: {exc}") from None


def _instant(v: Any, op: str) -> float:
    if not isinstance(v, str):
        raise _FilterError(
            f"{op} expects an ISO-8601 date or date-time string, got {_type_name(v)}"
        )
    try:
        return _parse_iso(str(v))
    except ValueError as exc:
        raise _FilterError(f"{op}: invalid ISO-8601 date-time {v!r}: {exc}") from None


# ----------------------------------------------------------------------------------------------
# compilation


def _compile_op(field: str, op: Any, operand: Any) -> Node:
    if type(op) is str:
        name = _SCALAR_OPS.get(op)
        if name is not None:
            return ("cmp", field, name, _scalar(operand, op))
        name = _NUMBER_OPS.get(op)
        if name is not None:
            return ("cmp", field, name, _number(operand, op))
        name = _LIST_OPS.get(op)
        if name is not None:
            return ("cmp", field, name, _items(operand, op))
        name = _STR_OPS.get(op)
        if name is not None:
            return ("cmp", field, name, _string(operand, op))
        name = _BOOL_OPS.get(op)
        if name is not None:
            return ("cmp", field, name, _boolean(operand, op))
        name = _TIME_OPS.get(op)
        if name is not None:
            return ("cmp", field, name, _instant(operand, op))
        hint = ""
        if ("$" + op) in _ALL_OPS:
            hint = f' (did you mean "${op}"?)'
        elif op in ("$and", "$or"):
            hint = f" ({op} belongs at the level of fields, not inside a field's operators)"
        raise _FilterError(
            f"unknown operator {json.dumps(op, ensure_ascii=False)}{hint}; expected one of "
            f"{_OPS_TEXT}"
        )
    raise _FilterError(f"operator names must be str, got {_type_name(op)}")


def _sorted_keys(d: Mapping, what: str) -> list:
    keys = list(d)
    if len(keys) > 1:
        for k in keys:
            if type(k) is not str:
                err = _FilterError(f"{what} names must be str, got {_type_name(k)}")
                err.segments.append(k)
                raise err
        keys.sort()
    return keys


def _compile_field(field: str, spec: Any, out: list) -> None:
    t = type(spec)
    if t is str or t is bool or t is int or t is float:
        out.append(("cmp", field, "eq", _scalar(spec, "$eq")))
        return
    if isinstance(spec, Mapping):
        if not spec:
            raise _FilterError(
                "an empty operator dict {} is not allowed; give at least one operator such as "
                '{"$eq": value}'
            )
        for op in _sorted_keys(spec, "operator"):
            out.append(_compile_op(field, op, spec[op]))
        return
    try:
        out.append(("cmp", field, "eq", _scalar(spec, "$eq")))
    except _FilterError:
        raise _FilterError(
            f"expected a str, int, float or bool (shorthand for $eq) or a dict of operators, "
            f"got {_type_name(spec)}"
        ) from None


def _compile_logical(key: str, children: Any, out: list) -> None:
    if not isinstance(children, (list, tuple)):
        raise _FilterError(f"{key} expects a non-empty list of filter dicts, got "
                           f"{_type_name(children)}")
    if not children:
        raise _FilterError(f"{key} expects a non-empty list of filter dicts, got an empty list")
    if key == "$and":
        for i, child in enumerate(children):
            try:
                _compile_dict(child, out)
            except _FilterError as err:
                err.segments.append(i)
                raise
        return
    alts: list[Node] = []
    for i, child in enumerate(children):
        try:
            node = _compile_node(child)
        except _FilterError as err:
            err.segments.append(i)
            raise
        if node[0] == "or":
            alts.extend(node[1])
        else:
            alts.append(node)
    if len(alts) == 1:
        node = alts[0]
        if node[0] == "and":
            out.extend(node[1])
        else:
            out.append(node)
    else:
        out.append(("or", tuple(alts)))


def _compile_dict(where: Any, out: list) -> None:
    """Appends the conjuncts of one where dict to ``out``."""
    if not isinstance(where, Mapping):
        raise _FilterError(f"expected a filter dict, got {_type_name(where)}")
    if not where:
        raise _FilterError("an empty filter {} is not allowed (use where=None for no filter)")
    for key in _sorted_keys(where, "field"):
        try:
            if type(key) is not str:
                raise _FilterError(f"field names must be str, got {_type_name(key)}")
            if key[:1] == "$":
                if key == "$and" or key == "$or":
                    _compile_logical(key, where[key], out)
                elif key in _ALL_OPS:
                    raise _FilterError(
                        f"operator {key} needs a field: write {{field: {{{json.dumps(key)}: "
                        "value}}"
                    )
                else:
                    raise _FilterError(
                        f"unknown logical operator {json.dumps(key, ensure_ascii=False)}; "
                        'expected "$and" or "$or" (field names cannot start with "$")'
                    )
            else:
                _compile_field(key, where[key], out)
        except _FilterError as err:
            err.segments.append(key)
            raise


def _compile_node(where: Any) -> Node:
    out: list[Node] = []
    _compile_dict(where, out)
    if len(out) == 1:
        return out[0]
    return ("and", tuple(out))


# -- cache: keyed on a hashable image of the where that keeps scalar types apart (1, 1.0 and
#    True are equal and hash alike in Python, but compile to different IR values). An entry
#    holds the IR and the native Filter built from it (converted and validated once), so that
#    a repeated where costs one dict lookup before the native evaluation.


class _Unhashable(Exception):
    pass


def _freeze(v: Any) -> Any:
    t = type(v)
    if t is str:
        return v
    if t is int or t is float or t is bool:
        return (t, v)
    if t is dict:
        return (dict, tuple([(k, _freeze(x)) for k, x in v.items()]))
    if t is list or t is tuple:
        return (list, tuple([_freeze(x) for x in v]))
    raise _Unhashable


# The key of the one-condition shapes {f: {op: v}} and {f: v} with a plain str / int / float /
# bool v, built in C without recursion: (f, op, type(v), v) or (f, type(v), v); None for any
# other where (then _freeze decides). It starts with a str, so it never equals a _freeze key
# (those start with "dict"). The C lookup of native_filter builds the same key.
_quick_key = _core.quick_key


_CACHE_SIZE = 1024
_cache: dict[Any, tuple[Node, Any]] = {}  # key -> (IR, native Filter)
_cached_filter = _core.cached_filter


def _compiled(where: Any) -> tuple[Node, Any]:
    """(IR, native Filter) of a non-None where, from the cache when possible; raises
    InvalidArgumentError naming the place of the error."""
    try:
        key = _quick_key(where)
        if key is None:
            key = _freeze(where)
        hit = _cache.get(key)
        if hit is not None:
            return hit
        node = _compile_node(where)  # raises before anything is cached
    except _Unhashable:  # numpy scalars, Mapping subclasses ...: compile without caching
        node = _compile_where_uncached(where)
        return node, _core.Filter(node)
    except _FilterError as err:
        raise _invalid(err) from None
    except RecursionError:
        raise InvalidArgumentError("where: the filter is nested too deeply") from None
    hit = (node, _core.Filter(node))
    if len(_cache) >= _CACHE_SIZE:
        try:  # evict the oldest entry (dicts keep insertion order)
            del _cache[next(iter(_cache))]
        except (KeyError, RuntimeError, StopIteration):  # another thread got there first
            pass
    _cache[key] = hit
    return hit


def _invalid(err: _FilterError) -> InvalidArgumentError:
    return InvalidArgumentError(f"{_format_path('where', err.segments)}: {err.message}")


def _compile_where_uncached(where: Any) -> Node:
    try:
        return _compile_node(where)
    except _FilterError as err:
        raise _invalid(err) from None
    except RecursionError:
        raise InvalidArgumentError("where: the filter is nested too deeply") from None


def compile_where(where: Mapping[str, Any] | None) -> Node | None:
    """Validates a ``where`` filter and compiles it to the IR; ``None`` means no filter.

    See ``docs/filter-ir.md``. Raises :class:`~kbcore.errors.InvalidArgumentError` (a
    ``ValueError``) whose message names the place inside the filter, e.g.
    ``where["$and"][1]["year"]: $gt expects a number, got str``.
    The result is canonical (see the module docstring); results for filters made of plain
    dicts, lists and scalars are cached (the IR is immutable, so sharing it is safe).
    """
    if where is None:
        return None
    return _compiled(where)[0]


def native_filter(where: Mapping[str, Any] | None) -> Any:
    """The compiled ``where`` as the native ``Filter`` the index evaluates (``None`` for None).

    Validates exactly as :func:`compile_where` (same errors) and shares its cache; a cache hit
    of a one-condition where is one native call (``_core.cached_filter`` builds the
    ``_quick_key`` key and looks it up). A native ``Filter`` is returned as it is, so that
    :class:`~kbcore.Index` searches accept a filter compiled once for several calls.
    """
    if where is None:
        return None
    hit = _cached_filter(_cache, where)
    if hit is not None:
        return hit
    if type(where) is _core.Filter:  # compiled already (after the lookup: free for a dict)
        return where
    return _compiled(where)[1]


# ----------------------------------------------------------------------------------------------
# Dify's External Knowledge API


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
    "=": "=",
    "==": "=",
    "≠": "≠",
    "!=": "≠",
    ">": ">",
    "<": "<",
    "≥": "≥",
    ">=": "≥",
    "≤": "≤",
    "<=": "≤",
    "before": "before",
    "after": "after",
}
_DIFY_NUMERIC = {">": "$gt", "<": "$lt", "≥": "$gte", "≤": "$lte"}
_DIFY_TEXT = {
    "contains": "$contains",
    "not contains": "$not_contains",
    "start with": "$starts_with",
    "end with": "$ends_with",
}
_DIFY_OPS_TEXT = (
    "contains, not contains, start with, end with, is, is not, in, not in, empty, not empty, "
    "null, not null, =, ≠ (!=), >, <, ≥ (>=), ≤ (<=), before, after"
)
_NUMBER_RE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _parse_number(text: str) -> int | float | None:
    s = text.strip()
    if _INT_RE.fullmatch(s):
        v = int(s)
        return v if _INT64_MIN <= v <= _INT64_MAX else float(v)
    if _NUMBER_RE.fullmatch(s):
        f = float(s)
        return f if math.isfinite(f) else None
    return None


def _finite(value: float, op: str) -> int | float:
    """A number the filter language accepts: ints beyond int64 become floats, inf/NaN fail."""
    if isinstance(value, int):
        value = int(value)
        return value if _INT64_MIN <= value <= _INT64_MAX else float(value)
    value = float(value)
    if not math.isfinite(value):
        raise InvalidArgumentError(f'"{op}" needs a finite number, got {value!r}')
    return value


def _dify_number(value: Any, op: str) -> int | float:
    value = _coerce_numpy(value)
    if type(value) is not bool and isinstance(value, (int, float)):
        return _finite(value, op)
    if isinstance(value, str):
        n = _parse_number(value)
        if n is not None:
            return n
        raise InvalidArgumentError(f'"{op}" compares numbers, but {value!r} is not a number')
    raise InvalidArgumentError(f'"{op}" compares numbers, got {_type_name(value)}')


def _dify_text(value: Any, op: str) -> str:
    value = _coerce_numpy(value)
    if isinstance(value, str):
        return str(value)
    if type(value) is not bool and isinstance(value, (int, float)):
        return str(value)
    raise InvalidArgumentError(f'"{op}" needs a string value, got {_type_name(value)}')


def _dify_scalar(value: Any, op: str) -> str | int | float | bool:
    value = _coerce_numpy(value)
    if isinstance(value, (str, bool)):
        return value if type(value) in (str, bool) else str(value)
    if isinstance(value, (int, float)):
        return _finite(value, op)
    raise InvalidArgumentError(
        f'"{op}" needs a string, number or boolean value, got {_type_name(value)}'
    )


def _dify_list(value: Any, op: str) -> list:
    value = _coerce_numpy(value)
    if isinstance(value, str):
        items: list = [s.strip() for s in value.split(",")]
        items = [s for s in items if s]
    elif isinstance(value, (list, tuple)):
        items = [_coerce_numpy(v) for v in value]
        items = [v.strip() if isinstance(v, str) else v for v in items]
    elif type(value) is not bool and isinstance(value, (int, float)):
        items = [value]
    else:
        raise InvalidArgumentError(
            f'"{op}" needs a list or a comma-separated string, got {_type_name(value)}'
        )
    if not items:
        raise InvalidArgumentError(f'"{op}" needs at least one value, got none')
    kinds = set()
    for v in items:
        if isinstance(v, str):
            kinds.add("str")
        elif isinstance(v, bool):
            kinds.add("bool")
        elif isinstance(v, (int, float)):
            kinds.add("number")
        else:
            raise InvalidArgumentError(
                f'"{op}" needs strings or numbers, got an item of type {_type_name(v)}'
            )
    if len(kinds) > 1:
        raise InvalidArgumentError(
            f'"{op}" needs values of one type (all strings, all numbers or all booleans), '
            f"got a mix of {' and '.join(sorted(kinds))}"
        )
    if kinds == {"number"}:
        items = [_finite(v, op) for v in items]
    return items


def _dify_instant(value: Any, op: str) -> tuple[str, float]:
    """(ISO-8601 string, epoch seconds) of a Dify date operand: ISO text or Unix seconds."""
    value = _coerce_numpy(value)
    if isinstance(value, str):
        text = value.strip()
        n = _parse_number(text)
        if n is None:
            try:
                return text, _parse_iso(text)
            except ValueError as exc:
                raise InvalidArgumentError(
                    f'"{op}" needs an ISO-8601 date/date-time or Unix seconds; {value!r}: {exc}'
                ) from None
        value = n
    if type(value) is not bool and isinstance(value, (int, float)):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise InvalidArgumentError(f'"{op}" needs a finite timestamp, got {value!r}')
        try:
            dt = datetime.fromtimestamp(seconds, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise InvalidArgumentError(f'"{op}": timestamp {value!r} is out of range') from None
        text = (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}"
                f"T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}")
        if dt.microsecond:
            text += f".{dt.microsecond:06d}"
        return text + "Z", value
    raise InvalidArgumentError(
        f'"{op}" needs an ISO-8601 date/date-time string or Unix seconds, got {_type_name(value)}'
    )


def _dify_one(field: str, op: str, value: Any, has_value: bool) -> dict:
    """The where dict of one Dify condition on one field."""
    if op == "empty":
        return {field: {"$empty": True}}
    if op == "not empty":
        return {field: {"$empty": False}}
    if op == "null":
        return {field: {"$exists": False}}
    if op == "not null":
        return {field: {"$exists": True}}
    if not has_value or value is None:
        raise InvalidArgumentError(f'"{op}" needs a value, got none')
    if op in _DIFY_TEXT:
        return {field: {_DIFY_TEXT[op]: _dify_text(value, op)}}
    if op in ("is", "is not"):
        key = "$eq" if op == "is" else "$ne"
        return {field: {key: _dify_scalar(value, op)}}
    if op in ("=", "≠"):
        key = "$eq" if op == "=" else "$ne"
        v = _dify_scalar(value, op)
        if isinstance(v, str):
            n = _parse_number(v)
            if n is not None:
                v = n
        return {field: {key: v}}
    if op in _DIFY_NUMERIC:
        return {field: {_DIFY_NUMERIC[op]: _dify_number(value, op)}}
    if op in ("in", "not in"):
        return {field: {"$in" if op == "in" else "$nin": _dify_list(value, op)}}
    # before / after: the stored value may be an ISO-8601 string (kbcore's date convention)
    # or Unix seconds (how Dify stores its own "time" metadata); either form may match
    text, seconds = _dify_instant(value, op)
    iso_key, num_key = ("$before", "$lt") if op == "before" else ("$after", "$gt")
    return {"$or": [{field: {iso_key: text}}, {field: {num_key: seconds}}]}


def dify_condition_to_where(metadata_condition: Mapping[str, Any] | None) -> dict | None:
    """Translates Dify's External Knowledge API ``metadata_condition`` into a ``where`` dict.

    ``{"logical_operator": "and" | "or", "conditions": [{"name": str | [str, ...],
    "comparison_operator": str, "value": ...}, ...]}`` -> a dict for :func:`compile_where`, or
    ``None`` when there is nothing to filter on (no condition object, or no / null / empty
    ``conditions``). A ``name`` list applies the condition to any of the fields (OR).

    Operators: ``contains``, ``not contains``, ``start with``, ``end with``, ``is``,
    ``is not`` (string / number / boolean equality), ``in``, ``not in`` (a list or a
    comma-separated string), ``empty``, ``not empty`` (missing, "" or []), ``null``,
    ``not null`` (missing / present), ``=``, ``≠``, ``>``, ``<``, ``≥``, ``≤`` (numbers; a
    numeric string such as ``"5"`` becomes a number; ``!=``, ``>=``, ``<=`` are accepted too),
    ``before``, ``after`` (an ISO-8601 date / date-time or Unix seconds; a stored ISO string
    or a stored number of Unix seconds is compared). Operator names ignore case and extra
    spaces.

    Raises :class:`~kbcore.errors.InvalidArgumentError` naming the condition when an operator
    is unknown or cannot apply to the value given (an HTTP layer answers 400).
    """
    if metadata_condition is None:
        return None
    root = "metadata_condition"
    if not isinstance(metadata_condition, Mapping):
        raise InvalidArgumentError(
            f"{root}: expected an object, got {_type_name(metadata_condition)}"
        )
    conditions = metadata_condition.get("conditions")
    if conditions is None:
        return None
    if not isinstance(conditions, (list, tuple)):
        raise InvalidArgumentError(
            f'{root}["conditions"]: expected a list of conditions, got {_type_name(conditions)}'
        )
    if not conditions:
        return None
    logical = metadata_condition.get("logical_operator")
    if logical is None:
        logical = "and"
    if not isinstance(logical, str) or logical.strip().lower() not in ("and", "or"):
        raise InvalidArgumentError(
            f'{root}["logical_operator"]: expected "and" or "or", got {logical!r}'
        )
    logical = logical.strip().lower()

    parts: list[dict] = []
    for i, cond in enumerate(conditions):
        path = f'{root}["conditions"][{i}]'
        if not isinstance(cond, Mapping):
            raise InvalidArgumentError(f"{path}: expected an object, got {_type_name(cond)}")
        names = cond.get("name")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, (list, tuple)) or not names:
            got = "an empty list" if isinstance(names, (list, tuple)) else _type_name(names)
            raise InvalidArgumentError(
                f'{path}["name"]: expected a field name or a non-empty list of field names, '
                f"got {got}"
            )
        for j, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise InvalidArgumentError(
                    f'{path}["name"]: field names must be non-empty strings, got '
                    f"{_type_name(name) if not isinstance(name, str) else 'an empty string'}"
                    + (f" at position {j}" if len(names) > 1 else "")
                )
            if name.startswith("$"):
                raise InvalidArgumentError(
                    f'{path}["name"]: field names cannot start with "$", got {name!r}'
                )
        raw_op = cond.get("comparison_operator")
        if not isinstance(raw_op, str):
            raise InvalidArgumentError(
                f'{path}["comparison_operator"]: expected a string, got {_type_name(raw_op)}'
            )
        op = _DIFY_OPS.get(" ".join(raw_op.split()).lower())
        if op is None:
            raise InvalidArgumentError(
                f'{path}["comparison_operator"]: unknown operator {raw_op!r}; expected one of '
                f"{_DIFY_OPS_TEXT}"
            )
        try:
            per_field = [
                _dify_one(str(name), op, cond.get("value"), "value" in cond) for name in names
            ]
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{path}: {exc}") from None
        part = per_field[0] if len(per_field) == 1 else {"$or": _flat_or(per_field)}
        if logical == "or" and list(part) == ["$or"]:
            parts.extend(part["$or"])
        else:
            parts.append(part)

    if len(parts) == 1:
        return parts[0]
    return {f"${logical}": parts}


def _flat_or(wheres: list[dict]) -> list[dict]:
    out: list[dict] = []
    for w in wheres:
        if list(w) == ["$or"]:
            out.extend(w["$or"])
        else:
            out.append(w)
    return out
