"""Arrow column helpers shared by the ingest pipeline and the segments (a leaf: it imports
nothing of ``engine``, so :mod:`.ingest` and :mod:`.segments` do not import each other)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["combined", "to_numpy"]


# Fixed-width Arrow types read straight from their data buffer. pyarrow's own to_numpy()
# imports pandas when it is installed (about 0.2 s, once per process: most of a reopen's
# time when the process is fresh), so the columns a reopen reads take this path.
_FIXED = {
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "float": np.float32,
    "double": np.float64,
}


def to_numpy(col: Any, dtype: Any) -> np.ndarray:
    """An Arrow column (chunked or not) as a numpy array of ``dtype``."""
    arr = combined(col)
    fixed = _FIXED.get(str(arr.type))
    if fixed is not None and arr.null_count == 0:
        n = len(arr)
        data = arr.buffers()[1]
        if data is None:  # an empty array may have no data buffer
            return np.zeros(0, dtype=dtype)
        view = np.frombuffer(data, dtype=fixed, count=n, offset=arr.offset * np.dtype(fixed).itemsize)
        return np.asarray(view, dtype=dtype)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def combined(col: Any) -> Any:
    """A ChunkedArray as one Array (no copy when it has one chunk); an Array as is."""
    if hasattr(col, "combine_chunks"):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col
