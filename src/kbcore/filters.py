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
``$before`` / ``$after`` (the native one, which also reads stored values).

The implementation lives in :mod:`kbcore._filter`: ``where`` (the compiler), ``cache`` (the
compiled-filter cache and :func:`native_filter`) and ``iso`` (ISO-8601, native).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ._filter.cache import compile_where, native_filter
from ._filter.iso import _parse_iso, iso8601_to_epoch
from ._filter.where import _INT64_MAX, _INT64_MIN, Node, _coerce_numpy, _type_name
from .errors import InvalidArgumentError

__all__ = ["Node", "compile_where", "dify_condition_to_where", "iso8601_to_epoch", "native_filter"]


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
