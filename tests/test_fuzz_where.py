"""Fuzzing of the ``where`` filter compiler and its native evaluation (hypothesis).

Arbitrary filter objects — operator-shaped dicts with hostile operands (huge or non-finite
numbers, lone surrogates, long strings, deep nesting, wrong types, unknown operators), and
random JSON-like values — must either compile or raise the documented error
(InvalidArgumentError / InvalidTypeError, i.e. ValueError / TypeError), never anything else.
A filter that compiles is then evaluated natively (``Index.count`` and a filtered ``search``)
on a small index and must agree with the Python reference evaluator (tests/filter_reference.py).

Seeds are fixed and the budget is small, so CI runs this file in a few seconds. A longer run:
``KBCORE_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz_where.py`` (``KBCORE_FUZZ_SEED=<int>``
picks another seed). Every failure found becomes a regression test in
tests/test_filters_compile.py.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from filter_reference import matches
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import kbcore
from kbcore.errors import InvalidArgumentError, InvalidTypeError
from kbcore.filters import compile_where, native_filter

EXAMPLES = int(os.environ.get("KBCORE_FUZZ_EXAMPLES", "200"))
SEED = int(os.environ.get("KBCORE_FUZZ_SEED", "20261201"))

OPS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$contains", "$not_contains",
       "$starts_with", "$ends_with", "$exists", "$empty", "$before", "$after", "$and", "$or",
       "$not", "$regex", "")
FIELDS = ("team", "year", "score", "tags", "flag", "when", "missing")


def fuzz_settings(fn):
    fn = settings(max_examples=EXAMPLES, deadline=None, database=None,
                  derandomize="KBCORE_FUZZ_SEED" not in os.environ,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])(fn)
    return seed(SEED)(fn)


_hostile_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(-3, 2030), st.integers(), st.sampled_from([2**63 - 1, -(2**63), 2**63, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -0.0, 5e-324]),
    st.text(max_size=6), st.sampled_from(["infra", "web", "a", "\ud800", "x\udfff", "1" * 400,
                                          "2024-01-15", "2024-13-01", "2024-01-15T10:00:00Z"]),
)
_operands = st.recursive(
    _hostile_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(OPS + FIELDS), inner,
                                                                         max_size=3)),
    max_leaves=12,
)
_conditions = st.recursive(
    st.one_of(
        st.dictionaries(st.sampled_from(FIELDS), _operands, min_size=1, max_size=2),
        st.dictionaries(st.sampled_from(FIELDS),
                        st.dictionaries(st.sampled_from(OPS), _operands, min_size=1, max_size=2),
                        min_size=1, max_size=2),
    ),
    lambda inner: st.one_of(
        st.dictionaries(st.sampled_from(("$and", "$or")), st.lists(inner, max_size=3), min_size=1, max_size=2),
        st.dictionaries(st.sampled_from(FIELDS), inner, min_size=1, max_size=1),
    ),
    max_leaves=8,
)
_anything = st.one_of(_conditions, _operands, st.text(max_size=5), st.binary(max_size=5))

# Mostly well-typed conditions with edge-case values, so that many compile and reach the
# native evaluation (the hostile ones above mostly stop at validation).
_values = st.one_of(st.sampled_from(["infra", "web", "a", "", "x"]), st.integers(2015, 2030),
                    st.floats(-1, 10, allow_nan=False), st.booleans(),
                    st.sampled_from([2**63 - 1, -(2**63), 1e308, -0.0]))
_typed_op = st.one_of(
    st.tuples(st.sampled_from(("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")), _values),
    st.tuples(st.sampled_from(("$in", "$nin")), st.lists(_values, max_size=4)),
    st.tuples(st.sampled_from(("$contains", "$not_contains", "$starts_with", "$ends_with")),
              st.one_of(st.sampled_from(["x", "y", "in", "a", ""]), _values)),
    st.tuples(st.sampled_from(("$exists", "$empty")), st.booleans()),
    st.tuples(st.sampled_from(("$before", "$after")),
              st.sampled_from(["2024-01-10", "2024-01-10T12:00:00+02:00", "2023-12-31T23:59:59Z"])),
    st.tuples(st.sampled_from(OPS), _hostile_scalars),
)
_leaf = st.one_of(
    st.builds(lambda f, v: {f: v}, st.sampled_from(FIELDS), _values),
    st.builds(lambda f, ops: {f: dict(ops)}, st.sampled_from(FIELDS), st.lists(_typed_op, min_size=1, max_size=2)),
)
_plausible = st.recursive(
    _leaf,
    lambda inner: st.builds(lambda op, xs: {op: xs}, st.sampled_from(("$and", "$or")),
                            st.lists(inner, min_size=1, max_size=3)),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def small_index():
    rng = np.random.default_rng(7)
    n, dim = 64, 8
    rows = []
    for i in range(n):
        row = {"team": ["infra", "web", "a"][i % 3], "year": 2018 + i % 8, "score": float(i) / 7,
               "tags": [["x", "y"], ["y"], []][i % 3], "flag": bool(i % 2),
               "when": f"2024-01-{1 + i % 28:02d}"}
        if i % 5 == 0:
            del row["year"]
        rows.append(row)
    index = kbcore.Index(dim, "l2", "flat")
    index.add(rng.standard_normal((n, dim)).astype(np.float32), np.arange(n), metadata=rows)
    return index, rows, rng.standard_normal(dim).astype(np.float32)


def _compile(where):
    try:
        return compile_where(where), native_filter(where)
    except (InvalidArgumentError, InvalidTypeError) as exc:
        assert isinstance(exc, (ValueError, TypeError))
        str(exc).encode("utf-8", "backslashreplace")  # the message itself is printable
        return None


@fuzz_settings
@given(_anything)
def test_any_where_compiles_or_raises_the_documented_error(where):
    _compile(where)


@fuzz_settings
@given(st.one_of(_plausible, _conditions))
def test_a_compiled_where_evaluates_natively_as_the_reference_says(small_index, where):
    compiled = _compile(where)
    if compiled is None:
        return
    index, rows, q = small_index
    expected = {i for i, row in enumerate(rows) if matches(where, row)}
    assert index.count(where=where) == len(expected)
    ids, dist = index.search(q, k=len(rows), where=where)
    got = {int(i) for i in ids if i >= 0}
    assert got == expected
    assert all(math.isfinite(d) for d, i in zip(dist, ids, strict=True) if i >= 0)
