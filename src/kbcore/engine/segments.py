"""Segments: immutable batches of chunks (and their documents) on disk, memory-mapped, and the
Arrow tables they are made of.

A segment is three files named after the generation that wrote it: ``seg-G.chunks.arrow``
(one row per chunk: ``__id``, ``__text``, ``__start``, ``__end`` and the chunk metadata),
``seg-G.docs.arrow`` (one row per document) and, until an index checkpoint covers it,
``seg-G.vectors.npy``. This module builds and reads the tables; it writes nothing
(:mod:`kbcore.engine.commit` does). Imports :mod:`.storage`, :mod:`.columns` and the engine's types only.
"""

from __future__ import annotations

import array
import errno
import json
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import FormatError
from . import storage
from .columns import combined, to_numpy
from .types import (
    EXTRA_CHUNK_COLUMNS,
    GROUP_FIELD,
    INTERNAL_COLUMNS,
    PARENT_FIELD,
    PARENT_INDEX,
    PARENT_STRIDE,
    DocumentInfo,
)

if TYPE_CHECKING:
    from .ingest import ChunkBatch


#: a lazily decoded Segment column not decoded yet (None is a value: no such column)
_UNSET: Any = object()

#: Most missing ids a non-contiguous segment keeps a list of (8 B each) to find a chunk's row
#: without numpy; past it, rows are found by a binary search of the segment's ids.
MAX_GAPS = 65536


class Segment:
    """One segment as loaded: its tables and numpy views of the columns the engine reads.

    Immutable: the liveness of its documents (``doc_live``) belongs to one manifest entry's
    ``deleted_docs``; :meth:`with_entry` returns a Segment sharing the tables for a newer one.
    """

    __slots__ = (
        "name",
        "deleted",
        "chunks",
        "docs",
        "ids",
        "min_id",
        "max_id",
        "contiguous",
        "_gaps",
        "_text",
        "_text_views",
        "_start",
        "_end",
        "_chunk_index",
        "groups",
        "doc_offsets",
        "_doc_ids",
        "_doc_pipelines",
        "doc_live",
        "_content",
        "_steps",
    )

    def __init__(self, entry: dict[str, Any], chunks: Any, docs: Any) -> None:
        self.name: str = entry["name"]
        self.deleted: tuple[int, ...] = tuple(entry.get("deleted_docs", ()))
        self.chunks = chunks
        self.docs = docs
        self.ids = to_numpy(chunks.column("__id"), np.int64)
        self.min_id = int(self.ids[0]) if len(self.ids) else 0
        self.max_id = int(self.ids[-1]) if len(self.ids) else -1
        self.contiguous = len(self.ids) == 0 or self.max_id - self.min_id + 1 == len(self.ids)
        self._gaps: Any = _UNSET
        # The columns a hit, a context window or a document's text reads, decoded at their
        # first use (per segment: a query touches the few segments its hits are in). The
        # bytes behind them were checked when the files were read (storage.read_segments).
        self._text: Any = _UNSET
        self._text_views: Any = _UNSET
        self._start: Any = _UNSET
        self._end: Any = _UNSET
        self._chunk_index: Any = _UNSET
        self.groups = to_numpy(chunks.column(GROUP_FIELD), np.int64)
        counts = to_numpy(docs.column("n_chunks"), np.int64)
        self.doc_offsets = np.concatenate(([0], np.cumsum(counts)))
        # Python lists of the documents' ids and pipelines, made at their first use (listing,
        # replacing, deleting documents): opening and searching never need them.
        self._doc_ids: list[str] | None = None
        self._doc_pipelines: list[str] | None = None
        self.doc_live = _liveness(len(counts), self.deleted)
        self._content: Any = _UNSET
        self._steps: Any = _UNSET

    @classmethod
    def read(cls, dirpath: str, entry: dict[str, Any]) -> Segment:
        """Loads the segment of a manifest entry (checksums verified by storage)."""
        return cls(
            entry,
            storage.read_arrow(dirpath, entry["files"]["chunks"]),
            storage.read_arrow(dirpath, entry["files"]["docs"]),
        )

    def with_entry(self, entry: dict[str, Any]) -> Segment:
        """This segment under a newer manifest entry: itself when no more documents were
        deleted, else a copy sharing the tables with the new liveness."""
        deleted = tuple(entry.get("deleted_docs", ()))
        if deleted == self.deleted:
            return self
        new = object.__new__(Segment)
        for name in Segment.__slots__:
            setattr(new, name, getattr(self, name))
        new.deleted = deleted
        new.doc_live = _liveness(len(self.doc_offsets) - 1, deleted)
        return new

    # Lazily decoded columns (built once; a racing first use builds them twice, equal).
    @property
    def text(self) -> Any:
        """The chunk texts (one Arrow string array)."""
        text = self._text
        if text is _UNSET:
            text = self._text = combined(self.chunks.column("__text"))
        return text

    @text.setter
    def text(self, value: Any) -> None:  # a test's stand-in column
        self._text = value

    @property
    def text_views(self) -> tuple[memoryview, memoryview, int] | None:
        """Zero-copy views of :attr:`text` (see :func:`_string_views`), or None."""
        views = self._text_views
        if views is _UNSET:
            views = self._text_views = _string_views(self.text)
        return views

    @text_views.setter
    def text_views(self, value: tuple[memoryview, memoryview, int] | None) -> None:
        self._text_views = value

    @property
    def start(self) -> np.ndarray:
        """Each chunk's start offset in its document (-1: unknown)."""
        col = self._start
        if col is _UNSET:
            col = self._start = to_numpy(self.chunks.column("__start"), np.int64)
        return col

    @property
    def end(self) -> np.ndarray:
        """Each chunk's end offset in its document (-1: unknown)."""
        col = self._end
        if col is _UNSET:
            col = self._end = to_numpy(self.chunks.column("__end"), np.int64)
        return col

    @property
    def chunk_index(self) -> np.ndarray:
        """Each chunk's index in its document."""
        col = self._chunk_index
        if col is _UNSET:
            col = self._chunk_index = to_numpy(self.chunks.column("chunk_index"), np.int64)
        return col

    @property
    def content(self) -> Any:
        """The optional answer column (a QA pair's answer), None when the segment has none
        (or only nulls)."""
        col = self._content
        if col is _UNSET:
            names = self.chunks.column_names
            col = self._content = _optional_text(self.chunks, "__content") if "__content" in names else None
        return col

    @property
    def steps(self) -> Any:
        """The optional stored intermediate step outputs (JSON text), None when the segment
        has none (or only nulls)."""
        col = self._steps
        if col is _UNSET:
            names = self.chunks.column_names
            col = self._steps = _optional_text(self.chunks, "__steps") if "__steps" in names else None
        return col

    @property
    def doc_ids(self) -> list[str]:
        """The id of each document row (built once; a racing first use builds it twice, equal)."""
        ids = self._doc_ids
        if ids is None:
            ids = self._doc_ids = self.docs.column("document_id").to_pylist()
        return ids

    @property
    def doc_pipelines(self) -> list[str]:
        """The pipeline of each document row (one str object per distinct pipeline)."""
        pipes = self._doc_pipelines
        if pipes is None:
            enc = combined(self.docs.column("pipeline_name")).dictionary_encode()
            names = enc.dictionary.to_pylist()
            pipes = self._doc_pipelines = [names[i] for i in enc.indices.to_numpy().tolist()]
        return pipes

    @property
    def rows(self) -> int:
        return len(self.ids)

    @property
    def live_rows(self) -> int:
        counts = np.diff(self.doc_offsets)
        return int(counts[self.doc_live].sum())

    def live_mask(self) -> np.ndarray:
        return np.repeat(self.doc_live, np.diff(self.doc_offsets))

    @property
    def gaps(self) -> array.array | None:
        """The ids missing between this segment's first and last (sorted; chunks dropped when
        the segment was merged), when there are at most :data:`MAX_GAPS` of them, else None:
        a chunk's row is then its id's offset from the first minus the gaps below it."""
        gaps = self._gaps
        if gaps is _UNSET:
            gaps = self._gaps = _missing_ids(self.ids, self.min_id, self.max_id)
        return gaps

    def row(self, chunk_id: int) -> int:
        """The row of a stored chunk id."""
        if self.contiguous:
            return chunk_id - self.min_id
        gaps = self.gaps
        if gaps is not None:  # a bisect over a few gaps: no numpy call per id
            return chunk_id - self.min_id - bisect_left(gaps, chunk_id)
        return int(np.searchsorted(self.ids, chunk_id))

    def text_of(self, row: int) -> str:
        """The text of one chunk row, read from the Arrow buffers (no Arrow scalar per hit)."""
        views = self.text_views
        if views is None:
            return self.text[row].as_py()
        offsets, data, base = views
        i = row + base
        return str(data[offsets[i] : offsets[i + 1]], "utf-8")

    def rows_of(self, chunk_ids: np.ndarray) -> np.ndarray:
        if self.contiguous:
            return chunk_ids - self.min_id
        return np.searchsorted(self.ids, chunk_ids)

    def doc_chunk_ids(self, doc_row: int) -> np.ndarray:
        return self.ids[self.doc_offsets[doc_row] : self.doc_offsets[doc_row + 1]]

    def doc_texts(self, doc_row: int) -> list[str]:
        """The chunk texts of one document (for the BM25 leg)."""
        return text_list(self.text[self.doc_offsets[doc_row] : self.doc_offsets[doc_row + 1]])

    def index_rows(self, rows: np.ndarray) -> tuple[np.ndarray, Any, list[str]]:
        """(ids, metadata table, texts) of some rows, as :meth:`Index.add` takes them."""
        meta = self.chunks.take(rows).drop_columns(internal_columns(self.chunks))
        return self.ids[rows], meta, text_list(self.text.take(rows))

    def content_of(self, row: int) -> str | None:
        """The text a hit on this row returns instead of its searched text (a QA pair's
        answer), or None."""
        if self.content is None or not self.content[row].is_valid:
            return None
        return self.content[row].as_py()

    def steps_of(self, row: int) -> dict[str, Any]:
        """The stored intermediate step outputs of one chunk row (step name -> output)."""
        if self.steps is None or not self.steps[row].is_valid:
            return {}
        return json.loads(self.steps[row].as_py())


def internal_columns(table: Any) -> list[str]:
    """The internal (non-metadata) columns of a chunk table."""
    names = set(table.column_names)
    return list(INTERNAL_COLUMNS) + [c for c in EXTRA_CHUNK_COLUMNS if c in names]


def _optional_text(chunks: Any, name: str) -> Any:
    col = combined(chunks.column(name))
    return None if col.null_count == len(col) else col


def _missing_ids(ids: np.ndarray, first: int, last: int) -> array.array | None:
    """The ids in [first, last] that ``ids`` (sorted, unique, from first to last) lacks,
    as an array of int64, or None when there are more than :data:`MAX_GAPS`."""
    if last - first + 1 - len(ids) > MAX_GAPS:
        return None
    after = np.flatnonzero(np.diff(ids) > 1)  # ids[i] is followed by a gap
    lengths = ids[after + 1] - ids[after] - 1
    # Run r's ids: ids[after[r]] + 1 + j for j < lengths[r], numbered across all runs.
    before = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    missing = np.repeat(ids[after] + 1 - before, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    out = array.array("q")
    out.frombytes(missing.astype(np.int64).tobytes())
    return out


def _liveness(ndocs: int, deleted: tuple[int, ...]) -> np.ndarray:
    live = np.ones(ndocs, dtype=bool)
    live[list(deleted)] = False
    return live


def build_tables(batch: ChunkBatch, ids: np.ndarray, groups: np.ndarray) -> tuple[Any, Any, Any]:
    """(chunk table, its metadata columns for the index, document table) of a batch whose
    chunks get ``ids`` and whose documents get dedup ``groups``."""
    import pyarrow as pa

    n, ndocs = len(ids), len(batch.doc_ids)
    doc_of_row = pa.array(np.repeat(np.arange(ndocs), batch.counts))
    doc_id_arr = pa.array(batch.doc_ids, pa.string()).take(doc_of_row)
    fname = (
        batch.filename_rows
        if batch.filename_rows is not None
        else pa.array(batch.filenames, pa.string()).take(doc_of_row)
    )
    cols: dict[str, Any] = {
        "__id": pa.array(ids),
        "__text": batch.texts,
        "__start": pa.array(batch.starts),
        "__end": pa.array(batch.ends),
        "document_id": doc_id_arr,
        "file_id": doc_id_arr,
        "chunk_index": pa.array(batch.chunk_index, pa.int64()),
        "filename": fname,
        "pipeline_name": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, np.int32)), pa.array([batch.pipeline])
        ).cast(pa.string()),
        GROUP_FIELD: pa.array(np.repeat(groups, batch.counts)),
    }
    if batch.user is not None:
        for c in batch.user.column_names:
            cols[c] = combined(batch.user.column(c))
        if PARENT_INDEX in cols:  # a parent-child batch: the key grouping each parent's children
            parents = to_numpy(cols[PARENT_INDEX], np.int64)
            cols[PARENT_FIELD] = pa.array(np.repeat(groups, batch.counts) * PARENT_STRIDE + parents)
    if batch.contents is not None:
        cols["__content"] = batch.contents
    if batch.steps is not None:
        cols["__steps"] = batch.steps
    chunks = pa.table(cols)
    doc_table = pa.table(
        {
            "document_id": pa.array(batch.doc_ids, pa.string()),
            "pipeline_name": pa.array([batch.pipeline] * ndocs, pa.string()),
            "filename": pa.array(batch.filenames, pa.string()),
            "text": pa.array(batch.doc_texts, pa.large_string()),
            "format": pa.array(batch.formats, pa.string()),
            "n_chunks": pa.array(batch.counts, pa.int64()),
            "group": pa.array(groups),
            "metadata": pa.array(batch.doc_metadata, pa.string()),
            "ingested_at": pa.array(np.full(ndocs, time.time())),
        }
    )
    for col, values, typ in (
        ("source_id", batch.source_ids, pa.string()),
        ("content_hash", batch.content_hashes, pa.string()),
        ("chunk_hashes", batch.chunk_hashes, pa.binary()),
    ):
        if values is not None:  # sync's bookkeeping; older segments lack it (read as null)
            doc_table = doc_table.append_column(col, pa.array(values, typ))
    return chunks, chunks.drop_columns(internal_columns(chunks)), doc_table


def live_tables(segments: tuple[Segment, ...]) -> tuple[Any, Any] | None:
    """(chunk table, document table) of the live rows of every segment, concatenated; None
    when nothing is live (compaction)."""
    import pyarrow as pa

    chunk_parts, doc_parts = [], []
    for seg in segments:
        if seg.doc_live.all():  # no filter: it would copy every column once more
            chunk_parts.append(seg.chunks)
            doc_parts.append(seg.docs)
        elif seg.doc_live.any():
            chunk_parts.append(seg.chunks.filter(pa.array(seg.live_mask())))
            doc_parts.append(seg.docs.filter(pa.array(seg.doc_live)))
    if not chunk_parts:
        return None
    return (
        pa.concat_tables(chunk_parts, promote_options="default").combine_chunks(),
        pa.concat_tables(doc_parts, promote_options="default").combine_chunks(),
    )


# -- Arrow column helpers ----------------------------------------------------------------------


def _string_views(arr: Any) -> tuple[memoryview, memoryview, int] | None:
    """(offsets, UTF-8 bytes, first offset index) of a string array without nulls, as zero-copy
    memoryviews (indexing a memoryview gives Python ints); None for other arrays."""
    import pyarrow as pa

    if arr.null_count or len(arr) == 0:
        return None
    large = pa.types.is_large_string(arr.type)
    if not large and not pa.types.is_string(arr.type):
        return None
    _, offsets, data = arr.buffers()
    n = arr.offset + len(arr) + 1
    raw = memoryview(offsets).cast("B")
    off = raw[: n * 8].cast("q") if large else raw[: n * 4].cast("i")
    return off, memoryview(data if data is not None else b"").cast("B"), arr.offset


def text_list(arr: Any) -> list[str]:
    """A pyarrow string array as a list of str for the native BM25 leg (null -> "")."""
    if arr.null_count:
        import pyarrow.compute as pc

        arr = pc.fill_null(arr, "")
    return arr.to_pylist()


# -- documents -----------------------------------------------------------------------------------


def document_text(seg: Segment, d: int) -> str:
    """The source text of document row ``d``: as parsed at ingest, or (for pre-embedded
    chunks) rebuilt from its chunks in chunk order, placed at their spans when known."""
    text = seg.docs.column("text")[d].as_py()
    if text is not None:
        return text
    lo, hi = int(seg.doc_offsets[d]), int(seg.doc_offsets[d + 1])
    rows = sorted(range(lo, hi), key=lambda r: int(seg.chunk_index[r]))
    out = ""
    end = 0
    for r in rows:
        piece = seg.text[r].as_py()
        s, e = int(seg.start[r]), int(seg.end[r])
        if s < 0 or e < 0:
            out = piece if not out else out + "\n\n" + piece
            continue
        if s > end:
            out += " " * (s - end) if out else ""
            out += piece
        elif e > end:
            out += piece[end - s :]
        end = max(end, e)
    return out


def document_infos(seg: Segment, pipeline: str | None) -> list[DocumentInfo]:
    """The live documents of a segment (of one pipeline, or all), in ingest order."""
    meta = seg.docs.column("metadata").to_pylist()
    fnames = seg.docs.column("filename").to_pylist()
    fmts = seg.docs.column("format").to_pylist()
    when = seg.docs.column("ingested_at").to_pylist()
    counts = np.diff(seg.doc_offsets)
    out = []
    for d in np.flatnonzero(seg.doc_live):
        if pipeline is not None and seg.doc_pipelines[d] != pipeline:
            continue
        out.append(
            DocumentInfo(
                seg.doc_ids[d],
                seg.doc_pipelines[d],
                fnames[d],
                int(counts[d]),
                _metadata(seg, int(d), meta[d]),
                fmts[d],
                when[d],
            )
        )
    return out


def _metadata(seg: Segment, row: int, text: Any) -> dict[str, Any]:
    """A document's stored metadata, checked here rather than when the segment is opened (an
    open parses no per-document JSON): FormatError naming the file if it is not a JSON object."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise FormatError(
            errno.EIO, f"knowledge base file '{seg.name}.docs.arrow': document {row}'s metadata is not a JSON object"
        )
    return value
