"""The native vector index: HNSW (approximate) or flat (exact), with stable int64 ids.

- :mod:`._index`: :class:`Index`, :class:`Group`, :func:`collapse_by_key`, :func:`fuse_rrf`
  (a hybrid search's two legs fused natively), and one query
  against several indexes at once (:class:`Search`, :func:`search_many`, its thread pool's
  size :func:`set_search_threads` / :func:`search_threads`, :func:`wake_search_pool` ahead of a
  call);
- :mod:`.params`: the one list of metric, kind, quantization and vectors names, the native
  limits and the parameter checks;
- :mod:`.spec`: :class:`IndexSpec`, the one frozen description of an index, validated once;
- :mod:`.arrays`: the input conversions (vectors, ids) an index and a sharded index share.
"""

from __future__ import annotations

from ._index import (
    REORDER_MIN_ROWS,
    Group,
    Index,
    Search,
    collapse_by_key,
    fuse_rrf,
    search_many,
    search_threads,
    set_search_threads,
    wake_search_pool,
)
from .params import (
    DIM_RANGE,
    EF_RANGE,
    KINDS,
    M_RANGE,
    METRICS,
    QUANTIZATIONS,
    RABITQ_BITS,
    RABITQ_DEFAULT_BITS,
    VECTORS,
    Kind,
    Metric,
    Quantization,
    Vectors,
    check_bits,
    check_params,
    check_quantization,
    check_vectors,
)
from .spec import IndexSpec, as_index_spec

__all__ = [
    "Index",
    "IndexSpec",
    "as_index_spec",
    "Group",
    "Metric",
    "Kind",
    "Quantization",
    "Vectors",
    "METRICS",
    "KINDS",
    "QUANTIZATIONS",
    "VECTORS",
    "REORDER_MIN_ROWS",
    "M_RANGE",
    "DIM_RANGE",
    "EF_RANGE",
    "RABITQ_BITS",
    "RABITQ_DEFAULT_BITS",
    "check_params",
    "check_quantization",
    "check_bits",
    "check_vectors",
    "collapse_by_key",
    "fuse_rrf",
    "Search",
    "search_many",
    "search_threads",
    "set_search_threads",
    "wake_search_pool",
]
