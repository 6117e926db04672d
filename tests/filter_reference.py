"""A pure-Python oracle of the ``where`` semantics (docs/filter-ir.md) and hypothesis strategies.

``matches(where, row)`` evaluates a *valid* where dict directly against one metadata row (a dict;
a missing key or ``None`` means the field is missing). It is written from the spec, not from the
IR or from ``kbcore.filters``, so that the compiler and the native evaluator can both be checked
against it. Nothing here imports kbcore.

Strategies (reusable by other test modules):

- ``valid_wheres()``: where dicts that the spec accepts (nested $and / $or, shorthand equality,
  several fields or operators in one dict, every operator);
- ``metadata_rows()``: metadata dicts whose values (and the where operands above) are drawn from
  small pools, so that filters match a useful fraction of rows;
- ``iso_datetimes()``: ISO-8601 strings in every accepted spelling.
"""

from __future__ import annotations

import math
import re
from datetime import date
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "FIELDS",
    "WORDS",
    "iso_datetimes",
    "iso_to_epoch",
    "matches",
    "metadata_rows",
    "metadata_values",
    "valid_wheres",
]

# ----------------------------------------------------------------------------------------------
# ISO-8601 (the grammar of docs/filter-ir.md and kbcore.filters.iso8601_to_epoch, computed with
# datetime arithmetic instead of a civil-days formula)

_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d+))?)?"
    r"([Zz]|[+-]\d{2}(?::?\d{2})?)?)?",
    re.ASCII,
)
_EPOCH_DATE = date(1970, 1, 1)
_CYCLE_DAYS = 146097  # days in 400 Gregorian years


def iso_to_epoch(text: str) -> float | None:
    """Epoch seconds (a double) of an ISO-8601 string, or None if it is not one.

    Date-only means midnight UTC, no offset means UTC, 24:00:00 is the end of the day and
    second 60 is a leap second. The calendar part is computed with ``datetime.date``; the
    double follows the IR contract (the native parser's sequence of IEEE operations):
    ``days * 86400.0 + (h * 3600.0 + m * 60.0 + s + fraction) - offset``, where the fraction is
    accumulated digit by digit as ``sum(digit * scale)`` with ``scale`` = 0.1, 0.01, ...
    """
    m = _ISO.fullmatch(text)
    if m is None:
        return None
    year, shift = int(m[1]), 0
    if year == 0:  # datetime starts at year 1; the calendar repeats every 400 years
        year, shift = 400, -_CYCLE_DAYS
    try:
        days = (date(year, int(m[2]), int(m[3])) - _EPOCH_DATE).days + shift
    except ValueError:
        return None
    secs = float(days) * 86400.0
    if m[4] is None:
        return secs
    hour, minute = int(m[4]), int(m[5])
    second = int(m[6]) if m[6] else 0
    frac, scale = 0.0, 0.1
    for ch in m[7] or "":
        frac += int(ch) * scale
        scale /= 10
    if hour > 24 or minute > 59 or second > 60:
        return None
    if hour == 24 and (minute or second or frac):
        return None
    secs += hour * 3600.0 + minute * 60.0 + second + frac
    tz = m[8]
    if not tz or tz in "Zz":
        return secs
    oh, om = int(tz[1:3]), (int(tz[-2:]) if len(tz) > 3 else 0)
    if oh > 23 or om > 59:
        return None
    return secs - (1 if tz[0] == "+" else -1) * (oh * 3600.0 + om * 60.0)


# ----------------------------------------------------------------------------------------------
# the semantics


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _equal(stored: Any, operand: Any) -> bool:
    """Spec equality: numbers compare numerically (1 == 1.0), a bool equals only a bool, a str
    only a str; a list never equals a scalar."""
    if isinstance(operand, bool):
        return isinstance(stored, bool) and stored == operand
    if _is_number(operand):
        return _is_number(stored) and stored == operand
    if isinstance(operand, str):
        return isinstance(stored, str) and stored == operand
    raise AssertionError(f"not a valid $eq operand: {operand!r}")


def _contains(stored: Any, operand: str) -> bool:
    if isinstance(stored, str):
        return operand in stored
    if isinstance(stored, list):
        return operand in stored
    return False


def _condition(op: str, operand: Any, stored: Any) -> bool:
    present = stored is not None
    if op == "$eq":
        return present and _equal(stored, operand)
    if op == "$ne":
        return not (present and _equal(stored, operand))
    if op in ("$gt", "$gte", "$lt", "$lte"):
        if not _is_number(stored):
            return False
        if op == "$gt":
            return stored > operand
        if op == "$gte":
            return stored >= operand
        if op == "$lt":
            return stored < operand
        return stored <= operand
    if op == "$in":
        return present and any(_equal(stored, x) for x in operand)
    if op == "$nin":
        return not (present and any(_equal(stored, x) for x in operand))
    if op == "$contains":
        return _contains(stored, operand)
    if op == "$not_contains":
        # like $contains, it only looks at str and list-of-str values; a missing field (or a
        # number / bool) neither contains nor "not contains" anything
        return isinstance(stored, (str, list)) and not _contains(stored, operand)
    if op == "$starts_with":
        return isinstance(stored, str) and stored.startswith(operand)
    if op == "$ends_with":
        return isinstance(stored, str) and stored.endswith(operand)
    if op == "$exists":
        return present == operand
    if op == "$empty":
        empty = stored is None or stored == "" or (isinstance(stored, list) and not stored)
        return empty == operand
    if op in ("$before", "$after"):
        if not isinstance(stored, str):
            return False
        when = iso_to_epoch(stored)
        if when is None:
            return False
        limit = iso_to_epoch(operand)
        assert limit is not None, f"invalid {op} operand {operand!r}"
        return when < limit if op == "$before" else when > limit
    raise AssertionError(f"unknown operator {op!r}")


def matches(where: dict, row: dict | None) -> bool:
    """Whether a metadata row satisfies a valid where dict (docs/filter-ir.md semantics).

    Every key of the dict must hold (AND); ``$and`` / ``$or`` take lists of where dicts; a field
    maps to a value (``$eq``) or to a dict of operators that must all hold.
    """
    row = row or {}
    for key, spec in where.items():
        if key == "$and":
            ok = all(matches(w, row) for w in spec)
        elif key == "$or":
            ok = any(matches(w, row) for w in spec)
        else:
            stored = row.get(key)
            if isinstance(spec, dict):
                ok = all(_condition(op, operand, stored) for op, operand in spec.items())
            else:
                ok = _condition("$eq", spec, stored)
        if not ok:
            return False
    return True


# ----------------------------------------------------------------------------------------------
# strategies

#: Field names used by the strategies ("d" is the field most likely to hold dates).
FIELDS = ("a", "b", "n", "tags", "d")
#: Words for strings and lists; short, overlapping, with one non-ASCII word.
WORDS = ("", "x", "ab", "abc", "b", "bc", "zoë", "10")

_words = st.sampled_from(WORDS)
_ints = st.one_of(
    st.integers(-3, 3),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([2**53, 2**53 + 1, -(2**63), 2**63 - 1]),
)
_floats = st.one_of(
    st.sampled_from([-1.5, 0.0, -0.0, 0.5, 1.0, 2.0, 2.5, float(2**53)]),
    st.floats(allow_nan=False, allow_infinity=True),
)
_numbers = st.one_of(_ints, _floats)
_scalars = st.one_of(_words, _numbers, st.booleans())


@st.composite
def iso_datetimes(draw: Any) -> str:
    """ISO-8601 strings accepted by the spec, in every spelling (dates cluster around 2024 so
    that comparisons go both ways)."""
    year = draw(st.one_of(st.sampled_from([2023, 2024, 2025]), st.integers(0, 9999)))
    month = draw(st.integers(1, 12))
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    day = draw(st.integers(1, days))
    text = f"{year:04d}-{month:02d}-{day:02d}"
    if draw(st.booleans()):
        return text
    text += draw(st.sampled_from(["T", "t", " "]))
    text += f"{draw(st.integers(0, 23)):02d}:{draw(st.integers(0, 59)):02d}"
    if draw(st.booleans()):
        text += f":{draw(st.integers(0, 59)):02d}"
        if draw(st.booleans()):
            text += draw(st.sampled_from([".", ","])) + draw(st.text("0123456789", min_size=1, max_size=12))
    offset = draw(st.sampled_from(["", "Z", "z", "+hh:mm", "-hh:mm", "+hhmm", "-hh"]))
    if "hh" in offset:
        hh, mm = draw(st.integers(0, 23)), draw(st.integers(0, 59))
        offset = offset.replace("hh", f"{hh:02d}").replace("mm", f"{mm:02d}")
    return text + offset


def metadata_values() -> st.SearchStrategy:
    """One metadata value: None, int, float, bool, str (some ISO dates) or a list of str."""
    return st.one_of(
        st.none(),
        _ints,
        _floats.filter(math.isfinite),  # the native core rejects NaN and infinities
        st.booleans(),
        _words,
        iso_datetimes(),
        st.lists(_words, max_size=3),
    )


def metadata_rows(fields: tuple[str, ...] = FIELDS) -> st.SearchStrategy:
    """A metadata row: a dict over a subset of ``fields``."""
    return st.dictionaries(st.sampled_from(fields), metadata_values(), max_size=len(fields))


def _non_empty_lists(elements: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(elements, min_size=1, max_size=4)


def _operators() -> st.SearchStrategy:
    """(operator, operand) pairs, every operator of the spec."""
    return st.one_of(
        st.tuples(st.sampled_from(["$eq", "$ne"]), _scalars),
        st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), _numbers),
        st.tuples(
            st.sampled_from(["$in", "$nin"]),
            st.one_of(
                _non_empty_lists(_words),
                _non_empty_lists(_numbers),
                _non_empty_lists(st.booleans()),
            ),
        ),
        st.tuples(st.sampled_from(["$contains", "$not_contains", "$starts_with", "$ends_with"]), _words),
        st.tuples(st.sampled_from(["$exists", "$empty"]), st.booleans()),
        st.tuples(st.sampled_from(["$before", "$after"]), iso_datetimes()),
    )


@st.composite
def _field_spec(draw: Any) -> Any:
    if draw(st.integers(0, 3)) == 0:
        return draw(_scalars)  # shorthand for $eq
    pairs = draw(st.lists(_operators(), min_size=1, max_size=3, unique_by=lambda p: p[0]))
    return dict(pairs)


def _leaf_wheres(fields: tuple[str, ...]) -> st.SearchStrategy:
    return st.dictionaries(st.sampled_from(fields), _field_spec(), min_size=1, max_size=3)


def valid_wheres(fields: tuple[str, ...] = FIELDS, max_leaves: int = 12) -> st.SearchStrategy:
    """Where dicts the spec accepts: field conditions, nested $and / $or, mixed dicts."""

    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        lists = st.lists(children, min_size=1, max_size=3)
        return st.one_of(
            st.builds(lambda xs: {"$and": xs}, lists),
            st.builds(lambda xs: {"$or": xs}, lists),
            st.builds(
                lambda xs, ys, leaf: {"$and": xs, "$or": ys, **leaf},
                lists,
                lists,
                _leaf_wheres(fields),
            ),
        )

    return st.recursive(_leaf_wheres(fields), extend, max_leaves=max_leaves)
