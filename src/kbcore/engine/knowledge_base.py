"""KnowledgeBase: one persistent knowledge base."""

from __future__ import annotations

import bisect
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import storage
from ..chunking import check_chunk_params
from ..embedders import check_embeddings, embedder_from_spec, embedder_spec
from ..errors import FormatError, InvalidArgumentError, InvalidTypeError, NotFoundError
from ..filters import native_filter
from ..fusion import check_rrf_k, check_vector_weight, linear, normalize_rrf, rrf
from ..index import Index, _as_vectors
from . import manifest as _policy
from .graph_builder import _LIVE_BUILDERS
from .ingest import _COMMIT_ROWS, _as_document, _as_table, _check_meta_key, _DocsIn, _prepare, _Prepared, _progress, _user_metadata_table, _vectors_from_column
from .locks import _RWLock
from .retrieval import _search_groups
from .scores import _score, _scores
from .segments import _combine, _np, _Segment, _text_list, _unlink_all
from .types import (
    _DEFAULT_PIPELINE,
    _GROUP,
    _INTERNAL_COLUMNS,
    _SEARCH_DEFAULTS,
    FUSIONS,
    SEARCH_TYPES,
    Document,
    DocumentInfo,
    Hit,
    IngestResult,
    KeyResult,
    TextResult,
    _check_choice,
    _check_name,
)

if TYPE_CHECKING:
    from .directory import Engine


class KnowledgeBase:
    """A persistent knowledge base. Get one from :class:`Engine`; do not construct directly."""

    def __init__(self, engine: Engine, name: str, path: str, embedder: Any | None) -> None:
        self._engine = engine
        self.name = name
        self.path = path
        self._explicit_embedder = embedder
        self._rw = _RWLock()
        self._wmutex = threading.RLock()
        self._flock = storage.FileLock(os.path.join(path, storage.LOCK))
        self._closed = False
        self._index: Index | None = None
        self._segments: list[_Segment] = []
        self._seg_mins: list[int] = []
        self._docs: dict[tuple[str, str], tuple[_Segment, int]] = {}
        self._lookup: tuple[np.ndarray, np.ndarray] | None = None
        self._manifest: dict[str, Any] = {}
        self._stale_text = False  # the index's text leg was rebuilt on load: checkpoint it
        self._graph_unsaved = False  # the background builder linked rows since the last save
        # Background graph building: ingest stores rows with defer_graph=True (searchable at
        # once by an exact scan of the rows not yet in the graph) and this thread links them
        # into the HNSW graph in small batches, each holding the native write lock briefly.
        self._builder: threading.Thread | None = None
        self._builder_stop = threading.Event()
        self._load()
        self._start_graph_builder()

    # -- properties ------------------------------------------------------------------------
    @property
    def metric(self) -> str:
        return self._manifest["config"]["metric"]

    @property
    def dim(self) -> int | None:
        return self._manifest["config"].get("dim")

    @property
    def embedder(self) -> Any | None:
        """The embedder of text queries and text ingest (None: vectors only)."""
        return self._embedder

    @property
    def search_defaults(self) -> dict[str, Any]:
        """``search_type``, ``fusion`` and ``vector_weight`` used when ``retrieve`` is not given
        them (set at creation or with :meth:`set_search_defaults`)."""
        cfg = self._manifest["config"]
        return {k: cfg.get(k, v) for k, v in _SEARCH_DEFAULTS.items()}

    def set_search_defaults(self, *, search_type: str | None = None, fusion: str | None = None,
                            vector_weight: float | None = None) -> None:
        """Changes the knowledge base's search defaults (durably); None keeps a value."""
        new = self.search_defaults
        if search_type is not None:
            new["search_type"] = _check_choice("search_type", search_type, SEARCH_TYPES)
        if fusion is not None:
            new["fusion"] = _check_choice("fusion", fusion, FUSIONS)
        if vector_weight is not None:
            new["vector_weight"] = check_vector_weight(vector_weight)
        with self._writing():
            m = self._next_manifest()
            m["config"].update(new)
            self._commit_manifest(m)
            with self._rw.write():
                self._apply(m, removed=())

    @property
    def pipelines(self) -> dict[str, dict[str, int]]:
        """Pipeline name -> {"chunk_size", "chunk_overlap"}."""
        return {k: dict(v) for k, v in self._manifest["pipelines"].items()}

    def __len__(self) -> int:
        """Number of stored chunks."""
        return 0 if self._index is None else len(self._index)

    def __repr__(self) -> str:
        return (f"KnowledgeBase({self.name!r}, chunks={len(self)}, documents={len(self._docs)}, "
                f"metric={self.metric!r}, dim={self.dim})")

    # -- loading -----------------------------------------------------------------------------
    def _load(self) -> None:
        m = storage.load_manifest(self.path)
        cfg = m["config"]
        segments = []
        for entry in m["segments"]:
            chunks = storage.read_arrow(self.path, entry["files"]["chunks"])
            docs = storage.read_arrow(self.path, entry["files"]["docs"])
            segments.append(_Segment(entry, chunks, docs))
        index = None
        if m.get("index"):
            storage.check_entry(self.path, m["index"])
            index = Index.load(os.path.join(self.path, m["index"]["path"]))
        elif cfg.get("dim"):
            index = self._new_index(cfg, int(cfg["dim"]))
        stale_text = False
        if index is not None:
            self._reconcile(index, segments)
            if index._native.text_documents() != len(index):  # written before the text leg existed
                index = self._rebuild_text_leg(index, segments, cfg)
                stale_text = True
        self._stale_text = stale_text
        self._manifest = m
        self._segments = segments
        self._seg_mins = [s.min_id for s in segments]
        self._index = index
        self._docs = {}
        for seg in segments:
            for d in np.flatnonzero(seg.doc_live):
                self._docs[(seg.doc_pipelines[d], seg.doc_ids[d])] = (seg, int(d))
        self._lookup = None
        self._embedder = self._resolve_embedder(m.get("embedder"))

    def _resolve_embedder(self, spec: dict[str, Any] | None) -> Any | None:
        if spec is None or spec.get("kind") == "none":
            return None
        for candidate in (self._explicit_embedder, self._engine._embedder):
            if candidate is not None and embedder_spec(candidate) == spec:
                return candidate
        built = embedder_from_spec(spec) if spec.get("kind") == "hashing" else None
        if built is not None:
            return built
        for candidate in (self._explicit_embedder, self._engine._embedder):
            if candidate is not None and int(candidate.dim) == int(spec.get("dim", -1)):
                return candidate
        if spec.get("kind") == "sentence-transformers":
            try:
                return embedder_from_spec(spec)
            except Exception:  # noqa: BLE001 - no model offline: text queries will say so
                return None
        return None

    @staticmethod
    def _new_index(cfg: dict[str, Any], dim: int) -> Index:
        return Index(dim, cfg["metric"], cfg["index"], M=cfg["M"],
                     ef_construction=cfg["ef_construction"], ef=cfg["ef"],
                     quantization=cfg.get("quantization"))

    def _reconcile(self, index: Index, segments: list[_Segment]) -> None:
        """Brings an index checkpoint up to the manifest: adds the live chunks it lacks (from
        the segments' vector files), removes the chunks deleted since."""
        live_parts = [seg.ids[seg.live_mask()] for seg in segments]
        live = np.concatenate(live_parts) if live_parts else np.empty(0, np.int64)
        have = index.ids()
        extra = np.setdiff1d(have, live, assume_unique=True)
        if len(extra):
            index.remove(extra)
        missing = np.setdiff1d(live, have, assume_unique=True)
        if not len(missing):
            return
        for seg in segments:
            sel = np.isin(seg.ids, missing, assume_unique=True)
            if not sel.any():
                continue
            ventry = seg.entry["files"].get("vectors")
            if not ventry:
                raise FormatError(
                    5, f"knowledge base {self.path!r} is inconsistent: segment {seg.name} has "
                    "chunks missing from the index and no vector file",
                )
            vectors = storage.read_npy(self.path, ventry)
            rows = np.flatnonzero(sel)
            meta = seg.chunks.take(rows).drop_columns(list(_INTERNAL_COLUMNS))
            index.add(vectors[rows], seg.ids[rows], metadata=meta,
                      texts=_text_list(seg.text.take(rows)), defer_graph=True)

    def _rebuild_text_leg(self, index: Index, segments: list[_Segment], cfg: dict[str, Any]) -> Index:
        """A copy of ``index`` whose BM25 leg holds every live chunk's text (from the segments).

        Index files written before the engine fed chunk text to the native BM25 index have no
        text leg; the vectors are re-added to a fresh index together with their text and
        metadata. Runs once: the next checkpoint (at the latest on close) persists the result.
        """
        fresh = self._new_index(cfg, index.dim)
        for seg in segments:
            rows = np.flatnonzero(seg.live_mask())
            if not len(rows):
                continue
            ids = seg.ids[rows]
            meta = seg.chunks.take(rows).drop_columns(list(_INTERNAL_COLUMNS))
            fresh.add(index.get_vectors(ids), ids, metadata=meta,
                      texts=_text_list(seg.text.take(rows)), defer_graph=True)
        return fresh

    def refresh(self) -> None:
        """Reloads the knowledge base if another process changed it since."""
        with self._wmutex, self._flock.hold():
            self._sync()
        self._start_graph_builder()

    def _sync(self) -> None:
        try:
            current = storage.load_manifest(self.path)["generation"]
        except FormatError:
            if not os.path.exists(self.path):
                raise NotFoundError(f"knowledge base {self.name!r} was deleted") from None
            raise
        if current != self._manifest.get("generation"):
            with self._rw.write():
                self._load()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        self._check_open()
        with self._wmutex, self._flock.hold():
            self._sync()
            yield

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError(f"knowledge base {self.name!r} is closed")

    # -- manifest helpers ------------------------------------------------------------------
    def _next_manifest(self) -> dict[str, Any]:
        m = json.loads(json.dumps(self._manifest))  # deep copy
        m["generation"] = self._manifest["generation"] + 1
        return m

    def _commit_manifest(self, m: dict[str, Any]) -> None:
        storage.save_manifest(self.path, m)

    def _gc(self) -> None:
        storage.remove_unreferenced(self.path, self._manifest)

    def _tail_rows(self) -> int:
        return sum(s.rows for s in self._segments if s.entry["files"].get("vectors"))

    def _ckpt_rows(self) -> int:
        idx = self._manifest.get("index")
        return int(idx.get("rows", 0)) if idx else 0

    # -- pipelines ---------------------------------------------------------------------------
    def create_pipeline(self, name: str, *, chunk_size: int | None = None,
                        chunk_overlap: int | None = None) -> None:
        """Adds a named pipeline (its own chunking); its documents are retrieved together with
        the others, and deduplication is per pipeline."""
        _check_name(name, "pipeline")
        cfg = self._manifest["config"]
        size, overlap = check_chunk_params(
            cfg["chunk_size"] if chunk_size is None else chunk_size,
            cfg["chunk_overlap"] if chunk_overlap is None else chunk_overlap,
        )
        with self._writing():
            if name in self._manifest["pipelines"]:
                raise InvalidArgumentError(f"pipeline {name!r} already exists in {self.name!r}")
            m = self._next_manifest()
            m["pipelines"][name] = {"chunk_size": size, "chunk_overlap": overlap}
            self._commit_manifest(m)
            self._manifest = m

    def delete_pipeline(self, name: str) -> int:
        """Removes a pipeline and every document ingested through it; returns chunks removed."""
        with self._writing():
            self._pipeline(name)
            if name == _DEFAULT_PIPELINE:
                raise InvalidArgumentError("the default pipeline cannot be deleted")
            keys = [k for k in self._docs if k[0] == name]
            removed = self._delete_keys(keys, drop_pipeline=name)
        return removed

    def _pipeline(self, name: str) -> dict[str, int]:
        p = self._manifest["pipelines"].get(name)
        if p is None:
            known = ", ".join(sorted(self._manifest["pipelines"]))
            raise NotFoundError(f"knowledge base {self.name!r} has no pipeline {name!r} (pipelines: {known})")
        return p

    # -- ingest ------------------------------------------------------------------------------
    def ingest(
        self,
        source: str | os.PathLike[str] | bytes | None = None,
        *,
        document_id: str | None = None,
        filename: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        pipeline: str = _DEFAULT_PIPELINE,
        format: str | None = None,
        text: str | None = None,
    ) -> IngestResult:
        """Parses, chunks, embeds and stores one document; re-ingesting a document id replaces
        it atomically.

        ``source`` is a path, or the file's content as bytes (or str) with ``filename=`` giving
        its type (the type also comes from the content: PDF and HTML are recognised); ``text``
        is already extracted text. Bad input (missing or empty file, bytes that do not decode,
        an unsupported type) raises before anything is stored.
        """
        doc = Document(source, document_id=document_id, filename=filename, metadata=metadata,
                       format=format, text=text)
        return self.ingest_many([doc], pipeline=pipeline, progress=False)[0]

    def ingest_many(
        self,
        documents: Iterable[Document | str | os.PathLike[str] | Mapping[str, Any]],
        *,
        pipeline: str = _DEFAULT_PIPELINE,
        metadata: Mapping[str, Any] | None = None,
        progress: bool | None = None,
    ) -> list[IngestResult]:
        """Ingests many documents (paths, :class:`Document`, or dicts of its fields).

        Every document is read, parsed and chunked first, so bad input raises before anything
        is stored. Chunks are then embedded and committed in batches (each batch atomic and
        durable). ``metadata`` is added to each document's own metadata. ``progress`` shows a
        bar (None: when stderr is a terminal).
        """
        self._check_open()
        pcfg = self._pipeline(pipeline)
        embedder = self._require_embedder("ingest text")
        prepared = []
        seen: set[str] = set()
        for item in documents:
            doc = _as_document(item)
            prep = _prepare(doc, pcfg["chunk_size"], pcfg["chunk_overlap"], metadata)
            if prep.document_id in seen:
                raise InvalidArgumentError(f"document id {prep.document_id!r} appears twice in one ingest call")
            seen.add(prep.document_id)
            prepared.append(prep)
        results: list[IngestResult] = []
        total = sum(len(p.chunks) for p in prepared)
        bar = _progress(total, f"ingest {self.name}", progress)
        try:
            batch: list[_Prepared] = []
            rows = 0
            for prep in prepared:
                batch.append(prep)
                rows += len(prep.chunks)
                if rows >= _COMMIT_ROWS:
                    results.extend(self._ingest_prepared(batch, pipeline, embedder, bar))
                    batch, rows = [], 0
            if batch:
                results.extend(self._ingest_prepared(batch, pipeline, embedder, bar))
        finally:
            bar.close()
        return results

    def _require_embedder(self, what: str) -> Any:
        if self._embedder is None:
            spec = self._manifest.get("embedder")
            if spec is None or spec.get("kind") == "none":
                raise InvalidArgumentError(
                    f"knowledge base {self.name!r} has no embedder, so it cannot {what}: give "
                    "query vectors, or create it with an embedder"
                )
            raise InvalidArgumentError(
                f"knowledge base {self.name!r} was built with embedder {spec}, which cannot be "
                f"rebuilt here, so it cannot {what}: pass embedder= to Engine or "
                "get_knowledge_base()"
            )
        return self._embedder

    def _embed(self, texts: list[str], embedder: Any, bar: Any) -> np.ndarray:
        bs = int(getattr(embedder, "batch_size", 256) or 256)
        dim = int(embedder.dim)
        out = np.empty((len(texts), dim), dtype=np.float32)
        for s in range(0, len(texts), bs):
            part = texts[s:s + bs]
            out[s:s + len(part)] = check_embeddings(embedder.embed(part), len(part), dim, repr(embedder))
            bar.update(len(part))
        return out

    def _ingest_prepared(self, batch: list[_Prepared], pipeline: str, embedder: Any, bar: Any) -> list[IngestResult]:
        import pyarrow as pa

        texts = [c.text for p in batch for c in p.chunks]
        vectors = self._embed(texts, embedder, bar)
        counts = np.fromiter((len(p.chunks) for p in batch), dtype=np.int64, count=len(batch))
        doc_of_row = np.repeat(np.arange(len(batch)), counts)
        user = _user_metadata_table([p.metadata for p in batch], doc_of_row)
        chunk_index = np.fromiter((c.index for p in batch for c in p.chunks), np.int64, len(texts))
        starts = np.fromiter((c.start for p in batch for c in p.chunks), np.int64, len(texts))
        ends = np.fromiter((c.end for p in batch for c in p.chunks), np.int64, len(texts))
        docs = _DocsIn(
            ids=[p.document_id for p in batch],
            filenames=[p.filename for p in batch],
            texts=[p.text for p in batch],
            formats=[p.format for p in batch],
            metadata=[json.dumps(p.metadata, sort_keys=True, ensure_ascii=False) for p in batch],
            counts=counts,
        )
        replaced = self._commit(pipeline, docs, pa.array(texts, pa.large_string()), starts, ends,
                                chunk_index, user, vectors, text_list=texts)
        return [IngestResult(p.document_id, pipeline, len(p.chunks), p.document_id in replaced, p.format)
                for p in batch]

    def ingest_table(
        self,
        data: Any,
        *,
        vectors: Any = None,
        vector_column: str = "vector",
        text_column: str = "text",
        document_id_column: str = "document_id",
        chunk_index_column: str | None = "chunk_index",
        span_columns: tuple[str, str] | None = ("char_start", "char_end"),
        filename_column: str | None = "filename",
        metadata_columns: Sequence[str] | None = None,
        pipeline: str = _DEFAULT_PIPELINE,
    ) -> int:
        """Ingests pre-embedded chunks from a pyarrow Table / RecordBatch or a Parquet or Arrow
        IPC file, at native speed (no Python loop over rows). Returns the number of documents.

        One row per chunk: ``vector_column`` (fixed-size or variable list of floats, or pass
        ``vectors=`` as a float array [rows, dim]), ``text_column``, ``document_id_column``
        (strings or integers). Optional: ``chunk_index_column`` (else the order of a document's
        rows), ``span_columns`` (character start and end in the document), ``filename_column``.
        Every other column (or only ``metadata_columns``) becomes chunk metadata. Rows of one
        document need not be adjacent. A document id already stored in the pipeline is replaced
        atomically. Works without an embedder; the vectors must match the knowledge base's
        dimension.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        self._check_open()
        self._pipeline(pipeline)
        table = _as_table(data)
        n = table.num_rows
        if n == 0:
            return 0
        names = set(table.column_names)
        for col in (text_column, document_id_column):
            if col not in names:
                raise InvalidArgumentError(f"the table has no column {col!r} (columns: {sorted(names)})")
        if vectors is None:
            if vector_column not in names:
                raise InvalidArgumentError(
                    f"the table has no vector column {vector_column!r}; name it with "
                    "vector_column= or pass vectors="
                )
            vecs = _vectors_from_column(table.column(vector_column))
        else:
            vecs = np.asarray(vectors)
            if vecs.ndim != 2 or vecs.shape[0] != n:
                raise InvalidArgumentError(f"vectors must have shape [{n}, dim], got {list(vecs.shape)}")
            if not np.issubdtype(vecs.dtype, np.floating) and not np.issubdtype(vecs.dtype, np.integer):
                raise InvalidTypeError(f"vectors must be a float array, got dtype {vecs.dtype}")
            vecs = np.ascontiguousarray(vecs, dtype=np.float32)
        if self.dim is not None and vecs.shape[1] != self.dim:
            raise InvalidArgumentError(
                f"vectors have dimension {vecs.shape[1]}, knowledge base {self.name!r} has {self.dim}"
            )
        if not np.isfinite(vecs).all():
            raise InvalidArgumentError("vectors contain NaN or infinite values")

        doc_col = _combine(table.column(document_id_column))
        if pa.types.is_dictionary(doc_col.type):
            doc_col = doc_col.cast(doc_col.type.value_type)
        if pa.types.is_integer(doc_col.type):
            doc_col = doc_col.cast(pa.string())
        if not (pa.types.is_string(doc_col.type) or pa.types.is_large_string(doc_col.type)):
            raise InvalidTypeError(f"column {document_id_column!r} must hold strings or integers, got {doc_col.type}")
        if doc_col.null_count:
            raise InvalidArgumentError(f"column {document_id_column!r} has null document ids")
        enc = doc_col.dictionary_encode()
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        order = np.argsort(codes, kind="stable")  # groups rows by document, first seen first
        counts = np.bincount(codes, minlength=len(enc.dictionary))
        doc_ids = enc.dictionary.cast(pa.string()).to_pylist()
        if any(d == "" for d in doc_ids):
            raise InvalidArgumentError(f"column {document_id_column!r} has empty document ids")
        sorted_needed = not np.all(order[1:] > order[:-1]) if n > 1 else False
        take = pa.array(order) if sorted_needed else None

        def col(name: str) -> Any:
            c = _combine(table.column(name))
            return c.take(take) if take is not None else c

        if sorted_needed:
            vecs = vecs[order]
        texts = col(text_column)
        if pa.types.is_dictionary(texts.type):
            texts = texts.cast(texts.type.value_type)
        if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
            raise InvalidTypeError(f"column {text_column!r} must hold strings, got {texts.type}")
        texts = texts.cast(pa.large_string())
        if texts.null_count:
            texts = pc.fill_null(texts, "")
        doc_starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        if chunk_index_column and chunk_index_column in names:
            chunk_index = _np(col(chunk_index_column), np.int64)
        else:
            chunk_index = np.arange(n, dtype=np.int64) - np.repeat(doc_starts, counts)
        if span_columns and span_columns[0] in names and span_columns[1] in names:
            starts = _np(col(span_columns[0]), np.int64)
            ends = _np(col(span_columns[1]), np.int64)
        else:
            starts = np.full(n, -1, np.int64)
            ends = np.full(n, -1, np.int64)
        filenames: list[str | None] = [None] * len(doc_ids)
        fname_arr = None
        if filename_column and filename_column in names:
            fname_arr = col(filename_column).cast(pa.string())
            firsts = fname_arr.take(pa.array(doc_starts)).to_pylist()
            filenames = firsts
        used = {text_column, document_id_column, vector_column, chunk_index_column, filename_column}
        if span_columns:
            used |= set(span_columns)
        if metadata_columns is None:
            meta_names = [c for c in table.column_names if c not in used]
        else:
            meta_names = list(metadata_columns)
            for c in meta_names:
                if c not in names:
                    raise InvalidArgumentError(f"metadata column {c!r} is not in the table")
        for c in meta_names:
            _check_meta_key(c)
        user = pa.table({c: col(c) for c in meta_names}) if meta_names else None
        docs = _DocsIn(ids=doc_ids, filenames=filenames, texts=[None] * len(doc_ids),
                       formats=[None] * len(doc_ids), metadata=["{}"] * len(doc_ids),
                       counts=counts.astype(np.int64), filename_rows=fname_arr)
        self._commit(pipeline, docs, texts, starts, ends, chunk_index, user, vecs)
        return len(doc_ids)

    # -- the commit ------------------------------------------------------------------------
    def _commit(self, pipeline: str, docs: _DocsIn, texts: Any, starts: np.ndarray, ends: np.ndarray,
                chunk_index: np.ndarray, user: Any, vectors: np.ndarray,
                text_list: list[str] | None = None) -> set[str]:
        """Stores one batch of documents atomically; returns the ids of replaced documents.

        ``texts`` (a pyarrow string array without nulls) is stored with the chunks and fed to
        the index's BM25 leg; ``text_list`` is the same as a list when the caller has it."""
        import pyarrow as pa

        if text_list is None:
            text_list = _text_list(texts)

        n = len(vectors)
        ndocs = len(docs.ids)
        with self._writing():
            m = self._next_manifest()
            cfg = m["config"]
            if cfg.get("dim") is None:
                cfg["dim"] = int(vectors.shape[1])
            elif cfg["dim"] != vectors.shape[1]:
                raise InvalidArgumentError(
                    f"vectors have dimension {vectors.shape[1]}, knowledge base {self.name!r} has {cfg['dim']}"
                )
            index = self._index if self._index is not None else self._new_index(cfg, cfg["dim"])
            gen = m["generation"]
            first = m["next_id"]
            ids = np.arange(first, first + n, dtype=np.int64)
            m["next_id"] = first + n
            groups = np.arange(m["next_group"], m["next_group"] + ndocs, dtype=np.int64)
            m["next_group"] += ndocs
            chunk_groups = np.repeat(groups, docs.counts)
            doc_of_row = np.repeat(np.arange(ndocs), docs.counts)

            # metadata columns (native) = the chunk table minus the internal columns
            doc_id_arr = pa.array(docs.ids, pa.string()).take(pa.array(doc_of_row))
            if docs.filename_rows is not None:
                fname = docs.filename_rows
            else:
                fname = pa.array(docs.filenames, pa.string()).take(pa.array(doc_of_row))
            cols: dict[str, Any] = {
                "__id": pa.array(ids), "__text": texts,
                "__start": pa.array(starts), "__end": pa.array(ends),
                "document_id": doc_id_arr, "file_id": doc_id_arr,
                "chunk_index": pa.array(chunk_index, pa.int64()),
                "filename": fname,
                "pipeline_name": pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(n, np.int32)), pa.array([pipeline])).cast(pa.string()),
                _GROUP: pa.array(chunk_groups),
            }
            if user is not None:
                for c in user.column_names:
                    cols[c] = _combine(user.column(c))
            chunks = pa.table(cols)
            meta = chunks.drop_columns(list(_INTERNAL_COLUMNS))
            doc_table = pa.table({
                "document_id": pa.array(docs.ids, pa.string()),
                "pipeline_name": pa.array([pipeline] * ndocs, pa.string()),
                "filename": pa.array(docs.filenames, pa.string()),
                "text": pa.array(docs.texts, pa.large_string()),
                "format": pa.array(docs.formats, pa.string()),
                "n_chunks": pa.array(docs.counts, pa.int64()),
                "group": pa.array(groups),
                "metadata": pa.array(docs.metadata, pa.string()),
                "ingested_at": pa.array(np.full(ndocs, time.time())),
            })

            replaced_refs = [self._docs[(pipeline, d)] for d in docs.ids if (pipeline, d) in self._docs]
            old_ids = (np.concatenate([s.doc_chunk_ids(r) for s, r in replaced_refs])
                       if replaced_refs else np.empty(0, np.int64))
            tail = self._tail_rows() + n
            ckpt = tail >= max(_policy.CKPT_MIN_ROWS, _policy.CKPT_FRACTION * self._ckpt_rows())

            seg_name = f"seg-{gen:08d}"
            files: dict[str, Any] = {}
            written: list[str] = []
            try:
                files["chunks"] = storage.write_arrow(self.path, f"{seg_name}.chunks.arrow", chunks)
                written.append(files["chunks"]["path"])
                files["docs"] = storage.write_arrow(self.path, f"{seg_name}.docs.arrow", doc_table)
                written.append(files["docs"]["path"])
                files["vectors"] = None
                if not ckpt:
                    files["vectors"] = storage.write_npy(self.path, f"{seg_name}.vectors.npy", vectors)
                    written.append(files["vectors"]["path"])
                # The new names are durable before the manifest names them. With a checkpoint,
                # Index.save fsyncs the directory after renaming the index into place, which
                # covers these names too, so one directory fsync is saved (~10-30 ms on a VM disk).
                if not ckpt:
                    storage.fsync_dir(self.path)
            except BaseException:
                _unlink_all(self.path, written)
                raise
            seg_entry = {"name": seg_name, "rows": n, "docs": ndocs, "deleted_docs": [], "files": files}
            m["segments"].append(seg_entry)
            self._mark_deleted(m, replaced_refs)

            with self._rw.write():
                try:
                    index.add(vectors, ids, metadata=meta, texts=text_list, defer_graph=True)
                except BaseException:
                    _unlink_all(self.path, written)
                    raise
                saved_old = None
                try:
                    if ckpt:
                        if len(old_ids):
                            saved_old = (index.get_vectors(old_ids), index.get_metadata(old_ids),
                                         [t for s, r in replaced_refs for t in _text_list(
                                             s.text[s.doc_offsets[r]:s.doc_offsets[r + 1]])])
                            index.remove(old_ids)
                        self._checkpoint_into(m, index, gen)
                    self._commit_manifest(m)
                except BaseException:
                    index.remove(ids)
                    if saved_old is not None:
                        index.add(saved_old[0], old_ids, metadata=saved_old[1], texts=saved_old[2])
                    _unlink_all(self.path, written + [f"index-{gen:08d}.kbi"])
                    raise
                if not ckpt and len(old_ids):
                    index.remove(old_ids)
                self._index = index
                self._apply(m, new_segment=_Segment(seg_entry, chunks, doc_table),
                            removed=[(pipeline, d) for d in docs.ids])
            self._gc()
            self._maybe_compact()
        self._start_graph_builder()
        return {self._segment_doc_id(s, r) for s, r in replaced_refs}

    @staticmethod
    def _segment_doc_id(seg: _Segment, row: int) -> str:
        return seg.doc_ids[row]

    def _checkpoint_into(self, m: dict[str, Any], index: Index, gen: int) -> None:
        """Saves the index as the manifest's checkpoint; drops every vector file entry."""
        name = f"index-{gen:08d}.kbi"
        self._graph_unsaved = False  # before the save: a batch linked after it sets it again
        index.save(os.path.join(self.path, name))  # fsyncs the file, renames it, fsyncs the directory
        entry = storage.file_entry(self.path, name)
        entry["rows"] = len(index)
        m["index"] = entry
        self._stale_text = False
        for seg in m["segments"]:
            seg["files"]["vectors"] = None

    def _mark_deleted(self, m: dict[str, Any], refs: list[tuple[_Segment, int]]) -> None:
        """Marks documents deleted in manifest m; drops segments left without live documents."""
        by_name = {s["name"]: s for s in m["segments"]}
        for seg, row in refs:
            entry = by_name[seg.name]
            if row not in entry["deleted_docs"]:
                entry["deleted_docs"].append(row)
                entry["deleted_docs"].sort()
        m["segments"] = [s for s in m["segments"] if len(s["deleted_docs"]) < s["docs"]]

    def _apply(self, m: dict[str, Any], new_segment: _Segment | None = None,
               removed: Iterable[tuple[str, str]] | None = None) -> None:
        """Makes manifest m (already committed) the in-memory state. Caller holds the rw lock.

        ``removed`` lists the (pipeline, document) keys the mutation deleted; the document map is
        then updated in place of being rebuilt (None: rebuild it from the segments)."""
        by_name = {s.name: s for s in self._segments}
        if new_segment is not None:
            by_name[new_segment.name] = new_segment
        segments = []
        for entry in m["segments"]:
            seg = by_name[entry["name"]]
            seg.entry = entry
            seg.doc_live[:] = True
            seg.doc_live[entry["deleted_docs"]] = False
            segments.append(seg)
        if removed is None:
            docs: dict[tuple[str, str], tuple[_Segment, int]] = {}
            for seg in segments:
                for d in np.flatnonzero(seg.doc_live):
                    docs[(seg.doc_pipelines[d], seg.doc_ids[d])] = (seg, int(d))
        else:
            docs = dict(self._docs)
            for key in removed:
                docs.pop(key, None)
            if new_segment is not None:
                for d, (p, doc_id) in enumerate(zip(new_segment.doc_pipelines, new_segment.doc_ids)):
                    docs[(p, doc_id)] = (new_segment, d)
        self._manifest = m
        self._segments = segments
        self._seg_mins = [s.min_id for s in segments]
        self._docs = docs
        self._lookup = None

    # -- delete ------------------------------------------------------------------------------
    def delete_document(self, document_id: str, *, pipeline: str | None = None,
                        missing_ok: bool = False) -> int:
        """Deletes a document's chunks (from every pipeline, or only ``pipeline``); returns the
        number of chunks removed. Unknown ids raise ``NotFoundError`` unless ``missing_ok``."""
        if not isinstance(document_id, str):
            raise InvalidTypeError(f"document_id must be a str, got {type(document_id).__name__}")
        with self._writing():
            if pipeline is not None:
                self._pipeline(pipeline)
            keys = [k for k in self._docs if k[1] == document_id and (pipeline is None or k[0] == pipeline)]
            if not keys:
                if missing_ok:
                    return 0
                where = f" in pipeline {pipeline!r}" if pipeline else ""
                raise NotFoundError(f"knowledge base {self.name!r} has no document {document_id!r}{where}")
            return self._delete_keys(keys)

    def _delete_keys(self, keys: list[tuple[str, str]], drop_pipeline: str | None = None) -> int:
        refs = [self._docs[k] for k in keys]
        ids = np.concatenate([s.doc_chunk_ids(r) for s, r in refs]) if refs else np.empty(0, np.int64)
        m = self._next_manifest()
        self._mark_deleted(m, refs)
        if drop_pipeline is not None:
            del m["pipelines"][drop_pipeline]
        self._commit_manifest(m)
        with self._rw.write():
            if len(ids) and self._index is not None:
                self._index.remove(ids)
            self._apply(m, removed=keys)
        self._gc()
        self._maybe_compact()
        return int(len(ids))

    # -- compaction --------------------------------------------------------------------------
    def _maybe_compact(self) -> None:
        stored = sum(s.rows for s in self._segments)
        live = len(self)
        if len(self._segments) > _policy.MAX_SEGMENTS or (stored > 256 and stored - live > stored // 2):
            self.compact()

    def compact(self) -> None:
        """Rewrites the live chunks into one segment and checkpoints the index, so deleted
        chunks' text and vectors no longer take disk space. Searches keep running meanwhile."""
        import pyarrow as pa

        with self._writing():
            if self._index is None:
                return
            m = self._next_manifest()
            gen = m["generation"]
            seg_name = f"seg-{gen:08d}"
            chunk_parts, doc_parts = [], []
            for seg in self._segments:
                if not seg.doc_live.any():
                    continue
                chunk_parts.append(seg.chunks.filter(pa.array(seg.live_mask())))
                doc_parts.append(seg.docs.filter(pa.array(seg.doc_live)))
            written: list[str] = []
            new_seg = None
            m["segments"] = []
            try:
                if chunk_parts:
                    chunks = pa.concat_tables(chunk_parts, promote_options="default").combine_chunks()
                    docs = pa.concat_tables(doc_parts, promote_options="default").combine_chunks()
                    files = {
                        "chunks": storage.write_arrow(self.path, f"{seg_name}.chunks.arrow", chunks),
                        "docs": storage.write_arrow(self.path, f"{seg_name}.docs.arrow", docs),
                        "vectors": None,
                    }
                    written = [files["chunks"]["path"], files["docs"]["path"]]
                    storage.fsync_dir(self.path)
                    entry = {"name": seg_name, "rows": chunks.num_rows, "docs": docs.num_rows,
                             "deleted_docs": [], "files": files}
                    m["segments"] = [entry]
                    new_seg = _Segment(entry, chunks, docs)
                self._checkpoint_into(m, self._index, gen)
                written.append(m["index"]["path"])
                self._commit_manifest(m)
            except BaseException:
                _unlink_all(self.path, written)
                raise
            with self._rw.write():
                self._segments = []
                self._apply(m, new_segment=new_seg)
            self._gc()

    # -- retrieval ---------------------------------------------------------------------------
    def _query_vector(self, query: Any) -> np.ndarray:
        if isinstance(query, str):
            if not query.strip():
                raise InvalidArgumentError("the query is empty")
            embedder = self._require_embedder("embed a text query")
            return check_embeddings(embedder.embed([query]), 1, self.dim, repr(embedder))[0]
        if isinstance(query, (bytes, bytearray)):
            raise InvalidTypeError("a query is a str or a vector, got bytes")
        q = np.asarray(query)
        if q.dtype == object or not (np.issubdtype(q.dtype, np.floating) or np.issubdtype(q.dtype, np.integer)):
            raise InvalidTypeError(f"a query is a str or a float vector, got {type(query).__name__} of dtype {q.dtype}")
        if q.ndim == 2 and q.shape[0] == 1:
            q = q[0]
        if q.ndim != 1:
            raise InvalidArgumentError(f"a query vector must be 1-D, got shape {list(q.shape)}")
        return q

    def _where(self, filters: Mapping[str, Any] | None, pipelines: Sequence[str] | None) -> Any:
        if pipelines is None:
            return filters
        if isinstance(pipelines, str):
            pipelines = [pipelines]
        for p in pipelines:
            self._pipeline(p)
        clause = {"pipeline_name": {"$in": list(pipelines)}}
        return {"$and": [filters, clause]} if filters else clause

    def _candidates(self, q: np.ndarray, top_k: int, where: Any, deduplicate: bool,
                    ef: int | None) -> list[tuple[int, float, Sequence[int]]]:
        index = self._index
        if index is None or len(index) == 0:
            return []
        if deduplicate:
            return _search_groups(self, q, top_k, where, ef)
        ids, dist = index.search(q, top_k, where=where, ef=ef, threads=1)
        return [(i, d, ()) for i, d in zip(ids.tolist(), dist.tolist()) if i >= 0]

    def _locate(self, chunk_id: int) -> tuple[_Segment, int]:
        seg = self._segments[bisect.bisect_right(self._seg_mins, chunk_id) - 1]
        return seg, seg.row(chunk_id)

    def _groups_of(self, ids: np.ndarray) -> np.ndarray:
        """The dedup group of each chunk id (vectorised; for fused hybrid results)."""
        lookup = self._lookup
        if lookup is None:
            all_ids = np.concatenate([s.ids for s in self._segments]) if self._segments else np.empty(0, np.int64)
            all_groups = np.concatenate([s.groups for s in self._segments]) if self._segments else np.empty(0, np.int64)
            lookup = self._lookup = (all_ids, all_groups)
        pos = np.searchsorted(lookup[0], ids)
        return lookup[1][pos]

    def _check_k(self, top_k: Any, name: str) -> int:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)):
            raise InvalidTypeError(f"{name} must be an integer, got {type(top_k).__name__}")
        if top_k < 1:
            raise InvalidArgumentError(f"{name} must be at least 1, got {top_k}")
        return int(top_k)

    def _search_mode(self, query: Any, search_type: str | None, fusion: str | None,
                     vector_weight: float | None) -> tuple[str, str, float]:
        """Resolves (search type, fusion, vector weight): arguments, else the knowledge base's
        defaults. A vector query under a *default* text or hybrid search type searches vectors."""
        cfg = self._manifest["config"]
        explicit = search_type is not None
        mode = _check_choice("search_type", search_type if explicit else cfg.get("search_type", "vector"),
                             SEARCH_TYPES)
        fusion = _check_choice("fusion", fusion if fusion is not None else cfg.get("fusion", "rrf"), FUSIONS)
        weight = check_vector_weight(vector_weight if vector_weight is not None
                                      else cfg.get("vector_weight", 0.7))
        if mode != "vector" and not isinstance(query, str):
            if isinstance(query, (bytes, bytearray)):
                raise InvalidTypeError("a query is a str or a vector, got bytes")
            if explicit:
                raise InvalidArgumentError(
                    f"search_type={mode!r} needs the query as a string (BM25 searches text), got a "
                    f"{type(query).__name__}; pass the text as query (for hybrid search of a "
                    "knowledge base without embedder, also the vector as query_vector=)"
                )
            mode = "vector"
        return mode, fusion, weight

    def retrieve(
        self,
        query: str | Any,
        top_k: int = 5,
        *,
        score_threshold: float = 0.0,
        filters: Mapping[str, Any] | None = None,
        deduplicate: bool = False,
        pipelines: Sequence[str] | None = None,
        ef: int | None = None,
        search_type: str | None = None,
        fusion: str | None = None,
        vector_weight: float | None = None,
        rrf_k: float = 60,
        window: int | None = None,
        query_vector: Any = None,
    ) -> list[Hit]:
        """The ``top_k`` chunks that best match ``query`` (a str, embedded with the knowledge
        base's embedder, or a vector), best first.

        ``filters`` is a native ``where`` filter over chunk metadata; ``pipelines`` restricts
        the pipelines searched; ``deduplicate=True`` returns at most one chunk (the best) per
        document and pipeline, ``top_k`` distinct documents when there are that many;
        ``score_threshold`` drops hits whose score is below it; ``ef`` overrides the HNSW
        search breadth.

        ``search_type`` (default: the knowledge base's, see :meth:`Engine.create_knowledge_base`):

        - ``"vector"``: nearest neighbours of the query's embedding;
        - ``"full_text"``: BM25 over the chunks' text (needs a str query, no embedder);
        - ``"hybrid"``: both legs, each over ``window`` candidates (default
          ``max(4 * top_k, 50)``) under the same filters, fused by ``fusion``: ``"rrf"``
          (reciprocal rank fusion, 1-based ranks, constant ``rrf_k``) or ``"linear"``
          (``vector_weight * minmax(vector score) + (1 - vector_weight) * minmax(BM25)``).
          ``vector_weight`` is used by linear fusion only.

        Deduplication applies after fusion. ``query_vector`` gives the vector leg's query for
        a str ``query`` (a knowledge base without embedder, or a precomputed embedding).
        Scores are in [0, 1]; see the module docstring for each search type's mapping.
        """
        top_k = self._check_k(top_k, "top_k")
        if isinstance(score_threshold, bool) or not isinstance(score_threshold, (int, float)):
            raise InvalidTypeError(f"score_threshold must be a number, got {type(score_threshold).__name__}")
        self._check_open()
        mode, fusion, weight = self._search_mode(query, search_type, fusion, vector_weight)
        rrf_k = check_rrf_k(rrf_k, "rrf_k")
        window = max(4 * top_k, 50) if window is None else self._check_k(window, "window")
        if query_vector is not None and not isinstance(query, str):
            raise InvalidArgumentError("query_vector= goes with a text query; the query is already a vector")
        if mode != "vector":
            return self._retrieve_fused(query, query_vector, top_k, score_threshold,
                                        self._where(filters, pipelines), deduplicate, ef, mode,
                                        fusion, weight, rrf_k, window)
        q = self._query_vector(query if query_vector is None else query_vector)
        where = self._where(filters, pipelines)
        metric = self._manifest["config"]["metric"]
        rw = self._rw
        rw.acquire_read()
        try:
            cands = self._candidates(q, top_k, where, deduplicate, ef)
            if score_threshold > 0.0:
                cands = [c for c in cands if _score(c[1], metric) >= score_threshold]
            return self._hits(cands, metric, fused=False)
        finally:
            rw.release_read()

    def _hits(self, cands: list[tuple[int, float, Sequence[int]]], metric: str, *, fused: bool) -> list[Hit]:
        """Hits of (chunk id, distance or fused score, part ids) candidates. Caller holds the
        read lock."""
        if not cands:
            return []
        metas = self._index.get_metadata([c[0] for c in cands])  # type: ignore[union-attr]
        hits = []
        for (cid, value, parts), meta in zip(cands, metas):
            seg, row = self._locate(cid)
            del meta[_GROUP]
            if len(parts):
                parts = tuple(int(seg_.chunk_index[r]) for seg_, r in map(self._locate, parts))
            if fused:
                score, dist = value, 1.0 - value
            else:
                score, dist = _score(value, metric), value
            hits.append(Hit(cid, meta["document_id"], seg.text[row].as_py(), meta, dist, score,
                            meta["pipeline_name"], meta["chunk_index"], tuple(parts)))
        return hits

    def _retrieve_fused(self, query: Any, query_vector: Any, top_k: int, score_threshold: float,
                        where: Any, deduplicate: bool, ef: int | None, mode: str, fusion: str,
                        weight: float, rrf_k: float, window: int) -> list[Hit]:
        """Full-text and hybrid retrieval: one native call per leg over ``window`` candidates,
        fusion in Python, dedup after fusion (widening the window while too few documents)."""
        if not query.strip():
            raise InvalidArgumentError("the query is empty")
        ef_value = 0 if ef is None else self._check_k(ef, "ef")
        q = None
        if mode == "hybrid":
            if query_vector is None and self._embedder is None:
                self._require_embedder(
                    "embed the query for hybrid search (pass query_vector=, or use "
                    "search_type='full_text')")
            q = self._query_vector(query if query_vector is None else query_vector)
        ir = native_filter(where)  # one compiled native filter for both legs
        metric = self._manifest["config"]["metric"]
        rw = self._rw
        rw.acquire_read()
        try:
            index = self._index
            if index is None or len(index) == 0:
                return []
            native = index._native
            if q is not None:
                q, _ = _as_vectors(q, index.dim, "the query vector")
            n = len(index)
            if mode == "full_text" and not deduplicate:
                window = min(window, top_k)  # one leg, no collapse: top_k candidates suffice
            while True:
                w = min(window, n)
                vec_leg: list[tuple[int, float]] = []
                if q is not None:
                    ids, dist = native.search(q, w, ef_value, 1, ir)
                    ids, dist = ids[0], dist[0]
                    if ids[-1] < 0:
                        keep = ids >= 0
                        ids, dist = ids[keep], dist[keep]
                    vec_leg = list(zip(ids.tolist(), _scores(dist, metric)))
                tids, tscores = native.search_text(query, w, ir)
                text_leg = list(zip(tids.tolist(), tscores.tolist()))
                if mode == "full_text":
                    top = text_leg[0][1] if text_leg else 0.0
                    fused = [(i, min(1.0, s / top) if top > 0.0 else 0.0) for i, s in text_leg]
                elif fusion == "rrf":
                    fused = normalize_rrf(rrf([vec_leg, text_leg], k=rrf_k), 2, rrf_k)
                else:
                    fused = linear(vec_leg, text_leg, weight)
                if not deduplicate:
                    cands: list[tuple[int, float, Sequence[int]]] = [(i, s, ()) for i, s in fused[:top_k]]
                    break
                cands = self._dedup_fused(fused, top_k)
                full = len(tids) == w or len(vec_leg) == w
                if len(cands) >= top_k or not full or w >= n:
                    break
                window = w * 4
            if score_threshold > 0.0:
                cands = [c for c in cands if c[1] >= score_threshold]
            return self._hits(cands, metric, fused=True)
        finally:
            rw.release_read()

    def _dedup_fused(self, fused: list[tuple[int, float]], top_k: int) -> list[tuple[int, float, Sequence[int]]]:
        """The best chunk of each (pipeline, document) in fused order, with the ids of every
        chunk of that document among the fused candidates (best first)."""
        if not fused:
            return []
        groups = self._groups_of(np.fromiter((f[0] for f in fused), np.int64, len(fused))).tolist()
        slot: dict[int, int] = {}
        out: list[tuple[int, float, list[int]]] = []
        for (cid, score), g in zip(fused, groups):
            i = slot.get(g)
            if i is None:
                slot[g] = len(out)
                out.append((cid, score, [cid]))
            else:
                out[i][2].append(cid)
        return out[:top_k]  # type: ignore[return-value]

    def retrieve_key(
        self,
        query: str | Any,
        topk: int = 5,
        *,
        deduplicate: bool = False,
        filters: Mapping[str, Any] | None = None,
        score_threshold: float = 0.0,
        pipelines: Sequence[str] | None = None,
        search_type: str | None = None,
        fusion: str | None = None,
        vector_weight: float | None = None,
        rrf_k: float = 60,
        window: int | None = None,
        query_vector: Any = None,
    ) -> list[KeyResult]:
        """aidb's ``retrieve_key``: the keys (document ids) of the closest chunks, with
        distance, ``part_ids`` (chunk indexes matched) and ``pipeline_name``. With
        ``deduplicate=True`` one result per document and pipeline, else one per chunk.
        The search options are :meth:`retrieve`'s."""
        hits = self.retrieve(query, self._check_k(topk, "topk"), deduplicate=deduplicate,
                             filters=filters, score_threshold=score_threshold, pipelines=pipelines,
                             search_type=search_type, fusion=fusion, vector_weight=vector_weight,
                             rrf_k=rrf_k, window=window, query_vector=query_vector)
        return [KeyResult(h.document_id, h.distance, h.part_ids or (h.chunk_index,), h.pipeline_name, h.score)
                for h in hits]

    def retrieve_text(
        self,
        query: str | Any,
        topk: int = 5,
        *,
        deduplicate: bool = False,
        filters: Mapping[str, Any] | None = None,
        score_threshold: float = 0.0,
        pipelines: Sequence[str] | None = None,
        search_type: str | None = None,
        fusion: str | None = None,
        vector_weight: float | None = None,
        rrf_k: float = 60,
        window: int | None = None,
        query_vector: Any = None,
    ) -> list[TextResult]:
        """aidb's ``retrieve_text``: :meth:`retrieve_key` plus ``value``, the document's source
        text, and ``chunk``, the text of the best matching chunk."""
        hits = self.retrieve(query, self._check_k(topk, "topk"), deduplicate=deduplicate,
                             filters=filters, score_threshold=score_threshold, pipelines=pipelines,
                             search_type=search_type, fusion=fusion, vector_weight=vector_weight,
                             rrf_k=rrf_k, window=window, query_vector=query_vector)
        out = []
        for h in hits:
            value = self.document_text(h.document_id, pipeline=h.pipeline_name)
            out.append(TextResult(h.document_id, value, h.distance, h.part_ids or (h.chunk_index,),
                                  h.pipeline_name, h.score, h.content))
        return out

    # -- documents ---------------------------------------------------------------------------
    def document_text(self, document_id: str, *, pipeline: str = _DEFAULT_PIPELINE) -> str:
        """The source text of a document: as parsed at ingest, or (for pre-embedded chunks)
        rebuilt from its chunks and their spans."""
        ref = self._docs.get((pipeline, document_id))
        if ref is None:
            raise NotFoundError(f"knowledge base {self.name!r} has no document {document_id!r} in pipeline {pipeline!r}")
        seg, d = ref
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
                out += piece[end - s:]
            end = max(end, e)
        return out

    def documents(self, *, pipeline: str | None = None) -> list[DocumentInfo]:
        """The stored documents (of one pipeline, or all), in ingest order."""
        out = []
        for seg in self._segments:
            meta = seg.docs.column("metadata").to_pylist()
            fnames = seg.docs.column("filename").to_pylist()
            fmts = seg.docs.column("format").to_pylist()
            when = seg.docs.column("ingested_at").to_pylist()
            counts = np.diff(seg.doc_offsets)
            for d in np.flatnonzero(seg.doc_live):
                if pipeline is not None and seg.doc_pipelines[d] != pipeline:
                    continue
                out.append(DocumentInfo(seg.doc_ids[d], seg.doc_pipelines[d], fnames[d], int(counts[d]),
                                        json.loads(meta[d]), fmts[d], when[d]))
        return out

    def __contains__(self, document_id: object) -> bool:
        return any(k[1] == document_id for k in self._docs)

    def count(self, filters: Mapping[str, Any] | None = None) -> int:
        """Number of chunks (passing ``filters`` if given)."""
        if self._index is None:
            return 0
        return self._index.count(filters)

    def info(self) -> dict[str, Any]:
        """A summary: configuration, counts, pipelines, embedder and bytes on disk."""
        cfg = dict(self._manifest["config"])
        disk = 0
        for name in os.listdir(self.path):
            try:
                disk += os.path.getsize(os.path.join(self.path, name))
            except OSError:
                pass
        return {
            "name": self.name, "path": self.path, **self.search_defaults, **cfg,
            "chunks": len(self), "documents": len(self._docs),
            "pipelines": self.pipelines, "embedder": self._manifest.get("embedder"),
            "segments": len(self._segments), "generation": self._manifest["generation"],
            "disk_bytes": disk, "created_at": self._manifest.get("created_at"),
        }

    # -- background graph building -------------------------------------------------------------
    _GRAPH_BATCH = 1024  # rows linked per native call: bounds how long a search may wait

    def _start_graph_builder(self) -> None:
        index = self._index
        if index is None or index.kind != "hnsw" or index.pending == 0 or self._closed:
            return
        if self._builder is not None and self._builder.is_alive():
            return
        self._builder_stop.clear()
        _LIVE_BUILDERS.add(self)
        self._builder = threading.Thread(target=self._build_graph_loop, name=f"kbcore-graph-{self.name}",
                                         daemon=True)
        self._builder.start()

    def _build_graph_loop(self) -> None:
        while not self._builder_stop.is_set():
            index = self._index
            if index is None or index.pending == 0:
                return
            index.build_graph(self._GRAPH_BATCH)
            # Saved at the next checkpoint or close, so that reopening does not relink.
            self._graph_unsaved = True

    def _stop_graph_builder(self) -> None:
        self._builder_stop.set()
        if self._builder is not None:
            self._builder.join()
            self._builder = None

    @property
    def pending_graph_rows(self) -> int:
        """Chunks stored and searchable (by exact scan) but not yet linked into the HNSW graph."""
        index = self._index
        return 0 if index is None else index.pending

    def wait_until_indexed(self, timeout: float | None = None) -> bool:
        """Waits until every chunk is linked into the HNSW graph (ingest returns as soon as
        the chunks are durable and searchable; linking continues in the background). Returns
        False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.pending_graph_rows:
            builder = self._builder
            if builder is None or not builder.is_alive():
                self._start_graph_builder()
                builder = self._builder
                if builder is None:
                    break
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            builder.join(timeout=0.05 if remaining is None else min(0.05, remaining))
            if deadline is not None and time.monotonic() >= deadline:
                return self.pending_graph_rows == 0
        return True

    # -- lifecycle ---------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Saves the index now, so that reopening replays nothing."""
        with self._writing():
            if self._index is None or not (self._tail_rows() or self._stale_text or self._graph_unsaved):
                return
            m = self._next_manifest()
            self._checkpoint_into(m, self._index, m["generation"])
            try:
                self._commit_manifest(m)
            except BaseException:
                _unlink_all(self.path, [m["index"]["path"]])
                raise
            with self._rw.write():
                self._apply(m, removed=())
            self._gc()

    def close(self) -> None:
        """Checkpoints the index if needed and releases the knowledge base. Rows not yet
        linked into the graph are saved as such and linked after the next open."""
        if self._closed:
            return
        self._stop_graph_builder()
        try:
            if os.path.exists(self.path) and (self._tail_rows() or self._stale_text or self._graph_unsaved):
                self.checkpoint()
        finally:
            self._closed = True
            self._engine._forget(self)

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
