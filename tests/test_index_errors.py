"""Every bad input listed in docs/index.md raises its kbcore.errors class, which is also the builtin,
with a message that names the problem."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import KINDS, build, make_clustered

import kbcore
from kbcore import errors

DIM = 8


def test_error_classes_subclass_kbcore_error_and_the_matching_builtin():
    assert issubclass(errors.KbcoreError, Exception)
    pairs = [
        (errors.InvalidArgumentError, ValueError),
        (errors.InvalidTypeError, TypeError),
        (errors.NotFoundError, KeyError),
        (errors.FormatError, OSError),
    ]
    for cls, builtin in pairs:
        assert issubclass(cls, errors.KbcoreError), cls
        assert issubclass(cls, builtin), (cls, builtin)
    assert not issubclass(errors.FormatError, FileNotFoundError)


def raises(cls, builtin, match):
    """pytest.raises on the builtin, then check the kbcore class too."""

    class _Ctx:
        def __enter__(self):
            self._cm = pytest.raises(builtin, match=match)
            self.info = self._cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self._cm.__exit__(*exc)
            assert isinstance(self.info.value, cls), f"{type(self.info.value)!r} is not {cls!r}"
            assert isinstance(self.info.value, errors.KbcoreError)
            return handled

    return _Ctx()


@pytest.fixture(params=KINDS)
def index(request):
    data, _ = make_clustered(61, 50, DIM)
    return build(data, metric="l2", kind=request.param)


def vecs(n=3, dim=DIM):
    return np.random.default_rng(62).standard_normal((n, dim)).astype(np.float32)


def poisoned(n, flat_pos, value, one_d=False):
    """float32 vectors [n, DIM] (or [DIM] if one_d) with `value` at flat position `flat_pos`."""
    v = vecs(n)
    v.reshape(-1)[flat_pos] = value
    return v[0] if one_d else v


# --------------------------------------------------------------------------------------------
# constructor and parameters


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dim=DIM, metric="cosin", kind="flat"), "(?i)metric"),
        (dict(dim=DIM, metric="L2 ", kind="hnsw"), "(?i)metric"),
        (dict(dim=DIM, metric="l2", kind="ivf"), "(?i)kind"),
        (dict(dim=DIM, metric="l2", kind="hnsw", ef=0), r"(?i)\bef\b"),
        (dict(dim=DIM, metric="l2", kind="hnsw", ef=-3), r"(?i)\bef\b"),
        (dict(dim=0, metric="l2", kind="flat"), "(?i)dim"),
        (dict(dim=-4, metric="l2", kind="flat"), "(?i)dim"),
    ],
    ids=["metric-typo", "metric-space", "kind", "ef-0", "ef-neg", "dim-0", "dim-neg"],
)
def test_bad_constructor_arguments_raise_invalid_argument_error(kwargs, match):
    with raises(errors.InvalidArgumentError, ValueError, match):
        kbcore.Index(**kwargs)


@pytest.mark.parametrize("bad", [0, -1])
def test_setting_ef_to_a_non_positive_value_raises_and_keeps_old_ef(index, bad):
    before = index.ef
    with raises(errors.InvalidArgumentError, ValueError, r"(?i)\bef\b"):
        index.ef = bad
    assert index.ef == before


# --------------------------------------------------------------------------------------------
# add


def test_ids_beyond_int64_are_not_held_and_a_huge_build_limit_means_all(index):
    # `in` answers False for what no int64 id can be (no binding TypeError), and a row limit
    # past any index builds every deferred row
    assert (1 << 80) not in index and -(1 << 80) not in index and (1 << 63) not in index
    assert 0 in index and np.int64(0) in index
    index.add(vecs(20), np.arange(200, 220, dtype=np.int64), defer_graph=True)
    assert index.pending == (20 if index.kind == "hnsw" else 0)
    assert index.build_graph(1 << 80) == 0 and index.pending == 0


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: (vecs(3, DIM + 1), [100, 101, 102]), "(?i)dim"),
        (lambda: (vecs(3, DIM - 1), [100, 101, 102]), "(?i)dim"),
        (lambda: (poisoned(3, 13, np.nan), [100, 101, 102]), "(?i)nan|finite"),
        (lambda: (poisoned(3, 5, np.inf), [100, 101, 102]), "(?i)inf|finite"),
        (lambda: (poisoned(3, 22, -np.inf), [100, 101, 102]), "(?i)inf|finite"),
        (lambda: (vecs(3), [100, 101, 100]), "(?i)duplicate"),
        (lambda: (vecs(3), [100, 101]), "(?i)ids|length|len|count|rows"),
        (lambda: (vecs(2), [100, 101, 102]), "(?i)ids|length|len|count|rows"),
    ],
    ids=["dim-too-big", "dim-too-small", "nan", "inf", "neg-inf", "duplicate-ids", "fewer-ids", "more-ids"],
)
def test_bad_add_raises_invalid_argument_error_and_adds_nothing(index, make, match):
    vectors, ids = make()
    with raises(errors.InvalidArgumentError, ValueError, match):
        index.add(vectors, np.asarray(ids, dtype=np.int64))
    assert len(index) == 50
    assert 100 not in index and 101 not in index


def test_nan_rejected_even_when_it_comes_as_float64(index):
    v = vecs().astype(np.float64)
    v[2, 3] = np.nan
    with raises(errors.InvalidArgumentError, ValueError, "(?i)nan|finite"):
        index.add(v, [100, 101, 102])
    assert len(index) == 50


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_float64_values_that_overflow_float32_are_rejected_as_non_finite(index):
    v = vecs().astype(np.float64)
    v[0, 0] = 1e300  # finite in float64, inf once converted to float32
    with raises(errors.InvalidArgumentError, ValueError, "(?i)inf|finite|range|overflow"):
        index.add(v, [100, 101, 102])
    assert len(index) == 50


@pytest.mark.parametrize(
    "vectors",
    [
        np.array([["a"] * DIM] * 2),
        np.array([[object()] * DIM] * 2, dtype=object),
        np.ones((2, DIM), dtype=bool),
    ],
    ids=["str", "object", "bool"],
)
def test_non_numeric_vectors_raise_invalid_type_error(index, vectors):
    with raises(errors.InvalidTypeError, TypeError, "(?i)dtype|type|float|numeric"):
        index.add(vectors, [100, 101])
    assert len(index) == 50


@pytest.mark.parametrize(
    "ids",
    [np.array([100.5, 101.5]), np.array(["a", "b"]), np.array([object(), object()], dtype=object)],
    ids=["float", "str", "object"],
)
def test_non_integer_ids_raise_invalid_type_error(index, ids):
    with raises(errors.InvalidTypeError, TypeError, "(?i)ids|int|dtype|type"):
        index.add(vecs(2), ids)
    assert len(index) == 50


# --------------------------------------------------------------------------------------------
# search


@pytest.mark.parametrize(
    "query, kw, match",
    [
        (vecs(2, DIM + 1), {}, "(?i)dim"),
        (vecs(1, DIM - 1)[0], {}, "(?i)dim"),
        (poisoned(2, 9, np.nan), {}, "(?i)nan|finite"),
        (poisoned(1, 0, np.nan, one_d=True), {}, "(?i)nan|finite"),
        (poisoned(2, 1, np.inf), {}, "(?i)inf|finite"),
        (vecs(2), {"k": 0}, r"(?i)\bk\b"),
        (vecs(2), {"k": -5}, r"(?i)\bk\b"),
        (vecs(2), {"ef": 0}, r"(?i)\bef\b"),
        (vecs(2), {"ef": -1}, r"(?i)\bef\b"),
    ],
    ids=["dim-batch", "dim-1d", "nan-batch", "nan-1d", "inf", "k-0", "k-neg", "ef-0", "ef-neg"],
)
def test_bad_search_raises_invalid_argument_error(index, query, kw, match):
    kw = {"k": 3, **kw}
    with raises(errors.InvalidArgumentError, ValueError, match):
        index.search(query, **kw)


def test_bad_search_on_empty_index_still_raises():
    empty = kbcore.Index(dim=DIM, metric="cosine", kind="hnsw")
    with raises(errors.InvalidArgumentError, ValueError, "(?i)dim"):
        empty.search(vecs(1, DIM + 2), k=3)
    with raises(errors.InvalidArgumentError, ValueError, r"(?i)\bk\b"):
        empty.search(vecs(1), k=0)


@pytest.mark.parametrize(
    "query",
    [np.array([["x"] * DIM]), np.array([[None] * DIM], dtype=object), np.zeros((1, DIM), dtype=bool)],
    ids=["str", "object", "bool"],
)
def test_non_numeric_queries_raise_invalid_type_error(index, query):
    with raises(errors.InvalidTypeError, TypeError, "(?i)dtype|type|float|numeric"):
        index.search(query, k=3)


# --------------------------------------------------------------------------------------------
# unknown ids


def test_get_vectors_of_unknown_id_raises_not_found_error(index):
    with raises(errors.NotFoundError, KeyError, "4242"):
        index.get_vectors([1, 4242])


def test_remove_of_unknown_id_raises_not_found_error_naming_it(index):
    with raises(errors.NotFoundError, KeyError, "4242"):
        index.remove([4242])
    assert len(index) == 50
