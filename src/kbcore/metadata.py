"""Metadata rows -> the typed columns the native core stores (see ``docs/filter-ir.md``).

A column is a tuple ``(name, kind, valid, *payload)`` over n rows; ``valid`` is uint8 [n]:

- ``(name, "int", valid, values: int64[n])``
- ``(name, "float", valid, values: float64[n])``
- ``(name, "bool", valid, values: uint8[n])``
- ``(name, "str", valid, offsets: int64[n+1], data: uint8[m])``
- ``(name, "strlist", valid, list_offsets: int64[n+1], offsets: int64[L+1], data: uint8[m])``

Rows without a value of a kind have ``valid == 0``, a zero value and an empty string / list. A
field that holds values of several kinds yields one column per kind, with disjoint ``valid``.
A (name, kind) with no valid row yields no column. Columns come sorted by name, then kind in
the order int, float, bool, str, strlist, so equal data always gives equal columns.

:func:`columns_from_rows` reads a list of dicts; :func:`columns_from_arrow` reads a pyarrow
Table or RecordBatch with vectorised pyarrow / numpy operations (pyarrow is imported lazily:
it is an optional dependency).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, InvalidTypeError

__all__ = ["KINDS", "Column", "columns_from_arrow", "columns_from_rows"]

#: A metadata column: (name, kind, valid, *payload).
Column = tuple

#: Column kinds, in the order columns of one field are emitted.
KINDS = ("int", "float", "bool", "str", "strlist")
_KIND_ORDER = {k: i for i, k in enumerate(KINDS)}

#: The int64 range (metadata values and filter operands; kbcore.filters uses these too).
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise InvalidTypeError(f"n must be an integer, got {type(n).__name__}")
    if n < 0:
        raise InvalidArgumentError(f"n must be non-negative, got {n}")
    return int(n)


def _valid_array(n: int, rows: list[int]) -> np.ndarray:
    valid = np.zeros(n, dtype=np.uint8)
    if rows:
        valid[np.asarray(rows, dtype=np.int64)] = 1
    return valid


def _offsets(n: int, rows: list[int], lengths: list[int]) -> np.ndarray:
    """int64 [n+1] offsets where row rows[i] has length lengths[i] and other rows length 0."""
    per_row = np.zeros(n, dtype=np.int64)
    if rows:
        per_row[np.asarray(rows, dtype=np.int64)] = np.asarray(lengths, dtype=np.int64)
    out = np.empty(n + 1, dtype=np.int64)
    out[0] = 0
    np.cumsum(per_row, out=out[1:])
    return out


def _bytes_array(chunks: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(chunks), dtype=np.uint8).copy()


def _encode(s: str, row: int, name: str) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgumentError(
            f"metadata row {row}, field {name!r}: the string is not valid Unicode "
            f"(it cannot be encoded as UTF-8: {exc.reason})"
        ) from None


def _sort_columns(columns: list[Column]) -> list[Column]:
    columns.sort(key=lambda c: (c[0], _KIND_ORDER[c[1]]))
    return columns


# ----------------------------------------------------------------------------------------------
# dicts


class _Field:
    """Per-field accumulators, one (rows, values) pair per kind."""

    __slots__ = (
        "bool_rows",
        "bool_vals",
        "float_rows",
        "float_vals",
        "int_rows",
        "int_vals",
        "list_rows",
        "list_vals",
        "str_rows",
        "str_vals",
    )
    bool_rows: list[int]
    bool_vals: list[bool]
    float_rows: list[int]
    float_vals: list[float]
    int_rows: list[int]
    int_vals: list[int]
    list_rows: list[int]
    list_vals: list[list[bytes]]
    str_rows: list[int]
    str_vals: list[bytes]

    def __init__(self) -> None:
        for slot in self.__slots__:
            setattr(self, slot, [])


def _bad_value(row: int, name: str, value: Any, why: str = "") -> InvalidArgumentError:
    what = why or f"unsupported value of type {type(value).__name__}"
    return InvalidArgumentError(
        f"metadata row {row}, field {name!r}: {what}; metadata values must be int, float, "
        "bool, str, a list of str, or None"
    )


def columns_from_rows(rows: Sequence[Mapping[str, Any] | None], n: int) -> list[Column]:
    """Typed columns (see the module docstring) of ``n`` metadata rows given as dicts.

    A row may be ``None`` (no metadata); a value ``None`` means the field is missing. Values
    must be int (fitting int64), float (finite: not NaN or infinite), bool, str or a list /
    tuple of str; numpy scalars are accepted. Anything else raises
    :class:`~kbcore.errors.InvalidArgumentError` naming the row and the field.
    """
    # One function of ~100 lines on purpose: its loop body runs once per metadata value of an
    # add with dict rows, and a helper call per value would cost more than the checks do.
    n = _check_n(n)
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Sequence):
        raise InvalidTypeError(f"metadata must be a sequence of dicts (one per row), got {type(rows).__name__}")
    if len(rows) != n:
        raise InvalidArgumentError(f"got {len(rows)} metadata rows for {n} items")

    fields: dict[str, _Field] = {}
    for r, row in enumerate(rows):
        if row is None:
            continue
        if not isinstance(row, Mapping):
            raise InvalidArgumentError(f"metadata row {r}: expected a dict or None, got {type(row).__name__}")
        for name, value in row.items():
            if type(name) is not str:
                if not isinstance(name, str):
                    raise InvalidArgumentError(
                        f"metadata row {r}: field names must be str, got {name!r} ({type(name).__name__})"
                    )
                name = str(name)
            if value is None:
                continue
            acc = fields.get(name)
            if acc is None:
                acc = fields[name] = _Field()
            t = type(value)
            if t is str:
                acc.str_rows.append(r)
                acc.str_vals.append(_encode(value, r, name))
            elif t is bool:
                acc.bool_rows.append(r)
                acc.bool_vals.append(value)
            elif t is int:
                if not _INT64_MIN <= value <= _INT64_MAX:
                    raise _bad_value(r, name, value, f"the integer {value} does not fit in int64")
                acc.int_rows.append(r)
                acc.int_vals.append(value)
            elif t is float:
                if not math.isfinite(value):
                    raise _bad_value(r, name, value, f"{value} is not allowed (floats must be finite)")
                acc.float_rows.append(r)
                acc.float_vals.append(value)
            elif t is list or t is tuple:
                encoded = []
                for j, item in enumerate(value):
                    if type(item) is not str:
                        if not isinstance(item, str):
                            raise _bad_value(
                                r,
                                name,
                                value,
                                f"item {j} of the list is {type(item).__name__}, not str",
                            )
                        item = str(item)
                    encoded.append(_encode(item, r, name))
                acc.list_rows.append(r)
                acc.list_vals.append(encoded)
            else:
                _add_other(acc, r, name, value)

    columns: list[Column] = []
    for name, acc in fields.items():
        vals: np.ndarray
        if acc.int_rows:
            vals = np.zeros(n, dtype=np.int64)
            vals[np.asarray(acc.int_rows)] = np.asarray(acc.int_vals, dtype=np.int64)
            columns.append((name, "int", _valid_array(n, acc.int_rows), vals))
        if acc.float_rows:
            vals = np.zeros(n, dtype=np.float64)
            vals[np.asarray(acc.float_rows)] = np.asarray(acc.float_vals, dtype=np.float64)
            columns.append((name, "float", _valid_array(n, acc.float_rows), vals))
        if acc.bool_rows:
            vals = np.zeros(n, dtype=np.uint8)
            vals[np.asarray(acc.bool_rows)] = np.asarray(acc.bool_vals, dtype=np.uint8)
            columns.append((name, "bool", _valid_array(n, acc.bool_rows), vals))
        if acc.str_rows:
            offsets = _offsets(n, acc.str_rows, [len(b) for b in acc.str_vals])
            columns.append((name, "str", _valid_array(n, acc.str_rows), offsets, _bytes_array(acc.str_vals)))
        if acc.list_rows:
            list_offsets = _offsets(n, acc.list_rows, [len(v) for v in acc.list_vals])
            flat = [b for v in acc.list_vals for b in v]
            offsets = np.zeros(len(flat) + 1, dtype=np.int64)
            if flat:
                np.cumsum(np.fromiter((len(b) for b in flat), dtype=np.int64, count=len(flat)), out=offsets[1:])
            columns.append((name, "strlist", _valid_array(n, acc.list_rows), list_offsets, offsets, _bytes_array(flat)))
    return _sort_columns(columns)


def _add_other(acc: _Field, r: int, name: str, value: Any) -> None:
    """Values that are not exactly str/bool/int/float/list/tuple: numpy scalars, subclasses."""
    if isinstance(value, np.generic):
        if isinstance(value, np.bool_):
            acc.bool_rows.append(r)
            acc.bool_vals.append(bool(value))
            return
        if isinstance(value, np.integer):
            v = int(value)
            if not _INT64_MIN <= v <= _INT64_MAX:
                raise _bad_value(r, name, value, f"the integer {v} does not fit in int64")
            acc.int_rows.append(r)
            acc.int_vals.append(v)
            return
        if isinstance(value, np.floating):
            f = float(value)
            if not math.isfinite(f):
                raise _bad_value(r, name, value, f"{f} is not allowed (floats must be finite)")
            acc.float_rows.append(r)
            acc.float_vals.append(f)
            return
        if isinstance(value, np.str_):
            acc.str_rows.append(r)
            acc.str_vals.append(_encode(str(value), r, name))
            return
        raise _bad_value(r, name, value)
    if isinstance(value, str):
        acc.str_rows.append(r)
        acc.str_vals.append(_encode(str(value), r, name))
    elif isinstance(value, bool):  # unreachable (bool cannot be subclassed); kept for clarity
        acc.bool_rows.append(r)
        acc.bool_vals.append(bool(value))
    elif isinstance(value, int):  # IntEnum and other int subclasses
        v = int(value)
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise _bad_value(r, name, value, f"the integer {v} does not fit in int64")
        acc.int_rows.append(r)
        acc.int_vals.append(v)
    elif isinstance(value, float):
        f = float(value)
        if not math.isfinite(f):
            raise _bad_value(r, name, value, f"{f} is not allowed (floats must be finite)")
        acc.float_rows.append(r)
        acc.float_vals.append(f)
    elif isinstance(value, Mapping):
        raise _bad_value(r, name, value, "nested dicts are not supported")
    else:
        raise _bad_value(r, name, value)


# ----------------------------------------------------------------------------------------------
# Arrow


def _import_pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("reading metadata from Arrow needs pyarrow: pip install pyarrow") from exc
    return pa, pc


def _np(arr: Any, dtype: Any) -> np.ndarray:
    """A contiguous numpy copy of a null-free pyarrow array, with the given dtype."""
    return np.ascontiguousarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _validity(pa: Any, arr: Any, n: int) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(n, dtype=np.uint8)
    return _np(arr.is_valid(), np.uint8)


def _string_buffers(pa: Any, pc: Any, arr: Any) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [len+1] from 0, data uint8) of a string array; nulls become ""."""
    if not pa.types.is_large_string(arr.type):
        arr = arr.cast(pa.large_string())
    if arr.null_count:
        arr = pc.fill_null(arr, "")
    buffers = arr.buffers()
    count = len(arr)
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[arr.offset : arr.offset + count + 1]
    start, stop = int(offsets[0]), int(offsets[-1])
    if buffers[2] is None or stop == start:
        data = np.empty(0, dtype=np.uint8)
    else:
        data = np.frombuffer(buffers[2], dtype=np.uint8)[start:stop].copy()
    return offsets - start, data  # the subtraction copies, so nothing aliases Arrow memory


def _first_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _arrow_column(pa: Any, pc: Any, name: str, arr: Any, n: int) -> list[Column]:
    t = arr.type
    types = pa.types
    if types.is_dictionary(t):
        return _arrow_column(pa, pc, name, arr.cast(t.value_type), n)
    if types.is_null(t):
        return []
    valid = _validity(pa, arr, n)
    if not valid.any():
        return []
    if types.is_boolean(t):
        vals = _np(pc.fill_null(arr, False), np.uint8) if arr.null_count else _np(arr, np.uint8)
        return [(name, "bool", valid, vals)]
    if types.is_integer(t):
        if t == pa.uint64():
            top = pc.max(arr).as_py()
            if top is not None and top > _INT64_MAX:
                too_big = pc.greater(arr, pa.scalar(_INT64_MAX, pa.uint64()))
                row = _first_row(_np(pc.fill_null(too_big, False), bool))
                raise InvalidArgumentError(
                    f"metadata column {name!r}, row {row}: the integer {arr[row].as_py()} does not fit in int64"
                )
        filled = pc.fill_null(arr, 0) if arr.null_count else arr
        return [(name, "int", valid, _np(filled, np.int64))]
    if types.is_floating(t):
        filled = pc.fill_null(arr, 0.0) if arr.null_count else arr
        vals = _np(filled, np.float64)
        bad = ~np.isfinite(vals) & valid.astype(bool)
        if bad.any():
            row = _first_row(bad)
            raise InvalidArgumentError(
                f"metadata column {name!r}, row {row}: {vals[row]} is not allowed (floats must "
                "be finite; use null for a missing value)"
            )
        return [(name, "float", valid, vals)]
    if types.is_string(t) or types.is_large_string(t) or _is_string_view(pa, t):
        offsets, data = _string_buffers(pa, pc, arr)
        return [(name, "str", valid, offsets, data)]
    if types.is_timestamp(t) or types.is_date(t):
        return _arrow_column(pa, pc, name, _iso_strings(pa, pc, arr), n)
    if _is_list(pa, t) and _is_stringish(pa, t.value_type):
        return [_arrow_strlist(pa, pc, name, arr, valid, n)]
    raise InvalidTypeError(
        f"metadata column {name!r} has Arrow type {t}; supported: integers that fit int64, "
        "floats, bool, string, list<string>, timestamp and date (stored as ISO-8601 strings), "
        "and dictionaries of these"
    )


def _is_string_view(pa: Any, t: Any) -> bool:
    f = getattr(pa.types, "is_string_view", None)
    return bool(f and f(t))


def _is_stringish(pa: Any, t: Any) -> bool:
    types = pa.types
    if types.is_dictionary(t):
        t = t.value_type
    return types.is_string(t) or types.is_large_string(t) or _is_string_view(pa, t)


def _is_list(pa: Any, t: Any) -> bool:
    types = pa.types
    return types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t)


def _iso_strings(pa: Any, pc: Any, arr: Any) -> Any:
    """ISO-8601 text of a timestamp or date array (UTC instants get a "Z")."""
    t = arr.type
    if pa.types.is_date(t):
        return arr.cast(pa.string())  # YYYY-MM-DD
    suffix = ""
    if t.tz is not None:
        # tz-aware values are UTC instants: drop the zone so the text is UTC, then mark it
        arr = arr.cast(pa.timestamp(t.unit))
        suffix = "Z"
    text = arr.cast(pa.string())  # "YYYY-MM-DD hh:mm:ss[.fraction]"
    text = pc.replace_substring(text, pattern=" ", replacement="T", max_replacements=1)
    if suffix:
        text = pc.binary_join_element_wise(text, pa.scalar(suffix), "")
    return text


def _arrow_strlist(pa: Any, pc: Any, name: str, arr: Any, valid: np.ndarray, n: int) -> Column:
    lengths = pc.list_value_length(arr)
    if arr.null_count:
        lengths = pc.fill_null(lengths, 0)
    per_row = _np(lengths, np.int64)
    list_offsets = np.empty(n + 1, dtype=np.int64)
    list_offsets[0] = 0
    np.cumsum(per_row, out=list_offsets[1:])
    items = arr.flatten()  # honours slicing and skips the items behind null rows
    if pa.types.is_dictionary(items.type):
        items = items.cast(items.type.value_type)
    if items.null_count:
        bad_item = _first_row(_np(items.is_null(), bool))
        row = int(np.searchsorted(list_offsets, bad_item, side="right")) - 1
        raise InvalidArgumentError(
            f"metadata column {name!r}, row {row}: item {bad_item - int(list_offsets[row])} of "
            "the list is null; lists must hold strings only"
        )
    offsets, data = _string_buffers(pa, pc, items)
    return (name, "strlist", valid, list_offsets, offsets, data)


def columns_from_arrow(table_or_batch: Any, n: int) -> list[Column]:
    """Typed columns (see the module docstring) of a pyarrow ``Table`` or ``RecordBatch``.

    Supported column types: signed and unsigned integers (values must fit int64), floats
    (finite; nulls are missing), bool, string / large_string (and string_view),
    list / large_list / fixed_size_list of string, dictionary-encoded variants of these, and
    timestamp / date columns, which become ISO-8601 strings (``YYYY-MM-DD`` for dates,
    ``YYYY-MM-DDThh:mm:ss[.fraction]`` for timestamps, with ``Z`` when the type has a time
    zone). Columns of the null type are skipped. Any other type raises
    :class:`~kbcore.errors.InvalidTypeError` naming the column. The conversion is vectorised
    (no Python loop over rows); chunked columns are combined.
    """
    pa, pc = _import_pyarrow()
    n = _check_n(n)
    if isinstance(table_or_batch, pa.RecordBatch):
        arrays = [table_or_batch.column(i) for i in range(table_or_batch.num_columns)]
    elif isinstance(table_or_batch, pa.Table):
        arrays = [_combine(pa, c) for c in table_or_batch.columns]
    else:
        raise InvalidTypeError(f"expected a pyarrow Table or RecordBatch, got {type(table_or_batch).__name__}")
    if table_or_batch.num_rows != n:
        raise InvalidArgumentError(f"got {table_or_batch.num_rows} metadata rows for {n} items")
    names = table_or_batch.schema.names
    seen: set[str] = set()
    columns: list[Column] = []
    for name, arr in zip(names, arrays):
        if name in seen:
            raise InvalidArgumentError(f"metadata column {name!r} appears more than once")
        seen.add(name)
        columns.extend(_arrow_column(pa, pc, name, arr, n))
    return _sort_columns(columns)


def _combine(pa: Any, chunked: Any) -> Any:
    """One contiguous Array from a ChunkedArray (strings widened first: no int32 overflow)."""
    t = chunked.type
    if pa.types.is_dictionary(t):  # chunks may carry different dictionaries
        chunked = chunked.cast(t.value_type)
        t = chunked.type
    if pa.types.is_string(t):
        chunked = chunked.cast(pa.large_string())
    elif pa.types.is_list(t) and pa.types.is_string(t.value_type):
        chunked = chunked.cast(pa.large_list(pa.large_string()))
    if chunked.num_chunks == 1:
        return chunked.chunk(0)
    return chunked.combine_chunks()
