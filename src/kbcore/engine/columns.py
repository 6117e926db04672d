"""Arrow column helpers shared by the ingest pipeline and the segments (a leaf: it imports
nothing of ``engine``, so :mod:`.ingest` and :mod:`.segments` do not import each other)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["combined", "to_numpy"]


def to_numpy(col: Any, dtype: Any) -> np.ndarray:
    """An Arrow column (chunked or not) as a numpy array of ``dtype``."""
    arr = combined(col)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def combined(col: Any) -> Any:
    """A ChunkedArray as one Array (no copy when it has one chunk); an Array as is."""
    if hasattr(col, "combine_chunks"):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col
