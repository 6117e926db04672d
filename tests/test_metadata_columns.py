"""Metadata rows -> typed columns (docs/filter-ir.md, "Metadata columns"): from dicts and from
Arrow, the layout of every kind, the errors (naming row / column and field), and the equivalence
of the two readers on the same data."""

from __future__ import annotations

import datetime as dt
import itertools
import math

import numpy as np
import pytest
from filter_reference import iso_to_epoch, metadata_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbcore.errors import InvalidArgumentError, InvalidTypeError
from kbcore.metadata import KINDS, columns_from_arrow, columns_from_rows

pa = pytest.importorskip("pyarrow")

# ----------------------------------------------------------------------------------------------
# helpers

_DTYPES = {"int": np.int64, "float": np.float64, "bool": np.uint8}


def assert_layout(columns, n: int) -> None:
    """Every column has the documented dtypes and shapes; valid masks of a field are disjoint;
    columns are sorted by (name, kind)."""
    keys = [(c[0], KINDS.index(c[1])) for c in columns]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    per_field: dict[str, np.ndarray] = {}
    for col in columns:
        name, kind, valid = col[0], col[1], col[2]
        assert isinstance(name, str) and kind in KINDS
        assert valid.dtype == np.uint8 and valid.shape == (n,) and valid.flags.c_contiguous
        assert set(np.unique(valid)) <= {0, 1} and valid.any()
        seen = per_field.setdefault(name, np.zeros(n, dtype=np.uint8))
        assert not (seen & valid).any(), f"{name}: valid masks overlap"
        seen |= valid
        if kind in _DTYPES:
            assert len(col) == 4
            values = col[3]
            assert values.dtype == _DTYPES[kind] and values.shape == (n,)
            assert values.flags.c_contiguous
            assert not values[valid == 0].any(), "invalid rows hold zeros"
        elif kind == "str":
            assert len(col) == 5
            offsets, data = col[3], col[4]
            assert offsets.dtype == np.int64 and offsets.shape == (n + 1,)
            assert data.dtype == np.uint8 and data.ndim == 1
            assert offsets[0] == 0 and offsets[-1] == len(data)
            assert (np.diff(offsets) >= 0).all()
            assert (np.diff(offsets)[valid == 0] == 0).all(), "invalid rows are empty"
        else:
            assert len(col) == 6
            list_offsets, offsets, data = col[3], col[4], col[5]
            assert list_offsets.dtype == np.int64 and list_offsets.shape == (n + 1,)
            assert offsets.dtype == np.int64 and offsets.shape == (int(list_offsets[-1]) + 1,)
            assert data.dtype == np.uint8
            assert list_offsets[0] == 0 and offsets[0] == 0 and offsets[-1] == len(data)
            assert (np.diff(list_offsets) >= 0).all() and (np.diff(offsets) >= 0).all()
            assert (np.diff(list_offsets)[valid == 0] == 0).all()


def rows_of(columns, n: int) -> list[dict]:
    """Decodes columns back to row dicts (fields without a value omitted)."""
    rows: list[dict] = [{} for _ in range(n)]
    for col in columns:
        name, kind, valid = col[0], col[1], col[2]
        for i in np.flatnonzero(valid):
            if kind == "int":
                v = int(col[3][i])
            elif kind == "float":
                v = float(col[3][i])
            elif kind == "bool":
                v = bool(col[3][i])
            elif kind == "str":
                v = bytes(col[4][col[3][i] : col[3][i + 1]]).decode("utf-8")
            else:
                lo, hi = col[3][i], col[3][i + 1]
                offs, data = col[4], col[5]
                v = [bytes(data[offs[j] : offs[j + 1]]).decode("utf-8") for j in range(lo, hi)]
            rows[i][name] = v
    return rows


def assert_columns_equal(a, b) -> None:
    assert [(c[0], c[1]) for c in a] == [(c[0], c[1]) for c in b]
    for ca, cb in zip(a, b):
        assert len(ca) == len(cb)
        for xa, xb in zip(ca[2:], cb[2:]):
            assert xa.dtype == xb.dtype, (ca[0], ca[1])
            np.testing.assert_array_equal(xa, xb, err_msg=f"{ca[0]}/{ca[1]}")


def without_none(row) -> dict:
    return {k: v for k, v in (row or {}).items() if v is not None}


# ----------------------------------------------------------------------------------------------
# from dicts


def test_each_kind_from_dicts_has_the_documented_layout():
    rows = [
        {"i": 3, "f": 2.5, "b": True, "s": "héllo", "l": ["x", "yz"]},
        None,
        {"i": -(2**63), "f": -0.0, "b": False, "s": "", "l": []},
        {"i": None, "s": "a"},
    ]
    cols = columns_from_rows(rows, 4)
    assert_layout(cols, 4)
    by_key = {(c[0], c[1]): c for c in cols}
    assert sorted(by_key) == [("b", "bool"), ("f", "float"), ("i", "int"), ("l", "strlist"), ("s", "str")]
    _, _, valid, values = by_key[("i", "int")]
    assert valid.tolist() == [1, 0, 1, 0] and values.tolist() == [3, 0, -(2**63), 0]
    _, _, valid, values = by_key[("f", "float")]
    assert valid.tolist() == [1, 0, 1, 0] and values.tolist() == [2.5, 0.0, 0.0, 0.0]
    assert math.copysign(1, values[2]) == -1  # -0.0 is kept
    _, _, valid, values = by_key[("b", "bool")]
    assert valid.tolist() == [1, 0, 1, 0] and values.tolist() == [1, 0, 0, 0]
    _, _, valid, offsets, data = by_key[("s", "str")]
    assert valid.tolist() == [1, 0, 1, 1]
    assert offsets.tolist() == [0, 6, 6, 6, 7] and bytes(data) == "héllo".encode() + b"a"
    _, _, valid, list_offsets, offsets, data = by_key[("l", "strlist")]
    assert valid.tolist() == [1, 0, 1, 0]
    assert list_offsets.tolist() == [0, 2, 2, 2, 2]
    assert offsets.tolist() == [0, 1, 3] and bytes(data) == b"xyz"
    assert rows_of(cols, 4) == [without_none(r) for r in rows]


def test_a_field_with_several_types_gets_one_column_per_kind_with_disjoint_valid():
    rows = [{"v": 1}, {"v": "1"}, {"v": 1.5}, {"v": True}, {"v": ["1"]}, {}]
    cols = columns_from_rows(rows, 6)
    assert_layout(cols, 6)
    assert [(c[0], c[1]) for c in cols] == [("v", k) for k in KINDS]
    assert [c[2].tolist() for c in cols] == [
        [1, 0, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 0],
    ]
    assert rows_of(cols, 6) == rows


def test_columns_are_sorted_by_name_and_kind_whatever_the_row_order():
    a = columns_from_rows([{"z": 1, "a": "x"}, {"m": 2.0}], 2)
    b = columns_from_rows([{"a": "x", "z": 1}, {"m": 2.0}], 2)
    assert [c[0] for c in a] == ["a", "m", "z"]
    assert_columns_equal(a, b)


def test_no_rows_or_no_values_give_no_columns():
    assert columns_from_rows([], 0) == []
    assert columns_from_rows([None, {}, {"a": None}], 3) == []


def test_numpy_scalars_tuples_and_str_subclasses_are_accepted():
    class Tag(str):
        pass

    rows = [
        {
            "i": np.int32(7),
            "f": np.float32(0.5),
            "b": np.bool_(True),
            "s": np.str_("x"),
            "l": ("a", Tag("b")),
            "t": Tag("c"),
        }
    ]
    cols = columns_from_rows(rows, 1)
    assert_layout(cols, 1)
    assert rows_of(cols, 1) == [{"i": 7, "f": 0.5, "b": True, "s": "x", "l": ["a", "b"], "t": "c"}]


def test_ints_at_the_int64_bounds_are_kept_exactly():
    cols = columns_from_rows([{"a": 2**63 - 1}, {"a": -(2**63)}], 2)
    assert cols[0][3].tolist() == [2**63 - 1, -(2**63)]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"a": {"x": 1}}], "metadata row 0, field 'a': nested dicts are not supported"),
        ([None, {"a": [1, 2]}], "metadata row 1, field 'a': item 0 of the list is int, not str"),
        ([{"a": ["x", None]}], "metadata row 0, field 'a': item 1 of the list is NoneType"),
        ([{"a": ["x", ["y"]]}], "metadata row 0, field 'a': item 1 of the list is list"),
        ([{}, {}, {"b": b"x"}], "metadata row 2, field 'b': unsupported value of type bytes"),
        ([{"a": float("nan")}], "metadata row 0, field 'a': nan is not allowed"),
        ([{"a": float("inf")}], "metadata row 0, field 'a': inf is not allowed"),
        ([{"a": np.float64("-inf")}], "metadata row 0, field 'a': -inf is not allowed"),
        ([{"a": 2**63}], ("metadata row 0, field 'a': the integer 9223372036854775808 does not fit in int64")),
        ([{"a": np.uint64(2**64 - 1)}], "does not fit in int64"),
        ([{"a": {1, 2}}], "unsupported value of type set"),
        ([{"a": dt.datetime(2024, 1, 1)}], "unsupported value of type datetime"),
        ([{"a": np.array([1])}], "unsupported value of type ndarray"),
        ([{"a": "\ud800"}], "metadata row 0, field 'a': the string is not valid Unicode"),
        ([{"a": ["\udfff"]}], "metadata row 0, field 'a': the string is not valid Unicode"),
        ([{1: "x"}], "metadata row 0: field names must be str, got 1 (int)"),
        ([None, "a=1"], "metadata row 1: expected a dict or None, got str"),
        ([[("a", 1)]], "metadata row 0: expected a dict or None, got list"),
    ],
)
def test_invalid_values_raise_naming_row_and_field(rows, message):
    with pytest.raises(InvalidArgumentError) as info:
        columns_from_rows(rows, len(rows))
    assert message in str(info.value), str(info.value)
    assert "metadata values must be" in str(info.value) or "metadata row" in str(info.value)


def test_row_count_must_match_n():
    with pytest.raises(InvalidArgumentError, match="got 2 metadata rows for 3 items"):
        columns_from_rows([{}, {}], 3)


@pytest.mark.parametrize("rows", [{"a": 1}, "abc", 5, None])
def test_rows_must_be_a_sequence(rows):
    with pytest.raises(InvalidTypeError, match="sequence of dicts"):
        columns_from_rows(rows, 1)  # type: ignore[arg-type]


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(metadata_rows(), max_size=12))
def test_rows_round_trip_through_columns(rows):
    cols = columns_from_rows(rows, len(rows))
    assert_layout(cols, len(rows))
    back = rows_of(cols, len(rows))
    expected = [without_none(r) for r in rows]
    assert back == expected
    for got, exp in zip(back, expected):  # same Python types (bool is not int, int is not float)
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in exp.items()}


# ----------------------------------------------------------------------------------------------
# from Arrow


def test_each_arrow_type_maps_to_its_kind():
    table = pa.table(
        {
            "i8": pa.array([1, None, -3], pa.int8()),
            "u32": pa.array([4, 5, None], pa.uint32()),
            "u64": pa.array([2**63 - 1, None, 0], pa.uint64()),
            "f16": pa.array([np.float16(0.5), None, np.float16(-1)], pa.float16()),
            "f32": pa.array([1.5, 2.5, None], pa.float32()),
            "b": pa.array([True, False, None]),
            "s": pa.array(["a", None, "ü"]),
            "ls": pa.array(["x", "yy", None], pa.large_string()),
            "l": pa.array([["a", "b"], [], None], pa.list_(pa.string())),
            "ll": pa.array([None, ["q"], ["r", "s"]], pa.large_list(pa.large_string())),
            "dict": pa.array(["u", None, "u"]).dictionary_encode(),
            "nothing": pa.nulls(3),
            "all_null_int": pa.array([None, None, None], pa.int64()),
        }
    )
    cols = columns_from_arrow(table, 3)
    assert_layout(cols, 3)
    kinds = {c[0]: c[1] for c in cols}
    assert kinds == {
        "i8": "int",
        "u32": "int",
        "u64": "int",
        "f16": "float",
        "f32": "float",
        "b": "bool",
        "s": "str",
        "ls": "str",
        "l": "strlist",
        "ll": "strlist",
        "dict": "str",
    }
    assert rows_of(cols, 3) == [
        {
            "i8": 1,
            "u32": 4,
            "u64": 2**63 - 1,
            "f16": 0.5,
            "f32": 1.5,
            "b": True,
            "s": "a",
            "ls": "x",
            "l": ["a", "b"],
            "dict": "u",
        },
        {"u32": 5, "f32": 2.5, "b": False, "ls": "yy", "l": [], "ll": ["q"]},
        {"i8": -3, "u64": 0, "f16": -1.0, "s": "ü", "ll": ["r", "s"], "dict": "u"},
    ]


def test_arrow_timestamps_and_dates_become_iso_strings():
    instant = dt.datetime(2024, 3, 1, 12, 30, 15, 250000, tzinfo=dt.timezone.utc)
    table = pa.table(
        {
            "naive_s": pa.array([dt.datetime(2024, 3, 1, 12, 30, 15), None], pa.timestamp("s")),
            "naive_us": pa.array([instant.replace(tzinfo=None), None], pa.timestamp("us")),
            "tokyo_ms": pa.array([instant, None], pa.timestamp("ms", tz="Asia/Tokyo")),
            "plus_ns": pa.array([instant, None], pa.timestamp("ns", tz="+05:30")),
            "d32": pa.array([dt.date(2024, 2, 29), None], pa.date32()),
            "d64": pa.array([None, dt.date(1969, 12, 31)], pa.date64()),
        }
    )
    cols = columns_from_arrow(table, 2)
    assert_layout(cols, 2)
    assert all(c[1] == "str" for c in cols)
    rows = rows_of(cols, 2)
    assert rows == [
        {
            "naive_s": "2024-03-01T12:30:15",
            "naive_us": "2024-03-01T12:30:15.250000",
            "tokyo_ms": "2024-03-01T12:30:15.250Z",
            "plus_ns": "2024-03-01T12:30:15.250000000Z",
            "d32": "2024-02-29",
        },
        {"d64": "1969-12-31"},
    ]
    # the strings are instants the filter language understands
    for name in ("naive_us", "tokyo_ms", "plus_ns"):
        assert iso_to_epoch(rows[0][name]) == instant.timestamp()
    assert iso_to_epoch(rows[1]["d64"]) == -86400.0


def test_chunked_and_sliced_arrow_columns():
    t1 = pa.table({"s": ["a", None, "bc"], "l": [["x"], None, ["y", "z"]], "i": [1, 2, None]})
    t2 = pa.table({"s": ["d", "é"], "l": [[], ["w"]], "i": [None, 5]})
    table = pa.concat_tables([t1, t2])
    assert table.column("s").num_chunks == 2
    cols = columns_from_arrow(table, 5)
    assert_layout(cols, 5)
    expected = [without_none(r) for r in table.to_pylist()]
    assert rows_of(cols, 5) == expected
    sliced = table.slice(1, 3)
    cols = columns_from_arrow(sliced, 3)
    assert_layout(cols, 3)
    assert rows_of(cols, 3) == expected[1:4]
    batch = pa.RecordBatch.from_pylist(t1.to_pylist()).slice(1)
    cols = columns_from_arrow(batch, 2)
    assert_layout(cols, 2)
    assert rows_of(cols, 2) == [without_none(r) for r in t1.to_pylist()[1:]]


def test_dictionary_chunks_with_different_dictionaries():
    c1 = pa.array(["a", "b"]).dictionary_encode()
    c2 = pa.array(["c", None, "a"]).dictionary_encode()
    table = pa.table({"s": pa.chunked_array([c1, c2])})
    cols = columns_from_arrow(table, 5)
    assert rows_of(cols, 5) == [{"s": "a"}, {"s": "b"}, {"s": "c"}, {}, {"s": "a"}]


def test_an_empty_table_gives_no_columns():
    table = pa.table({"a": pa.array([], pa.int64()), "s": pa.array([], pa.string())})
    assert columns_from_arrow(table, 0) == []


def test_arrow_string_nulls_with_hidden_bytes_are_dropped():
    # a null slot may cover bytes in the data buffer; they must not leak into the next rows
    arr = pa.Array.from_buffers(
        pa.string(),
        3,
        [
            pa.py_buffer(np.packbits([1, 0, 1], bitorder="little").tobytes()),
            pa.py_buffer(np.array([0, 1, 4, 5], dtype=np.int32).tobytes()),
            pa.py_buffer(b"aXXXb"),
        ],
    )
    cols = columns_from_arrow(pa.table({"s": arr}), 3)
    assert_layout(cols, 3)
    assert rows_of(cols, 3) == [{"s": "a"}, {}, {"s": "b"}]


@pytest.mark.parametrize(
    ("table", "error", "message"),
    [
        (
            pa.table({"x": pa.array([1.0, float("nan")])}),
            InvalidArgumentError,
            "metadata column 'x', row 1: nan is not allowed",
        ),
        (
            pa.table({"x": pa.array([float("-inf")], pa.float32())}),
            InvalidArgumentError,
            "metadata column 'x', row 0: -inf is not allowed",
        ),
        (
            pa.table({"x": pa.array([None, 2**64 - 1], pa.uint64())}),
            InvalidArgumentError,
            "metadata column 'x', row 1: the integer 18446744073709551615 does not fit in int64",
        ),
        (
            pa.table({"x": pa.array([["a"], ["b", None]])}),
            InvalidArgumentError,
            "metadata column 'x', row 1: item 1 of the list is null",
        ),
        (
            pa.table({"x": pa.array([{"a": 1}])}),
            InvalidTypeError,
            "metadata column 'x' has Arrow type struct<a: int64>",
        ),
        (pa.table({"x": pa.array([[1]])}), InvalidTypeError, "metadata column 'x' has Arrow type list<item: int64>"),
        (pa.table({"x": pa.array([b"x"])}), InvalidTypeError, "metadata column 'x' has Arrow type binary"),
        (pa.table({"x": pa.array([dt.time(1, 2)])}), InvalidTypeError, "metadata column 'x' has Arrow type time64[us]"),
        (
            pa.table({"x": pa.array([dt.timedelta(1)])}),
            InvalidTypeError,
            "metadata column 'x' has Arrow type duration[us]",
        ),
        (
            pa.table({"x": pa.array([1], pa.decimal128(5, 2))}),
            InvalidTypeError,
            "metadata column 'x' has Arrow type decimal128(5, 2)",
        ),
        (
            pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]),
            InvalidArgumentError,
            "metadata column 'a' appears more than once",
        ),
    ],
)
def test_invalid_arrow_columns_raise_naming_the_column(table, error, message):
    with pytest.raises(error) as info:
        columns_from_arrow(table, table.num_rows)
    assert message in str(info.value), str(info.value)


def test_arrow_input_must_be_a_table_or_batch_of_n_rows():
    with pytest.raises(InvalidTypeError, match="expected a pyarrow Table or RecordBatch"):
        columns_from_arrow([{"a": 1}], 1)
    with pytest.raises(InvalidArgumentError, match="got 1 metadata rows for 2 items"):
        columns_from_arrow(pa.table({"a": [1]}), 2)


# ----------------------------------------------------------------------------------------------
# the two readers agree

_ARROW_TYPES = {
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "str": pa.string(),
    "strlist": pa.list_(pa.string()),
}
_WORDS = st.sampled_from(["", "a", "bc", "déf", "日本", "a,b"])
_VALUES = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "bool": st.booleans(),
    "str": _WORDS,
    "strlist": st.lists(_WORDS, max_size=3),
}


@st.composite
def typed_tables(draw):
    """(rows as dicts, the same data as an Arrow table): one type per field, some nulls."""
    n = draw(st.integers(0, 12))
    kinds = draw(st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), st.sampled_from(KINDS), max_size=5))
    data = {
        name: draw(st.lists(st.one_of(st.none(), _VALUES[kind]), min_size=n, max_size=n))
        for name, kind in kinds.items()
    }
    schema = pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in kinds.items()])
    table = pa.table(data, schema=schema) if kinds else pa.table({"_": pa.nulls(n)})
    rows = [{name: data[name][i] for name in kinds} for i in range(n)]
    return rows, table, n


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(typed_tables(), st.integers(1, 4))
def test_arrow_and_dict_readers_give_equal_columns(case, n_chunks):
    rows, table, n = case
    from_rows = columns_from_rows(rows, n)
    from_arrow = columns_from_arrow(table, n)
    assert_layout(from_arrow, n)
    assert_columns_equal(from_rows, from_arrow)
    # the same data in several chunks, and as a record batch
    bounds = sorted({0, n, *np.linspace(0, n, n_chunks + 1).astype(int).tolist()})
    chunked = pa.concat_tables([table.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds)] or [table])
    assert_columns_equal(from_rows, columns_from_arrow(chunked, n))
    batch = table.combine_chunks().to_batches()
    if len(batch) == 1:
        assert_columns_equal(from_rows, columns_from_arrow(batch[0], n))


def test_a_large_arrow_table_matches_its_rows():
    n = 50_000
    rng = np.random.default_rng(7)
    words = np.array(["alpha", "beta", "gamma", "δέλτα"])
    ints = rng.integers(-1000, 1000, n)
    ints_mask = rng.random(n) < 0.1
    table = pa.table(
        {
            "i": pa.array(ints, mask=ints_mask),
            "f": pa.array(rng.random(n)),
            "s": pa.array(words[rng.integers(0, 4, n)]),
            "l": pa.ListArray.from_arrays(
                np.arange(0, 2 * n + 1, 2, dtype=np.int32), pa.array(words[rng.integers(0, 4, 2 * n)])
            ),
        }
    )
    cols = columns_from_arrow(table, n)
    assert_layout(cols, n)
    assert_columns_equal(cols, columns_from_rows(table.to_pylist(), n))
