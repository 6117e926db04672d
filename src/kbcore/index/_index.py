"""The native vector index: HNSW (approximate) or flat (exact), with stable int64 ids."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import InvalidArgumentError, InvalidTypeError
from ..filters import native_filter
from .arrays import as_ids as _as_ids
from .arrays import as_vectors as _as_vectors
from .params import (
    EF_RANGE,
    Kind,
    Metric,
    Quantization,
    Vectors,
)
from .params import bounded as _bounded
from .params import limit as _limit
from .params import positive as _positive
from .params import threads as _threads
from .spec import IndexSpec, as_index_spec

# numpy's float32 dtype (a singleton: `dtype is _FLOAT32` is the cheapest exact test).
_FLOAT32 = np.dtype(np.float32)

# Index.add renumbers the slots for locality (Index.reorder) once the index holds at least this
# many rows and twice as many as at its last reorder (or its creation or load), so each reorder
# follows a doubling and their cost stays a small share of the build (about 6 % at 1M rows).
# Below it the codes fit the caches and the walk gains nothing measurable (docs/graph-quality.md).
REORDER_MIN_ROWS = 100_000

__all__ = [
    "Index",
    "Group",
    "Search",
    "collapse_by_key",
    "fuse_rrf",
    "search_many",
    "search_threads",
    "set_search_threads",
    "wake_search_pool",
]

_MAX_EF = EF_RANGE[1]
# The keywords' defaults, to tell an explicit keyword from an absent one when a spec is given.
_DEFAULTS = IndexSpec().to_dict()


class Group(NamedTuple):
    """One source in a grouped search: its key and its best hits.

    ``ids`` / ``distances``: the best ``group_size`` parts, best first. ``part_ids``: every part
    of this source that the search met among its candidates (best first; includes ``ids``).
    """

    key: int | str
    ids: tuple[int, ...]
    distances: tuple[float, ...]
    part_ids: tuple[int, ...]

    @property
    def distance(self) -> float:
        """The group's best distance."""
        return self.distances[0]


def _metadata_columns(metadata: Any, n: int) -> list[tuple[Any, ...]]:
    if metadata is None:
        return []
    from .. import metadata as _md

    if type(metadata).__module__.split(".")[0] == "pyarrow":
        return _md.columns_from_arrow(metadata, n)
    if isinstance(metadata, (str, bytes, Mapping)) or not isinstance(metadata, Sequence):
        raise InvalidTypeError(
            "metadata must be a list of dicts (one per row) or a pyarrow Table / RecordBatch, "
            f"got {type(metadata).__name__}"
        )
    if len(metadata) != n:
        raise InvalidArgumentError(f"got {n} vectors but {len(metadata)} metadata rows")
    return _md.columns_from_rows(metadata, n)


def _arrow_texts(texts: Any, n: int) -> Any:
    """A pyarrow string array (or chunked array) of n rows as the native add takes it: its
    (offsets int64, UTF-8 bytes, validity or None) buffers, without a Python str per row."""
    import pyarrow as pa

    arr = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    if not isinstance(arr, pa.Array):
        raise InvalidTypeError(f"texts must be a list of str or a pyarrow string array, got {type(texts).__name__}")
    if len(arr) != n:
        raise InvalidArgumentError(f"got {n} vectors but {len(arr)} texts")
    large = pa.types.is_large_string(arr.type)
    if not large and not pa.types.is_string(arr.type):
        raise InvalidTypeError(f"texts must be strings, got an Arrow array of {arr.type}")
    if n == 0:
        return []
    _, offsets, data = arr.buffers()
    off = np.frombuffer(offsets, np.int64 if large else np.int32, n + 1, arr.offset * (8 if large else 4))
    raw = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
    valid = None if arr.null_count == 0 else np.asarray(arr.is_valid(), dtype=np.uint8)
    return (np.ascontiguousarray(off, dtype=np.int64), raw, valid)


def _ranked(ids: npt.ArrayLike, scores: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """A ranked list as the native collapse takes it: int64 ids and float32 scores, 1-D, of one length."""
    id_arr = _as_ids(ids)
    values = np.asarray(scores)
    if values.dtype.kind not in "fiu":
        raise InvalidTypeError(f"scores must be numbers, got dtype {values.dtype}")
    if values.ndim != 1 or len(values) != len(id_arr):
        raise InvalidArgumentError(
            f"scores must be a 1-D sequence as long as ids ({len(id_arr)}), got shape {list(values.shape)}"
        )
    if values.dtype != np.float32 or not values.flags.c_contiguous:
        values = np.ascontiguousarray(values, dtype=np.float32)
    return id_arr, values


def collapse_by_key(
    ids: npt.ArrayLike, scores: npt.ArrayLike, keys: npt.ArrayLike, *, group_size: int = 1, limit: int
) -> list[Group]:
    """:meth:`Index.collapse` with the group of each hit given (``keys``: one int per id) instead
    of read from a metadata field: the first ``limit`` groups of the ranked list, natively.
    Raises InvalidArgumentError / InvalidTypeError for lists of different lengths, a
    ``group_size`` below 1 or a negative ``limit``."""
    id_arr, values = _ranked(ids, scores)
    key_arr = _as_ids(keys, "keys")
    return _core.collapse_keys(id_arr, values, key_arr, _positive("group_size", group_size), _limit(limit), Group)


def fuse_rrf(
    vector_ids: np.ndarray,
    vector_distances: np.ndarray,
    text_ids: np.ndarray,
    text_scores: np.ndarray,
    k: float = 60,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`kbcore.fusion.rrf` then :func:`kbcore.fusion.normalize_rrf` of a hybrid search's
    two legs as the searches return them, natively in one call: ``(ids, scores)``, int64 and
    float64 arrays, best first.

    The vector leg is :meth:`Index.search`'s ``(ids, distances)`` of one query (ascending
    distance; ids < 0 are padding and skipped), the text leg :meth:`Index.search_text`'s
    ``(ids, scores)`` (descending score); each leg ranks equal values by id ascending. The
    result holds exactly the ids, scores and order of ``normalize_rrf(rrf([vector_leg,
    text_leg], k), 2, k)`` over those ranked legs. Raises InvalidArgumentError for legs whose
    ids and values differ in length or ``k`` not a finite number >= 0.
    """
    if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(f"rrf k must be a number, got {type(k).__name__}")
    return _core.rrf_fuse(
        np.ascontiguousarray(vector_ids, dtype=np.int64),
        np.ascontiguousarray(vector_distances, dtype=np.float32),
        np.ascontiguousarray(text_ids, dtype=np.int64),
        np.ascontiguousarray(text_scores, dtype=np.float32),
        float(k),
    )


class Index:
    """A vector index over float32 vectors with int64 ids.

    ``kind="hnsw"`` is an approximate HNSW graph (Malkov & Yashunin 2018); ``kind="flat"``
    scans every vector and is exact. Distances are "smaller is closer" for every metric:

    - ``cosine``: ``1 - cos(a, b)``, in [0, 2]; vectors are stored unit-normalised.
    - ``ip``: ``1 - dot(a, b)`` (as hnswlib); vectors are stored as given.
    - ``l2``: squared Euclidean distance.

    ``quantization="sq8"`` (hnsw only) stores an 8-bit code per dimension beside each float32
    row and walks the graph on the codes, a quarter of the bytes per visited node; the best
    ``rerank`` candidates (default: the best ``min(max(ef, k), max(2k, 16))``) are then
    re-scored exactly from the float32 rows, so returned distances are exact. The codes are
    trained (per-dimension min/max) when the index first holds 1,000 rows; before that a
    quantized index searches the float32 rows. Values outside the trained range clip;
    :meth:`retrain_quantizer` trains again from the rows stored now.

    ``quantization="rabitq"`` stores RaBitQ codes (Gao & Long 2024, and its multi-bit
    extension) of ``bits`` bits per dimension (1 to 8, default 4) after a seeded random
    rotation: an unbiased distance estimate with a per-row error bound. Its re-rank reads, in
    order of lower bound, only the candidates that can still enter the top k (default depth:
    the whole candidate list). The centroid is trained at 1,000 rows like SQ8's ranges.
    With ``vectors="disk"``
    (quantized only) the float32 rows live in a memory-mapped temporary file whose pages are
    dropped from the resident set after every change, so resident memory is the codes, the
    graph and the rows recently re-ranked (see docs/quantization.md).

    Thread safety: searches (and other reads) may run from any number of threads at once;
    ``add`` and ``remove`` are exclusive: they wait for running searches and block new ones.
    Native work releases the GIL.
    """

    # About 420 lines: the whole index API (34 methods, most of them argument checks and a
    # docstring around one native call); the work is in the native core.

    __slots__ = ("_native", "_dim", "_ordered_rows", "_fast")

    def __init__(
        self,
        dim: int,
        metric: Metric = "cosine",
        kind: Kind = "hnsw",
        *,
        M: int = 16,
        ef_construction: int = 200,
        ef: int = 64,
        seed: int = 42,
        quantization: Quantization | None = None,
        rerank: int | None = None,
        vectors: Vectors = "memory",
        bits: int | None = None,
        spec: IndexSpec | Mapping[str, Any] | None = None,
    ) -> None:
        """``spec`` (an :class:`~kbcore.index.IndexSpec` or its dict) describes the index whole;
        without it the keywords are turned into one. Raises InvalidArgumentError (a ValueError)
        for an unknown metric, kind or quantization, quantization with ``kind="flat"``, a
        non-positive parameter, or ``spec`` given together with a keyword it holds."""
        dim = _positive("dim", dim)
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InvalidArgumentError(f"seed must be a non-negative integer, got {seed!r}")
        given: dict[str, Any] = {
            "metric": metric,
            "kind": kind,
            "M": M,
            "ef_construction": ef_construction,
            "ef": ef,
            "quantization": quantization,
            "rerank": rerank,
            "vectors": vectors,
            "bits": bits,
        }
        if spec is None:
            spec = IndexSpec(**given)
        else:
            spec = as_index_spec(spec)
            clash = sorted(k for k, v in given.items() if v != _DEFAULTS[k])
            if clash:
                raise InvalidArgumentError(f"pass either spec or the keywords it holds, not both: {clash}")
        self._native = _core.Index(
            dim,
            spec.metric,
            spec.kind,
            spec.M,
            spec.ef_construction,
            spec.ef,
            int(seed),
            spec.quantization or "none",
            spec.rerank or 0,
            spec.vectors,
            spec.bits or 0,
        )
        self._dim = int(self._native.dim)
        self._fast = _core.fast_search(self._native)
        self._ordered_rows = 0

    @property
    def spec(self) -> IndexSpec:
        """The index's :class:`~kbcore.index.IndexSpec` (its current default ``ef``)."""
        return IndexSpec(
            metric=self.metric,
            kind=self.kind,
            M=self.M,
            ef_construction=self.ef_construction,
            ef=self.ef,
            quantization=self.quantization,
            bits=self.bits,
            rerank=self.rerank,
            vectors=self.vectors,
        )

    @classmethod
    def _wrap(cls, native: _core.Index) -> Index:
        obj = cls.__new__(cls)
        obj._native = native
        obj._dim = int(native.dim)
        obj._fast = _core.fast_search(native)
        obj._ordered_rows = int(native.size())
        return obj

    # -- properties ---------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    @property
    def metric(self) -> Metric:
        return self._native.metric  # type: ignore[return-value]

    @property
    def kind(self) -> Kind:
        return self._native.kind  # type: ignore[return-value]

    @property
    def M(self) -> int:  # noqa: N802 - the name of the HNSW parameter
        return int(self._native.M)

    @property
    def ef_construction(self) -> int:
        return int(self._native.ef_construction)

    @property
    def quantization(self) -> Quantization | None:
        """``"sq8"`` or ``"rabitq"`` for a quantized index, else None."""
        q = self._native.quantization
        return None if q == "none" else q  # type: ignore[return-value]

    @property
    def rerank(self) -> int | None:
        """Exact re-rank depth of a quantized search (None: the default, for SQ8 the best
        ``min(max(ef, k), max(2k, 16))`` candidates, for RaBitQ the whole list pruned by the
        error bound)."""
        r = int(self._native.rerank)
        return r if r > 0 else None

    @rerank.setter
    def rerank(self, value: int | None) -> None:
        """Changes the re-rank depth of this index (None: the default), e.g. to reach a higher
        recall on an index loaded from disk without rebuilding it; saved with the index.
        InvalidArgumentError for an index without codes or a depth outside [1, 2^30]."""
        if not self.quantization:
            raise InvalidArgumentError("rerank applies to a quantized index (quantization='sq8' or 'rabitq')")
        self._native.rerank = 0 if value is None else _bounded("rerank", value)

    @property
    def bits(self) -> int | None:
        """Bits per dimension of a RaBitQ index's codes, else None."""
        b = int(self._native.bits)
        return b if b > 0 else None

    @property
    def vectors(self) -> Vectors:
        """Where the float32 rows live: ``"memory"`` or ``"disk"`` (a memory-mapped file)."""
        return self._native.vectors  # type: ignore[return-value]

    @property
    def in_place(self) -> bool:
        """True while a loaded index reads its level-0 graph links in place from its file
        (:meth:`load` with ``mmap=True``); False when built here or copied (``mmap=False``)."""
        return bool(self._native._links_in_place)

    @property
    def quantizer_trained(self) -> bool:
        """True once a quantized index has trained its codes (at 1,000 rows)."""
        return bool(self._native.quantizer_trained)

    def retrain_quantizer(self, *, threads: int = 0) -> None:
        """Trains the quantizer again (SQ8's ranges, RaBitQ's centroid) from the rows stored now
        and re-encodes every row.

        Use after the data drifted outside the trained range (such values clip). Raises
        InvalidArgumentError for an index without quantization or without rows.
        """
        self._native.retrain_quantizer(_threads(threads))

    def reorder(self, *, method: str = "gorder", threads: int = 0) -> None:
        """Renumbers the rows' internal slots so that graph neighbours sit near each other in
        memory: the walk then reads fewer scattered pages (on 1M synthetic rows, sq8: 13-18 %
        less time per query at recall 0.95-0.99; nothing measurable below 100k rows, where the
        codes fit the caches; docs/graph-quality.md).

        :meth:`add` calls it by itself (``reorder=None``) when an add leaves at least
        ``REORDER_MIN_ROWS`` (100,000) rows and twice as many as at the last reorder (small adds included); call it
        after building an index through ``defer_graph``, or with ``vectors="disk"`` (neither is
        reordered by itself: deferred rows are linked later, rows on disk move inside their file).

        ``method``: ``"gorder"`` (Gorder's greedy window on direct links, the fastest walk
        measured), ``"bfs"`` (breadth-first from the graph's entry point) or ``"rcm"``
        (reverse Cuthill-McKee). Rows, codes, links, metadata and text move together: ids,
        metadata and answers are unchanged (up to the order of equal distances); only
        :meth:`ids` lists the ids in the new storage order. A saved file keeps the order, so a
        reload needs no work. Later adds take free or new slots. Raises InvalidArgumentError for
        a flat index or an unknown method. About 0.5-1 s per 100k rows of 384 dimensions
        (gorder, one thread; the codes are re-encoded on ``threads``). The order is computed
        under the shared lock, so searches keep running; they wait only while the rows move
        (about a quarter of the time). Adds and removes may run meanwhile: rows added then keep
        their slots at the end. No second copy of the rows is made.
        """
        if not isinstance(method, str):
            raise InvalidTypeError(f"method must be a str ('gorder', 'bfs' or 'rcm'), got {type(method).__name__}")
        self._native.reorder(method, _threads(threads))
        self._ordered_rows = len(self)

    @property
    def ef(self) -> int:
        """Default size of the search candidate list (raised to k when smaller)."""
        return int(self._native.ef)

    @ef.setter
    def ef(self, value: int) -> None:
        self._native.ef = _bounded("ef", value)

    # -- mutation -----------------------------------------------------------------------
    def add(
        self,
        vectors: npt.ArrayLike,
        ids: npt.ArrayLike,
        *,
        metadata: Sequence[Mapping[str, Any] | None] | Any | None = None,
        texts: Sequence[str | None] | Any | None = None,
        defer_graph: bool = False,
        reorder: bool | None = None,
        threads: int = 0,
    ) -> None:
        """Adds vectors [n, dim] under int64 ids [n]; an id already present is replaced.

        ``metadata`` is optional per-row metadata: a list of n dicts (values int, float, bool,
        str, list of str, or None for missing) or a pyarrow Table / RecordBatch of n rows (the
        fast path: columns go to native memory without a Python loop). A replaced id gets
        exactly the new metadata.

        ``defer_graph=True`` (hnsw) stores the rows and makes them searchable at once (they are
        scanned exactly) but leaves linking them into the graph to :meth:`build_graph`, so
        the call returns after copying the rows and writers hold the lock only briefly.

        ``texts`` (optional, n str or None, or a pyarrow string array of n rows: the fast path,
        read from its buffers) feed the native BM25 index used by :meth:`search_text` and
        hybrid retrieval; a replaced id gets exactly the new text.

        ``reorder``: ``None`` (default) renumbers the slots for locality (:meth:`reorder`)
        after linking when the index now holds at least ``REORDER_MIN_ROWS`` (100,000) rows and
        twice as many as at its last reorder, with the rows in memory and none waiting for the
        graph: about 6 % more build time at 1M rows for a 13-18 % faster walk. ``True``
        reorders after this add whatever its size (hnsw only), ``False`` never.

        The whole batch is validated first (dimension, NaN/inf, duplicate ids, zero vectors
        under cosine, metadata types); a bad batch changes nothing. ``threads=0`` uses all
        cores.
        """
        if reorder is not None and not isinstance(reorder, bool):
            raise InvalidTypeError(f"reorder must be True, False or None, got {type(reorder).__name__}")
        if reorder and self.kind != "hnsw":
            raise InvalidArgumentError("reorder=True needs an hnsw index: a flat index has no graph to follow")
        arr, _ = _as_vectors(vectors, self.dim, "vectors")
        id_arr = _as_ids(ids)
        if len(id_arr) != arr.shape[0]:
            raise InvalidArgumentError(f"got {arr.shape[0]} vectors but {len(id_arr)} ids")
        columns = _metadata_columns(metadata, arr.shape[0])
        if texts is not None and type(texts).__module__.split(".")[0] == "pyarrow":
            texts = _arrow_texts(texts, arr.shape[0])
        elif texts is not None:
            if isinstance(texts, str) or not isinstance(texts, Sequence):
                raise InvalidTypeError("texts must be a list of str (or None per row)")
            if len(texts) != arr.shape[0]:
                raise InvalidArgumentError(f"got {arr.shape[0]} vectors but {len(texts)} texts")
            # each text's type is checked natively, as it is copied (InvalidTypeError)
        self._native.add(arr, id_arr, _threads(threads), columns, texts, bool(defer_graph))
        if reorder or (reorder is None and not defer_graph and self.reorder_due):
            self.reorder(threads=threads)

    @property
    def reorder_due(self) -> bool:
        """Whether the automatic reorder applies now: at least ``REORDER_MIN_ROWS`` rows and
        twice as many as at the last reorder (or creation, or load), an hnsw index with its
        rows in memory and none waiting for the graph. :meth:`add` checks it after linking;
        the engine's background graph builder checks it once every row is linked."""
        n = len(self)
        return (
            n >= REORDER_MIN_ROWS
            and n >= 2 * self._ordered_rows
            and self.kind == "hnsw"
            and self.vectors == "memory"
            and self.pending == 0
        )

    def build_graph(self, max_rows: int | None = None, *, threads: int = 0) -> int:
        """Links up to ``max_rows`` (all if None) rows added with ``defer_graph=True`` into
        the HNSW graph and returns how many still wait. Each call holds the write lock only
        for its own batch, so a background thread can call it in small batches while
        searches continue. Searches are exact over waiting rows, so results never miss them.
        """
        limit = 2**62 if max_rows is None else min(_positive("max_rows", max_rows), 2**62)  # more rows than any index
        return int(self._native.build_graph(limit, _threads(threads)))

    @property
    def pending(self) -> int:
        """Rows stored but not yet linked into the graph (see ``defer_graph``)."""
        return int(self._native.pending_rows())

    def remove(self, ids: npt.ArrayLike, *, threads: int = 0) -> None:
        """Removes ids; they are never returned again and their slots are reused.

        Raises :class:`~kbcore.errors.NotFoundError` (a ``KeyError``) if any id is absent, in
        which case nothing is removed. The graph is repaired around the removed nodes.
        """
        self._native.remove(_as_ids(ids), _threads(threads))

    # -- queries ------------------------------------------------------------------------
    def search(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        *,
        where: Mapping[str, Any] | None = None,
        ef: int | None = None,
        threads: int = 0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest neighbours of each query.

        ``queries`` is one vector [dim] or a batch [q, dim]. Returns ``(ids, distances)``:
        int64 and float32 arrays of shape [q, k] (or [k] for one query), ascending by
        distance, padded with id -1 and distance +inf when fewer than k vectors exist.
        ``ef`` (default :attr:`ef`) is the candidate list size of HNSW search; ``threads``
        is the number of native threads for a batch (0 = all cores).

        ``where`` is a Chroma-style metadata filter (see ``docs/filter-ir.md``), compiled
        once per call (or a filter already compiled by :func:`kbcore.filters.native_filter`,
        so that several searches share one compilation) and evaluated natively; results then come
        only from passing rows, and if at least k rows pass, k results come back. Small passing
        sets are scanned exactly; larger ones use a filter-aware graph traversal, chosen by a
        cost model.
        """
        if where is None:
            # The loop of single queries a RAG request runs: one plain native call, which
            # answers a float32 [dim] query with int k / ef / threads in range and returns None
            # for anything else (and for a query it refuses), handled by the checked path below.
            found = self._fast(queries, k, ef, threads)
            if found is not None:
                return found
        if (
            type(queries) is np.ndarray
            and queries.dtype is _FLOAT32
            and queries.ndim == 1
            and queries.shape[0] == self._dim
            and type(k) is int
            and 0 < k <= _MAX_EF
            and (ef is None or (type(ef) is int and 0 < ef <= _MAX_EF))
            and type(threads) is int
            and threads >= 0
        ):
            # Hot path of a loop of single queries (what a RAG request runs): nothing to
            # convert or check but the filter (one query runs on one thread whatever `threads`
            # says; a strided view is copied by the binding). Half the overhead of the batch
            # call with a [1, dim] view: it is a tenth of a query's time on SciFact.
            return self._native.search_one(queries, k, ef or 0, None if where is None else native_filter(where))
        arr, one = _as_vectors(queries, self._dim, "queries")
        k = _bounded("k", k)
        ef_value = 0 if ef is None else _bounded("ef", ef)
        ids, dist = self._native.search(arr, k, ef_value, _threads(threads), native_filter(where))
        if one:
            return ids[0], dist[0]
        return ids, dist

    def _hybrid_args(
        self, query_vector: npt.ArrayLike, query_text: str, k: int, where: Any, ef: int | None
    ) -> tuple[np.ndarray, str, int, int, Any]:
        """The checked arguments of the two-leg calls (the checks of search and search_text)."""
        if not isinstance(query_text, str):
            raise InvalidTypeError(f"query_text must be a str, got {type(query_text).__name__}")
        vector: np.ndarray
        if (
            type(query_vector) is np.ndarray
            and query_vector.dtype is _FLOAT32
            and query_vector.ndim == 1
            and query_vector.shape[0] == self._dim
        ):
            vector = query_vector
        else:
            arr, _ = _as_vectors(query_vector, self._dim, "the query vector")
            if arr.shape[0] != 1:
                raise InvalidArgumentError(f"a hybrid search takes one query vector, got {arr.shape[0]}")
            vector = arr[0]
        k = k if type(k) is int and 0 < k <= _MAX_EF else _bounded("k", k)
        ef_value = 0 if ef is None else ef if type(ef) is int and 0 < ef <= _MAX_EF else _bounded("ef", ef)
        return vector, query_text, k, ef_value, None if where is None else native_filter(where)

    def search_hybrid_legs(
        self,
        query_vector: npt.ArrayLike,
        query_text: str,
        k: int = 50,
        *,
        where: Mapping[str, Any] | None = None,
        ef: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Both legs of one hybrid query in one native call: ``(ids, distances, text_ids,
        text_scores)``, exactly ``search(query_vector, k, where=where, ef=ef)`` followed by
        ``search_text(query_text, k, where=where)``. The BM25 leg runs on the calling thread
        while the vector leg runs on a worker of the search pool (when a hardware thread is
        idle, see :func:`set_search_threads`). Raises InvalidArgumentError /
        InvalidTypeError as those calls do.
        """
        return self._native.search_hybrid_legs(*self._hybrid_args(query_vector, query_text, k, where, ef))

    def search_hybrid_rrf(
        self,
        query_vector: npt.ArrayLike,
        query_text: str,
        k: int = 50,
        *,
        where: Mapping[str, Any] | None = None,
        ef: int | None = None,
        rrf_k: float = 60,
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """:meth:`search_hybrid_legs` then :func:`fuse_rrf` of the two legs with ``rrf_k``, in
        one native call: the hits and scores of the three calls made one after the other.

        Returns ``(ids, scores, vector_hits, text_hits)``: the fused int64 ids and float64
        scores, best first, and how many hits each leg had (a leg with fewer than ``k``
        returned every row it could). Raises InvalidArgumentError / InvalidTypeError as
        those calls do.
        """
        if isinstance(rrf_k, bool) or not isinstance(rrf_k, (int, float, np.integer, np.floating)):
            raise InvalidTypeError(f"rrf k must be a number, got {type(rrf_k).__name__}")
        q, text, k, ef_value, nf = self._hybrid_args(query_vector, query_text, k, where, ef)
        return self._native.search_hybrid_rrf(q, text, k, ef_value, nf, float(rrf_k))

    def search_stats(self, queries: npt.ArrayLike, k: int = 10, *, ef: int | None = None) -> dict[str, np.ndarray]:
        """Debug statistics of the unfiltered graph walk that :meth:`search` runs.

        For each query (one vector [dim] or a batch [q, dim]) and the same ``k`` and ``ef``,
        returns uint64 arrays [q] (shape [1] for one query) under
        ``"hops"`` (level-0 nodes expanded), ``"upper_hops"`` (link lists read by the descent
        through the upper levels: greedy, with a beam at level 1 in graphs of 50,000 slots or
        more, a wider one from 500,000) and ``"scored"`` (distances evaluated on codes or
        rows, descent included; the exact re-rank of a quantized index is not counted). Rows
        whose graph insertion is deferred are not counted. One thread; for analysis, not for
        serving: :meth:`search` itself counts nothing. Raises
        :class:`~kbcore.errors.InvalidArgumentError` for a flat index.
        """
        arr, _ = _as_vectors(queries, self._dim, "queries")
        k = _bounded("k", k)
        ef_value = 0 if ef is None else _bounded("ef", ef)
        hops, upper, scored = self._native.search_stats(arr, k, ef_value)
        return {"hops": hops, "upper_hops": upper, "scored": scored}

    def get_vectors(self, ids: npt.ArrayLike) -> np.ndarray:
        """Stored vectors of ids as float32 [n, dim] (unit-normalised under cosine)."""
        return self._native.get_vectors(_as_ids(ids))

    def search_groups(
        self,
        queries: npt.ArrayLike,
        k: int = 10,
        *,
        group_by: str = "document_id",
        group_size: int = 1,
        where: Mapping[str, Any] | None = None,
        ef: int | None = None,
        threads: int = 0,
    ) -> list[Group] | list[list[Group]]:
        """The k best distinct sources per query: search with per-source deduplication.

        Hits are grouped by the metadata field ``group_by`` (int or str values; rows without
        it are never returned). Each :class:`Group` holds its best ``group_size`` hits and the
        ids of every part of that source the search met. Groups are ordered by best distance.
        The graph search keeps widening its candidate list until k distinct groups are found
        or the (filtered) index is exhausted, so a page is never short when k groups exist.
        Returns a list of groups for one query (1-D), or one list per query for a batch.
        """
        arr, one = _as_vectors(queries, self.dim, "queries")
        k = _bounded("k", k)
        group_size = _positive("group_size", group_size)
        if not isinstance(group_by, str) or not group_by:
            raise InvalidTypeError(f"group_by must be a non-empty field name, got {group_by!r}")
        ef_value = 0 if ef is None else _bounded("ef", ef)
        # The native layer builds the Group instances itself (one list per query).
        result = self._native.search_groups(
            arr,
            k,
            group_by,
            group_size,
            ef_value,
            _threads(threads),
            native_filter(where),
            "auto",
            Group,
        )
        return result[0] if one else result

    def collapse(
        self,
        ids: npt.ArrayLike,
        scores: npt.ArrayLike,
        *,
        group_by: str = "document_id",
        group_size: int = 1,
        limit: int,
    ) -> list[Group]:
        """Groups a ranked list the caller already has (best first, e.g. a fused hybrid list)
        by the metadata field ``group_by``, by the rule of :meth:`search_groups`: the first
        ``limit`` groups to appear, each with its first ``group_size`` hits (``distances``
        holds their given ``scores``) and every part among the list. Rows without a value of
        the field are skipped. One native call, O(n log n).

        Raises NotFoundError for an id not in the index; InvalidArgumentError for a repeated
        id, a field no stored row has, lists of different lengths, ``group_size`` below 1 or
        a negative ``limit``."""
        id_arr, values = _ranked(ids, scores)
        if not isinstance(group_by, str) or not group_by:
            raise InvalidTypeError(f"group_by must be a non-empty field name, got {group_by!r}")
        return self._native.collapse(
            id_arr, values, group_by, _positive("group_size", group_size), _limit(limit), Group
        )

    def search_text(
        self,
        query: str,
        k: int = 10,
        *,
        where: Mapping[str, Any] | None = None,
        stats: tuple[int, int, Mapping[str, int]] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """BM25 full-text search over the texts given to :meth:`add`.

        Returns ``(ids, scores)``: int64 and float32 arrays of at most k rows, score
        descending (BM25 with k1=1.2, b=0.75; higher is better). Rows that match no query
        term are not returned. ``where`` filters as in :meth:`search`. See
        :func:`kbcore.tokenize` for the tokenization.

        ``stats`` ``(documents, total_length, {term: df})`` replaces this index's corpus
        statistics (the sum of :meth:`text_stats` over the shards of one corpus, as
        :class:`kbcore.distributed.ShardedIndex` gathers them), so that the scores are those
        of one index over every shard's rows. Raises
        :class:`~kbcore.errors.InvalidArgumentError` if it counts fewer rows than this index
        holds or lacks a query term this index has.
        """
        if not isinstance(query, str):
            raise InvalidTypeError(f"query must be a str, got {type(query).__name__}")
        k = _bounded("k", k)
        if stats is None:
            return self._native.search_text(query, k, native_filter(where))
        try:
            documents, total_length, df = stats
            global_stats = (int(documents), int(total_length), {str(t): int(c) for t, c in df.items()})
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidTypeError("stats must be (documents, total_length, {term: df}) as text_stats returns") from exc
        if any(v < 0 for v in (global_stats[0], global_stats[1], *global_stats[2].values())):
            raise InvalidArgumentError("stats counts must be non-negative")
        return self._native.search_text(query, k, native_filter(where), global_stats)

    def text_stats(self, query: str) -> tuple[int, int, dict[str, int]]:
        """This index's BM25 statistics for ``query``: ``(rows with text, their total tokens,
        {distinct query term: rows containing it})``. Summed over shards, the result is the
        ``stats`` argument of :meth:`search_text`."""
        if not isinstance(query, str):
            raise InvalidTypeError(f"query must be a str, got {type(query).__name__}")
        return self._native.text_stats(query)

    def text_documents(self) -> int:
        """Number of rows that have a text in the BM25 leg (see ``texts`` of :meth:`add`).
        Index files written before the text leg existed load with 0."""
        return int(self._native.text_documents())

    def get_metadata(self, ids: npt.ArrayLike) -> list[dict[str, Any]]:
        """Stored metadata of each id, as dicts (fields without a value are omitted)."""
        return self._native.get_metadata(_as_ids(ids))

    def count(self, where: Mapping[str, Any] | None = None) -> int:
        """Number of stored vectors whose metadata passes ``where`` (all if None)."""
        if where is None:
            return len(self)
        return self._native.count(native_filter(where))

    def ids(self) -> np.ndarray:
        """The live ids as an int64 array (in storage order)."""
        return self._native.ids()

    def memory_usage(self) -> int:
        """Approximate bytes held natively by vectors, ids and graph."""
        return int(self._native.memory_bytes())

    def __len__(self) -> int:
        return int(self._native.size())

    def __contains__(self, id: object) -> bool:
        if isinstance(id, bool) or not isinstance(id, (int, np.integer)) or not -(2**63) <= id < 2**63:
            return False  # ids are int64: nothing else can be held
        return bool(self._native.contains(int(id)))

    def __repr__(self) -> str:
        return (
            f"kbcore.Index(dim={self.dim}, metric={self.metric!r}, kind={self.kind!r}, "
            f"M={self.M}, ef_construction={self.ef_construction}, ef={self.ef}, "
            + (f"quantization={self.quantization!r}, " if self.quantization else "")
            + (f"bits={self.bits}, " if self.bits else "")
            + f"size={len(self)})"
        )

    # -- persistence --------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the index to one file atomically (temp file, fsync, rename)."""
        self._native.save(os.fspath(path))

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, vectors: Vectors | None = None, mmap: bool = True) -> Index:
        """Reads an index written by :meth:`save`.

        ``vectors``: None reopens the rows where they were when saved (an index saved with
        ``vectors="disk"`` comes back with its rows read in place from the mapped file, see
        ``docs/quantization.md``); ``"memory"`` or ``"disk"`` overrides that (``"disk"`` needs a
        quantized index: InvalidArgumentError for other files).

        ``mmap``: True (the default) reads the rows, codes and graph links in place from the
        mapped file: the open takes milliseconds and the pages are the page cache's (not the
        process's anonymous memory). False copies them into the process's memory once the file
        is checked, in 2 MiB pages where the kernel grants them: a slower open (about a second
        per GB) and more anonymous memory, for faster searches of a large index (about 8 % at
        1M rows, ``docs/index.md``). Rows kept on disk (``vectors="disk"``) stay in the file.

        Raises ``FileNotFoundError`` if the file does not exist and
        :class:`~kbcore.errors.FormatError` (an ``OSError``) if it is truncated, corrupted,
        not an index file, or written by a newer kbcore.
        """
        p = os.fspath(path)
        if not os.path.exists(p):
            raise FileNotFoundError(2, "No such file or directory", p)
        if vectors not in (None, "memory", "disk"):
            raise InvalidArgumentError(f"unknown vectors {vectors!r}; expected 'memory', 'disk' or None")
        if type(mmap) is not bool:
            raise InvalidTypeError(f"mmap must be a bool, got {type(mmap).__name__}")
        return cls._wrap(_core.Index.load(p, vectors, mmap))


@dataclass(frozen=True, slots=True)
class Search:
    """One search of :func:`search_many`: ``query`` (one vector [dim]) against ``index``, as
    :meth:`Index.search` (``group_by`` None) or :meth:`Index.search_groups` would run it."""

    index: Index
    query: npt.ArrayLike
    k: int = 10
    where: Any = None
    ef: int | None = None
    group_by: str | None = None
    group_size: int = 1


def search_many(searches: Sequence[Search], *, threads: int = 0) -> list[Any]:
    """Several searches of one query each, run concurrently natively (a persistent pool of
    :func:`search_threads` threads, the GIL released; at most ``threads`` of them for this
    call, 0 = all, 1 = one after the other on the caller): for each, what :meth:`Index.search`
    (``(ids, distances)``, 1-D) or :meth:`Index.search_groups` (a list of :class:`Group`)
    returns for that one query, the same results. The first failing search raises (an
    invalid filter, a NaN query...), as its own call would. Each index must not be mutated
    meanwhile (the caller holds whatever lock orders its writes)."""
    requests = []
    for s in searches:
        if type(s) is not Search:
            raise InvalidTypeError(f"search_many takes Search values, got {type(s).__name__}")
        index = s.index
        if not isinstance(index, Index):
            raise InvalidTypeError(f"a Search's index must be an Index, got {type(index).__name__}")
        q = s.query
        if not (type(q) is np.ndarray and q.dtype is _FLOAT32 and q.ndim == 1):
            arr, one = _as_vectors(q, index.dim, "query")
            if not one:
                raise InvalidArgumentError(f"a Search's query is one vector [dim], got shape {list(np.shape(q))}")
            q = arr[0]
        k = s.k if type(s.k) is int and 0 < s.k <= _MAX_EF else _bounded("k", s.k)
        ef = 0 if s.ef is None else (s.ef if type(s.ef) is int and 0 < s.ef <= _MAX_EF else _bounded("ef", s.ef))
        group_by = s.group_by
        group_size = 1
        if group_by is not None:
            if not isinstance(group_by, str) or not group_by:
                raise InvalidTypeError(f"group_by must be a non-empty field name, got {group_by!r}")
            group_size = s.group_size if s.group_size == 1 else _positive("group_size", s.group_size)
        where = None if s.where is None else native_filter(s.where)
        requests.append((index._native, q, k, ef, where, group_by, group_size))
    return _core.search_many(requests, _threads(threads), Group)


def set_search_threads(threads: int) -> None:
    """How many threads (the caller included) work on one :func:`search_many` call: 1 runs
    the searches one after the other; 0 restores the default: a pool of the hardware threads
    (at most 8) of which a call takes only those idle at the moment (the runnable tasks of
    ``/proc/loadavg``, read at most every 20 ms), since on a machine whose cores are all busy
    a search handed to a worker waits for a core longer than it saves. Replaces the pool;
    calls under way finish on the old one."""
    _core.set_search_threads(_threads(threads))


def wake_search_pool(tasks: int) -> None:
    """A hint that a :func:`search_many` call of ``tasks`` searches comes soon (after work of
    the caller's own, such as embedding the query): the pool's workers that call would use
    (none when ``tasks`` < 2 or no core is idle) wake now and look for it for up to 1 ms, so
    the call does not wait for their wake-up (tens of microseconds, as long as a search).
    Costs about a microsecond; the answers do not depend on it."""
    _core.wake_search_pool(tasks if type(tasks) is int and tasks >= 0 else _positive("tasks", tasks))


def search_threads() -> int:
    """The threads (the caller included) working on one :func:`search_many` call."""
    return int(_core.search_threads())
