"""The ``where`` compiler: a Chroma-style filter dict -> the canonical IR of ``docs/filter-ir.md``
(validation with errors that name the place, operand normalisation, flattening). Pure Python;
the ISO-8601 operands go through the native parser (:mod:`.iso`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..metadata import _INT64_MAX, _INT64_MIN
from .iso import parse_iso, type_name

#: A compiled filter node (see the module docstring).
Node = tuple


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


# ----------------------------------------------------------------------------------------------
# operand normalisation


def coerce_numpy(v: Any) -> Any:
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
        c = coerce_numpy(v)
        if c is not v and type(c) is not bool:
            return _number(c, op)
        if isinstance(v, int) and not isinstance(v, bool):  # an int subclass (IntEnum ...)
            return _check_int(int(v), op)
        if isinstance(v, float):
            return _number(float(v), op)
    raise _FilterError(f"{op} expects a number, got {type_name(v)}")


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
    c = coerce_numpy(v)
    if c is not v:
        return _scalar(c, op)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return _number(v, op)
    raise _FilterError(f"{op} expects a str, int, float or bool, got {type_name(v)}")


def _string(v: Any, op: str) -> str:
    if type(v) is str:
        return v
    if isinstance(v, str):
        return str(v)
    raise _FilterError(f"{op} expects a str, got {type_name(v)}")


def _boolean(v: Any, op: str) -> bool:
    if type(v) is bool:
        return v
    c = coerce_numpy(v)
    if type(c) is bool:
        return c
    raise _FilterError(f"{op} expects a bool (true or false), got {type_name(v)}")


def _item_kind(item: Any) -> str | None:
    """ "str", "bool" or "number" for a valid $in item (numpy scalars included), else None."""
    item = coerce_numpy(item)
    if isinstance(item, str):
        return "str"
    if isinstance(item, bool):
        return "bool"
    if isinstance(item, int) or (isinstance(item, float) and not math.isnan(item)):
        return "number"
    return None


def _items(v: Any, op: str) -> tuple:
    if not isinstance(v, (list, tuple)):
        raise _FilterError(f"{op} expects a non-empty list, got {type_name(v)}")
    if not v:
        raise _FilterError(f"{op} expects a non-empty list, got an empty list")
    kind = _item_kind(v[0])
    if kind is None:
        raise _FilterError(f"{op} expects items that are str, int, float or bool; item 0 is {type_name(v[0])}")
    out: list = []
    seen: set = set()
    for i, item in enumerate(v):
        if _item_kind(item) != kind:
            first = {"str": "a str", "bool": "a bool", "number": "a number"}[kind]
            raise _FilterError(
                f"{op} expects items that are all str, all bool or all numbers; item 0 is "
                f"{first} but item {i} is {type_name(item)}"
            )
        item = coerce_numpy(item)
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


def _instant(v: Any, op: str) -> float:
    if not isinstance(v, str):
        raise _FilterError(f"{op} expects an ISO-8601 date or date-time string, got {type_name(v)}")
    try:
        return parse_iso(str(v))
    except ValueError as exc:
        raise _FilterError(f"{op}: invalid ISO-8601 date-time {v!r}: {exc}") from None


# ----------------------------------------------------------------------------------------------
# compilation


#: operator -> (IR name, operand check); the order is the one error messages list.
_OPS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "$eq": ("eq", _scalar),
    "$ne": ("ne", _scalar),
    "$gt": ("gt", _number),
    "$gte": ("gte", _number),
    "$lt": ("lt", _number),
    "$lte": ("lte", _number),
    "$in": ("in", _items),
    "$nin": ("nin", _items),
    "$contains": ("contains", _string),
    "$not_contains": ("not_contains", _string),
    "$starts_with": ("starts_with", _string),
    "$ends_with": ("ends_with", _string),
    "$exists": ("exists", _boolean),
    "$empty": ("empty", _boolean),
    "$before": ("before", _instant),
    "$after": ("after", _instant),
}
_ALL_OPS = tuple(_OPS)
_OPS_TEXT = ", ".join(_ALL_OPS)


def _compile_op(field: str, op: Any, operand: Any) -> Node:
    if type(op) is str:
        entry = _OPS.get(op)
        if entry is not None:
            return ("cmp", field, entry[0], entry[1](operand, op))
        hint = ""
        if ("$" + op) in _ALL_OPS:
            hint = f' (did you mean "${op}"?)'
        elif op in ("$and", "$or"):
            hint = f" ({op} belongs at the level of fields, not inside a field's operators)"
        raise _FilterError(f"unknown operator {json.dumps(op, ensure_ascii=False)}{hint}; expected one of {_OPS_TEXT}")
    raise _FilterError(f"operator names must be str, got {type_name(op)}")


def _sorted_keys(d: Mapping, what: str) -> list:
    keys = list(d)
    if len(keys) > 1:
        for k in keys:
            if type(k) is not str:
                err = _FilterError(f"{what} names must be str, got {type_name(k)}")
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
                'an empty operator dict {} is not allowed; give at least one operator such as {"$eq": value}'
            )
        for op in _sorted_keys(spec, "operator"):
            out.append(_compile_op(field, op, spec[op]))
        return
    try:
        out.append(("cmp", field, "eq", _scalar(spec, "$eq")))
    except _FilterError:
        raise _FilterError(
            f"expected a str, int, float or bool (shorthand for $eq) or a dict of operators, got {type_name(spec)}"
        ) from None


def _compile_logical(key: str, children: Any, out: list) -> None:
    if not isinstance(children, (list, tuple)):
        raise _FilterError(f"{key} expects a non-empty list of filter dicts, got {type_name(children)}")
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
        raise _FilterError(f"expected a filter dict, got {type_name(where)}")
    if not where:
        raise _FilterError("an empty filter {} is not allowed (use where=None for no filter)")
    for key in _sorted_keys(where, "field"):
        try:
            if type(key) is not str:
                raise _FilterError(f"field names must be str, got {type_name(key)}")
            if key[:1] == "$":
                if key == "$and" or key == "$or":
                    _compile_logical(key, where[key], out)
                elif key in _ALL_OPS:
                    raise _FilterError(f"operator {key} needs a field: write {{field: {{{json.dumps(key)}: value}}}}")
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
