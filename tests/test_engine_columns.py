"""``kbcore.engine.columns.to_numpy``: Arrow columns read from their data buffer (pyarrow's own
``to_numpy`` imports pandas, ~0.2 s of a fresh process's first reopen), equal to pyarrow's
conversion for every fixed-width type, slices, several chunks and empty columns; nulls and other
types take pyarrow's path. And a reopen in a fresh process does not import pandas."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from kbcore.engine.columns import to_numpy

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]


@pytest.mark.parametrize("typ", TYPES + [pa.float32(), pa.float64()], ids=str)
def test_fixed_width_columns_equal_pyarrows_conversion(typ):
    rng = np.random.default_rng(7)
    values = rng.integers(0, 100, size=50)
    arr = pa.array(values, type=typ)
    for col in (arr, arr.slice(13, 21), pa.chunked_array([arr.slice(0, 10), arr.slice(30, 7)]), arr.slice(5, 0)):
        want = np.asarray(col.to_numpy() if not isinstance(col, pa.ChunkedArray) else col.to_numpy(), np.int64)
        got = to_numpy(col, np.int64)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)


def test_nulls_and_other_types_take_pyarrows_path():
    with_nulls = pa.array([1.0, None, 3.0], type=pa.float64())
    got = to_numpy(with_nulls, np.float64)
    assert got[0] == 1.0 and np.isnan(got[1]) and got[2] == 3.0
    np.testing.assert_array_equal(to_numpy(pa.array([True, False, True]), np.int64), [1, 0, 1])


def test_the_result_does_not_alias_a_sliced_neighbour():
    arr = pa.array(np.arange(10, dtype=np.int64))
    got = to_numpy(arr.slice(4, 3), np.int64)
    np.testing.assert_array_equal(got, [4, 5, 6])


@pytest.mark.skipif(importlib.util.find_spec("pandas") is None, reason="pandas is not installed here")
def test_a_fresh_reopen_does_not_import_pandas(tmp_path):
    code = f"""
import sys
import numpy as np
import pyarrow as pa
from kbcore.engine import Engine
e = Engine({str(tmp_path)!r})
kb = e.create_knowledge_base("kb", embedder=False)
vecs = np.random.default_rng(3).standard_normal((40, 8)).astype(np.float32)
kb.ingest_table(pa.table({{"document_id": [f"d{{i % 5}}" for i in range(40)], "text": ["x"] * 40}}), vectors=vecs)
kb.wait_until_indexed()
e.close()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    probe = f"""
import sys
import numpy as np
from kbcore.engine import Engine
e = Engine({str(tmp_path)!r})
hits = e.get_knowledge_base("kb").retrieve(np.ones(8, np.float32), 3)
assert len(hits) == 3, hits
print("pandas" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
