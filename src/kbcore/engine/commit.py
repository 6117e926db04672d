"""Commits: the only code that writes a knowledge base's files or mutates its published index.

Every mutation (ingest, delete, pipeline or configuration change, checkpoint, compaction,
merging small segments) runs here as a staged transaction, with the knowledge base's writer
held by the caller (:meth:`KnowledgeBase._writing`).

Lock order (always taken in this order, released in reverse):

    KnowledgeBase thread RLock -> FileLock (other processes) -> RWLock.write (searches)
    -> the native index's own lock (taken inside each Index call)

Invariants:

1. New files are named after the new generation (``seg-G.*``, ``index-G.kbi``) and are durable
   (fsynced, and their directory entry fsynced) before a manifest names them.
2. The manifest is replaced last (atomically, :func:`kbcore.engine.storage.save_manifest`): it is the
   commit point. A crash before it leaves the previous state; the new files are then
   unreferenced and collected by the next commit.
3. The index is mutated only while ``RWLock.write()`` is held, and the new :class:`KbState`
   is published (``StateCell.state``) under the same hold, so a search sees the index and
   the segments of one generation.
4. On failure before the commit point: the index changes are undone (in reverse, still under
   the write hold), the new files are unlinked and the old KbState stays published: one
   rollback path, :class:`_Transaction`. After the commit point nothing is rolled back; if
   the in-memory apply fails there, the published state keeps the old generation and the
   next mutation reloads from disk (:meth:`KnowledgeBase._sync`).
5. Unreferenced files are removed only after the manifest that dropped them is durable.
6. A sharded index (:mod:`kbcore.engine.shards`) is durable on its own: no row the manifest
   lists as live is removed from it before the manifest that drops the row is committed, so
   that reopening can always re-sync the shards from the manifest.

:data:`fault_hook` (tests only) is called with the name of a point of a commit:
``"index-written"`` (the index holds the commit's rows, the manifest is not replaced yet),
``"manifest-committed"`` (the manifest is replaced, rows it dropped may still be in the
index) and ``"segments-merged"`` (a merge's segment and manifest are written, not yet
installed); a test kills the process there to check the recovery.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import numpy as np

from ..errors import InvalidArgumentError
from ..index import Index
from . import manifest as policy
from . import storage
from .ingest import ChunkBatch
from .segments import Segment, build_tables, live_tables, text_list
from .shards import close_index, discard, is_sharded
from .state import KbState, StateCell, new_index

#: Called right before the index is saved (the graph builder marks its work as saved).
OnCheckpoint = Callable[[], None]

#: Fault injection for tests: called with the name of a commit point (see the module docstring).
fault_hook: Callable[[str], None] | None = None


def _fault(point: str) -> None:
    if fault_hook is not None:
        fault_hook(point)


class _Transaction:
    """What a commit has done so far, so that a failure undoes exactly that."""

    def __init__(self, cell: StateCell) -> None:
        self.cell = cell
        self.path = cell.state.path
        self._files: list[str] = []
        self._undo: list[Callable[[], None]] = []
        #: the manifest written ahead with the segment (:meth:`write_segment`), not yet installed
        self._manifest_temp: str | None = None

    # -- files ---------------------------------------------------------------------------
    def write_segment(
        self,
        name: str,
        chunks: Any,
        docs: Any,
        vectors: np.ndarray | None,
        *,
        fsync_dir: bool,
        manifest: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Writes ``name``'s files durably; returns its manifest entry ``files``.

        ``fsync_dir=False`` when a checkpoint follows (Index.save fsyncs the directory after
        its rename, which covers these names too). ``manifest``: a function of ``files``
        returning the manifest to commit; it is written with the segment, as a temp file, and
        :meth:`commit_manifest` only renames it. The files, the temp manifest and the
        directory are fsynced concurrently (:func:`kbcore.engine.storage.write_files`): one journal
        transaction per group instead of one per file (~10 ms each on a VM disk)."""
        blobs = [("chunks", f"{name}.chunks.arrow", storage.arrow_bytes(chunks))]
        blobs.append(("docs", f"{name}.docs.arrow", storage.arrow_bytes(docs)))
        if vectors is not None:
            blobs.append(("vectors", f"{name}.vectors.npy", storage.npy_bytes(vectors)))
        files: dict[str, Any] = {"chunks": None, "docs": None, "vectors": None}
        for kind, fname, data in blobs:
            files[kind] = storage.entry_of(fname, data)
        out = [(os.path.join(self.path, fname), data) for _, fname, data in blobs]
        self._files.extend(fname for _, fname, _ in blobs)
        if manifest is not None:
            temp = storage.manifest_temp_name()
            out.append((os.path.join(self.path, temp), storage.manifest_bytes(manifest(files))))
            self._files.append(temp)
            self._manifest_temp = temp
        storage.write_files(out, sync_dir=self.path if fsync_dir or manifest is not None else None)
        return files

    def checkpoint(self, m: dict[str, Any], index: Index, on_checkpoint: OnCheckpoint) -> None:
        """Saves ``index`` as ``m``'s checkpoint (fsyncs the file, renames it, fsyncs the
        directory); drops every vector file entry of ``m``. A sharded index checkpoints every
        shard (``save()``, the shards keep their own files) and ``m`` records the rows covered
        in ``shard_checkpoint`` instead of an index file."""
        on_checkpoint()  # before the save: a batch linked after it marks the graph unsaved again
        if not isinstance(index, Index):
            index.save()
            m["shard_checkpoint"] = {"rows": len(index), "generation": m["generation"]}
            policy.drop_vector_files(m)
            return
        name = f"index-{m['generation']:08d}.kbi"
        self._files.append(name)
        index.save(os.path.join(self.path, name))
        entry = storage.file_entry(self.path, name)
        entry["rows"] = len(index)
        m["index"] = entry
        policy.drop_vector_files(m)

    def _wrote(self, entry: dict[str, Any]) -> dict[str, Any]:
        self._files.append(entry["path"])
        return entry

    # -- the index -----------------------------------------------------------------------
    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Holds ``RWLock.write()``; a failure inside undoes the index changes before the hold
        is released (invariant 3)."""
        with self.cell.rw.write():
            try:
                yield
            except BaseException:
                self._undo_index()
                raise

    def on_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def publish(self, state: KbState) -> None:
        """Makes ``state`` current. Call inside :meth:`exclusive`."""
        self.cell.state = state

    # -- the commit point ------------------------------------------------------------------
    def commit_manifest(self, m: dict[str, Any]) -> None:
        temp, self._manifest_temp = self._manifest_temp, None
        if temp is None:
            storage.save_manifest(self.path, m)
        else:  # written with the segment (the same ``m``): the rename is the commit point
            storage.install_manifest(self.path, temp)
        self._files.clear()
        self._undo.clear()

    def rollback(self) -> None:
        self._undo_index()
        for name in self._files:
            try:
                os.unlink(os.path.join(self.path, name))
            except OSError:
                pass
        self._files.clear()

    def _undo_index(self) -> None:
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            fn()


@contextmanager
def _transaction(cell: StateCell) -> Iterator[_Transaction]:
    txn = _Transaction(cell)
    try:
        yield txn
    except BaseException:
        txn.rollback()
        raise


def _collect(cell: StateCell) -> None:
    storage.remove_unreferenced(cell.state.path, cell.state.manifest)


# -- mutations ---------------------------------------------------------------------------------


def write_new(dirpath: str, m: dict[str, Any]) -> None:
    """Writes the manifest of a new knowledge base into its (temporary) directory."""
    storage.save_manifest(dirpath, m)


def ingest(cell: StateCell, batch: ChunkBatch, vectors: np.ndarray, on_checkpoint: OnCheckpoint) -> set[str]:
    """Stores one batch of documents atomically, replacing the documents of the same ids in
    the batch's pipeline; returns the replaced ids. Compacts afterwards when due."""
    state = cell.state
    n, ndocs = len(vectors), len(batch.doc_ids)
    m = policy.next_generation(state.manifest)
    cfg = m["config"]
    if cfg.get("dim") is None:
        cfg["dim"] = int(vectors.shape[1])
    elif cfg["dim"] != vectors.shape[1]:
        raise InvalidArgumentError(
            f"vectors have dimension {vectors.shape[1]}, knowledge base {state.name!r} has {cfg['dim']}"
        )
    index = state.index
    created = index is None
    if index is None:
        index = new_index(cfg, cfg["dim"], state.path, fresh=True, vectors=state.vectors, mmap=state.mmap)
    sharded = is_sharded(cfg)
    ids = np.arange(m["next_id"], m["next_id"] + n, dtype=np.int64)
    groups = np.arange(m["next_group"], m["next_group"] + ndocs, dtype=np.int64)
    m["next_id"] += n
    m["next_group"] += ndocs
    chunks, meta, doc_table = build_tables(batch, ids, groups)
    keys = [(batch.pipeline, d) for d in batch.doc_ids]
    replaced = [ref for ref in map(state.doc, keys) if ref is not None]
    old_ids = np.concatenate([s.doc_chunk_ids(r) for s, r in replaced]) if replaced else np.empty(0, np.int64)
    ckpt = policy.needs_checkpoint(state.manifest, n)
    name = f"seg-{m['generation']:08d}"
    texts: Any = batch.text_list
    if texts is None:  # an Index reads the Arrow array's buffers; a sharded one splits a list
        texts = text_list(batch.texts) if is_sharded(cfg) else batch.texts
    entry: dict[str, Any] = {"name": name, "rows": n, "docs": ndocs, "deleted_docs": [], "files": None}

    def final_manifest(files: dict[str, Any]) -> dict[str, Any]:
        entry["files"] = files
        m["segments"].append(entry)
        policy.mark_deleted(m, replaced)
        return m

    with _transaction(cell) as txn:
        if ckpt:  # the checkpoint adds the index to the manifest: written after it
            final_manifest(txn.write_segment(name, chunks, doc_table, None, fsync_dir=False))
        else:  # the manifest is final now: written and synced with the segment's files
            txn.write_segment(name, chunks, doc_table, vectors, fsync_dir=True, manifest=final_manifest)
        with txn.exclusive():
            if sharded:  # a shard may apply its part of a failed add: undo what is there
                if created:
                    txn.on_undo(lambda: close_index(index))
                txn.on_undo(lambda: discard(index, ids))
                index.add(vectors, ids, metadata=meta, texts=texts, defer_graph=True)
            else:
                index.add(vectors, ids, metadata=meta, texts=texts, defer_graph=True)
                txn.on_undo(lambda: index.remove(ids))
            if ckpt:
                if not sharded:  # the checkpoint must not hold the replaced rows (invariant 6: a sharded one may)
                    _remove_rows(txn, index, old_ids, replaced)
                txn.checkpoint(m, index, on_checkpoint)
            _fault("index-written")
            txn.commit_manifest(m)
            _fault("manifest-committed")
            if (sharded or not ckpt) and len(old_ids):
                index.remove(old_ids)  # after the commit point: the ids are present, nothing to undo
            txn.publish(
                state.applied(
                    m,
                    index=index,
                    new_segment=Segment(entry, chunks, doc_table),
                    removed=keys,
                    stale_text=False if ckpt else None,
                )
            )
    _collect(cell)
    maybe_compact(cell, on_checkpoint)
    return {s.doc_ids[r] for s, r in replaced}


def _remove_rows(txn: _Transaction, index: Index, ids: np.ndarray, refs: list[tuple[Segment, int]]) -> None:
    """Removes stored rows from the index, keeping what re-adds them on rollback."""
    if not len(ids):
        return
    saved = (index.get_vectors(ids), index.get_metadata(ids), [t for s, r in refs for t in s.doc_texts(r)])
    index.remove(ids)
    txn.on_undo(lambda: index.add(saved[0], ids, metadata=saved[1], texts=saved[2]))


def delete(
    cell: StateCell, keys: list[tuple[str, str]], on_checkpoint: OnCheckpoint, drop_pipeline: str | None = None
) -> int:
    """Deletes the documents of the (pipeline, document id) keys (and a pipeline); returns the
    number of chunks removed. Compacts afterwards when due."""
    state = cell.state
    # The callers pass stored keys (KnowledgeBase resolves them with keys_of first).
    refs = [cast("tuple[Segment, int]", state.doc(k)) for k in keys]
    ids = np.concatenate([s.doc_chunk_ids(r) for s, r in refs]) if refs else np.empty(0, np.int64)
    m = policy.next_generation(state.manifest)
    policy.mark_deleted(m, refs)
    if drop_pipeline is not None:
        del m["pipelines"][drop_pipeline]
    with _transaction(cell) as txn:
        txn.commit_manifest(m)  # no new file: the manifest first, then the index
        _fault("manifest-committed")
        with txn.exclusive():
            if len(ids) and state.index is not None:
                state.index.remove(ids)
            txn.publish(state.applied(m, removed=keys))
    _collect(cell)
    maybe_compact(cell, on_checkpoint)
    return int(len(ids))


def update_manifest(cell: StateCell, change: Callable[[dict[str, Any]], None]) -> None:
    """Commits a change of configuration or pipelines (no data changes)."""
    m = policy.next_generation(cell.state.manifest)
    change(m)
    with _transaction(cell) as txn:
        txn.commit_manifest(m)
        with txn.exclusive():
            txn.publish(cell.state.with_manifest(m))


def checkpoint(cell: StateCell, on_checkpoint: OnCheckpoint, graph_unsaved: bool) -> None:
    """Saves the index when reopening would replay something (tail rows, a rebuilt text leg,
    graph links made since the last save)."""
    state = cell.state
    if state.index is None or not (policy.tail_rows(state.manifest) or state.stale_text or graph_unsaved):
        return
    m = policy.next_generation(state.manifest)
    with _transaction(cell) as txn:
        txn.checkpoint(m, state.index, on_checkpoint)
        txn.commit_manifest(m)
        with txn.exclusive():
            txn.publish(state.applied(m, removed=(), stale_text=False))
    _collect(cell)
    maybe_compact(cell, on_checkpoint)  # every segment is covered now: small ones may merge


def switch_index(
    cell: StateCell,
    index: Index,
    embedder_spec: dict[str, Any],
    on_checkpoint: OnCheckpoint,
    on_publish: Callable[[], None],
) -> None:
    """Makes ``index`` (built off to the side by :mod:`kbcore.engine.reembed`, holding every
    live chunk) the knowledge base's index, with ``embedder_spec`` and its dimension: the index
    is saved as the checkpoint of the next generation (every segment's vector file dropped),
    then the manifest is committed. ``on_publish`` runs under ``RWLock.write()`` right before
    the new state is published (the knowledge base swaps its embedder there)."""
    state = cell.state
    m = policy.next_generation(state.manifest)
    m["config"]["dim"] = int(index.dim)
    m["embedder"] = embedder_spec
    with _transaction(cell) as txn:
        txn.checkpoint(m, index, on_checkpoint)
        _fault("index-written")
        txn.commit_manifest(m)
        _fault("manifest-committed")
        new = state.applied(m, index=index, removed=(), stale_text=False)
        with txn.exclusive():
            on_publish()
            txn.publish(new)
    _collect(cell)


def maybe_compact(cell: StateCell, on_checkpoint: OnCheckpoint) -> None:
    state = cell.state
    # The live rows from the segments, not len(index): that waits for the native lock, which
    # the background graph builder holds while it links a batch.
    if state.index is None:
        return
    live = [s.live_rows for s in state.segments]
    merging = False
    try:
        if policy.needs_compaction(state.manifest, sum(live), len(schema_runs(state.segments))):
            compact(cell, on_checkpoint)
            return
        stop = policy.covered_prefix(state.manifest)
        first = _alike_schemas(state.segments, stop)
        start = policy.merge_start(live[first:stop])
        if start is not None:
            merging = True
            merge(cell, first + start, stop)
    except Exception as exc:  # the mutation before it is committed: do not report it failed
        what = "merging segments" if merging else "compaction"
        warnings.warn(
            f"knowledge base {state.name!r}: {what} failed ({exc}); it is retried after the next change",
            RuntimeWarning,
            stacklevel=3,
        )


def _alike_schemas(segments: tuple[Segment, ...], stop: int) -> int:
    """Where the trailing run of ``segments[:stop]`` whose tables concatenate with those of
    ``segments[stop - 1]`` starts (a metadata column may change type from one batch to the
    next; a column missing from some segments is filled with nulls)."""
    first = stop - 1
    if first <= 0:
        return max(first, 0)
    chunks, docs = [segments[first].chunks.schema], [segments[first].docs.schema]
    while first > 0 and _concatenable(chunks, docs, segments[first - 1]):
        first -= 1
        chunks.append(segments[first].chunks.schema)
        docs.append(segments[first].docs.schema)
    return first


def _concatenable(chunks: list[Any], docs: list[Any], seg: Segment) -> bool:
    """Whether ``seg``'s tables concatenate with tables of the ``chunks`` / ``docs`` schemas
    (as :func:`live_tables` does: missing columns become nulls, types must agree)."""
    import pyarrow as pa

    if seg.chunks.schema.equals(chunks[-1]) and seg.docs.schema.equals(docs[-1]):
        return True
    try:
        pa.unify_schemas([*chunks, seg.chunks.schema], promote_options="default")
        pa.unify_schemas([*docs, seg.docs.schema], promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True


def merge(cell: StateCell, start: int, stop: int) -> None:
    """Rewrites the live chunks of segments ``start`` to ``stop`` (exclusive; segments the
    index checkpoint covers, without vector files) as one segment in their place, in their
    order. The index is not touched: the chunks keep their ids. Fewer segments, fewer files
    for a reopen to map and check."""
    state = cell.state
    m = policy.next_generation(state.manifest)
    tables = live_tables(state.segments[start:stop])
    new_seg = None
    merged: list[dict[str, Any]] = []
    if tables is not None:  # else nothing is live (mark_deleted drops such segments)
        chunks, docs = tables
        name = f"seg-{m['generation']:08d}"
        entry = {"name": name, "rows": chunks.num_rows, "docs": docs.num_rows, "deleted_docs": [], "files": None}
        new_seg = Segment(entry, chunks, docs)
        merged.append(entry)
    m["segments"][start:stop] = merged

    def final_manifest(files: dict[str, Any]) -> dict[str, Any]:
        merged[0]["files"] = files
        return m

    with _transaction(cell) as txn:
        if new_seg is not None:
            txn.write_segment(new_seg.name, new_seg.chunks, new_seg.docs, None, fsync_dir=True, manifest=final_manifest)
            _fault("segments-merged")
        txn.commit_manifest(m)
        with txn.exclusive():
            txn.publish(state.applied(m, new_segment=new_seg))
    _collect(cell)


def compact(cell: StateCell, on_checkpoint: OnCheckpoint) -> None:
    """Rewrites the live chunks into as few segments as their tables allow and checkpoints the
    index, so that deleted chunks' text and vectors no longer take disk space. Searches keep
    running meanwhile. Segments concatenate only with neighbours of the same table schemas (a
    metadata column may change type from one batch to the next, and a value keeps the type it
    was ingested with): each run of alike segments becomes one segment, in id order."""
    state = cell.state
    if state.index is None:
        return
    m = policy.next_generation(state.manifest)
    runs = schema_runs(state.segments)
    first_gen = m["generation"]
    m["generation"] = first_gen + max(len(runs) - 1, 0)  # a new segment per run, each its own name
    new_segs: list[Segment] = []
    m["segments"] = []
    with _transaction(cell) as txn:
        for i, (start, stop) in enumerate(runs):
            tables = live_tables(state.segments[start:stop])
            if tables is None:
                continue
            chunks, docs = tables
            name = f"seg-{first_gen + i:08d}"
            files = txn.write_segment(name, chunks, docs, None, fsync_dir=True)
            entry = {"name": name, "rows": chunks.num_rows, "docs": docs.num_rows, "deleted_docs": [], "files": files}
            m["segments"].append(entry)
            new_segs.append(Segment(entry, chunks, docs))
        txn.checkpoint(m, state.index, on_checkpoint)
        txn.commit_manifest(m)
        with txn.exclusive():
            txn.publish(state.applied(m, new_segments=new_segs, stale_text=False))
    _collect(cell)


def schema_runs(segments: tuple[Segment, ...]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each maximal run of consecutive segments whose tables concatenate
    (:func:`_concatenable`): what one segment can hold."""
    runs: list[tuple[int, int]] = []
    start = 0
    chunks: list[Any] = []
    docs: list[Any] = []
    for i, seg in enumerate(segments):
        if chunks and not _concatenable(chunks, docs, seg):
            runs.append((start, i))
            start, chunks, docs = i, [], []
        chunks.append(seg.chunks.schema)
        docs.append(seg.docs.schema)
    if segments:
        runs.append((start, len(segments)))
    return runs
