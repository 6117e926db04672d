"""A segment: one immutable batch of chunks and their documents on disk, memory-mapped."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .types import _GROUP


class _Segment:
    """One immutable batch of chunks (and their documents) on disk, memory-mapped."""

    def __init__(self, entry: dict[str, Any], chunks: Any, docs: Any) -> None:
        self.entry = entry  # the manifest entry (deleted_docs is updated in place)
        self.name: str = entry["name"]
        self.chunks = chunks
        self.docs = docs
        self.ids = _np(chunks.column("__id"), np.int64)
        self.min_id = int(self.ids[0]) if len(self.ids) else 0
        self.max_id = int(self.ids[-1]) if len(self.ids) else -1
        self.contiguous = len(self.ids) == 0 or self.max_id - self.min_id + 1 == len(self.ids)
        self.text = _combine(chunks.column("__text"))
        self.start = _np(chunks.column("__start"), np.int64)
        self.end = _np(chunks.column("__end"), np.int64)
        self.chunk_index = _np(chunks.column("chunk_index"), np.int64)
        self.groups = _np(chunks.column(_GROUP), np.int64)
        counts = _np(docs.column("n_chunks"), np.int64)
        self.doc_offsets = np.concatenate(([0], np.cumsum(counts)))
        self.doc_ids: list[str] = docs.column("document_id").to_pylist()
        self.doc_pipelines: list[str] = docs.column("pipeline_name").to_pylist()
        self.doc_live = np.ones(len(counts), dtype=bool)
        for d in entry.get("deleted_docs", []):
            self.doc_live[d] = False

    @property
    def rows(self) -> int:
        return len(self.ids)

    @property
    def live_rows(self) -> int:
        counts = np.diff(self.doc_offsets)
        return int(counts[self.doc_live].sum())

    def live_mask(self) -> np.ndarray:
        return np.repeat(self.doc_live, np.diff(self.doc_offsets))

    def row(self, chunk_id: int) -> int:
        if self.contiguous:
            return chunk_id - self.min_id
        return int(np.searchsorted(self.ids, chunk_id))

    def doc_row(self, row: int) -> int:
        return int(np.searchsorted(self.doc_offsets, row, side="right")) - 1

    def doc_chunk_ids(self, doc_row: int) -> np.ndarray:
        return self.ids[self.doc_offsets[doc_row]:self.doc_offsets[doc_row + 1]]


def _np(col: Any, dtype: Any) -> np.ndarray:
    arr = _combine(col)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _combine(col: Any) -> Any:
    if hasattr(col, "combine_chunks"):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _text_list(arr: Any) -> list[str]:
    """A pyarrow string array as a list of str for the native BM25 leg (null -> "")."""
    if arr.null_count:
        import pyarrow.compute as pc

        arr = pc.fill_null(arr, "")
    return arr.to_pylist()


def _unlink_all(dirpath: str, names: list[str]) -> None:
    for name in names:
        try:
            os.unlink(os.path.join(dirpath, name))
        except OSError:
            pass
