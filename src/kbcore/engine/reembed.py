"""Re-embedding: a new index generation built from the stored chunk texts with another
embedder, while searches keep using the published index.

:func:`build` embeds every live chunk of a snapshot into a fresh, unpublished index (the
knowledge base's metric, kind and quantization; the new embedder's dimension) without any
lock: the snapshot's segments are immutable and nothing else sees the new index. Under the
writer, :func:`catch_up` brings it to the current state (embeds the chunks ingested since
the snapshot, drops the chunks deleted since); :func:`kbcore.engine.commit.switch_index`
then checkpoints it and commits the manifest that names it with the new embedder: the one
commit point. A kill before it leaves the old knowledge base (the new index file is
unreferenced and collected by the next commit), after it the new one.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..embedders import check_embeddings
from ..index import Index
from .segments import Segment, text_list
from .state import KbState, new_index
from .types import INTERNAL_COLUMNS


def build(state: KbState, embedder: Any, *, batch_size: int, bar: Any) -> tuple[Index, int, float]:
    """(the new index holding every live chunk of ``state``, chunks embedded, seconds spent
    in ``embedder.embed``). Graph links are deferred (the graph builder makes them once the
    index is published, as after an ingest)."""
    dim = int(embedder.dim)
    index = new_index(state.config, dim)
    total, spent = 0, 0.0
    for seg in state.segments:
        n, s = _add_rows(index, seg, np.flatnonzero(seg.live_mask()), embedder, dim, batch_size, bar)
        total, spent = total + n, spent + s
    return index, total, spent


def catch_up(index: Index, state: KbState, embedder: Any, *, batch_size: int, bar: Any) -> tuple[int, float]:
    """Makes ``index`` hold exactly the live chunks of ``state`` (call with the writer held):
    removes the chunks deleted since :func:`build`'s snapshot and embeds the ones added since.
    Returns (chunks embedded, seconds in the embedder)."""
    parts = [seg.ids[seg.live_mask()] for seg in state.segments]
    live = np.concatenate(parts) if parts else np.empty(0, np.int64)
    have = index.ids()
    extra = np.setdiff1d(have, live, assume_unique=True)
    if len(extra):
        index.remove(extra)
    missing = np.setdiff1d(live, have, assume_unique=True)
    total, spent = 0, 0.0
    if not len(missing):
        return 0, 0.0
    dim = int(index.dim)
    for seg in state.segments:
        rows = np.flatnonzero(np.isin(seg.ids, missing, assume_unique=True))
        n, s = _add_rows(index, seg, rows, embedder, dim, batch_size, bar)
        total, spent = total + n, spent + s
    return total, spent


def _index_rows(seg: Segment, rows: np.ndarray) -> tuple[np.ndarray, Any, Any]:
    """(ids, metadata table, texts as a pyarrow string array) of some rows of ``seg``, as
    :meth:`Index.add` takes them (the Arrow texts are its fast path: read from their buffers
    on the add's thread, no Python str per row). Zero-copy slices for a contiguous run of rows
    (the usual case: a segment without deleted documents), which saves an Arrow ``take`` per
    batch."""
    lo, n = int(rows[0]), len(rows)
    if int(rows[-1]) - lo + 1 != n:
        meta = seg.chunks.take(rows).drop_columns(list(INTERNAL_COLUMNS))
        return seg.ids[rows], meta, seg.text.take(rows)
    meta = seg.chunks.slice(lo, n).drop_columns(list(INTERNAL_COLUMNS))
    return seg.ids[lo : lo + n], meta, seg.text.slice(lo, n)


#: Batches whose ``Index.add`` may be queued behind the one running: the embedder never waits
#: for an add unless the adds fall this far behind (bounded memory: this many batches).
IN_FLIGHT = 2


def _read_batch(seg: Segment, part: np.ndarray) -> tuple[np.ndarray, Any, Any, list[str]]:
    """(ids, metadata, Arrow texts, texts as str) of one batch: what the embedder and the add take."""
    ids, meta, arrow_texts = _index_rows(seg, part)
    return ids, meta, arrow_texts, text_list(arrow_texts)


def _add_rows(
    index: Index, seg: Segment, rows: np.ndarray, embedder: Any, dim: int, batch_size: int, bar: Any
) -> tuple[int, float]:
    """Embeds ``rows`` of ``seg`` batch by batch, in a pipeline around the embedder: the next
    batch's rows and texts are read on one thread while the current batch is embedded, and
    each batch's ``Index.add`` (which releases the GIL: storing rows and metadata, tokenizing
    the BM25 leg) runs on another, at most :data:`IN_FLIGHT` adds queued (bounded memory: a
    few batches). An error is re-raised here and the work still queued cancelled (the index
    is then discarded). Returns (rows, seconds inside ``embedder.embed``)."""
    spent = 0.0
    starts = range(0, len(rows), batch_size)
    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="kbcore-reembed-add") as pool,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="kbcore-reembed-read") as reader,
    ):
        pending: deque[Future[None]] = deque()
        ahead: Future[tuple[np.ndarray, Any, Any, list[str]]] | None = None
        try:
            for k, start in enumerate(starts):
                batch = _read_batch(seg, rows[start : start + batch_size]) if ahead is None else ahead.result()
                ahead = None
                if k + 1 < len(starts):
                    nxt = starts[k + 1]
                    ahead = reader.submit(_read_batch, seg, rows[nxt : nxt + batch_size])
                ids, meta, arrow_texts, texts = batch
                t0 = time.perf_counter()
                out = embedder.embed(texts)
                spent += time.perf_counter() - t0
                vectors = check_embeddings(out, len(texts), dim, repr(embedder))
                while len(pending) >= IN_FLIGHT:
                    pending.popleft().result()
                pending.append(pool.submit(index.add, vectors, ids, metadata=meta, texts=arrow_texts, defer_graph=True))
                bar.update(len(texts))
            while pending:
                pending.popleft().result()
        finally:
            for f in pending:  # an error above: the queued adds are not run (the index is discarded)
                f.cancel()
            if ahead is not None:
                ahead.cancel()
    return int(len(rows)), spent
