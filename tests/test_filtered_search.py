"""Filtered search end to end: ``where`` evaluated natively against stored metadata (issue 3).

Every result is compared with an oracle that does not use kbcore: ``filter_reference.matches``
(a pure-Python evaluator written from docs/filter-ir.md) decides which rows pass, and the exact
float64 numpy oracle of conftest ranks the passing rows. Hypothesis runs are derandomized (the
same examples on every run) and numpy data is seeded.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest
from conftest import (
    KINDS,
    assert_distances_are_true,
    assert_search_matches_oracle,
    oracle_topk,
    recall_at_k,
)
from filter_reference import FIELDS, iso_to_epoch, matches, metadata_rows, valid_wheres
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kbcore
from kbcore.filters import compile_where

DIM = 8

_HYPOTHESIS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --------------------------------------------------------------------------------------------
# helpers


def _vectors(n: int, seed: int = 0, dim: int = DIM) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def _index(rows, kind: str, *, ids=None, data=None, seed: int = 0, **kw) -> kbcore.Index:
    n = len(rows)
    data = _vectors(n, seed) if data is None else data
    ids = np.arange(n, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    kw.setdefault("M", 8)
    kw.setdefault("ef_construction", 40)
    index = kbcore.Index(dim=data.shape[1], metric="l2", kind=kind, **kw)
    index.add(data, ids, metadata=rows, threads=1)
    return index


def _typed(value):
    """A comparable image of a metadata value that keeps int, float, bool and str apart (and the
    sign of a zero): 1, 1.0, True and "1" all differ."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def _expected_metadata(row) -> dict:
    """What get_metadata should return for a stored row: None values (missing) omitted, tuples
    as lists."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in (row or {}).items() if v is not None}


def _passing_mask(where, rows) -> np.ndarray:
    return np.array([matches(where, r) for r in rows], dtype=bool)


def _assert_filtered_approx(got_ids, got_dist, data, ids, queries, mask, k) -> None:
    """An approximate filtered result: only passing ids, each at its true distance, unique per
    row, sorted, and exactly min(k, passing) real hits (the rest padding)."""
    got_ids = np.atleast_2d(got_ids)
    got_dist = np.atleast_2d(got_dist)
    assert got_ids.shape == (len(queries), k)
    assert_distances_are_true(got_ids, got_dist, data[mask], ids[mask], queries, "l2")
    want = min(k, int(mask.sum()))
    real = (got_ids != -1).sum(axis=1)
    assert (real == want).all(), f"expected {want} hits per query, got {real.tolist()}"
    assert (got_ids[:, :want] != -1).all(), "padding must come after the real hits"
    d = got_dist[:, :want].astype(np.float64)
    assert (np.diff(d, axis=1) >= 0).all(), "distances must be ascending"


# --------------------------------------------------------------------------------------------
# differential: random metadata x random filters, both index kinds

_INT64 = (-(2**63), 2**63 - 1)


@st.composite
def _leaf_about(draw, rows: list) -> dict:
    """One field condition whose operand comes from a value stored in ``rows`` (or a variant of
    it), so that it splits the rows: independent random operands (valid_wheres) almost never
    match anything on random metadata."""
    present = sorted({key for r in rows if r for key, v in r.items() if v is not None})
    field = draw(st.sampled_from(present)) if present and draw(st.integers(0, 7)) else draw(st.sampled_from(FIELDS))
    values = [r[field] for r in rows if r and r.get(field) is not None]
    if not values or draw(st.integers(0, 9)) == 0:
        return {field: {draw(st.sampled_from(["$exists", "$empty"])): draw(st.booleans())}}
    v = draw(st.sampled_from(values))
    if isinstance(v, bool):
        op = draw(st.sampled_from(["$eq", "$ne", "$in", "$nin"]))
        return {field: {op: [v] if op in ("$in", "$nin") else v}}
    if isinstance(v, (int, float)):
        variants = [v]
        if isinstance(v, int) and float(v) != v:  # an int next to a double: compare both ways
            variants.append(float(v))
        if isinstance(v, float) and v.is_integer() and _INT64[0] <= v <= _INT64[1]:
            variants.append(int(v))
        x = draw(st.sampled_from(variants))
        op = draw(st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"]))
        if op in ("$in", "$nin"):
            others = [u for u in values if not isinstance(u, (bool, str, list))]
            return {field: {op: [x, *draw(st.lists(st.sampled_from(others), max_size=2))]}}
        return {field: x} if op == "$eq" and draw(st.booleans()) else {field: {op: x}}
    if isinstance(v, list):
        if not v:
            return {field: {"$empty": draw(st.booleans())}}
        member = draw(st.sampled_from(v))
        op = draw(st.sampled_from(["$contains", "$not_contains", "$in", "$nin", "$eq"]))
        if op in ("$in", "$nin"):
            return {field: {op: [member]}}
        return {field: {op: member}}
    # a str: equality, substrings, and instants when it is an ISO-8601 date
    ops = ["$eq", "$ne", "$in", "$nin", "$contains", "$not_contains", "$starts_with", "$ends_with"]
    if iso_to_epoch(v) is not None:
        ops += ["$before", "$after"] * 3
    op = draw(st.sampled_from(ops))
    i = draw(st.integers(0, len(v)))
    j = draw(st.integers(i, len(v)))
    if op in ("$in", "$nin"):
        return {field: {op: [v]}}
    if op == "$contains" or op == "$not_contains":
        return {field: {op: v[i:j]}}
    if op == "$starts_with":
        return {field: {op: v[:j]}}
    if op == "$ends_with":
        return {field: {op: v[i:]}}
    if op in ("$before", "$after"):
        dates = [u for u in values if isinstance(u, str) and iso_to_epoch(u) is not None]
        return {field: {op: draw(st.sampled_from(dates))}}
    return {field: {op: v}}


def _merged(leaves: list) -> dict:
    """Several field conditions in one dict (an AND), operators of one field merged."""
    out: dict = {}
    for w in leaves:
        for key, spec in w.items():
            if isinstance(out.get(key), dict) and isinstance(spec, dict):
                out[key] = {**out[key], **spec}
            else:
                out[key] = spec
    return out


@st.composite
def _wheres_about(draw, rows: list, depth: int = 2) -> dict:
    """Where dicts built from ``_leaf_about``: leaves, several keys in one dict, $and / $or
    nested up to ``depth`` (drawn step by step: building strategy trees per example is slow)."""
    shape = draw(st.integers(0, 4)) if depth else 0
    if shape == 0:
        return draw(_leaf_about(rows))
    if shape == 1:
        return _merged([draw(_leaf_about(rows)) for _ in range(draw(st.integers(2, 3)))])

    def children() -> list:
        return [draw(_wheres_about(rows, depth - 1)) for _ in range(draw(st.integers(1, 3)))]

    if shape == 2:
        return {"$and": children()}
    if shape == 3:
        return {"$or": children()}
    return {"$and": children(), "$or": children(), **draw(_leaf_about(rows))}


_ROWS = st.lists(metadata_rows(), min_size=3, max_size=40)
_RANDOM_WHERES = valid_wheres()


@st.composite
def _corpora(draw) -> tuple[list, list]:
    """Metadata rows and 1-4 filters over them: most split the rows, some are fully random."""
    rows = draw(_ROWS)
    wheres = [
        draw(_RANDOM_WHERES) if draw(st.integers(0, 2)) == 0 else draw(_wheres_about(rows))
        for _ in range(draw(st.integers(1, 4)))
    ]
    return rows, wheres


def _conditions(where: dict):
    """Every single-operator condition inside a where, as a where of its own."""
    for key, spec in where.items():
        if key in ("$and", "$or"):
            for child in spec:
                yield from _conditions(child)
        elif isinstance(spec, dict):
            for op, operand in spec.items():
                yield {key: {op: operand}}
        else:
            yield {key: spec}


@settings(_HYPOTHESIS, max_examples=150)
@given(corpus=_corpora(), k=st.integers(1, 8), seed=st.integers(0, 2**32 - 1))
def test_filtered_search_agrees_with_the_reference_evaluator(corpus, k, seed):
    rows, wheres = corpus
    n = len(rows)
    data = _vectors(n, seed)
    queries = _vectors(2, seed + 1)
    ids = np.arange(n, dtype=np.int64) * 7 + 3  # ids differ from storage slots
    flat = _index(rows, "flat", ids=ids, data=data)
    hnsw = _index(rows, "hnsw", ids=ids, data=data)
    for where in wheres:
        for condition in _conditions(where):  # each condition alone, unmasked by and / or
            assert flat.count(condition) == _passing_mask(condition, rows).sum(), condition
        mask = _passing_mask(where, rows)
        expected = int(mask.sum())
        assert flat.count(where) == expected, where
        assert hnsw.count(where) == expected, where

        got_ids, got_dist = flat.search(queries, k, where=where, threads=1)
        assert_search_matches_oracle(got_ids, got_dist, data[mask], ids[mask], queries, k, "l2")

        got_ids, got_dist = hnsw.search(queries, k, where=where, threads=1)
        _assert_filtered_approx(got_ids, got_dist, data, ids, queries, mask, k)
        ir = compile_where(where)
        got_ids, got_dist = hnsw._native.search(queries, k, 16, 1, ir, "exact")
        assert_search_matches_oracle(got_ids, got_dist, data[mask], ids[mask], queries, k, "l2")
        got_ids, got_dist = hnsw._native.search(queries, k, 16, 1, ir, "graph")
        _assert_filtered_approx(got_ids, got_dist, data, ids, queries, mask, k)
        got_ids, got_dist = hnsw._native.search(queries, k, 16, 1, ir, "walk")
        _assert_filtered_approx(got_ids, got_dist, data, ids, queries, mask, k)


@settings(_HYPOTHESIS, max_examples=50)
@given(
    corpus=_corpora(),
    updates=st.lists(st.tuples(st.integers(0, 39), metadata_rows()), max_size=10),
    removals=st.sets(st.integers(0, 39), max_size=6),
    kind=st.sampled_from(KINDS),
)
def test_counts_follow_upserts_removes_and_save_load(tmp_path_factory, corpus, updates, removals, kind):
    rows, wheres = corpus
    # the reference state: id -> metadata row
    state = dict(enumerate(rows))
    index = _index(rows, kind)
    for i, row in updates:  # an upsert replaces the row (or adds a new id past the end)
        index.add(_vectors(1, 1000 + i), [i], metadata=[row])
        state[i] = row
    for i in sorted(removals):
        if i in state:
            index.remove([i])
            del state[i]
    fresh = list(range(100, 103))  # new ids may reuse freed slots; they get no metadata
    index.add(_vectors(3, 99), fresh)
    state.update({i: None for i in fresh})

    path = tmp_path_factory.mktemp("idx") / "index.kb"
    index.save(path)
    loaded = kbcore.Index.load(path)
    live = sorted(state)
    for ix in (index, loaded):
        assert sorted(ix.ids().tolist()) == live
        assert [_typed(m) for m in ix.get_metadata(live)] == [_typed(_expected_metadata(state[i])) for i in live]
        for where in wheres:
            expected = sorted(i for i in live if matches(where, state[i]))
            assert ix.count(where) == len(expected), where
            got, _ = ix.search(np.zeros(DIM), len(live), where=where)
            assert sorted(got[got >= 0].tolist()) == expected, where


# --------------------------------------------------------------------------------------------
# every operator, on a small hand-written table (expectations written from the spec)

DOCS = [
    {"year": 2019, "lang": "en", "tags": ["ml", "nlp"], "title": "deep learning", "score": 0.5, "draft": False},  # 0
    {"year": 2020, "lang": "fr", "tags": ["nlp"], "title": "learning to rank", "score": 1.5, "draft": True},  # 1
    {"year": 2021, "lang": "en", "tags": [], "title": "", "score": 2.0},  # 2
    {"year": 2022, "lang": "de", "title": "ranking zoë", "draft": False},  # 3
    {"lang": "en", "tags": ["ml", ""]},  # 4
    {},  # 5
]

OPERATOR_CASES = [
    # equality, shorthand and explicit, on str / int / bool
    ({"lang": "en"}, [0, 2, 4]),
    ({"lang": {"$eq": "en"}}, [0, 2, 4]),
    ({"year": {"$eq": 2020}}, [1]),
    ({"draft": False}, [0, 3]),
    ({"lang": {"$eq": "EN"}}, []),
    # $ne matches rows without the field
    ({"lang": {"$ne": "en"}}, [1, 3, 5]),
    ({"year": {"$ne": 2020}}, [0, 2, 3, 4, 5]),
    ({"draft": {"$ne": True}}, [0, 2, 3, 4, 5]),
    # order comparisons on ints and floats, int and float operands
    ({"year": {"$gt": 2020}}, [2, 3]),
    ({"year": {"$gte": 2020}}, [1, 2, 3]),
    ({"year": {"$lt": 2020}}, [0]),
    ({"year": {"$lte": 2020}}, [0, 1]),
    ({"year": {"$gt": 2020.5}}, [2, 3]),
    ({"year": {"$lte": 2019.0}}, [0]),
    ({"score": {"$lt": 2}}, [0, 1]),
    ({"score": {"$lte": 2}}, [0, 1, 2]),
    ({"score": {"$gte": 0.5, "$lt": 1.5}}, [0]),
    ({"year": {"$gt": float("-inf")}}, [0, 1, 2, 3]),
    ({"year": {"$lt": float("inf")}}, [0, 1, 2, 3]),
    # order comparisons never match str, list or bool values
    ({"lang": {"$gt": 0}}, []),
    ({"draft": {"$gte": 0}}, []),
    # $in / $nin ($nin matches rows without the field)
    ({"lang": {"$in": ["en", "de"]}}, [0, 2, 3, 4]),
    ({"lang": {"$nin": ["en", "de"]}}, [1, 5]),
    ({"year": {"$in": [2019, 2022.0]}}, [0, 3]),
    ({"year": {"$nin": [2019]}}, [1, 2, 3, 4, 5]),
    ({"draft": {"$in": [True]}}, [1]),
    ({"draft": {"$nin": [False]}}, [1, 2, 4, 5]),
    # $contains: substring on a str, membership (not substring) on a list of str
    ({"title": {"$contains": "learn"}}, [0, 1]),
    ({"tags": {"$contains": "nlp"}}, [0, 1]),
    ({"tags": {"$contains": "nl"}}, []),
    ({"tags": {"$contains": ""}}, [4]),
    ({"title": {"$contains": ""}}, [0, 1, 2, 3]),
    ({"lang": {"$contains": "n"}}, [0, 2, 4]),
    # $not_contains requires the field
    ({"tags": {"$not_contains": "nlp"}}, [2, 4]),
    ({"title": {"$not_contains": "learn"}}, [2, 3]),
    # $starts_with / $ends_with: str fields only (UTF-8 aware)
    ({"title": {"$starts_with": "learn"}}, [1]),
    ({"title": {"$ends_with": "ing"}}, [0]),
    ({"title": {"$ends_with": "zoë"}}, [3]),
    ({"title": {"$ends_with": "ë"}}, [3]),
    ({"title": {"$starts_with": ""}}, [0, 1, 2, 3]),
    ({"tags": {"$starts_with": "ml"}}, []),
    # $exists / $empty
    ({"year": {"$exists": True}}, [0, 1, 2, 3]),
    ({"year": {"$exists": False}}, [4, 5]),
    ({"tags": {"$empty": True}}, [2, 3, 5]),
    ({"tags": {"$empty": False}}, [0, 1, 4]),
    ({"title": {"$empty": True}}, [2, 4, 5]),
    ({"title": {"$empty": False}}, [0, 1, 3]),
    # logical operators, nesting, several keys in one dict
    ({"$and": [{"lang": "en"}, {"year": {"$gte": 2020}}]}, [2]),
    ({"$or": [{"lang": "fr"}, {"year": {"$lt": 2020}}]}, [0, 1]),
    (
        {
            "$or": [
                {"$and": [{"lang": "en"}, {"tags": {"$contains": "ml"}}]},
                {"$and": [{"draft": True}, {"year": 2020}]},
            ]
        },
        [0, 1, 4],
    ),
    ({"$and": [{"$or": [{"lang": "de"}, {"lang": "fr"}]}, {"$or": [{"year": 2022}, {"score": 1.5}]}]}, [1, 3]),
    ({"$and": [{"$or": [{"$and": [{"lang": "en"}]}]}]}, [0, 2, 4]),
    ({"lang": "en", "year": {"$gt": 2019}}, [2]),
    ({"year": {"$gt": 2019, "$lt": 2022}}, [1, 2]),
    ({"$or": [{"lang": "de"}, {"year": 2019}], "draft": False, "tags": {"$exists": False}}, [3]),
    ({"$and": [{"year": {"$exists": True}}], "$or": [{"lang": "fr"}, {"score": 2.0}]}, [1, 2]),
    # a field no row has
    ({"nope": 1}, []),
    ({"nope": {"$ne": 1}}, [0, 1, 2, 3, 4, 5]),
]


@pytest.fixture(scope="module")
def doc_indexes():
    return {kind: _index(DOCS, kind) for kind in KINDS}


def _selected(index, where, n) -> list[int]:
    ids, _ = index.search(np.zeros(DIM), n, where=where)
    return sorted(ids[ids >= 0].tolist())


def _assert_selects(index, rows, where, expected, reference_rows=None) -> None:
    """The reference evaluator, count() and a filtered search all select exactly `expected`."""
    ref = rows if reference_rows is None else reference_rows
    assert [i for i, r in enumerate(ref) if matches(where, r)] == expected, where
    assert index.count(where) == len(expected), where
    assert _selected(index, where, len(rows)) == expected, where


@pytest.mark.parametrize("where, expected", OPERATOR_CASES, ids=lambda v: None)
@pytest.mark.parametrize("kind", KINDS)
def test_each_operator_selects_the_rows_the_spec_says(doc_indexes, kind, where, expected):
    # the expectations are hand-written from docs/filter-ir.md; the reference must agree
    _assert_selects(doc_indexes[kind], DOCS, where, expected)


MISSING_FIELD_CASES = [
    # (operator dict on a field that no row has, whether rows without it match)
    ({"$eq": 1}, False),
    ({"$eq": "x"}, False),
    ({"$ne": 1}, True),
    ({"$ne": "x"}, True),
    ({"$ne": False}, True),
    ({"$gt": 0}, False),
    ({"$gte": 0}, False),
    ({"$lt": 0}, False),
    ({"$lte": 0}, False),
    ({"$in": ["x"]}, False),
    ({"$in": [0]}, False),
    ({"$nin": ["x"]}, True),
    ({"$nin": [0, 1]}, True),
    ({"$nin": [True]}, True),
    ({"$contains": ""}, False),
    ({"$not_contains": "x"}, False),
    ({"$starts_with": ""}, False),
    ({"$ends_with": ""}, False),
    ({"$exists": True}, False),
    ({"$exists": False}, True),
    ({"$empty": True}, True),
    ({"$empty": False}, False),
    ({"$before": "9999-12-31"}, False),
    ({"$after": "0000-01-01"}, False),
]


@pytest.mark.parametrize("op, matches_missing", MISSING_FIELD_CASES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_missing_field_matches_only_ne_nin_exists_false_and_empty_true(kind, op, matches_missing):
    # rows without "f": another field, an empty dict, an explicit None value, no metadata at all
    rows = [{"g": 1}, {}, {"f": None, "g": "x"}, None]
    index = _index(rows, kind)
    where = {"f": op}
    expected = [0, 1, 2, 3] if matches_missing else []
    _assert_selects(index, rows, where, expected)


# --------------------------------------------------------------------------------------------
# int vs float vs bool vs str, lists of str

TYPED_ROWS = [
    {"v": 1},  # 0
    {"v": 1.0},  # 1
    {"v": True},  # 2
    {"v": "1"},  # 3
    {"v": 0},  # 4
    {"v": False},  # 5
    {"v": ["1"]},  # 6
    {"v": 1.5},  # 7
    {"v": -0.0},  # 8
    {},  # 9
]

TYPED_CASES = [
    ({"v": 1}, [0, 1]),
    ({"v": 1.0}, [0, 1]),
    ({"v": True}, [2]),
    ({"v": "1"}, [3]),
    ({"v": 0}, [4, 8]),
    ({"v": 0.0}, [4, 8]),
    ({"v": False}, [5]),
    ({"v": {"$ne": 1}}, [2, 3, 4, 5, 6, 7, 8, 9]),
    ({"v": {"$ne": True}}, [0, 1, 3, 4, 5, 6, 7, 8, 9]),
    ({"v": {"$ne": False}}, [0, 1, 2, 3, 4, 6, 7, 8, 9]),
    ({"v": {"$gt": 0}}, [0, 1, 7]),
    ({"v": {"$gte": 0}}, [0, 1, 4, 7, 8]),
    ({"v": {"$lte": 1}}, [0, 1, 4, 8]),
    ({"v": {"$lt": 1.5}}, [0, 1, 4, 8]),
    ({"v": {"$in": [1]}}, [0, 1]),
    ({"v": {"$in": [1.5, 0]}}, [4, 7, 8]),
    ({"v": {"$in": [True]}}, [2]),
    ({"v": {"$in": [True, False]}}, [2, 5]),
    ({"v": {"$in": ["1"]}}, [3]),  # a list value never equals a scalar: use $contains
    ({"v": {"$nin": [1]}}, [2, 3, 4, 5, 6, 7, 8, 9]),
    ({"v": {"$nin": ["1"]}}, [0, 1, 2, 4, 5, 6, 7, 8, 9]),
    ({"v": {"$nin": [False]}}, [0, 1, 2, 3, 4, 6, 7, 8, 9]),
    ({"v": {"$contains": "1"}}, [3, 6]),
    ({"v": {"$not_contains": "1"}}, []),
    ({"v": {"$not_contains": "2"}}, [3, 6]),
    ({"v": {"$starts_with": "1"}}, [3]),
    ({"v": {"$exists": True}}, [0, 1, 2, 3, 4, 5, 6, 7, 8]),
    ({"v": {"$empty": True}}, [9]),
]


@pytest.mark.parametrize("where, expected", TYPED_CASES, ids=lambda v: None)
@pytest.mark.parametrize("kind", KINDS)
def test_numbers_compare_numerically_and_bools_str_and_lists_stay_apart(kind, where, expected):
    _assert_selects(_index(TYPED_ROWS, kind), TYPED_ROWS, where, expected)


LIST_ROWS = [
    {"tags": ["a", "b"]},  # 0
    {"tags": ["ab"]},  # 1
    {"tags": []},  # 2
    {"tags": "ab"},  # 3  a plain str in the same field
    {"tags": [""]},  # 4
    {"tags": ("b", "c")},  # 5  a tuple is a list of str
    {},  # 6
]

LIST_CASES = [
    ({"tags": {"$contains": "a"}}, [0, 3]),  # membership in lists, substring in the str
    ({"tags": {"$contains": "ab"}}, [1, 3]),
    ({"tags": {"$contains": "b"}}, [0, 3, 5]),
    ({"tags": {"$contains": ""}}, [3, 4]),  # "" is a substring of any str, a member of [""]
    ({"tags": {"$not_contains": "b"}}, [1, 2, 4]),
    ({"tags": {"$in": ["ab"]}}, [3]),  # $in compares whole values: no list equals "ab"
    ({"tags": {"$nin": ["ab"]}}, [0, 1, 2, 4, 5, 6]),
    ({"tags": "ab"}, [3]),
    ({"tags": {"$ne": "a"}}, [0, 1, 2, 3, 4, 5, 6]),
    ({"tags": {"$empty": True}}, [2, 6]),
    ({"tags": {"$empty": False}}, [0, 1, 3, 4, 5]),
    ({"tags": {"$exists": True}}, [0, 1, 2, 3, 4, 5]),
    ({"tags": {"$ends_with": "b"}}, [3]),
    ({"$or": [{"tags": {"$contains": "c"}}, {"tags": {"$contains": ""}}]}, [3, 4, 5]),
    ({"$and": [{"tags": {"$contains": "a"}}, {"tags": {"$contains": "b"}}]}, [0, 3]),
]


@pytest.mark.parametrize("where, expected", LIST_CASES, ids=lambda v: None)
@pytest.mark.parametrize("kind", KINDS)
def test_list_of_str_fields_use_membership_for_contains_and_never_equal_a_scalar(kind, where, expected):
    reference_rows = [_expected_metadata(r) for r in LIST_ROWS]  # the tuple as a list
    _assert_selects(_index(LIST_ROWS, kind), LIST_ROWS, where, expected, reference_rows)


# --------------------------------------------------------------------------------------------
# the int64 limits: exact comparisons, no rounding through double

EDGE_VALUES = [
    2**63 - 1,
    2**63 - 1024,
    2**63 - 1025,
    2**63 - 2048,
    -(2**63),
    -(2**63) + 1,
    2**53,
    2**53 + 1,
    0,
    1,
    -1,
    1.0,
    2.0**53,
    9.2e18,
    -9.2e18,
    0.5,
    -0.5,
    2.0**63,
    -(2.0**63),
]
_EDGE_OPERANDS = EDGE_VALUES + [float("inf"), float("-inf")]


def test_comparisons_at_the_int64_limits_agree_with_the_reference():
    rows = [{"a": v} for v in EDGE_VALUES]
    index = _index(rows, "flat")
    wrong = []
    for op in ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte"):
        for x in _EDGE_OPERANDS:
            where = {"a": {op: x}}
            got, expected = index.count(where), int(_passing_mask(where, rows).sum())
            if got != expected:
                wrong.append((op, x, got, expected))
    for op in ("$in", "$nin"):
        for items in itertools.combinations(EDGE_VALUES, 2):
            where = {"a": {op: list(items)}}
            got, expected = index.count(where), int(_passing_mask(where, rows).sum())
            if got != expected:
                wrong.append((op, items, got, expected))
    assert not wrong, f"{len(wrong)} wrong counts, first: {wrong[:5]}"


@pytest.mark.parametrize("kind", KINDS)
def test_int64_neighbours_that_round_to_the_same_double_are_told_apart(kind):
    rows = [
        {"a": 2**53},  # 0
        {"a": 2**53 + 1},  # 1  not representable as a double
        {"a": 2.0**53},  # 2
        {"a": 2**63 - 1},  # 3  rounds to 2.0**63 as a double
        {"a": 2.0**63},  # 4
        {"a": -(2**63)},  # 5  exactly -(2.0**63)
        {"a": -(2.0**63)},  # 6
        {"a": 2**63 - 1025},  # 7
        {"a": 2**63 - 1024},  # 8
    ]
    index = _index(rows, kind)
    cases = [
        ({"a": 2**53 + 1}, [1]),
        ({"a": 2**53}, [0, 2]),
        ({"a": 2.0**53}, [0, 2]),
        ({"a": {"$gt": 2.0**53, "$lt": 2**53 + 2}}, [1]),
        ({"a": {"$gt": 2**53}, "$and": [{"a": {"$lt": 2**62}}]}, [1]),
        ({"a": 2**63 - 1}, [3]),
        ({"a": 2.0**63}, [4]),
        ({"a": {"$gt": 2**63 - 1}}, [4]),
        ({"a": {"$gte": 2**63 - 1}}, [3, 4]),
        ({"a": {"$lt": 2.0**63, "$gt": 2**63 - 1024}}, [3]),
        ({"a": {"$in": [2**63 - 1]}}, [3]),
        ({"a": {"$nin": [2**63 - 1, 2.0**63]}}, [0, 1, 2, 5, 6, 7, 8]),
        ({"a": -(2**63)}, [5, 6]),
        ({"a": {"$lt": -(2**63) + 1}}, [5, 6]),
        ({"a": {"$gt": 2**63 - 1025, "$lt": 2**63 - 1}}, [8]),
        ({"a": {"$gte": 2**63 - 1025, "$lte": 2**63 - 1024}}, [7, 8]),
        ({"a": 2**63 - 1025}, [7]),
    ]
    for where, expected in cases:
        _assert_selects(index, rows, where, expected)


def test_an_integer_operand_beyond_int64_is_rejected_not_rounded():
    index = _index([{"a": 2**63 - 1}], "flat")
    with pytest.raises(
        ValueError, match=re.escape('where["a"]: $gt: the integer 9223372036854775808 does not fit in int64')
    ):
        index.search(np.zeros(DIM), 1, where={"a": {"$gt": 2**63}})
    with pytest.raises(ValueError, match=re.escape('where["a"]: $in: item 1')):
        index.search(np.zeros(DIM), 1, where={"a": {"$in": [1, -(2**63) - 1]}})


# --------------------------------------------------------------------------------------------
# ISO-8601 dates compared as instants

DATE_ROWS = [
    {"d": "2024-03-01"},  # 0  2024-03-01T00:00:00Z
    {"d": "2024-03-01T01:00:00+02:00"},  # 1  2024-02-29T23:00:00Z
    {"d": "2024-02-29T23:30:00-01:00"},  # 2  2024-03-01T00:30:00Z
    {"d": "2024-03-01T00:00:00Z"},  # 3  same instant as 0
    {"d": "2024-03-01 00:00:00.5"},  # 4  half a second later (no offset: UTC)
    {"d": "2024-03-01T05:30+0530"},  # 5  2024-03-01T00:00:00Z, compact offset
    {"d": "2024-02-29T20:00-04"},  # 6  2024-03-01T00:00:00Z, hour-only offset
    {"d": "2024-02-29T24:00:00"},  # 7  24:00 = the end of the day = 0
    {"d": "not a date"},  # 8  a str that is not ISO: never before/after
    {"d": ["2024-03-01"]},  # 9  a list: never before/after
    {"d": 1709251200},  # 10 a number: never before/after
    {},  # 11
]
_MIDNIGHT = [0, 3, 5, 6, 7]

DATE_CASES = [
    ({"d": {"$before": "2024-03-01T00:00:00Z"}}, [1]),  # strictly before
    ({"d": {"$after": "2024-03-01"}}, [2, 4]),
    ({"d": {"$before": "2024-03-01T02:00:00+02:00"}}, [1]),  # the operand is midnight UTC too
    ({"d": {"$after": "2024-02-29T23:59:59-00:30"}}, [2]),  # 00:29:59Z
    ({"d": {"$after": "2024-02-29T23:00:00Z", "$before": "2024-03-01T00:30:00+00:00"}}, sorted(_MIDNIGHT + [4])),
    ({"d": {"$after": "2024-03-01T01:00+01"}}, [2, 4]),
    ({"d": {"$before": "2024-03-01T00:00:00.5Z"}}, sorted([1] + _MIDNIGHT)),
    ({"d": {"$after": "2024-02-29T23:59:59.999Z"}}, sorted([2, 4] + _MIDNIGHT)),
    ({"d": {"$before": "1970-01-01"}}, []),
    ({"d": {"$after": "0000-01-01"}}, list(range(8))),
    ({"$or": [{"d": {"$before": "2024-02-29T23:00:01Z"}}, {"d": {"$after": "2024-03-01T00:29Z"}}]}, [1, 2]),
]


@pytest.mark.parametrize("where, expected", DATE_CASES, ids=lambda v: None)
@pytest.mark.parametrize("kind", KINDS)
def test_before_and_after_compare_iso_dates_as_instants_across_offsets(kind, where, expected):
    _assert_selects(_index(DATE_ROWS, kind), DATE_ROWS, where, expected)


# --------------------------------------------------------------------------------------------
# errors name the place inside the filter

ERROR_CASES = [
    ({"$and": [{"a": 1}, {"year": {"$gt": "2020"}}]}, 'where["$and"][1]["year"]: $gt expects a number, got str'),
    ({"year": {"$gt": True}}, 'where["year"]: $gt expects a number, got bool'),
    ({"year": {"$lte": None}}, 'where["year"]: $lte expects a number, got None'),
    ({"year": {"$gte": float("nan")}}, 'where["year"]: $gte expects a number, got NaN'),
    ({"a": {"$in": []}}, 'where["a"]: $in expects a non-empty list, got an empty list'),
    ({"a": {"$nin": "x"}}, 'where["a"]: $nin expects a non-empty list, got str'),
    (
        {"a": {"$in": [1, "x"]}},
        (
            'where["a"]: $in expects items that are all str, all bool or all numbers; item 0 is a '
            "number but item 1 is str"
        ),
    ),
    (
        {"a": {"$in": [True, 1]}},
        ('where["a"]: $in expects items that are all str, all bool or all numbers; item 0 is a bool but item 1 is int'),
    ),
    ({"a": {"$foo": 1}}, 'where["a"]: unknown operator "$foo"'),
    (
        {"$and": [{"$or": [{"x": 1}, {"y": {"gt": 1}}]}]},
        'where["$and"][0]["$or"][1]["y"]: unknown operator "gt" (did you mean "$gt"?)',
    ),
    ({}, "where: an empty filter {} is not allowed"),
    ({"a": {}}, 'where["a"]: an empty operator dict {} is not allowed'),
    ({"$or": []}, 'where["$or"]: $or expects a non-empty list of filter dicts, got an empty list'),
    ({"$and": [{"a": 1}, []]}, 'where["$and"][1]: expected a filter dict, got list'),
    ({"$or": [{"a": 1}, {"b": {"$contains": 3}}]}, 'where["$or"][1]["b"]: $contains expects a str, got int'),
    ({"a": {"$starts_with": ["x"]}}, 'where["a"]: $starts_with expects a str, got list'),
    ({"a": {"$exists": 1}}, 'where["a"]: $exists expects a bool (true or false), got int'),
    ({"a": {"$empty": "yes"}}, 'where["a"]: $empty expects a bool (true or false), got str'),
    ({"a": {"$before": "yesterday"}}, 'where["a"]: $before: invalid ISO-8601 date-time'),
    ({"a": {"$after": "2024-02-30"}}, 'where["a"]: $after: invalid ISO-8601 date-time'),
    ({"a": {"$after": 1709251200}}, 'where["a"]: $after expects'),
    ({"a": {"$eq": [1]}}, 'where["a"]: $eq expects a str, int, float or bool, got list'),
    ({"a": None}, 'where["a"]: expected a str, int, float or bool (shorthand for $eq) or a dict'),
    ({"$not": {"a": 1}}, 'where["$not"]: unknown logical operator "$not"'),
    ({"$eq": 1}, 'where["$eq"]: operator $eq needs a field'),
    ({1: 2}, "where[1]: field names must be str, got int"),
    ([("a", 1)], "where: expected a filter dict, got list"),
]


@pytest.mark.parametrize("where, message", ERROR_CASES, ids=lambda v: None)
@pytest.mark.parametrize("kind", KINDS)
def test_invalid_filters_raise_value_error_naming_the_path(doc_indexes, kind, where, message):
    index = doc_indexes[kind]
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        index.search(np.zeros(DIM), 3, where=where)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        index.count(where)


def test_invalid_filters_raise_even_on_an_empty_index():
    index = kbcore.Index(dim=DIM, kind="hnsw")
    with pytest.raises(ValueError, match=re.escape('where["y"]: $gt expects a number, got str')):
        index.search(np.zeros(DIM), 3, where={"y": {"$gt": "x"}})


# --------------------------------------------------------------------------------------------
# both strategies on clustered data: 50%, 10%, 1% selectivity and an anti-correlated filter

N_CLUSTERS = 20
N_ROWS = 4000
N_QUERIES = 40


@pytest.fixture(scope="module")
def clustered_index():
    """4,000 x 32 vectors in 20 equal Gaussian clusters, queries near cluster 0; attributes
    uncorrelated with position ("bucket", "tenant") and one that is ("cluster")."""
    rng = np.random.default_rng(31)
    dim = 32
    centers = rng.standard_normal((N_CLUSTERS, dim)).astype(np.float32)
    labels = np.arange(N_ROWS) % N_CLUSTERS
    data = (centers[labels] + 0.6 * rng.standard_normal((N_ROWS, dim))).astype(np.float32)
    queries = (centers[0] + 0.6 * rng.standard_normal((N_QUERIES, dim))).astype(np.float32)
    perm = rng.permutation(N_ROWS)
    rows = [{"bucket": int(p % 100), "tenant": f"t{p % 10}", "cluster": int(c)} for p, c in zip(perm, labels)]
    ids = np.arange(N_ROWS, dtype=np.int64) * 3 + 11
    index = kbcore.Index(dim=dim, metric="l2", kind="hnsw", M=16, ef_construction=100, seed=5)
    index.add(data, ids, metadata=rows)
    # the two clusters farthest from the queries' cluster: 10% of the rows, none near a query
    far = np.argsort(((centers - centers[0]) ** 2).sum(axis=1))[-2:]
    return index, data, ids, queries, rows, [int(c) for c in far]


SELECTIVITY_FILTERS = {
    "50%": {"bucket": {"$lt": 50}},
    "10%": {"tenant": "t3"},
    "1%": {"$and": [{"tenant": "t3"}, {"bucket": {"$lt": 10}}]},
}


def _filter_of(name, far):
    if name == "anti-correlated 10%":
        return {"cluster": {"$in": far}}
    if name == "anti-correlated 1%":
        return {"cluster": {"$in": far}, "bucket": {"$lt": 10}}
    return SELECTIVITY_FILTERS[name]


@pytest.mark.parametrize("name, fraction", [("50%", 0.5), ("10%", 0.1), ("1%", 0.01), ("anti-correlated 10%", 0.1)])
def test_forced_exact_strategy_equals_the_oracle(clustered_index, name, fraction):
    index, data, ids, queries, rows, far = clustered_index
    where = _filter_of(name, far)
    mask = _passing_mask(where, rows)
    assert mask.sum() == pytest.approx(fraction * N_ROWS, rel=0.05)
    got_ids, got_dist = index._native.search(queries, 10, 64, 1, compile_where(where), "exact")
    assert_search_matches_oracle(got_ids, got_dist, data[mask], ids[mask], queries, 10, "l2")


@pytest.mark.parametrize(
    "strategy, name, min_recall",
    [
        ("graph", "50%", 0.9),
        ("graph", "10%", 0.9),
        ("graph", "1%", None),
        ("graph", "anti-correlated 10%", 0.9),
        ("graph", "anti-correlated 1%", None),
        # The plain walk scores every node it meets and admits passing ones; where it cannot reach
        # k passing rows (selective or anti-correlated filters) the exact answer replaces it.
        ("walk", "50%", 0.9),
        ("walk", "10%", 0.9),
        ("walk", "1%", None),
        ("walk", "anti-correlated 10%", None),
        ("walk", "anti-correlated 1%", None),
    ],
)
def test_forced_graph_strategies_return_k_passing_rows_with_high_recall(clustered_index, strategy, name, min_recall):
    index, data, ids, queries, rows, far = clustered_index
    where = _filter_of(name, far)
    mask = _passing_mask(where, rows)
    got_ids, got_dist = index._native.search(queries, 10, 64, 1, compile_where(where), strategy)
    _assert_filtered_approx(got_ids, got_dist, data, ids, queries, mask, 10)
    if min_recall is not None:
        recall = recall_at_k(got_ids, data[mask], ids[mask], queries, 10, "l2")
        assert recall >= min_recall, f"recall@10 {recall:.3f} at {name} ({strategy})"


def test_cost_model_walks_wide_filters_and_scans_selective_ones(clustered_index):
    index, *_ = clustered_index
    native = index._native
    index.search(np.zeros(native.dim, dtype=np.float32) + 1, 10)  # calibrates evals per ef
    live = len(index)
    assert native.strategy(live // 2, 16) == "walk"
    assert native.strategy(live // 5, 16) in ("graph", "exact")
    assert native.strategy(max(live // 1000, 1), 64) == "exact"
    assert native.strategy(0, 64) == "exact"


@pytest.mark.parametrize("ef", [None, 10])
@pytest.mark.parametrize("name", ["50%", "10%", "1%", "anti-correlated 10%", "anti-correlated 1%"])
def test_plain_filtered_search_always_returns_k_passing_rows(clustered_index, name, ef):
    index, data, ids, queries, rows, far = clustered_index
    where = _filter_of(name, far)
    mask = _passing_mask(where, rows)
    for k in (1, 10, 50):
        got_ids, got_dist = index.search(queries, k, where=where, ef=ef)
        _assert_filtered_approx(got_ids, got_dist, data, ids, queries, mask, k)
    if ef is None:
        got_ids, _ = index.search(queries, 10, where=where)
        recall = recall_at_k(got_ids, data[mask], ids[mask], queries, 10, "l2")
        assert recall >= 0.9, f"recall@10 {recall:.3f} at {name}"


def test_filtered_search_with_fewer_passing_rows_than_k_returns_all_of_them(clustered_index):
    index, data, ids, queries, rows, far = clustered_index
    where = {"$and": [{"tenant": "t3"}, {"bucket": 3}, {"cluster": {"$in": far}}]}
    mask = _passing_mask(where, rows)
    assert 0 < mask.sum() < 20
    exp_ids, _ = oracle_topk(data[mask], ids[mask], queries, 20, "l2")
    for strategy in ("auto", "exact", "graph", "walk"):
        got_ids, got_dist = index._native.search(queries, 20, 64, 1, compile_where(where), strategy)
        assert_search_matches_oracle(got_ids, got_dist, data[mask], ids[mask], queries, 20, "l2")
        np.testing.assert_array_equal(np.sort(got_ids, axis=1), np.sort(exp_ids, axis=1))
    got_ids, _ = index.search(queries, 5, where={"tenant": "nobody"})
    assert (got_ids == -1).all()


@pytest.mark.parametrize("quantization", [None, "sq8"])
@pytest.mark.parametrize(
    "where",
    [
        {"bucket": {"$lt": 50}},  # an int range
        {"score": {"$gte": 0.5}},  # a float range over int and float rows
        {"tenant": {"$in": ["t1"]}},  # one string
        {"even": True},  # a bool
    ],
)
def test_walk_on_a_wide_leaf_filter_skips_removed_and_admits_only_passing_rows(quantization, where):
    """A wide single-field filter is tested per node by the walk (no bitmap of every passing
    row): with rows removed, slots reused, and rows whose graph insertion is deferred, every
    strategy returns passing live rows only, the count is exact and recall holds."""
    rng = np.random.default_rng(17)
    n, dim = 3000, 24
    data = rng.standard_normal((n, dim)).astype(np.float32)
    queries = rng.standard_normal((30, dim)).astype(np.float32)

    def row(i: int) -> dict:
        # "score" is an int on some rows and a float on others, as JSON metadata can be.
        score = int(i % 2) if i % 3 == 0 else float(rng.random())
        return {"bucket": int(rng.integers(100)), "score": score, "tenant": f"t{i % 2}", "even": i % 2 == 0}

    rows = [row(i) for i in range(n)]
    ids = np.arange(n, dtype=np.int64)
    index = kbcore.Index(dim=dim, metric="l2", kind="hnsw", M=16, ef_construction=80, seed=3, quantization=quantization)
    index.add(data[:2500], ids[:2500], metadata=rows[:2500])
    gone = rng.choice(2500, size=400, replace=False)
    index.remove(gone.tolist())
    # 500 new rows, some in the removed rows' slots, not linked into the graph yet.
    index.add(data[2500:], ids[2500:], metadata=rows[2500:], defer_graph=True)
    assert index.pending == 500
    # Then rows removed from the graph and from the pending queue leave dead slots behind.
    gone_too = np.concatenate([rng.choice(np.setdiff1d(np.arange(2500), gone), 200, replace=False), ids[2500:2600]])
    index.remove(gone_too.tolist())
    assert index.pending == 400
    live = np.ones(n, dtype=bool)
    live[gone] = False
    live[gone_too] = False
    mask = _passing_mask(where, rows) & live
    assert 0.3 * n < mask.sum() < 0.7 * n, "the filter must be wide enough for the walk"
    assert index.count(where) == mask.sum()
    ir = compile_where(where)
    for strategy in ("auto", "walk", "graph", "exact"):
        got_ids, got_dist = index._native.search(queries, 10, 64, 1, ir, strategy)
        _assert_filtered_approx(got_ids, got_dist, data, ids, queries, mask, 10)
        recall = recall_at_k(got_ids, data[mask], ids[mask], queries, 10, "l2")
        assert recall >= (0.999 if strategy == "exact" else 0.9), f"{strategy}: recall@10 {recall:.3f}"


# --------------------------------------------------------------------------------------------
# metadata lifecycle: persistence, upsert, remove, Arrow input, get_metadata

LIFECYCLE_WHERES = [w for w, _ in OPERATOR_CASES]


def _doc_rows(n: int = 60) -> list[dict]:
    """DOCS repeated with variations, so filtered searches have several candidates."""
    out = []
    for i in range(n):
        row = dict(DOCS[i % len(DOCS)])
        if "year" in row:
            row["year"] += i // len(DOCS)
        out.append(row)
    return out


def _assert_same_filtered_results(a: kbcore.Index, b: kbcore.Index, wheres, k=7) -> None:
    queries = _vectors(5, 77)
    for where in wheres:
        assert a.count(where) == b.count(where), where
        ia, da = a.search(queries, k, where=where)
        ib, db = b.search(queries, k, where=where)
        np.testing.assert_array_equal(ia, ib, err_msg=str(where))
        np.testing.assert_array_equal(da, db, err_msg=str(where))


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_keeps_metadata_and_filtered_results(tmp_path, kind):
    rows = _doc_rows()
    index = _index(rows, kind, ids=np.arange(len(rows)) * 5)
    index.remove([5, 10])
    index.add(_vectors(2, 3), [5, 1000], metadata=[{"lang": "xx", "year": 1}, None])
    path = tmp_path / "index.kb"
    index.save(path)
    loaded = kbcore.Index.load(path)
    live = index.ids()
    assert sorted(loaded.ids().tolist()) == sorted(live.tolist())
    assert [_typed(m) for m in loaded.get_metadata(live)] == [_typed(m) for m in index.get_metadata(live)]
    assert loaded.get_metadata([5, 1000]) == [{"lang": "xx", "year": 1}, {}]
    _assert_same_filtered_results(index, loaded, LIFECYCLE_WHERES + [{"lang": "xx"}])


@pytest.mark.parametrize("kind", KINDS)
def test_upsert_replaces_a_rows_metadata_entirely(kind):
    rows = _doc_rows(12)
    index = _index(rows, kind)
    assert index.get_metadata([3])[0]["lang"] == "de"
    before = index.count({"lang": "de"})
    index.add(_vectors(1, 5), [3], metadata=[{"lang": "it", "stars": 4.5}])
    assert index.get_metadata([3]) == [{"lang": "it", "stars": 4.5}]
    assert index.count({"lang": "de"}) == before - 1
    assert 3 not in _selected(index, {"lang": "de"}, 12)
    assert 3 not in _selected(index, {"year": {"$exists": True}}, 12)
    assert 3 not in _selected(index, {"title": {"$contains": "rank"}}, 12)
    assert _selected(index, {"lang": "it"}, 12) == [3]
    assert _selected(index, {"stars": {"$gt": 4}}, 12) == [3]
    # an upsert without metadata (row None) leaves the id with none
    index.add(_vectors(1, 6), [3], metadata=[None])
    assert index.get_metadata([3]) == [{}]
    assert index.count({"lang": "it"}) == 0
    assert 3 in _selected(index, {"lang": {"$ne": "it"}}, 12)
    assert 3 in _selected(index, {"lang": {"$exists": False}}, 12)


@pytest.mark.parametrize("kind", KINDS)
def test_remove_drops_metadata_and_a_reused_slot_does_not_inherit_it(kind):
    rows = _doc_rows(12)
    index = _index(rows, kind)
    n_de = index.count({"lang": "de"})
    index.remove([3])
    assert index.count({"lang": "de"}) == n_de - 1
    assert index.count({"lang": {"$ne": "zz"}}) == 11  # removed rows do not match $ne either
    assert 3 not in _selected(index, {"lang": {"$ne": "en"}}, 12)
    with pytest.raises(KeyError):
        index.get_metadata([3])
    # new ids (one of which takes the freed slot) come with no metadata, or with their own
    index.add(_vectors(2, 8), [50, 51], metadata=[None, {"lang": "de", "year": 7}])
    assert index.get_metadata([50, 51]) == [{}, {"lang": "de", "year": 7}]
    assert _selected(index, {"lang": "de"}, 13) == sorted(
        [i for i in range(12) if i != 3 and rows[i].get("lang") == "de"] + [51]
    )
    assert 50 in _selected(index, {"lang": {"$exists": False}}, 13)
    # ... and the removed id comes back with exactly its new metadata
    index.add(_vectors(1, 9), [3], metadata=[{"tags": ["new"]}])
    assert index.get_metadata([3]) == [{"tags": ["new"]}]
    assert _selected(index, {"tags": {"$contains": "new"}}, 14) == [3]


def _arrow_table():
    pa = pytest.importorskip("pyarrow")
    rows = _doc_rows(30)
    fields = ["year", "lang", "tags", "title", "score", "draft"]
    types = [pa.int64(), pa.string(), pa.list_(pa.string()), pa.string(), pa.float64(), pa.bool_()]
    columns = {f: [r.get(f) for r in rows] for f in fields}
    table = pa.table(columns, schema=pa.schema(list(zip(fields, types))))
    return pa, rows, table


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", ["table", "dictionary-encoded", "record batch", "chunked"])
def test_metadata_from_arrow_equals_metadata_from_the_same_dicts(kind, form):
    pa, rows, table = _arrow_table()
    if form == "dictionary-encoded":
        i = table.schema.get_field_index("lang")
        table = table.set_column(i, "lang", table.column("lang").dictionary_encode())
    elif form == "record batch":
        table = table.combine_chunks().to_batches()[0]
    elif form == "chunked":
        table = pa.concat_tables([table.slice(0, 7), table.slice(7, 16), table.slice(23)])
    n = len(rows)
    data = _vectors(n, 12)
    from_dicts = _index(rows, kind, data=data)
    from_arrow = _index(table, kind, data=data)
    all_ids = np.arange(n)
    assert [_typed(m) for m in from_arrow.get_metadata(all_ids)] == [_typed(_expected_metadata(r)) for r in rows]
    _assert_same_filtered_results(from_dicts, from_arrow, LIFECYCLE_WHERES, k=5)


@pytest.mark.parametrize("kind", KINDS)
def test_get_metadata_returns_stored_values_with_their_types(kind):
    rows = [
        {
            "i": 1,
            "f": 1.0,
            "b": True,
            "s": "1",
            "l": ["a", ""],
            "e": [],
            "big": 2**63 - 1,
            "neg": -(2**63),
            "z": -0.0,
            "u": "zoë ✓",
            "empty": "",
            "g": 1e300,
        },  # 0
        {"i": None, "f": 2.5, "b": False},  # 1
        None,  # 2
        {"m": 3},  # 3
        {"m": "3"},  # 4
        {"m": 3.0},  # 5
        {"m": False},  # 6
        {"m": ["3"]},  # 7
        {"m": ("x", "y"), "n": np.int64(-5), "p": np.float64(0.25), "q": np.bool_(True)},  # 8
    ]
    index = _index(rows, kind, ids=[10 * i for i in range(len(rows))])
    expected = [_expected_metadata(r) for r in rows]
    expected[8] = {"m": ["x", "y"], "n": -5, "p": 0.25, "q": True}
    got = index.get_metadata([10 * i for i in range(len(rows))])
    assert [_typed(m) for m in got] == [_typed(m) for m in expected]
    # in the order asked, with repeats
    order = [80, 0, 30, 0]
    assert [_typed(m) for m in index.get_metadata(order)] == [_typed(expected[i // 10]) for i in order]
    assert index.get_metadata([]) == []
    with pytest.raises(KeyError):
        index.get_metadata([0, 11])


def test_no_nan_slips_into_stored_floats():
    # a where on a float field must never meet a NaN: metadata rejects NaN up front
    index = kbcore.Index(dim=DIM, kind="flat")
    with pytest.raises(ValueError, match="row 1, field 'f'"):
        index.add(_vectors(2), [0, 1], metadata=[{"f": 1.0}, {"f": math.nan}])
    assert len(index) == 0
