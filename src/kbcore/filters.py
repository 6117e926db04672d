"""The ``where`` filter language: validation and compilation to the IR the native core evaluates.

See ``docs/filter-ir.md`` for the grammar, the semantics and the IR. In short,
:func:`compile_where` turns a Chroma-style ``where`` dict into an immutable tree of tuples::

    ("and", (node, ...)) | ("or", (node, ...)) | ("cmp", field, op, value)

The output is canonical: the keys of every dict are visited in sorted order (dicts are
unordered collections, so two equal dicts compile to the same IR), nested ``and`` in ``and`` and
``or`` in ``or`` are flattened, a single-child ``and`` / ``or`` is replaced by its child, and
duplicate ``$in`` / ``$nin`` items are dropped (first occurrence kept). Lists keep their order.

:func:`dify_condition_to_where` (from :mod:`kbcore.dify.condition`) translates the
``metadata_condition`` of Dify's External Knowledge API into a ``where`` dict;
:func:`iso8601_to_epoch` is the date-time parser used by
``$before`` / ``$after`` (its grammar is the contract for the native parser of stored values).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
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
        return node, _native(node, where)
    except _FilterError as err:
        raise _invalid(err) from None
    except RecursionError:
        raise InvalidArgumentError("where: the filter is nested too deeply") from None
    hit = (node, _native(node, where))
    if len(_cache) >= _CACHE_SIZE:
        try:  # evict the oldest entry (dicts keep insertion order)
            del _cache[next(iter(_cache))]
        except (KeyError, RuntimeError, StopIteration):  # another thread got there first
            pass
    _cache[key] = hit
    return hit


def _native(node: Node, where: Any) -> Any:
    """``_core.Filter(node)``; a string that is not valid Unicode (a lone surrogate, which
    the binding cannot convert to UTF-8) is an InvalidArgumentError naming its place."""
    try:
        return _core.Filter(node)
    except RuntimeError:
        segments = _surrogate_at(where)
        if segments is None:
            raise
        err = _FilterError("a string contains a lone surrogate, which is not valid Unicode")
        err.segments = segments
        text = str(_invalid(err)).encode("utf-8", "backslashreplace").decode("utf-8")
        raise InvalidArgumentError(text) from None


def _surrogate_at(v: Any) -> list[object] | None:
    """Path segments (innermost first) of the first str in ``v`` that is not UTF-8."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return []
        return None
    if isinstance(v, Mapping):
        items: Any = v.items()
    elif isinstance(v, (list, tuple)):
        items = enumerate(v)
    else:
        return None
    for k, x in items:
        for part in (k, x):
            found = _surrogate_at(part)
            if found is not None:
                return found + [k]
    return None


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
    ``_quick_key`` key and looks it up).
    """
    if where is None:
        return None
    hit = _cached_filter(_cache, where)
    if hit is not None:
        return hit
    return _compiled(where)[1]


# Dify's metadata_condition translator lives in kbcore.dify.condition; re-exported here.
from .dify.condition import dify_condition_to_where
