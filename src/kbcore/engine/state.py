"""KbState: an immutable snapshot of one knowledge base (manifest, segments, document map,
index), and StateCell, the one pointer to the current snapshot.

A mutation never edits a KbState: :mod:`kbcore.engine.commit` builds the next one
(:meth:`KbState.applied`) and swaps ``StateCell.state`` while it holds ``StateCell.rw.write()``,
together with the index mutation. A reader takes ``rw.read()`` and uses one snapshot
throughout, so it sees the index and the segments of the same generation.

:meth:`KbState.load` builds the index of a snapshot from the files (checkpoint plus replay);
that index is private until the snapshot is published, so building it here does not break
the rule that only :mod:`kbcore.engine.commit` mutates a published index. The index of a
sharded knowledge base is a :class:`~kbcore.distributed.ShardedIndex` whose shards are
durable on their own; :func:`_reconcile` then re-syncs them with the manifest (the rule is
in :mod:`kbcore.engine.shards`).
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FormatError, InvalidArgumentError, NotFoundError
from ..index import Index, IndexSpec, Vectors
from . import shards as _shards
from . import storage
from .locks import RWLock
from .manifest import checkpoint_rows, tail_rows
from .segments import Segment
from .types import SEARCH_DEFAULTS, KbStats

#: (segment name, document row in it): stays valid when the segment gets a newer entry
DocRef = tuple[str, int]


@dataclass(frozen=True, slots=True, eq=False)
class KbState:
    """One generation of a knowledge base, as loaded or as committed."""

    name: str
    path: str
    manifest: dict[str, Any]
    segments: tuple[Segment, ...]
    docs: Mapping[tuple[str, str], DocRef]  # (pipeline, document id) -> where it is stored
    index: Index | None
    #: the index's text leg was rebuilt on load and is not checkpointed yet
    stale_text: bool = False
    seg_mins: list[int] = field(default_factory=list)
    #: (search_type, fusion, vector_weight) of the configuration, resolved once
    defaults: tuple[str, str, float] = ("vector", "rrf", 0.7)
    by_name: dict[str, Segment] = field(default_factory=dict)
    #: where this process keeps the float32 rows ("memory" / "disk"): the configuration's
    #: ``vectors``, or the override the knowledge base was opened with (:func:`vectors_of`)
    vectors: str = "memory"
    #: whether this process reads a reopened index in place from its file (the ``mmap`` it
    #: was opened with; a sharded knowledge base's shards reopen the same way)
    mmap: bool = True

    @classmethod
    def build(
        cls,
        name: str,
        path: str,
        manifest: dict[str, Any],
        segments: tuple[Segment, ...],
        docs: Mapping[tuple[str, str], DocRef],
        index: Index | None,
        stale_text: bool = False,
        vectors: str = "memory",
        mmap: bool = True,
    ) -> KbState:
        cfg = manifest["config"]
        defaults = tuple(cfg.get(k, v) for k, v in SEARCH_DEFAULTS.items())
        return cls(
            name,
            path,
            manifest,
            segments,
            docs,
            index,
            stale_text,
            [s.min_id for s in segments],
            defaults,
            {s.name: s for s in segments},
            vectors,
            mmap,
        )

    # -- reading --------------------------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        return self.manifest["config"]

    @property
    def generation(self) -> int:
        return int(self.manifest["generation"])

    def pipeline(self, name: str) -> dict[str, int]:
        """A pipeline's chunking; NotFoundError listing the pipelines if there is none."""
        p = self.manifest["pipelines"].get(name)
        if p is None:
            known = ", ".join(sorted(self.manifest["pipelines"]))
            raise NotFoundError(f"knowledge base {self.name!r} has no pipeline {name!r} (pipelines: {known})")
        return p

    def doc(self, key: tuple[str, str]) -> tuple[Segment, int] | None:
        """(segment, document row) of a stored (pipeline, document id), else None."""
        ref = self.docs.get(key)
        return None if ref is None else (self.by_name[ref[0]], ref[1])

    def keys_of(self, document_id: str, pipeline: str | None) -> list[tuple[str, str]]:
        """The (pipeline, document id) keys of a stored document (in one pipeline, or all)."""
        return [k for k in self.docs if k[1] == document_id and (pipeline is None or k[0] == pipeline)]

    def locate(self, chunk_id: int) -> tuple[Segment, int]:
        """(segment, row) of a stored chunk id."""
        seg = self.segments[bisect.bisect_right(self.seg_mins, chunk_id) - 1]
        return seg, seg.row(chunk_id)

    def groups_of(self, ids: np.ndarray) -> np.ndarray:
        """The dedup group (the ``_group`` field) of each stored chunk id, read from the
        segments' group column: one vectorised lookup per segment met, no copy."""
        where = np.searchsorted(np.asarray(self.seg_mins), ids, side="right") - 1
        out = np.empty(len(ids), np.int64)
        for s in np.unique(where).tolist():
            sel = where == s
            seg = self.segments[s]
            out[sel] = seg.groups[seg.rows_of(ids[sel])]
        return out

    def stats(self) -> KbStats:
        m = self.manifest
        index = self.index
        return KbStats(
            chunks=0 if index is None else len(index),
            documents=len(self.docs),
            segments=len(m["segments"]),
            tail_rows=tail_rows(m),
            checkpoint_rows=checkpoint_rows(m),
            vector_files=sum(1 for s in m["segments"] if s["files"].get("vectors")),
            pending_graph_rows=0 if index is None else index.pending,
            text_leg_unsaved=self.stale_text,
            generation=self.generation,
        )

    # -- the next generation ------------------------------------------------------------------
    def applied(
        self,
        m: dict[str, Any],
        *,
        index: Index | None = None,
        new_segment: Segment | None = None,
        new_segments: Iterable[Segment] = (),
        removed: Iterable[tuple[str, str]] | None = None,
        stale_text: bool | None = None,
    ) -> KbState:
        """The snapshot of manifest ``m`` (committed), built from this one.

        ``new_segment`` is the segment the mutation wrote (``new_segments``: the several a
        compaction writes); ``removed`` the (pipeline, document) keys it deleted, so that the
        document map is updated instead of rebuilt (None: rebuild it from the segments)."""
        old = dict(self.by_name)
        for seg in new_segments:
            old[seg.name] = seg
        if new_segment is not None:
            old[new_segment.name] = new_segment
        segments = tuple(old[e["name"]].with_entry(e) for e in m["segments"])
        docs: Mapping[tuple[str, str], DocRef]
        if removed is None:
            docs = LazyDocMap(segments)
        else:
            docs = dict(self.docs)
            for key in removed:
                docs.pop(key, None)
            if new_segment is not None:
                for d, key in enumerate(zip(new_segment.doc_pipelines, new_segment.doc_ids)):
                    docs[key] = (new_segment.name, d)
        return KbState.build(
            self.name,
            self.path,
            m,
            segments,
            docs,
            self.index if index is None else index,
            self.stale_text if stale_text is None else stale_text,
            self.vectors,
            self.mmap,
        )

    def with_manifest(self, m: dict[str, Any]) -> KbState:
        """The same data under a manifest that changed only its configuration or pipelines."""
        return KbState.build(
            self.name, self.path, m, self.segments, self.docs, self.index, self.stale_text, self.vectors, self.mmap
        )

    # -- loading --------------------------------------------------------------------------------
    @classmethod
    def load(cls, name: str, path: str, vectors: str | None = None, *, mmap: bool = True) -> KbState:
        """Reads the manifest, the segments and the index checkpoint, and brings the index up
        to the manifest (replaying the tail; rebuilding a missing text leg once).

        ``vectors`` overrides the configuration's ``vectors`` for this process (see
        :func:`vectors_of`); None opens the index as it was saved. ``mmap`` as for
        :meth:`kbcore.Index.load`: the checkpoint read in place (True) or copied into memory.

        Holds the reader lock (:func:`kbcore.engine.storage.reading`) throughout, so a writer in
        another process does not delete the files of the manifest read here meanwhile; every
        file is validated (:func:`kbcore.engine.storage.read_segments`): FormatError."""
        with storage.reading(path):
            return cls._load_locked(name, path, vectors, mmap)

    @classmethod
    def _load_locked(cls, name: str, path: str, override: str | None, mmap: bool = True) -> KbState:
        m = storage.load_manifest(path)
        cfg = m["config"]
        vectors = vectors_of(cfg, override)
        loading = None
        if m.get("index"):
            # The size against the manifest here; the content when the native loader reads it
            # (its header fields and the payload checksum cover every byte: FormatError). The
            # native load (no GIL) runs beside the segments' checks, which are mostly CRC-32 and
            # Arrow validation without the GIL too: a reopen waits for the longer of the two.
            storage.check_size(path, m["index"])
            loading = _Background(Index.load, os.path.join(path, m["index"]["path"]), vectors=vectors, mmap=mmap)
        try:
            segments = tuple(Segment(e, c, d) for e, c, d in storage.read_segments(path, m))
        except BaseException:
            if loading is not None:
                loading.abandon()
            raise
        index = None
        if loading is not None:
            index = loading.result()
        elif cfg.get("dim"):
            index = new_index(cfg, int(cfg["dim"]), path, vectors=vectors, mmap=mmap)
        stale_text = False
        if index is not None:
            _reconcile(path, index, segments, m["segments"])
            if not _shards.is_sharded(cfg) and index.text_documents() != len(
                index
            ):  # written before the text leg existed
                index = _rebuild_text_leg(index, segments, cfg)
                stale_text = True
        return cls.build(name, path, m, segments, LazyDocMap(segments), index, stale_text, vectors, mmap)


class _Background:
    """``fn(*args, **kwargs)`` on a thread of its own, started at once: :meth:`result` waits and
    returns its value or raises its exception; :meth:`abandon` waits and drops both (a caller
    that failed meanwhile reports its own error)."""

    __slots__ = ("_error", "_thread", "_value")

    def __init__(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller by result()
                self._error = exc

        self._thread = threading.Thread(target=run, name="kbcore-load", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._value

    def abandon(self) -> None:
        self._thread.join()
        self._value = self._error = None


class StateCell:
    """The current KbState of a knowledge base and the lock that orders its swaps against
    searches. Only :mod:`kbcore.engine.commit` assigns ``state`` (under ``rw.write()``)."""

    __slots__ = ("rw", "state")

    def __init__(self, state: KbState) -> None:
        self.rw = RWLock()
        self.state = state


def vectors_of(cfg: dict[str, Any], override: str | None = None) -> Vectors:
    """Where a knowledge base's float32 rows live in this process: ``override`` ("memory" or
    "disk", for a quantized, unsharded knowledge base; others keep "memory"), else the
    configuration's ``vectors`` (absent: "memory")."""
    if override is None:
        return "disk" if cfg.get("vectors") == "disk" else "memory"  # the manifest check allows only these
    if override not in ("memory", "disk"):
        raise InvalidArgumentError(f"unknown vectors {override!r}; expected 'memory', 'disk' or None")
    if override == "disk" and (not cfg.get("quantization") or _shards.is_sharded(cfg)):
        return "memory"
    return "disk" if override == "disk" else "memory"


def new_index(
    cfg: dict[str, Any],
    dim: int,
    path: str | None = None,
    *,
    fresh: bool = False,
    vectors: str | None = None,
    mmap: bool = True,
) -> Index:
    """An empty index of a knowledge base's configuration (its rows where ``vectors`` says,
    default the configuration's); for a sharded knowledge base (at ``path``) its ShardedIndex,
    loaded or created, whose shards reopen their checkpoints as ``mmap`` says (see
    :func:`kbcore.engine.shards.open_index`)."""
    if _shards.is_sharded(cfg):
        assert path is not None
        return _shards.open_index(path, cfg, dim, fresh=fresh, mmap=mmap)
    return Index(dim, spec=IndexSpec.from_config(cfg).replace(vectors=vectors_of(cfg, vectors)))


def _doc_map(segments: tuple[Segment, ...]) -> dict[tuple[str, str], DocRef]:
    docs: dict[tuple[str, str], DocRef] = {}
    for seg in segments:
        live = np.flatnonzero(seg.doc_live).tolist()
        pipes, ids, name = seg.doc_pipelines, seg.doc_ids, seg.name
        docs.update(zip(zip([pipes[d] for d in live], [ids[d] for d in live]), [(name, d) for d in live]))
    return docs


class LazyDocMap(Mapping[tuple[str, str], DocRef]):
    """The document map of a snapshot ((pipeline, document id) -> (segment, row)), built from
    the segments at its first use: opening a knowledge base and searching it never need it."""

    __slots__ = ("_segments", "_map", "_lock")

    def __init__(self, segments: tuple[Segment, ...]) -> None:
        self._segments = segments
        self._map: dict[tuple[str, str], DocRef] | None = None
        self._lock = threading.Lock()

    def _built(self) -> dict[tuple[str, str], DocRef]:
        m = self._map
        if m is None:
            with self._lock:
                m = self._map
                if m is None:
                    m = self._map = _doc_map(self._segments)
        return m

    def __getitem__(self, key: tuple[str, str]) -> DocRef:
        return self._built()[key]

    def get(self, key: tuple[str, str], default: Any = None) -> Any:
        return self._built().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._built()

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


def _reconcile(path: str, index: Index, segments: tuple[Segment, ...], entries: list[dict[str, Any]]) -> None:
    """Brings an index checkpoint up to the manifest: adds the live chunks it lacks (from the
    segments' vector files), removes the chunks deleted since."""
    live_parts = [seg.ids[seg.live_mask()] for seg in segments]
    live = np.concatenate(live_parts) if live_parts else np.empty(0, np.int64)
    have = index.ids()
    if len(have) == len(live) and np.array_equal(have, live):
        return  # the checkpoint is up to date (the usual reopen): no sort of a million ids
    extra, missing = _id_differences(have, live)
    if len(extra):
        index.remove(extra)
    if not len(missing):
        return
    for seg, entry in zip(segments, entries):
        sel = np.isin(seg.ids, missing, assume_unique=True)
        if not sel.any():
            continue
        ventry = entry["files"].get("vectors")
        if not ventry:
            raise FormatError(
                5,
                f"knowledge base {path!r} is inconsistent: segment {seg.name} has "
                "chunks missing from the index and no vector file",
            )
        vectors = storage.read_npy(path, ventry, rows=seg.rows, dim=index.dim)
        rows = np.flatnonzero(sel)
        ids, meta, texts = seg.index_rows(rows)
        index.add(vectors[rows], ids, metadata=meta, texts=texts, defer_graph=True)


def _id_differences(have: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids in ``have`` not in ``live``, ids in ``live`` not in ``have``): two bitmaps over the
    id range instead of sorting both (ids are >= 0, ``live`` validated below next_id)."""
    bound = int(max(have.max(initial=-1), live.max(initial=-1))) + 1
    if have.min(initial=0) < 0 or bound > 8 * (len(have) + len(live)) + 4096:  # sparse: sort instead
        return np.setdiff1d(have, live, assume_unique=True), np.setdiff1d(live, have, assume_unique=True)
    in_live = np.zeros(bound, bool)
    in_live[live] = True
    in_have = np.zeros(bound, bool)
    in_have[have] = True
    return have[~in_live[have]], live[~in_have[live]]


def _rebuild_text_leg(index: Index, segments: tuple[Segment, ...], cfg: dict[str, Any]) -> Index:
    """A copy of ``index`` whose BM25 leg holds every live chunk's text (from the segments).

    Index files written before the engine fed chunk text to the native BM25 index have no
    text leg; the vectors are re-added to a fresh index together with their text and
    metadata. Runs once: the next checkpoint (at the latest on close) persists the result.
    """
    fresh = new_index(cfg, index.dim, vectors=index.vectors)
    for seg in segments:
        rows = np.flatnonzero(seg.live_mask())
        if len(rows):
            ids, meta, texts = seg.index_rows(rows)
            fresh.add(index.get_vectors(ids), ids, metadata=meta, texts=texts, defer_graph=True)
    return fresh
