"""compile_where: validation errors (with their path), the IR of each operator, canonical form,
ISO-8601 parsing, and a property test against the reference semantics (filter_reference.py)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
from filter_reference import (
    iso_datetimes,
    iso_to_epoch,
    matches,
    metadata_rows,
    valid_wheres,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbcore.errors import InvalidArgumentError
from kbcore.filters import compile_where, iso8601_to_epoch

# ----------------------------------------------------------------------------------------------
# helpers

_CMP_OPS = {
    "eq",
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "in",
    "nin",
    "contains",
    "not_contains",
    "starts_with",
    "ends_with",
    "exists",
    "empty",
    "before",
    "after",
}


def assert_well_formed(node) -> None:
    """The IR contract of docs/filter-ir.md, node by node."""
    assert type(node) is tuple
    if node[0] in ("and", "or"):
        assert len(node) == 2 and type(node[1]) is tuple and len(node[1]) >= 1
        for child in node[1]:
            assert_well_formed(child)
        return
    assert node[0] == "cmp" and len(node) == 4, node
    _, field, op, value = node
    assert type(field) is str and not field.startswith("$")
    assert op in _CMP_OPS, op
    if op in ("eq", "ne"):
        assert type(value) in (int, float, bool, str)
    elif op in ("gt", "gte", "lt", "lte"):
        assert type(value) in (int, float)
    elif op in ("in", "nin"):
        assert type(value) is tuple and value
        kinds = {str if type(v) is str else bool if type(v) is bool else float for v in value}
        assert len(kinds) == 1 and all(type(v) in (int, float, bool, str) for v in value)
    elif op in ("contains", "not_contains", "starts_with", "ends_with"):
        assert type(value) is str
    elif op in ("exists", "empty"):
        assert type(value) is bool
    else:
        assert type(value) is float
    if type(value) is int:
        assert -(2**63) <= value < 2**63
    if type(value) is float:
        assert not math.isnan(value)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _eq(stored, value) -> bool:
    if type(value) is bool:
        return type(stored) is bool and stored == value
    if type(value) is str:
        return type(stored) is str and stored == value
    return _num(stored) and stored == value


def eval_ir(node, row: dict) -> bool:
    """A direct evaluator of the IR (the semantics the native core implements)."""
    kind = node[0]
    if kind == "and":
        return all(eval_ir(c, row) for c in node[1])
    if kind == "or":
        return any(eval_ir(c, row) for c in node[1])
    _, field, op, value = node
    stored = row.get(field)
    present = stored is not None
    if op == "eq":
        return present and _eq(stored, value)
    if op == "ne":
        return not (present and _eq(stored, value))
    if op in ("gt", "gte", "lt", "lte"):
        if not _num(stored):
            return False
        return {"gt": stored > value, "gte": stored >= value, "lt": stored < value, "lte": stored <= value}[op]
    if op == "in":
        return present and any(_eq(stored, v) for v in value)
    if op == "nin":
        return not (present and any(_eq(stored, v) for v in value))
    if op in ("contains", "not_contains"):
        if not isinstance(stored, (str, list)):
            return False
        return (value in stored) == (op == "contains")
    if op == "starts_with":
        return isinstance(stored, str) and stored.startswith(value)
    if op == "ends_with":
        return isinstance(stored, str) and stored.endswith(value)
    if op == "exists":
        return present == value
    if op == "empty":
        return (stored is None or stored == "" or stored == []) == value
    when = iso_to_epoch(stored) if isinstance(stored, str) else None
    if when is None:
        return False
    return when < value if op == "before" else when > value


def error_of(where) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        compile_where(where)
    assert isinstance(info.value, ValueError)
    return str(info.value)


# ----------------------------------------------------------------------------------------------
# IR of each operator


@pytest.mark.parametrize(
    ("where", "ir"),
    [
        ({"a": "x"}, ("cmp", "a", "eq", "x")),
        ({"a": 3}, ("cmp", "a", "eq", 3)),
        ({"a": 2.5}, ("cmp", "a", "eq", 2.5)),
        ({"a": True}, ("cmp", "a", "eq", True)),
        ({"a": {"$eq": "x"}}, ("cmp", "a", "eq", "x")),
        ({"a": {"$ne": False}}, ("cmp", "a", "ne", False)),
        ({"a": {"$ne": -7}}, ("cmp", "a", "ne", -7)),
        ({"a": {"$gt": 1}}, ("cmp", "a", "gt", 1)),
        ({"a": {"$gte": 1.5}}, ("cmp", "a", "gte", 1.5)),
        ({"a": {"$lt": -2}}, ("cmp", "a", "lt", -2)),
        ({"a": {"$lte": float("inf")}}, ("cmp", "a", "lte", float("inf"))),
        ({"a": {"$in": ["x", "y"]}}, ("cmp", "a", "in", ("x", "y"))),
        ({"a": {"$in": [1, 2.5]}}, ("cmp", "a", "in", (1, 2.5))),
        ({"a": {"$nin": [True]}}, ("cmp", "a", "nin", (True,))),
        ({"a": {"$in": ("x",)}}, ("cmp", "a", "in", ("x",))),
        ({"a": {"$contains": "ab"}}, ("cmp", "a", "contains", "ab")),
        ({"a": {"$not_contains": ""}}, ("cmp", "a", "not_contains", "")),
        ({"a": {"$starts_with": "ab"}}, ("cmp", "a", "starts_with", "ab")),
        ({"a": {"$ends_with": "é"}}, ("cmp", "a", "ends_with", "é")),
        ({"a": {"$exists": True}}, ("cmp", "a", "exists", True)),
        ({"a": {"$exists": False}}, ("cmp", "a", "exists", False)),
        ({"a": {"$empty": True}}, ("cmp", "a", "empty", True)),
        ({"a": {"$before": "2024-01-01"}}, ("cmp", "a", "before", 1704067200.0)),
        ({"a": {"$after": "1970-01-01T00:00:01Z"}}, ("cmp", "a", "after", 1.0)),
        ({"": 1}, ("cmp", "", "eq", 1)),
    ],
)
def test_each_operator_compiles_to_its_ir_node(where, ir):
    got = compile_where(where)
    assert got == ir
    assert type(got[3]) is type(ir[3])
    if isinstance(ir[3], tuple):
        assert [type(v) for v in got[3]] == [type(v) for v in ir[3]]
    assert_well_formed(got)


def test_none_means_no_filter():
    assert compile_where(None) is None


def test_several_fields_are_an_and_in_sorted_field_order():
    assert compile_where({"b": 1, "a": 2}) == ("and", (("cmp", "a", "eq", 2), ("cmp", "b", "eq", 1)))
    assert compile_where({"b": 1, "a": 2}) == compile_where({"a": 2, "b": 1})


def test_several_operators_on_one_field_are_an_and():
    assert compile_where({"y": {"$lt": 5, "$gt": 1}}) == ("and", (("cmp", "y", "gt", 1), ("cmp", "y", "lt", 5)))


def test_single_child_and_or_collapse_to_the_child():
    leaf = ("cmp", "a", "eq", 1)
    assert compile_where({"$and": [{"a": 1}]}) == leaf
    assert compile_where({"$or": [{"a": 1}]}) == leaf
    assert compile_where({"$or": [{"$and": [{"$or": [{"a": 1}]}]}]}) == leaf


def test_nested_and_in_and_and_or_in_or_are_flattened():
    a, b, c = (("cmp", f, "eq", 1) for f in "abc")
    assert compile_where({"$and": [{"a": 1}, {"$and": [{"b": 1}, {"c": 1}]}]}) == ("and", (a, b, c))
    assert compile_where({"$or": [{"a": 1}, {"$or": [{"b": 1}, {"c": 1}]}]}) == ("or", (a, b, c))
    assert compile_where({"$and": [{"a": 1, "b": 1}], "c": 1}) == ("and", (a, b, c))
    # an or inside an and stays a child
    assert compile_where({"$and": [{"a": 1}, {"$or": [{"b": 1}, {"c": 1}]}]}) == ("and", (a, ("or", (b, c))))
    # an and inside an or stays a child
    assert compile_where({"$or": [{"a": 1, "b": 1}, {"c": 1}]}) == ("or", (("and", (a, b)), c))


def test_and_or_and_fields_in_one_dict_are_anded():
    got = compile_where({"x": 1, "$or": [{"a": 1}, {"b": 1}], "$and": [{"c": 1}]})
    assert got == (
        "and",
        (("cmp", "c", "eq", 1), ("or", (("cmp", "a", "eq", 1), ("cmp", "b", "eq", 1))), ("cmp", "x", "eq", 1)),
    )


def test_list_children_keep_their_order():
    got = compile_where({"$or": [{"b": 1}, {"a": 1}]})
    assert [c[1] for c in got[1]] == ["b", "a"]


def test_in_items_are_deduplicated_keeping_first_occurrence():
    assert compile_where({"a": {"$in": ["y", "x", "y"]}})[3] == ("y", "x")
    got = compile_where({"a": {"$nin": [2, 1, 2.0, 1.0]}})[3]
    assert got == (2, 1) and [type(v) for v in got] == [int, int]


def test_scalar_types_are_kept_apart_by_the_cache():
    # 1, 1.0 and True are equal (and hash alike) in Python but are different IR values
    for _ in range(2):
        for v in (1, 1.0, True, "1"):
            got = compile_where({"a": v})
            assert got == ("cmp", "a", "eq", v) and type(got[3]) is type(v)
            got = compile_where({"a": {"$in": [v]}})
            assert type(got[3][0]) is type(v)


def test_compiling_twice_gives_equal_ir_and_does_not_alias_input():
    where = {"a": {"$in": ["x", "y"]}, "b": {"$gt": 1}}
    first = compile_where(where)
    where["a"]["$in"].append("z")  # mutating the input after compiling changes nothing cached
    assert compile_where({"a": {"$in": ["x", "y"]}, "b": {"$gt": 1}}) == first
    assert compile_where(where)[1][0][3] == ("x", "y", "z")


def test_numpy_scalars_are_accepted_as_python_scalars():
    got = compile_where(
        {"a": np.int64(3), "b": {"$gt": np.float32(1.5)}, "c": np.bool_(True), "d": {"$in": [np.int32(1), 2]}}
    )
    assert got == (
        "and",
        (("cmp", "a", "eq", 3), ("cmp", "b", "gt", 1.5), ("cmp", "c", "eq", True), ("cmp", "d", "in", (1, 2))),
    )
    assert type(got[1][0][3]) is int and type(got[1][2][3]) is bool
    assert_well_formed(got)


def test_int64_bounds_are_accepted():
    assert compile_where({"a": 2**63 - 1})[3] == 2**63 - 1
    assert compile_where({"a": {"$gte": -(2**63)}})[3] == -(2**63)


def test_mapping_that_is_not_a_dict_is_accepted():
    from types import MappingProxyType

    got = compile_where(MappingProxyType({"a": MappingProxyType({"$gt": 1})}))
    assert got == ("cmp", "a", "gt", 1)


# ----------------------------------------------------------------------------------------------
# errors: every rule, with the path


@pytest.mark.parametrize(
    ("where", "message"),
    [
        # the example of the spec
        ({"$and": [{"a": 1}, {"year": {"$gt": "5"}}]}, 'where["$and"][1]["year"]: $gt expects a number, got str'),
        # non-dict where / children
        ([{"a": 1}], "where: expected a filter dict, got list"),
        ("a", "where: expected a filter dict, got str"),
        (1, "where: expected a filter dict, got int"),
        ({"$and": [{"a": 1}, [1]]}, 'where["$and"][1]: expected a filter dict, got list'),
        ({"$or": ["x"]}, 'where["$or"][0]: expected a filter dict, got str'),
        ({"$or": [None]}, 'where["$or"][0]: expected a filter dict, got None'),
        # {} anywhere
        ({}, "where: an empty filter {} is not allowed"),
        ({"$or": [{"a": 1}, {}]}, 'where["$or"][1]: an empty filter {} is not allowed'),
        ({"a": {}}, 'where["a"]: an empty operator dict {} is not allowed'),
        # $and / $or operand
        ({"$and": []}, ('where["$and"]: $and expects a non-empty list of filter dicts, got an empty list')),
        ({"$or": []}, 'where["$or"]: $or expects a non-empty list'),
        ({"$and": {"a": 1}}, ('where["$and"]: $and expects a non-empty list of filter dicts, got dict')),
        ({"$or": "a"}, 'where["$or"]: $or expects a non-empty list of filter dicts, got str'),
        # field names
        ({1: "x"}, "where[1]: field names must be str, got int"),
        ({"a": 1, 2: "x"}, "where[2]: field names must be str, got int"),
        ({"$or": [{"a": 1}, {None: 1}]}, 'where["$or"][1][None]: field names must be str'),
        ({"$year": 1}, 'where["$year"]: unknown logical operator "$year"'),
        ({"$not": {"a": 1}}, 'where["$not"]: unknown logical operator "$not"'),
        ({"$gt": 1}, 'where["$gt"]: operator $gt needs a field'),
        # unknown operators
        ({"a": {"$regex": "x"}}, 'where["a"]: unknown operator "$regex"; expected one of'),
        ({"a": {"gt": 1}}, 'where["a"]: unknown operator "gt" (did you mean "$gt"?)'),
        ({"a": {"$and": [{"b": 1}]}}, 'where["a"]: unknown operator "$and"'),
        ({"a": {1: 1}}, 'where["a"]: operator names must be str, got int'),
        ({"a": {"b": 1}}, 'where["a"]: unknown operator "b"'),
        # shorthand values
        (
            {"a": None},
            ('where["a"]: expected a str, int, float or bool (shorthand for $eq) or a dict of operators, got None'),
        ),
        (
            {"a": [1, 2]},
            ('where["a"]: expected a str, int, float or bool (shorthand for $eq) or a dict of operators, got list'),
        ),
        ({"a": b"x"}, 'where["a"]: expected a str, int, float or bool'),
        ({"a": float("nan")}, 'where["a"]: $eq expects a str, int, float or bool, got NaN'),
        # $eq / $ne
        ({"a": {"$eq": None}}, 'where["a"]: $eq expects a str, int, float or bool, got None'),
        ({"a": {"$ne": [1]}}, 'where["a"]: $ne expects a str, int, float or bool, got list'),
        ({"a": {"$eq": {"x": 1}}}, 'where["a"]: $eq expects a str, int, float or bool, got dict'),
        ({"a": {"$eq": float("nan")}}, ('where["a"]: $eq expects a str, int, float or bool, got NaN')),
        # numbers
        ({"a": {"$gt": True}}, 'where["a"]: $gt expects a number, got bool'),
        ({"a": {"$gte": "1"}}, 'where["a"]: $gte expects a number, got str'),
        ({"a": {"$lt": None}}, 'where["a"]: $lt expects a number, got None'),
        ({"a": {"$lte": [1]}}, 'where["a"]: $lte expects a number, got list'),
        ({"a": {"$lte": float("nan")}}, 'where["a"]: $lte expects a number, got NaN'),
        ({"a": {"$gt": np.bool_(True)}}, 'where["a"]: $gt expects a number, got bool'),
        # int64
        ({"a": 2**63}, 'where["a"]: $eq: the integer 9223372036854775808 does not fit in int64'),
        ({"a": {"$gt": -(2**63) - 1}}, ('where["a"]: $gt: the integer -9223372036854775809 does not fit in int64')),
        (
            {"a": {"$in": [1, 2**64]}},
            'where["a"]: $in: item 1, the integer 18446744073709551616, does not fit in int64',
        ),
        ({"a": {"$nin": [-(2**63) - 1]}}, 'where["a"]: $nin: item 0, the integer '),
        # $in / $nin
        ({"a": {"$in": []}}, 'where["a"]: $in expects a non-empty list, got an empty list'),
        ({"a": {"$nin": []}}, 'where["a"]: $nin expects a non-empty list, got an empty list'),
        ({"a": {"$in": "abc"}}, 'where["a"]: $in expects a non-empty list, got str'),
        ({"a": {"$in": {"x"}}}, 'where["a"]: $in expects a non-empty list, got set'),
        ({"a": {"$in": 1}}, 'where["a"]: $in expects a non-empty list, got int'),
        (
            {"a": {"$in": ["x", 1]}},
            (
                'where["a"]: $in expects items that are all str, all bool or '
                "all numbers; item 0 is a str but item 1 is int"
            ),
        ),
        ({"a": {"$in": [1, True]}}, "item 0 is a number but item 1 is bool"),
        ({"a": {"$nin": [True, 0]}}, "item 0 is a bool but item 1 is int"),
        ({"a": {"$in": [None]}}, ('where["a"]: $in expects items that are str, int, float or bool; item 0 is None')),
        ({"a": {"$in": [[1]]}}, "item 0 is list"),
        ({"a": {"$in": [1.0, float("nan")]}}, "item 1 is NaN"),
        # string operators
        ({"a": {"$contains": 1}}, 'where["a"]: $contains expects a str, got int'),
        ({"a": {"$not_contains": ["x"]}}, 'where["a"]: $not_contains expects a str, got list'),
        ({"a": {"$starts_with": None}}, 'where["a"]: $starts_with expects a str, got None'),
        ({"a": {"$ends_with": True}}, 'where["a"]: $ends_with expects a str, got bool'),
        # bool operators
        ({"a": {"$exists": 1}}, 'where["a"]: $exists expects a bool (true or false), got int'),
        ({"a": {"$empty": "yes"}}, 'where["a"]: $empty expects a bool (true or false), got str'),
        # dates
        ({"a": {"$before": 1704067200}}, ('where["a"]: $before expects an ISO-8601 date or date-time string, got int')),
        ({"a": {"$after": "yesterday"}}, ("where[\"a\"]: $after: invalid ISO-8601 date-time 'yesterday'")),
        ({"a": {"$after": "2024-02-30"}}, "day 30 is out of range for 2024-02"),
        ({"a": {"$before": "2023-02-29"}}, "day 29 is out of range for 2023-02"),
        ({"a": {"$before": "2024-13-01"}}, "month 13 is out of range"),
        ({"a": {"$before": "2024-00-01"}}, "month 0 is out of range"),
        ({"a": {"$before": "2024-01-01T25:00"}}, "hour 25 is out of range"),
        ({"a": {"$before": "2024-01-01T24:01"}}, "hour 24 is only allowed as 24:00:00"),
        ({"a": {"$before": "2024-01-01T24:00:00.5"}}, "hour 24 is only allowed as 24:00:00"),
        ({"a": {"$before": "2024-01-01T10:60"}}, "minute 60 is out of range"),
        ({"a": {"$before": "2024-01-01T10:00:61"}}, "second 61 is out of range"),
        ({"a": {"$before": "2024-01-01T10:00+24:00"}}, "offset +24:00 is out of range"),
        ({"a": {"$before": "2024-01-01Z"}}, "invalid ISO-8601 date-time '2024-01-01Z'"),
        ({"a": {"$before": "2024-1-01"}}, "invalid ISO-8601"),
        ({"a": {"$before": " 2024-01-01"}}, "invalid ISO-8601"),
        ({"a": {"$before": "2024-01-01T10"}}, "invalid ISO-8601"),
        ({"a": {"$before": "2024-01-01T10:00:00."}}, "invalid ISO-8601"),
        ({"a": {"$before": "٢٠٢٤-01-01"}}, "invalid ISO-8601"),  # non-ASCII digits
        # deep paths
        (
            {"$or": [{"a": 1}, {"$and": [{"b": 1}, {"c": {"$in": []}}]}]},
            'where["$or"][1]["$and"][1]["c"]: $in expects a non-empty list',
        ),
        ({"x": 1, "$and": [{"y": {"$exists": "no"}}]}, 'where["$and"][0]["y"]: $exists expects a bool'),
        ({'q"uote': {"$gt": "x"}}, 'where["q\\"uote"]: $gt expects a number, got str'),
    ],
)
def test_invalid_filters_raise_with_the_path_in_the_message(where, message):
    got = error_of(where)
    assert got.startswith(message) or message in got, got
    if message.startswith("where"):
        assert got.startswith(message), got


def test_errors_are_raised_again_on_a_second_call():
    bad = {"a": {"$gt": "x"}}
    assert error_of(bad) == error_of(bad)


def test_the_first_invalid_key_in_sorted_order_is_reported():
    assert error_of({"b": {"$gt": "x"}, "a": {"$lt": "y"}}).startswith('where["a"]: $lt expects a number')


def test_too_deep_nesting_is_an_invalid_argument():
    where: dict = {"a": 1}
    for _ in range(5000):
        where = {"$and": [where]}
    assert "nested too deeply" in error_of(where)


# ----------------------------------------------------------------------------------------------
# ISO-8601


def _utc(*args, tz=timezone.utc) -> float:
    return (datetime(*args, tzinfo=tz) - datetime(1970, 1, 1, tzinfo=timezone.utc)) / timedelta(seconds=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1970-01-01", 0.0),
        ("2024-01-01", _utc(2024, 1, 1)),
        ("2024-02-29", _utc(2024, 2, 29)),
        ("2000-02-29T12:00", _utc(2000, 2, 29, 12)),
        ("2024-06-15T10:20:30", _utc(2024, 6, 15, 10, 20, 30)),
        ("2024-06-15t10:20:30Z", _utc(2024, 6, 15, 10, 20, 30)),
        ("2024-06-15 10:20:30z", _utc(2024, 6, 15, 10, 20, 30)),
        ("2024-06-15T10:20:30+02:00", _utc(2024, 6, 15, 8, 20, 30)),
        ("2024-06-15T10:20:30-0530", _utc(2024, 6, 15, 15, 50, 30)),
        ("2024-06-15T10:20:30+02", _utc(2024, 6, 15, 8, 20, 30)),
        ("2024-06-15T10:20-00:00", _utc(2024, 6, 15, 10, 20)),
        ("1970-01-01T00:00:00.5", 0.5),
        ("1970-01-01T00:00:00,25Z", 0.25),
        ("2024-01-01T24:00", _utc(2024, 1, 2)),
        ("2024-12-31T23:59:60Z", _utc(2025, 1, 1)),
        ("1969-12-31T23:59:59", -1.0),
        ("1900-03-01", _utc(1900, 3, 1)),
        ("0001-01-01", _utc(1, 1, 1)),
        ("0000-03-01", _utc(400, 3, 1) - 146097 * 86400),
        ("9999-12-31T23:59:59", _utc(9999, 12, 31, 23, 59, 59)),
    ],
)
def test_iso8601_strings_are_parsed_to_epoch_seconds(text, expected):
    assert iso8601_to_epoch(text) == expected
    assert compile_where({"t": {"$before": text}})[3] == expected


def test_iso8601_fractions_follow_the_native_double_arithmetic():
    # days * 86400 + (h * 3600 + m * 60 + s + fraction) - offset, the fraction summed digit by
    # digit (cpp/string_dict.cpp), so a native parse of the same text gives the same double
    frac = 0.0
    scale = 0.1
    for d in "123456789":
        frac += int(d) * scale
        scale /= 10
    days = (datetime(2024, 6, 15) - datetime(1970, 1, 1)).days
    expected = float(days) * 86400.0 + (10 * 3600.0 + 20 * 60.0 + 30 + frac) - 3600.0
    assert iso8601_to_epoch("2024-06-15T10:20:30.123456789+01:00") == expected
    assert abs(iso8601_to_epoch("1970-01-01T00:00:01.25") - 1.25) == 0.0
    assert iso_to_epoch("2024-06-15T10:20:30.123456789+01:00") == expected


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)), st.integers(-23 * 60, 23 * 60))
def test_iso8601_parser_agrees_with_datetime(naive, offset_minutes):
    tz = timezone(timedelta(minutes=offset_minutes))
    aware = naive.replace(tzinfo=tz)
    whole = (aware.replace(microsecond=0) - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(seconds=1)
    got = iso8601_to_epoch(aware.isoformat(timespec="microseconds"))
    assert abs(got - (whole + naive.microsecond / 1e6)) <= 1e-6
    assert iso8601_to_epoch(aware.isoformat(timespec="seconds")) == float(whole)


@given(iso_datetimes())
def test_iso8601_parser_agrees_with_the_reference(text):
    assert iso8601_to_epoch(text) == iso_to_epoch(text)


@given(
    st.text(alphabet="0123456789-:T +Z.,z", min_size=8, max_size=32)
    | st.sampled_from(
        [
            "2024-02-29",
            "2023-02-29",
            "2024-01-01T24:00",
            "2024-01-01T24:00:01",
            "2024-01-01T10:00+23:59",
            "2024-01-01T10:00+2400",
            "2024-12-31T23:59:60",
        ]
    )
)
def test_the_native_iso8601_parser_accepts_exactly_what_the_reference_accepts(text):
    # iso8601_to_epoch is the native parser (the one the core applies to stored strings);
    # tests/filter_reference.py keeps an independent Python reading of the grammar
    want = iso_to_epoch(text)
    if want is None:
        with pytest.raises(InvalidArgumentError, match="invalid ISO-8601"):
            iso8601_to_epoch(text)
    else:
        assert iso8601_to_epoch(text) == want


def test_iso8601_to_epoch_rejects_non_strings():
    with pytest.raises(InvalidArgumentError, match="got int"):
        iso8601_to_epoch(5)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------
# properties against the reference semantics


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(valid_wheres())
def test_every_valid_where_compiles_to_well_formed_ir(where):
    ir = compile_where(where)
    assert_well_formed(ir)
    assert compile_where(where) == ir  # deterministic (and the cached copy is the same)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(valid_wheres(), st.lists(metadata_rows(), min_size=1, max_size=8))
def test_compiled_ir_means_what_the_where_means(where, rows):
    ir = compile_where(where)
    for row in rows:
        assert eval_ir(ir, row) == matches(where, row), (where, row, ir)


# ----------------------------------------------------------------------------------------------
# native_filter: the cached native form the index evaluates


@pytest.mark.parametrize(
    "where",
    [
        {"a": {"$gt": "x"}},
        {"a": {"$bogus": 1}},
        {"$a": 1},
        {"a": float("nan")},
        {"a": {"$in": []}},
        {},
        {"a": {"$gt": 1}, "b": {"$lt": "y"}},
        {"a": 2**63},
    ],
)
def test_native_filter_raises_what_compile_where_raises(where):
    from kbcore.filters import native_filter

    expected = error_of(where)
    for _ in range(2):  # the second call must not find anything cached
        with pytest.raises(InvalidArgumentError) as exc:
            native_filter(where)
        assert str(exc.value) == expected


def test_native_filter_cache_keeps_scalar_types_apart():
    import kbcore

    index = kbcore.Index(2, "l2", "flat")
    rows = [{"a": 1}, {"a": True}, {"a": "1"}, {"a": 1.0}, {"a": 2}]
    index.add(np.eye(5, 2, dtype=np.float32) + 1, np.arange(5, dtype=np.int64), metadata=rows)
    # 1 and 1.0 match the int and the float row; True only the bool row; "1" only the str row
    # (in Python 1 == 1.0 == True and they hash alike: a cache key must keep them apart)
    for _ in range(3):  # the first round fills the cache, the others hit it
        for v, passing in ((1, 2), (True, 1), ("1", 1), (1.0, 2), (False, 0)):
            assert index.count({"a": v}) == passing, v
            assert index.count({"a": {"$eq": v}}) == passing, v
            assert index.count({"a": {"$ne": v}}) == 5 - passing, v


def test_native_filter_follows_a_where_mutated_between_calls():
    import kbcore

    index = kbcore.Index(2, "l2", "flat")
    index.add(np.ones((10, 2), dtype=np.float32), np.arange(10, dtype=np.int64), metadata=[{"a": i} for i in range(10)])
    where = {"a": {"$lt": 5}}
    assert index.count(where) == 5
    where["a"]["$lt"] = 2
    assert index.count(where) == 2
    where["a"] = {"$gte": 7}
    assert index.count(where) == 3
    where["b"] = 1
    assert index.count(where) == 0


@pytest.mark.parametrize(
    "where",
    [
        {"a": {"$lt": 5}},
        {"a": 1},
        {"a": True},
        {"a": 1.0},
        {"a": "x"},
        {"a": {"$eq": "x"}},
        {"a": {"$in": [1, 2]}},  # a list operand: no quick key
        {"a": {"$gt": 1, "$lt": 3}},  # two operators: no quick key
        {"a": 1, "b": 2},  # two fields: no quick key
        {"$and": [{"a": 1}, {"b": 2}]},
        {1: 2},
        {"a": {1: 2}},
        {"a": None},
        {"a": np.int64(3)},  # not a plain int: no quick key
    ],
)
def test_native_cache_lookup_uses_the_quick_key(where):
    # The lookup (kbcore._core.cached_filter) hits exactly the entries stored under the key
    # the cache uses (kbcore.filters.cache._quick_key), and returns None for every other shape.
    from kbcore import _core
    from kbcore.filters.cache import _quick_key

    key = _quick_key(where)
    sentinel = object()
    cache = {} if key is None else {key: (("ir",), sentinel)}
    assert _core.cached_filter(cache, where) is (None if key is None else sentinel)
    assert _core.cached_filter({}, where) is None  # a miss
    # A look-alike key of another type never hits: 1, 1.0 and True hash alike.
    if key is not None:
        other = {("a", bool, True): (("ir",), sentinel), ("a", "$lt", float, 5.0): (("ir",), sentinel)}
        if key not in other:
            assert _core.cached_filter(other, where) is None


def test_native_cache_lookup_checks_its_arguments():
    from kbcore import _core

    with pytest.raises(TypeError):
        _core.cached_filter([], {"a": 1})
    with pytest.raises(TypeError):
        _core.cached_filter({})


def test_a_filter_object_never_initialised_raises_instead_of_crashing():
    # Filter.__new__ alone makes an object with no filter inside: every entry point that
    # takes a native filter must refuse it with a clear error, for subclasses too.
    import kbcore
    from kbcore import _core

    class Sub(_core.Filter):
        pass

    index = kbcore.Index(2, "l2", "hnsw")
    index.add(np.eye(3, 2, dtype=np.float32), np.arange(3, dtype=np.int64), metadata=[{"a": i} for i in range(3)])
    native = index._native
    q = np.ones((1, 2), dtype=np.float32)
    for empty in (_core.Filter.__new__(_core.Filter), Sub.__new__(Sub)):
        for call in (
            lambda empty=empty: native.count(empty),
            lambda empty=empty: native.search(q, 2, 0, 1, empty, "auto"),
            lambda empty=empty: native.search_groups(q, 2, "a", 1, 0, 1, empty, "auto", kbcore.Group),
            lambda empty=empty: _core.Filter(("and", (empty,))),
        ):
            with pytest.raises(InvalidArgumentError, match="never initialised"):
                call()
    # An initialised subclass instance is a filter like any other.
    assert native.count(Sub(compile_where({"a": {"$gte": 1}}))) == 2
