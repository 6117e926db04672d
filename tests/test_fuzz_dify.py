"""Property tests and fuzzing of the Dify translator and the Dify request parser (hypothesis).

- The translation agrees with a model of Dify's own SQL filter (tests/dify_reference.py) on
  generated rows and conditions: what a Dify user gets from Dify's knowledge bases.
- Arbitrary condition objects and request bodies (huge numbers, long digit strings, lone
  surrogates, deep nesting, random bytes) only ever give a result or the documented error
  (InvalidArgumentError / a 4xx ApiError), never another exception.

Seeds are fixed (``derandomize``) and the budget is small, so CI runs this file in a few
seconds. A longer run: ``KBCORE_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz_dify.py``
(``KBCORE_FUZZ_SEED=<int>`` picks a different fixed seed; see docs/dify.md, "Fuzzing").
Every failure found becomes a regression test in tests/test_dify_condition.py or
tests/test_server.py.
"""

from __future__ import annotations

import json
import os

import pytest
from dify_reference import Undefined, dify_matches
from filter_reference import matches
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kbcore.dify.condition import dify_condition_to_where
from kbcore.dify.request import ApiError, parse_request
from kbcore.errors import InvalidArgumentError
from kbcore.filters import compile_where

EXAMPLES = int(os.environ.get("KBCORE_FUZZ_EXAMPLES", "150"))
SEED = int(os.environ.get("KBCORE_FUZZ_SEED", "20260112"))


def fuzz_settings(examples: int = EXAMPLES):
    def wrap(fn):
        fn = settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize="KBCORE_FUZZ_SEED" not in os.environ,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )(fn)
        return seed(SEED)(fn)

    return wrap


# ----------------------------------------------------------------------------------------------
# agreement with Dify's filter

NAMES = ("t", "n", "m")
_texts = st.text(alphabet="ab1,2 ", min_size=1, max_size=4)
_ints = st.integers(-3, 12)
_floats = st.integers(-8, 8).map(lambda k: k + 0.5)  # never integral: 2.0 vs "2" is a known gap
_row_values = st.one_of(st.none(), _texts, _ints, _floats)
_rows = st.fixed_dictionaries({name: _row_values for name in NAMES})

_TEXT_OPS = ("contains", "not contains", "start with", "end with")
_EQ_OPS = ("is", "=", "is not", "≠")
_NUM_OPS = (">", "<", "≥", "≤", "before", "after")


@st.composite
def dify_conditions(draw) -> dict:
    op = draw(st.sampled_from(_TEXT_OPS + _EQ_OPS + _NUM_OPS + ("in", "not in", "empty", "not empty")))
    if op in _TEXT_OPS:
        value = draw(st.one_of(st.none(), _texts))
    elif op in _EQ_OPS:
        value = draw(st.one_of(st.none(), _texts, _ints, _floats, _ints.map(str)))
    elif op in _NUM_OPS:
        value = draw(st.one_of(st.none(), _ints, _floats, _ints.map(str)))
    elif op in ("in", "not in"):
        value = draw(
            st.one_of(
                st.none(),
                st.text(alphabet="ab1,2 ", max_size=8),
                st.lists(st.one_of(_texts, _ints, _floats), max_size=3),
            )
        )
    else:
        value = draw(st.one_of(st.none(), _texts))
    cond = {"name": draw(st.sampled_from(NAMES)), "comparison_operator": op}
    if value is not None or draw(st.booleans()):
        cond["value"] = value  # Dify sends "value": null; older clients leave it out
    return cond


@st.composite
def metadata_conditions(draw) -> dict:
    return {
        "logical_operator": draw(st.sampled_from(["and", "or"])),
        "conditions": draw(st.lists(dify_conditions(), min_size=1, max_size=3)),
    }


def _kbcore_row(row: dict) -> dict:
    return {k: v for k, v in row.items() if v is not None}


def _text_on_number(mc: dict, row: dict) -> bool:
    """A text operator on a stored number: Dify matches the number's JSON text (LIKE), kbcore
    never (docs/dify.md, "Differences")."""
    return any(
        c["comparison_operator"] in _TEXT_OPS and isinstance(row.get(c["name"]), (int, float)) for c in mc["conditions"]
    )


@fuzz_settings(EXAMPLES * 2)
@given(mc=metadata_conditions(), rows=st.lists(_rows, min_size=1, max_size=6))
def test_translation_keeps_the_rows_difys_own_filter_keeps(mc, rows):
    where = dify_condition_to_where(mc)
    if where is not None:
        compile_where(where)
    for row in rows:
        if _text_on_number(mc, row):
            continue
        try:
            expected = dify_matches(mc, row)
        except Undefined:  # Dify's SQL fails on this row (a text value cast to a number)
            continue
        got = True if where is None else matches(where, _kbcore_row(row))
        assert got == expected, (mc, row, where)


# ----------------------------------------------------------------------------------------------
# robustness: only the documented errors

_nasty_strings = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "\ud800",
            "a\udc80b",
            "1" * 400,
            "1" * 5000,
            "9" * 20000 + "x",
            "1e99999",
            "-0",
            ".5",
            "5.",
            "1_000",
            "nan",
            "inf",
            " 2024-01-15 ",
            "2024-01-15T00:00:00." + "1" * 3000,
            "2024-13-01",
            ",,,",
            "",
        ]
    ),
)
_nasty_numbers = st.one_of(
    st.integers(),
    st.floats(),
    st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1]),
)
_scalars = st.one_of(st.none(), st.booleans(), _nasty_numbers, _nasty_strings)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_nasty_strings, inner, max_size=3)),
    max_leaves=8,
)
_valid_ops = st.sampled_from(
    [
        "contains",
        "not contains",
        "start with",
        "end with",
        "is",
        "is not",
        "in",
        "not in",
        "empty",
        "not empty",
        "null",
        "not null",
        "=",
        "≠",
        ">",
        "<",
        "≥",
        "≤",
        "before",
        "after",
        ">=",
        "IS NOT",
        "like",
    ]
)


@st.composite
def rough_conditions(draw) -> object:
    """Mostly well-formed conditions (a valid name and operator) with hostile values, so the
    value handling is reached; sometimes anything at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_json_values)
    cond = {}
    if draw(st.integers(0, 9)):
        cond["name"] = draw(st.sampled_from(["team", ["a", "b"], "year"]))
    else:
        cond["name"] = draw(st.one_of(_nasty_strings, st.lists(_nasty_strings, max_size=3), _scalars))
    if draw(st.integers(0, 9)):
        cond["comparison_operator"] = draw(_valid_ops)
    else:
        cond["comparison_operator"] = draw(st.one_of(_nasty_strings, _scalars))
    if draw(st.integers(0, 5)):
        cond["value"] = draw(_scalars if draw(st.integers(0, 3)) else _json_values)
    return cond


@st.composite
def rough_metadata_conditions(draw) -> object:
    mc = {}
    if draw(st.booleans()):
        mc["logical_operator"] = draw(st.sampled_from(["and", "or", "OR"]) if draw(st.integers(0, 9)) else _scalars)
    mc["conditions"] = draw(st.lists(rough_conditions(), max_size=4) if draw(st.integers(0, 9)) else _json_values)
    return draw(st.one_of(st.just(mc), _json_values)) if draw(st.integers(0, 9)) == 0 else mc


@fuzz_settings()
@given(mc=rough_metadata_conditions())
def test_the_translator_returns_a_valid_where_or_raises_invalid_argument(mc):
    try:
        where = dify_condition_to_where(mc)
    except InvalidArgumentError as exc:
        assert str(exc)
        str(exc).encode("utf-8")  # the message itself can be sent as JSON
        return
    if where is not None:
        compile_where(where)


def _dump(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=True, default=str).encode("ascii")


@st.composite
def request_bodies(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        depth = draw(st.integers(1, 3000))
        return b'{"knowledge_id": "kb", "query": "q", "x": ' + b"[" * depth + b"]" * depth + b"}"
    body = {
        "knowledge_id": draw(st.one_of(st.just("kb"), _scalars)),
        "query": draw(st.one_of(st.just("keys"), _nasty_strings, _scalars)),
        "retrieval_setting": draw(
            st.one_of(
                st.fixed_dictionaries(
                    {
                        "top_k": st.one_of(st.integers(-3, 200), _scalars),
                        "score_threshold": st.one_of(st.floats(), _scalars),
                    }
                ),
                _json_values,
            )
        ),
        "metadata_condition": draw(st.one_of(rough_metadata_conditions(), st.none())),
    }
    return _dump(body)


@fuzz_settings()
@given(body=request_bodies())
def test_the_request_parser_answers_a_request_or_a_4xx_error(body):
    try:
        req = parse_request(body, 50)
    except ApiError as err:
        assert 400 <= err.status < 500, err.message
        assert err.code in (3000, 3001, 3002)
        json.dumps({"error_msg": err.message}, ensure_ascii=False).encode("utf-8")
        return
    assert 1 <= req.top_k <= 50
    assert 0.0 <= req.score_threshold <= 1.0
    req.knowledge_id.encode("utf-8")
    req.query.encode("utf-8")


@pytest.mark.parametrize("depth", [10, 31, 33, 1000, 100_000])
def test_json_depth_is_bounded_without_recursion_errors(depth):
    body = b'{"knowledge_id": "kb", "query": "q", "x": ' + b"[" * depth + b"]" * depth + b"}"
    if depth + 1 <= 32:
        assert parse_request(body, 5).knowledge_id == "kb"
    else:
        with pytest.raises(ApiError) as info:
            parse_request(body, 5)
        assert info.value.status == 400 and "deeper than 32" in info.value.message
