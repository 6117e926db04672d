"""dify_condition_to_where: every operator of Dify's External Knowledge API metadata_condition,
the logical operator, name lists, value conversions, and the errors an HTTP layer turns into 400.

Operator spellings are those of the Dify docs ("External Knowledge API", metadata_condition):
contains, not contains, start with, end with, is, is not, in, not in, empty, not empty, =, ≠, >,
<, ≥, ≤, before, after (older docs also list null / not null).
"""

from __future__ import annotations

import pytest
from filter_reference import matches

from kbcore.errors import InvalidArgumentError
from kbcore.filters import compile_where, dify_condition_to_where


def one(op: str, value=None, name="f", **extra) -> dict:
    cond = {"name": name, "comparison_operator": op, **extra}
    if value is not None:
        cond["value"] = value
    return {"conditions": [cond]}


def translate(mc):
    where = dify_condition_to_where(mc)
    if where is not None:
        compile_where(where)  # every translation is a valid filter
    return where


def error_of(mc) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        dify_condition_to_where(mc)
    assert isinstance(info.value, ValueError)
    return str(info.value)


# ----------------------------------------------------------------------------------------------
# each operator


@pytest.mark.parametrize(
    ("op", "value", "where"),
    [
        ("contains", "AI", {"f": {"$contains": "AI"}}),
        ("not contains", "AI", {"f": {"$not_contains": "AI"}}),
        ("start with", "Intro", {"f": {"$starts_with": "Intro"}}),
        ("end with", ".pdf", {"f": {"$ends_with": ".pdf"}}),
        ("is", "report", {"f": {"$eq": "report"}}),
        ("is", True, {"f": {"$eq": True}}),
        ("empty", None, {"f": {"$empty": True}}),
        ("not empty", None, {"f": {"$empty": False}}),
        ("null", None, {"f": {"$exists": False}}),
        ("not null", None, {"f": {"$exists": True}}),
        ("=", "abc", {"f": {"$eq": "abc"}}),  # Dify's own "=" falls back to string equality
        (">", "5", {"f": {"$gt": 5}}),
        (">", 1e3, {"f": {"$gt": 1000.0}}),
        ("<", "1e2", {"f": {"$lt": 100.0}}),
        ("≥", 2020, {"f": {"$gte": 2020}}),
        (">=", "2020", {"f": {"$gte": 2020}}),
        ("≤", -1.5, {"f": {"$lte": -1.5}}),
        ("<=", ".5", {"f": {"$lte": 0.5}}),
        ("before", "2024-01-01", {"$or": [{"f": {"$before": "2024-01-01"}}, {"f": {"$lt": 1704067200.0}}]}),
        (
            "after",
            "2024-01-01T10:00:00+02:00",
            {"$or": [{"f": {"$after": "2024-01-01T10:00:00+02:00"}}, {"f": {"$gt": 1704096000.0}}]},
        ),
        (
            "before",
            -62135596800,  # 0001-01-01: years before 1000 keep four digits
            {"$or": [{"f": {"$before": "0001-01-01T00:00:00Z"}}, {"f": {"$lt": -62135596800}}]},
        ),
        (">", 2**70, {"f": {"$gt": float(2**70)}}),
        ("before", 1704067200, {"$or": [{"f": {"$before": "2024-01-01T00:00:00Z"}}, {"f": {"$lt": 1704067200}}]}),
        (
            "after",
            "1704067200.5",
            {"$or": [{"f": {"$after": "2024-01-01T00:00:00.500000Z"}}, {"f": {"$gt": 1704067200.5}}]},
        ),
    ],
)
def test_each_dify_operator_translates_to_a_where(op, value, where):
    got = translate(one(op, value))
    assert got == where
    # numbers come out as numbers of the expected type
    assert repr(got) == repr(where)


@pytest.mark.parametrize(
    ("op", "canonical"),
    [
        ("CONTAINS", "contains"),
        ("Not  Contains", "not contains"),
        (" is not ", "is not"),
        ("starts with", "start with"),
        ("ends with", "end with"),
        ("==", "="),
    ],
)
def test_operator_spelling_ignores_case_and_spaces(op, canonical):
    value = "x" if canonical != "=" else 1
    assert translate(one(op, value)) == translate(one(canonical, value))


def test_empty_operators_ignore_a_given_value():
    assert translate(one("empty", "ignored")) == {"f": {"$empty": True}}
    assert translate(one("not empty", ["x"])) == {"f": {"$empty": False}}


# ----------------------------------------------------------------------------------------------
# structure


@pytest.mark.parametrize(
    "mc",
    [
        None,
        {},
        {"conditions": None},
        {"conditions": []},
        {"logical_operator": "or"},
        {"logical_operator": "and", "conditions": None},
    ],
)
def test_no_conditions_means_no_filter(mc):
    assert dify_condition_to_where(mc) is None


def test_logical_operator_defaults_to_and():
    mc = {
        "conditions": [
            {"name": "a", "comparison_operator": "is", "value": "x"},
            {"name": "b", "comparison_operator": ">", "value": 1},
        ]
    }
    assert translate(mc) == {"$and": [{"a": {"$eq": "x"}}, {"b": {"$gt": 1}}]}
    assert translate({**mc, "logical_operator": None}) == translate(mc)
    assert translate({**mc, "logical_operator": "AND"}) == translate(mc)


def test_logical_operator_or():
    mc = {
        "logical_operator": "or",
        "conditions": [
            {"name": "a", "comparison_operator": "is", "value": "x"},
            {"name": "b", "comparison_operator": "<", "value": "3"},
        ],
    }
    assert translate(mc) == {"$or": [{"a": {"$eq": "x"}}, {"b": {"$lt": 3}}]}


def test_a_name_list_applies_the_condition_to_any_of_the_fields():
    mc = one("contains", "AI", name=["category", "tag"])
    assert translate(mc) == {"$or": [{"category": {"$contains": "AI"}}, {"tag": {"$contains": "AI"}}]}
    assert translate(one("is", "x", name=["only"])) == {"only": {"$eq": "x"}}


def test_name_lists_nest_under_and_and_flatten_under_or():
    conds = [
        {"name": ["a", "b"], "comparison_operator": "is", "value": "x"},
        {"name": "c", "comparison_operator": "empty"},
    ]
    assert translate({"conditions": conds}) == {
        "$and": [{"$or": [{"a": {"$eq": "x"}}, {"b": {"$eq": "x"}}]}, {"c": {"$empty": True}}]
    }
    assert translate({"logical_operator": "or", "conditions": conds}) == {
        "$or": [{"a": {"$eq": "x"}}, {"b": {"$eq": "x"}}, {"c": {"$empty": True}}]
    }


def test_before_on_a_name_list_is_one_flat_or():
    got = translate(one("before", "2024-01-01", name=["d1", "d2"]))
    assert got == {
        "$or": [
            {"d1": {"$before": "2024-01-01"}},
            {"d1": {"$lt": 1704067200.0}},
            {"d2": {"$before": "2024-01-01"}},
            {"d2": {"$lt": 1704067200.0}},
        ]
    }


# ----------------------------------------------------------------------------------------------
# semantics, through the reference evaluator

ROWS = [
    {"id": 0, "tags": ["ai", "ml"], "title": "Intro to AI", "year": 2021, "d": "2023-06-01"},
    {"id": 1, "tags": ["db"], "title": "Storage", "year": 2019, "d": 1672531200},  # 2023-01-01
    {"id": 2, "tags": [], "title": "", "year": "2020", "d": "2024-03-01T12:00:00Z"},
    {"id": 3, "title": "AI notes", "year": 2024.0},
    {"id": 4},
]


def ids_matching(mc) -> list[int]:
    where = translate(mc)
    return [r["id"] for r in ROWS if where is None or matches(where, r)]


@pytest.mark.parametrize(
    ("mc", "expected"),
    [
        (one("contains", "AI", name="title"), [0, 3]),
        (one("contains", "ai", name="tags"), [0]),
        (one("not contains", "ai", name="tags"), [1, 2]),  # rows without tags do not count
        (one("start with", "AI", name="title"), [3]),
        (one("empty", name="tags"), [2, 3, 4]),
        (one("not empty", name="title"), [0, 1, 3]),
        (one("in", "db, ml", name="tags"), []),  # $in is equality, a list never equals a str
        (one("not in", "Storage,AI notes", name="title"), [0, 2]),  # row 4 lacks the field
        (one("≥", "2021", name="year"), [0, 3]),  # "2020" is a string: not a number
        (one("=", "2024", name="year"), [3]),  # 2024.0 == 2024
        (one("=", "2020", name="year"), [2]),  # the text "2020" equals the text "2020"
        (one("is", 2020, name="year"), [2]),  # Dify's number comparison reads "2020" as 2020
        (one("is not", 2019, name="year"), [0, 3]),  # Dify compares numbers; 4 lacks it
        # dates stored as ISO strings or as Unix seconds are both compared
        (one("before", "2023-07-01", name="d"), [0, 1]),
        (one("after", 1672531200, name="d"), [0, 2]),
        (one("after", "2023-01-01T00:00:00Z", name="d"), [0, 2]),
        (one("contains", "AI", name=["title", "tags"]), [0, 3]),
        (
            {
                "logical_operator": "or",
                "conditions": [
                    {"name": "year", "comparison_operator": "<", "value": 2020},
                    {"name": "title", "comparison_operator": "empty"},
                ],
            },
            [1, 2, 4],
        ),
        (
            {
                "conditions": [
                    {"name": "year", "comparison_operator": ">", "value": 2020},
                    {"name": "title", "comparison_operator": "contains", "value": "AI"},
                ]
            },
            [0, 3],
        ),
        ({"conditions": None}, [0, 1, 2, 3, 4]),
    ],
)
def test_translated_conditions_select_the_expected_rows(mc, expected):
    assert ids_matching(mc) == expected


# ----------------------------------------------------------------------------------------------
# errors (HTTP 400)


@pytest.mark.parametrize(
    ("mc", "message"),
    [
        ([1], "metadata_condition: expected an object, got list"),
        ("and", "metadata_condition: expected an object, got str"),
        ({"conditions": {"name": "x"}}, 'metadata_condition["conditions"]: expected a list of conditions, got dict'),
        (
            {"logical_operator": "xor", "conditions": [{}]},
            'metadata_condition["logical_operator"]: expected "and" or "or", got \'xor\'',
        ),
        (
            {"logical_operator": 1, "conditions": [{}]},
            'metadata_condition["logical_operator"]: expected "and" or "or", got 1',
        ),
        ({"conditions": [5]}, 'metadata_condition["conditions"][0]: expected an object, got int'),
        (
            {"conditions": [{"comparison_operator": "is", "value": 1}]},
            (
                'metadata_condition["conditions"][0]["name"]: expected a field name or a non-empty '
                "list of field names, got None"
            ),
        ),
        (
            one("is", 1, name=[]),
            (
                'metadata_condition["conditions"][0]["name"]: expected a field name or a non-empty '
                "list of field names, got an empty list"
            ),
        ),
        (
            one("is", 1, name=["a", 3]),
            (
                'metadata_condition["conditions"][0]["name"]: field names must be non-empty strings, '
                "got int at position 1"
            ),
        ),
        (one("is", 1, name=""), "field names must be non-empty strings, got an empty string"),
        (one("is", 1, name="$and"), 'field names cannot start with "$"'),
        (
            {"conditions": [{"name": "a", "value": 1}]},
            ('metadata_condition["conditions"][0]["comparison_operator"]: expected a string, got None'),
        ),
        (
            one("like", "x"),
            (
                'metadata_condition["conditions"][0]["comparison_operator"]: unknown operator \'like\'; '
                "expected one of contains"
            ),
        ),
        (one("regex", "x"), "unknown operator 'regex'"),
        # values that cannot apply
        (one(">", "abc"), 'metadata_condition["conditions"][0]: ">" compares numbers, but \'abc\' is not a number'),
        (one("<", True), '"<" compares numbers, got bool'),
        (one("≥", [1]), '"≥" compares numbers, got list'),
        (one("<=", "nan"), "'nan' is not a number"),
        (one(">", "1_000"), "'1_000' is not a number"),
        (one(">", float("inf")), '">" needs a finite number'),
        (one("is", ["a"]), '"is" needs a string, number or boolean value, got list'),
        (one("=", {"a": 1}), '"is" needs a string, number or boolean value, got dict'),
        (one("in", [["a"]]), '"in" needs strings or numbers, got an item of type list'),
        (one("contains", ["a"]), '"contains" needs a string value, got list'),
        (one("start with", True), '"start with" needs a string value, got bool'),
        (one("in", {"a": 1}), '"in" needs a list or a comma-separated string, got dict'),
        (one("before", "soon"), '"before" needs an ISO-8601 date/date-time or Unix seconds'),
        (one("after", "2024-02-30"), "day 30 is out of range"),
        (one("after", True), ('"after" needs an ISO-8601 date/date-time string or Unix seconds, got bool')),
        (one("before", 1e300), '"before": timestamp 1e+300 is out of range'),
        (one("in", [1, float("nan")]), '"in" needs a finite number, got nan'),
        (one(">", 10**400), '">": the integer operand (1329 bits) is out of range'),
        (one("is", 10**400), '"is": the integer operand (1329 bits) is out of range'),
        (one("is", "\ud800"), "the value contains a lone surrogate (U+D800 at position 0)"),
        (one("is", "x", name="a\udc80"), '["name"] contains a lone surrogate (U+DC80'),
        (one("in", ["ok", "b\ud800"]), "item 1 contains a lone surrogate"),
        (
            {"conditions": [{"name": "f", "comparison_operator": "empty"}] * 257},
            'metadata_condition["conditions"]: at most 256 conditions, got 257',
        ),
        (one("empty", name=["f"] * 65), "at most 64 field names, got 65"),
        (one("before", ["2024-01-01"]), "got list"),
    ],
)
def test_invalid_conditions_raise_invalid_argument_naming_the_condition(mc, message):
    got = error_of(mc)
    assert message in got, got


def test_the_error_names_the_failing_condition_index():
    mc = {
        "conditions": [
            {"name": "a", "comparison_operator": "is", "value": "x"},
            {"name": "b", "comparison_operator": ">", "value": "many"},
        ]
    }
    assert error_of(mc).startswith('metadata_condition["conditions"][1]: ">" compares numbers')


# ----------------------------------------------------------------------------------------------
# Dify 1.12 semantics (see docs/dify.md)

DIFY_ROWS = [
    {"id": 0, "v": "2.0", "n": 3, "d": "2024-01-15", "t": "infra"},
    {"id": 1, "v": "2", "n": 2.5, "d": 1705276800, "t": "search"},  # 2024-01-15 in seconds
    {"id": 2, "n": "3", "d": "2024-01-15T00:00:01Z", "t": "infra, search"},
    {"id": 3},
]


def dify_ids(mc) -> list[int]:
    where = translate(mc)
    return [r["id"] for r in DIFY_ROWS if where is None or matches(where, r)]


@pytest.mark.parametrize(
    ("mc", "expected"),
    [
        (one("=", "2.0", name="v"), [0]),  # text equality: "2.0" is not "2"
        (one("is", "3", name="n"), [0, 2]),  # the number 3 is spelled "3"
        (one("is", "2.5", name="n"), [1]),
        (one("is not", "3", name="n"), [1]),  # 3 and "3" are both "3"; row 3 lacks n
        (one("≠", "2.0", name="v"), [1]),
        (one("is", 1705276800, name="d"), [0, 1]),  # Unix seconds = the ISO date's instant
        (one("is not", 1705276800, name="d"), [2]),
        (one("is", 1705276801, name="d"), [2]),
        (one("in", "infra,search", name="t"), [0, 1]),  # split on commas, not a substring
        (one("in", "", name="t"), []),
        (one("not in", "", name="t"), [0, 1, 2, 3]),
        (one("not in", "infra", name="t"), [1, 2]),  # row 3 lacks t: NULL is never "not in"
        (one("in", [3, "2.5"], name="n"), [0, 1, 2]),
        (one("in", "3", name="n"), [0, 2]),
        (one("is", None, name="t"), [0, 1, 2, 3]),  # a null value: Dify skips the condition
        (
            {
                "logical_operator": "or",
                "conditions": [
                    {"name": "t", "comparison_operator": "contains", "value": None},
                    {"name": "n", "comparison_operator": ">", "value": 2.6},
                ],
            },
            [0],
        ),
        ({"conditions": [{"name": "t", "comparison_operator": "is"}]}, [0, 1, 2, 3]),
    ],
)
def test_dify_semantics_select_the_rows_difys_filter_selects(mc, expected):
    assert dify_ids(mc) == expected


def test_only_null_valued_conditions_mean_no_filter():
    mc = {
        "conditions": [
            {"name": "a", "comparison_operator": "is", "value": None},
            {"name": "b", "comparison_operator": "<", "value": None},
        ]
    }
    assert dify_condition_to_where(mc) is None


@pytest.mark.parametrize("text", ["1" * 400, "1" * 5000, "9" * 20000 + "x", "-" + "1" * 4400])
def test_long_digit_strings_are_text_or_a_clear_error_never_overflow(text):
    assert translate(one("=", text)) == {"f": {"$eq": text}}
    with pytest.raises(InvalidArgumentError, match="is not a number"):
        dify_condition_to_where(one(">", text))


# ----------------------------------------------------------------------------------------------
# linear time: every regular expression and parser a request reaches (item: ReDoS audit)


def _seconds(fn, arg) -> float:
    import time

    t0 = time.perf_counter()
    fn(arg)
    return time.perf_counter() - t0


def test_the_number_parser_is_linear_on_a_long_non_number():
    from kbcore.dify.condition import _number_shape, _parse_number

    # the old regex took 4.85 s on 20,000 digits plus "x" (quadratic backtracking)
    for n in (20_000, 200_000):
        text = "1" * n + "x"
        assert _parse_number(text) is None
        assert _seconds(_number_shape, text) < 0.5
        assert _seconds(_parse_number, "1." + "1" * n + "e+x") < 0.5


def test_every_regex_on_the_request_path_is_linear_on_adversarial_input():
    from kbcore import _core
    from kbcore.embedders import hashing
    from kbcore.engine import types
    from kbcore.filters import iso

    cases = [
        (iso._SHAPE.fullmatch, "2024-01-01T00:00:00." + "1" * 100_000 + "x"),
        (iso._SHAPE.fullmatch, "2024-01-01T00:00" + ":00" * 30_000),
        (_core.parse_iso8601, "2024-01-01T00:00:00." + "1" * 100_000 + "x"),
        (types._NAME_RE.fullmatch, "a" * 100_000 + "!"),
        (hashing._WORD_RE.findall, "ab " * 100_000),
    ]
    for fn, text in cases:
        assert _seconds(fn, text) < 0.5, (fn, text[:30])
    with pytest.raises(InvalidArgumentError, match="ISO-8601"):
        dify_condition_to_where(one("after", "2024-01-01T00:00:00." + "1" * 100_000 + "x"))


# ----------------------------------------------------------------------------------------------
# the where API itself: a lone surrogate is an InvalidArgumentError naming its place, not the
# binding's RuntimeError


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ({"a": "\ud800"}, 'where["a"]'),
        ({"a\udc00": 1}, 'where["a\\udc00"]'),
        ({"$or": [{"x": 1}, {"y": {"$in": ["a", "b\ud800"]}}]}, 'where["$or"][1]["y"]["$in"][1]'),
        ({"t": {"$contains": "\udfff"}}, 'where["t"]["$contains"]'),
    ],
)
def test_compile_where_and_native_filter_reject_lone_surrogates_naming_the_path(where, path):
    from kbcore.filters import native_filter

    for fn in (compile_where, native_filter):
        with pytest.raises(InvalidArgumentError) as info:
            fn(where)
        assert str(info.value).startswith(path + ": a string contains a lone surrogate")
        str(info.value).encode("utf-8")
