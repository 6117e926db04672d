"""KnowledgeBase: the public face of one knowledge base. Each method checks its arguments and
orchestrates the modules that do the work: :mod:`.ingest` (documents -> chunk batch),
:mod:`.commit` (every write), :mod:`.retrieval` (every search), :mod:`.graph_builder`.

It owns the pointer to the current snapshot (a :class:`~kbcore.engine.state.StateCell`), the
writer (thread ``RLock`` + ``FileLock``) and the graph builder; it holds no Arrow code and no
file names.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from ..chunking import check_chunk_params, check_chunking
from ..embedders import Embedder, as_embedder, embedder_spec
from ..errors import FormatError, InvalidArgumentError, InvalidTypeError, NotFoundError
from ..fusion import check_vector_weight
from ..index import Index
from ..rerankers import as_reranker, reranker_spec
from . import commit, ingest, reembed, reranking, retrieval, shards, storage, sync
from .embedding import KbEmbedder
from .graph_builder import GraphBuilder
from .manifest import tail_rows
from .segments import document_infos, document_text
from .state import KbState, StateCell
from .sync import Planned
from .types import (
    DEFAULT_PIPELINE,
    FUSIONS,
    SEARCH_TYPES,
    Document,
    DocumentInfo,
    Hit,
    IngestResult,
    KbStats,
    KeyResult,
    PreparedDocument,
    ReembedReport,
    SearchOptions,
    Step,
    SyncReport,
    TextResult,
    check_choice,
    check_name,
    check_steps,
)


class KnowledgeBase:
    """A persistent knowledge base. Get one from :class:`Engine`; do not construct directly."""

    # About 480 lines: the whole public API of a knowledge base (46 methods of 2-30 lines, most
    # of it signatures and docstrings); the work is in the modules named in the module docstring.

    def __init__(
        self,
        name: str,
        path: str,
        embedder: Embedder | None,
        *,
        default_embedder: Embedder | None = None,
        on_close: Callable[[KnowledgeBase], None] | None = None,
        vectors: str | None = None,
        mmap: bool = True,
    ) -> None:
        self.name = name
        self.path = path
        self._on_close = on_close
        self._vectors = vectors  # override of the configuration's vectors (None: as saved)
        self._mmap = mmap  # Index.load's: the checkpoint read in place (True) or copied
        self._wmutex = threading.RLock()
        self._flock = storage.FileLock(os.path.join(path, storage.LOCK))
        self._closed = False
        self._deleted = False
        self._cell = StateCell(self._load())
        self._embedder = KbEmbedder(name, self._cell.state.manifest.get("embedder"), embedder, default_embedder)
        self._reranker = reranking.KbReranker(name, lambda: self._cell.state.manifest.get("reranker"))
        #: Bumped when a re-embed switches the embedder (a query embedded before retries).
        self._embed_epoch = 0
        self._builder = GraphBuilder(name, lambda: self._cell.state.index)
        #: (pipeline, step name) -> the user step's function (held in memory, not stored)
        self._step_fns: dict[tuple[str, str], Callable[[str], str]] = {}
        self._builder.start()

    # -- properties ------------------------------------------------------------------------
    @property
    def metric(self) -> str:
        return self._cell.state.config["metric"]

    @property
    def dim(self) -> int | None:
        return self._cell.state.config.get("dim")

    @property
    def vectors(self) -> str:
        """Where this process keeps the float32 rows: "memory", or "disk" (a quantized
        knowledge base created or opened with ``vectors="disk"``; see docs/quantization.md)."""
        return self._cell.state.vectors

    @property
    def embedder(self) -> Embedder | None:
        """The embedder of text queries and text ingest (None: vectors only)."""
        return self._embedder.current

    @property
    def index(self) -> Index | None:
        """The current native index (a :class:`~kbcore.distributed.ShardedIndex` for a sharded
        knowledge base), for reading (search, count, ids, metadata) alongside the engine; None
        before the first ingest of a knowledge base without dimension. Mutating
        it bypasses the engine's files: the next reopen would not match."""
        return self._cell.state.index

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def search_defaults(self) -> dict[str, Any]:
        """``search_type``, ``fusion`` and ``vector_weight`` used when ``retrieve`` is not given
        them (set at creation or with :meth:`set_search_defaults`)."""
        return dict(zip(("search_type", "fusion", "vector_weight"), self._cell.state.defaults))

    def set_search_defaults(
        self, *, search_type: str | None = None, fusion: str | None = None, vector_weight: float | None = None
    ) -> None:
        """Changes the knowledge base's search defaults (durably); None keeps a value."""
        new = self.search_defaults
        if search_type is not None:
            new["search_type"] = check_choice("search_type", search_type, SEARCH_TYPES)
        if fusion is not None:
            new["fusion"] = check_choice("fusion", fusion, FUSIONS)
        if vector_weight is not None:
            new["vector_weight"] = check_vector_weight(vector_weight)
        with self._writing():
            commit.update_manifest(self._cell, lambda m: m["config"].update(new))

    @property
    def reranker_spec(self) -> dict[str, Any] | None:
        """The spec of the default reranker (None: no rerank unless ``retrieve`` asks)."""
        spec = self._cell.state.manifest.get("reranker")
        return dict(spec) if spec is not None else None

    def set_reranker(self, reranker: Any) -> None:
        """Sets (durably, in the manifest) the default reranker of :meth:`retrieve`: a reranker,
        a function ``(query, texts) -> scores``, a spec or a kind name (see
        :func:`kbcore.rerankers.as_reranker`); None removes it. A custom one (a function) is
        recorded by name and used by this process; after a reopen, set it again."""
        rr = None if reranker is None else as_reranker(reranker)
        spec = None if rr is None else reranker_spec(rr)
        with self._writing():
            commit.update_manifest(
                self._cell, lambda m: m.__setitem__("reranker", spec) if spec else m.pop("reranker", None)
            )
        if rr is not None:
            self._reranker.attach(rr)

    @property
    def pipelines(self) -> dict[str, dict[str, Any]]:
        """Pipeline name -> {"chunk_size", "chunk_overlap"} (and "chunk_unit" / "separators"
        when set, and "steps", a list of {"name", "intermediate"}, for a pipeline created with
        steps)."""
        return {k: dict(v) for k, v in self._cell.state.manifest["pipelines"].items()}

    def stats(self) -> KbStats:
        """Storage counters: segments, rows not covered by the index checkpoint, checkpoint
        rows, rows waiting for the graph builder (see :class:`~kbcore.engine.KbStats`)."""
        return self._cell.state.stats()

    def __len__(self) -> int:
        """Number of stored chunks."""
        index = self._cell.state.index
        return 0 if index is None else len(index)

    def __repr__(self) -> str:
        return (
            f"KnowledgeBase({self.name!r}, chunks={len(self)}, documents={len(self._cell.state.docs)}, "
            f"metric={self.metric!r}, dim={self.dim})"
        )

    # -- the writer ------------------------------------------------------------------------
    def refresh(self) -> None:
        """Reloads the knowledge base if another process changed it since. Never waits for a
        commit in progress: it sees the last committed state."""
        with self._wmutex:
            self._sync()
        self._start_builder()

    def _load(self) -> KbState:
        """KbState.load; for a sharded knowledge base under the writer lock (opening re-syncs
        the shards with the manifest, which writes them: :mod:`kbcore.engine.shards`)."""
        if not shards.is_sharded(storage.load_manifest(self.path)["config"]):
            return KbState.load(self.name, self.path, self._vectors, mmap=self._mmap)
        with self._wmutex, self._flock.hold():
            return KbState.load(self.name, self.path, self._vectors, mmap=self._mmap)

    def _sync(self) -> None:
        try:
            current = storage.load_manifest(self.path)["generation"]
        except FormatError:
            if not os.path.exists(self.path):
                raise NotFoundError(f"knowledge base {self.name!r} was deleted") from None
            raise
        if current != self._cell.state.generation:
            self._close_shards()  # the reload opens the shards again (one owner at a time)
            state = KbState.load(self.name, self.path, self._vectors, mmap=self._mmap)
            with self._cell.rw.write():
                self._cell.state = state

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Holds the writer (thread RLock, then the FileLock) on a state synced with the disk.
        Checked open again once the RLock is held: a delete (or close) that got it first wins."""
        self._check_open()
        with self._wmutex:
            self._check_open()
            with self._flock.hold():
                self._sync()
                yield

    def _check_open(self) -> None:
        if self._deleted:
            raise InvalidArgumentError(f"knowledge base {self.name!r} is closed: it was deleted")
        if self._closed:
            raise InvalidArgumentError(f"knowledge base {self.name!r} is closed")

    def _start_builder(self) -> None:
        if not self._closed:
            self._builder.start()

    # -- pipelines ---------------------------------------------------------------------------
    def create_pipeline(
        self,
        name: str,
        *,
        chunk_size: int | None = None,
        chunk_overlap: int | None = None,
        steps: Sequence[Step | str] | None = None,
        chunk_unit: str | None = None,
        separators: Sequence[str] | None = None,
    ) -> None:
        """Adds a named pipeline (its own chunking); its documents are retrieved together with
        the others, and deduplication is per pipeline.

        ``steps`` (aidb's pipeline steps): a list of :class:`~kbcore.engine.Step`, e.g.
        ``["parse", Step("chunk", intermediate=True), Step("summary", fn=summarize)]``:
        ``"parse"`` (optional, first), ``"chunk"`` (required) and user steps, callables ``(text)
        -> text`` run on each chunk in order; the last output is what is embedded and stored.
        A step with ``intermediate=True`` keeps its output beside each chunk and
        :meth:`retrieve_text` returns it in ``intermediate_steps``. ``chunk_unit`` /
        ``separators`` as for :meth:`Engine.create_knowledge_base`; each of the four chunking
        settings left None is the knowledge base's. The step list is stored in
        the manifest; a user step's function is not: after reopening, give it again with
        :meth:`set_step_function` before ingesting through the pipeline."""
        check_name(name, "pipeline")
        records, fns = check_steps(steps) if steps is not None else ([], {})
        cfg = self._cell.state.config
        size, overlap = check_chunk_params(
            cfg["chunk_size"] if chunk_size is None else chunk_size,
            cfg["chunk_overlap"] if chunk_overlap is None else chunk_overlap,
        )
        unit, seps = check_chunking(
            cfg.get("chunk_unit", "chars") if chunk_unit is None else chunk_unit,
            cfg.get("separators") if separators is None else separators,
        )
        with self._writing():
            if name in self._cell.state.manifest["pipelines"]:
                raise InvalidArgumentError(f"pipeline {name!r} already exists in {self.name!r}")

            def change(m: dict[str, Any]) -> None:
                m["pipelines"][name] = {"chunk_size": size, "chunk_overlap": overlap}
                if unit != "chars":
                    m["pipelines"][name]["chunk_unit"] = unit
                if seps:
                    m["pipelines"][name]["separators"] = list(seps)
                if records:
                    m["pipelines"][name]["steps"] = records
                check_settings(m, self.name)  # before it is written: a bad one never opens

            commit.update_manifest(self._cell, change)
            for step_name, fn in fns.items():
                self._step_fns[(name, step_name)] = fn

    def set_step_function(self, pipeline: str, step: str, fn: Callable[[str], str]) -> None:
        """Gives the function of a user step of ``pipeline`` in this process (functions are
        not stored: after reopening a knowledge base, give them again before ingesting)."""
        steps = self._steps_of(pipeline)
        if not any(s["name"] == step for s in steps) or step in ("parse", "chunk"):
            raise NotFoundError(f"pipeline {pipeline!r} has no user step {step!r}")
        if not callable(fn):
            raise InvalidTypeError(f"fn must be a callable (text) -> text, got {type(fn).__name__}")
        self._step_fns[(pipeline, step)] = fn

    def _steps_of(self, pipeline: str) -> list[dict[str, Any]]:
        """A pipeline's steps as the manifest records them ([] without steps)."""
        cfg: dict[str, Any] = dict(self._cell.state.pipeline(pipeline))
        return list(cfg.get("steps") or [])

    def _run_steps(self, prepared: PreparedDocument) -> PreparedDocument:
        steps = self._steps_of(prepared.pipeline)
        if not steps:
            return prepared
        fns = {s: f for (p, s), f in self._step_fns.items() if p == prepared.pipeline}
        return ingest.apply_steps(prepared, steps, fns)

    def delete_pipeline(self, name: str) -> int:
        """Removes a pipeline and every document ingested through it; returns chunks removed."""
        with self._writing():
            self._cell.state.pipeline(name)
            if name == DEFAULT_PIPELINE:
                raise InvalidArgumentError("the default pipeline cannot be deleted")
            keys = [k for k in self._cell.state.docs if k[0] == name]
            return commit.delete(self._cell, keys, self._builder.mark_saved, drop_pipeline=name)

    # -- ingest ------------------------------------------------------------------------------
    def ingest(
        self,
        source: str | os.PathLike[str] | bytes | None = None,
        *,
        document_id: str | None = None,
        filename: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        pipeline: str = DEFAULT_PIPELINE,
        format: str | None = None,
        text: str | None = None,
        embedder: Any = None,
        rows_as_documents: bool = False,
        id_column: str | None = None,
    ) -> IngestResult:
        """Parses, chunks, embeds and stores one document; re-ingesting a document id replaces
        it atomically.

        ``source`` is a path, or the file's content as bytes (or str) with ``filename=`` giving
        its type (the type also comes from the content: PDF and HTML are recognised); ``text``
        is already extracted text. Bad input (missing or empty file, bytes that do not decode,
        an unsupported type) raises before anything is stored. A ``.zip`` stores one document
        per supported member (see :meth:`ingest_many` and docs/formats.md). ``embedder``: as
        :meth:`ingest_many`'s.

        ``rows_as_documents=True`` (``.csv`` / ``.tsv`` / ``.xlsx``): each data row becomes its
        own document ``<document_id>/<row id>`` (``id_column``'s value, else the row number;
        ``<sheet>/<...>`` in a workbook) whose text is the row's ``header: value`` lines and
        whose metadata holds its cells, typed (filterable); like a zip's members, the rows are
        listed in the result's ``members``, replaced together on re-ingest and deleted together
        by ``delete_document(document_id)`` (docs/formats.md).
        """
        if not isinstance(rows_as_documents, bool):
            raise InvalidTypeError(f"rows_as_documents must be a bool, got {type(rows_as_documents).__name__}")
        doc = Document(
            source,
            document_id=document_id,
            filename=filename,
            metadata=metadata,
            format=format,
            text=text,
            rows_as_documents=rows_as_documents,
            id_column=id_column,
        )
        return self.ingest_many([doc], pipeline=pipeline, progress=False, embedder=embedder)[0]

    def ingest_many(
        self,
        documents: Iterable[Document | str | os.PathLike[str] | Mapping[str, Any]],
        *,
        pipeline: str = DEFAULT_PIPELINE,
        metadata: Mapping[str, Any] | None = None,
        progress: bool | None = None,
        embedder: Any = None,
    ) -> list[IngestResult]:
        """Ingests many documents (paths, :class:`Document`, or dicts of its fields).

        Every document is read, parsed and chunked first, so bad input raises before anything
        is stored. Chunks are then embedded and committed in batches (each batch atomic and
        durable). ``metadata`` is added to each document's own metadata. ``progress`` shows a
        bar (None: when stderr is a terminal).

        A ``.zip`` becomes one document per supported member, with id ``<archive id>/<path
        inside>`` and the metadata ``archive`` = the archive's id; its result lists them in
        ``members`` and the skipped ones in ``skipped``. Re-ingesting the archive replaces its
        members and then deletes the members it no longer holds; ``delete_document(archive
        id)`` deletes them all (docs/formats.md).

        ``embedder``: embeds this call's chunks instead of the knowledge base's own embedder (for
        a knowledge base created without one whose vectors come from elsewhere, e.g. a host's
        model); its vectors must have the knowledge base's dimension. Not recorded.
        """
        self._check_open()
        pcfg = ingest.chunking_for(self._cell.state.pipeline(pipeline), self._embedder.current)
        call_embedder = None if embedder is None else as_embedder(embedder)
        if call_embedder is None:
            self._embedder.require("ingest text")  # fail before parsing anything
        elif self.dim is not None and int(call_embedder.dim) != self.dim:
            raise InvalidArgumentError(
                f"embedder {call_embedder!r} makes {int(call_embedder.dim)}-dimensional vectors but knowledge "
                f"base {self.name!r} holds {self.dim}-dimensional ones"
            )
        prepared, skipped = ingest.prepare_all(documents, pipeline, self._parents_of(pcfg), metadata)
        prepared = [self._split(p, pcfg) for p in prepared]
        if pcfg.get("steps"):
            prepared = [self._run_steps(p) for p in prepared]
        results: list[IngestResult] = []
        bar = ingest.progress(sum(len(p.chunks) for p in prepared), f"ingest {self.name}", progress)
        try:
            for part in ingest.commit_groups(prepared):
                spec = self._cell.state.manifest.get("embedder")  # before the embedder: see _same_embedder
                emb = call_embedder if call_embedder is not None else self._embedder.require("ingest text")
                vectors = ingest.embed([t for p in part for t in p.texts], emb, bar)
                results.extend(self._commit_prepared(part, pipeline, vectors, embedded_with=spec))
        finally:
            bar.close()
        if not skipped:
            return results
        return self._archive_results(prepared, results, skipped, pipeline)

    def _archive_results(
        self,
        prepared: list[PreparedDocument],
        results: list[IngestResult],
        skipped: dict[str, tuple[tuple[str, str], ...]],
        pipeline: str,
    ) -> list[IngestResult]:
        """One result per input: an archive's members folded into the archive's result, after
        deleting the members a re-ingested archive no longer holds."""
        out: list[IngestResult] = []
        members: dict[str, list[IngestResult]] = {}
        for prep, res in zip(prepared, results, strict=True):
            if prep.archive is None:
                out.append(res)
                continue
            if prep.archive not in members:
                members[prep.archive] = []
                out.append(IngestResult(prep.archive, pipeline, 0, False, prep.archive_format))
            members[prep.archive].append(res)
        for archive_id, group in members.items():
            kept = {r.document_id for r in group}
            stale = [k for k in self._archive_keys(archive_id, pipeline) if k[1] not in kept]
            if stale:
                with self._writing():
                    live = [k for k in stale if self._cell.state.doc(k) is not None]
                    if live:
                        commit.delete(self._cell, live, self._builder.mark_saved)
        return [
            replace(
                r,
                chunks=sum(m.chunks for m in members[r.document_id]),
                replaced=any(m.replaced for m in members[r.document_id]),
                members=tuple(members[r.document_id]),
                skipped=skipped.get(r.document_id, ()),
            )
            if r.document_id in members and not r.members
            else r
            for r in out
        ]

    def _archive_keys(self, archive_id: str, pipeline: str | None) -> list[tuple[str, str]]:
        """The (pipeline, document id) keys of the stored members of an archive."""
        return [
            (d.pipeline_name, d.document_id)
            for d in self.documents(pipeline=pipeline)
            if d.metadata.get("archive") == archive_id and d.document_id.startswith(archive_id + "/")
        ]

    def prepare(
        self,
        source: str | os.PathLike[str] | bytes | None = None,
        *,
        document_id: str | None = None,
        filename: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        pipeline: str = DEFAULT_PIPELINE,
        format: str | None = None,
        text: str | None = None,
    ) -> PreparedDocument:
        """Reads, parses and chunks one document as :meth:`ingest` would, without embedding or
        storing it: embed ``prepared.texts`` elsewhere (e.g. a host's asynchronous embedder)
        and store them with :meth:`ingest_prepared`. Raises as :meth:`ingest` on bad input;
        needs no embedder."""
        self._check_open()
        pcfg = ingest.chunking_for(self._cell.state.pipeline(pipeline), self._embedder.current)
        doc = Document(source, document_id=document_id, filename=filename, metadata=metadata, format=format, text=text)
        parents = self._parents_of(pcfg)
        prepared = ingest.prepare(doc, pipeline, parents["chunk_size"], parents["chunk_overlap"], None, parents)
        return self._run_steps(self._split(prepared, pcfg))

    def _parents_of(self, pcfg: Mapping[str, int]) -> Mapping[str, int]:
        """The chunking that makes the documents' first chunks: the pipeline's, or for a
        parent-child knowledge base its parents (no overlap)."""
        parent = self._cell.state.config.get("parent_chunk_size")
        return pcfg if parent is None else {**pcfg, "chunk_size": parent, "chunk_overlap": 0}

    def _split(self, prepared: PreparedDocument, pcfg: Mapping[str, int]) -> PreparedDocument:
        """A parent-child knowledge base's document: its parents split into children."""
        if self._cell.state.config.get("parent_chunk_size") is None:
            return prepared
        return ingest.split_parents(prepared, pcfg["chunk_size"], pcfg["chunk_overlap"], pcfg)

    def prepare_qa(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        question_column: str = "question",
        answer_column: str = "answer",
        document_id: str | None = None,
        filename: str | None = None,
        format: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        pipeline: str = DEFAULT_PIPELINE,
    ) -> PreparedDocument:
        """Reads question-answer pairs as :meth:`ingest_qa` would, without embedding or
        storing them: embed ``prepared.texts`` (the questions) elsewhere and store them with
        :meth:`ingest_prepared`. Raises as :meth:`ingest_qa` on bad input; needs no embedder."""
        self._check_open()
        self._cell.state.pipeline(pipeline)
        if self._cell.state.config.get("index_type") == "parent_child":
            raise InvalidArgumentError(
                f"knowledge base {self.name!r} is parent_child: question-answer pairs go to a knowledge base "
                "with index_type='chunk'"
            )
        return ingest.prepare_qa(
            source,
            pipeline,
            filename=filename,
            format=format,
            question_column=question_column,
            answer_column=answer_column,
            document_id=document_id,
            metadata=metadata,
        )

    def ingest_qa(
        self,
        source: str | os.PathLike[str] | bytes,
        *,
        question_column: str = "question",
        answer_column: str = "answer",
        document_id: str | None = None,
        filename: str | None = None,
        format: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        pipeline: str = DEFAULT_PIPELINE,
    ) -> IngestResult:
        """Ingests question-answer pairs (a ``.csv`` / ``.tsv`` / ``.jsonl`` / ``.xlsx`` path,
        or its bytes with ``filename=`` or ``format=``) as one document with a chunk per row:
        the question is embedded and searched (vector and BM25), the answer is what a hit
        returns as ``content``, with the question in ``metadata["question"]`` (LangRAG's
        ``qa`` index, without the LLM). Columns are found by name in the header row (the
        object keys for JSON lines). A bad row (missing column, empty question or answer)
        raises InvalidArgumentError naming it, and nothing is stored; re-ingesting the
        document id replaces it atomically (docs/qa.md)."""
        embedder = self._embedder.require("ingest text")
        prepared = self.prepare_qa(
            source,
            question_column=question_column,
            answer_column=answer_column,
            document_id=document_id,
            filename=filename,
            format=format,
            metadata=metadata,
            pipeline=pipeline,
        )
        bar = ingest.progress(len(prepared.chunks), f"ingest {self.name}", None)
        try:
            vectors = ingest.embed(prepared.texts, embedder, bar)
        finally:
            bar.close()
        return self._commit_prepared([prepared], pipeline, vectors)[0]

    def ingest_prepared(self, prepared: PreparedDocument, vectors: Any) -> IngestResult:
        """Stores a :meth:`prepare` d document with its chunks' vectors ([len(prepared.texts),
        dim] floats, in chunk order), atomically replacing a document of the same id in its
        pipeline. Raises InvalidArgumentError for a wrong shape or dimension, NaN / inf, or a
        pipeline that no longer exists."""
        if not isinstance(prepared, PreparedDocument):
            raise InvalidTypeError(
                f"prepared must be a PreparedDocument (from prepare()), got {type(prepared).__name__}"
            )
        self._check_open()
        self._cell.state.pipeline(prepared.pipeline)
        vecs = ingest.check_vectors(vectors, len(prepared.chunks), self.dim, self.name)
        return self._commit_prepared([prepared], prepared.pipeline, vecs)[0]

    def _commit_prepared(
        self, docs: Sequence[PreparedDocument], pipeline: str, vectors: np.ndarray, *, embedded_with: Any = None
    ) -> list[IngestResult]:
        batch = ingest.ChunkBatch.from_prepared(docs, pipeline)
        with self._writing():
            if embedded_with is not None:
                vectors = self._same_embedder(embedded_with, [t for p in docs for t in p.texts], vectors)
            replaced = commit.ingest(self._cell, batch, vectors, self._builder.mark_saved)
        self._start_builder()
        return [IngestResult(p.document_id, pipeline, len(p.chunks), p.document_id in replaced, p.format) for p in docs]

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
        pipeline: str = DEFAULT_PIPELINE,
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
        self._check_open()
        self._cell.state.pipeline(pipeline)
        if self._cell.state.config.get("index_type") == "parent_child":
            raise InvalidArgumentError(
                f"knowledge base {self.name!r} is parent_child: its chunks are made at ingest from the "
                "document text (ingest, ingest_many or prepare), not taken from a table"
            )
        made = ingest.ChunkBatch.from_table(
            data,
            vectors,
            pipeline=pipeline,
            dim=self.dim,
            kb_name=self.name,
            vector_column=vector_column,
            text_column=text_column,
            document_id_column=document_id_column,
            chunk_index_column=chunk_index_column,
            span_columns=span_columns,
            filename_column=filename_column,
            metadata_columns=metadata_columns,
        )
        if made is None:
            return 0
        batch, vecs = made
        with self._writing():
            commit.ingest(self._cell, batch, vecs, self._builder.mark_saved)
        self._start_builder()
        return len(batch.doc_ids)

    # -- sync and re-embedding ------------------------------------------------------------------
    def sync(
        self,
        source: Any,
        *,
        include: str | Sequence[str] | None = None,
        exclude: str | Sequence[str] | None = None,
        delete_missing: bool = True,
        pipeline: str = DEFAULT_PIPELINE,
        metadata: Mapping[str, Any] | None = None,
        progress: bool | None = None,
    ) -> SyncReport:
        """Brings ``pipeline`` in line with ``source``: a folder (recursively; document ids are
        the files' paths relative to it, ``/``-separated; ``include`` / ``exclude`` are glob
        patterns, see :func:`kbcore.engine.sync.folder_items`) or an iterable of documents
        (:class:`Document`, paths, dicts, or ``(id, content[, metadata])`` tuples).

        A document whose content hash (bytes, chunking, metadata) is stored already is
        skipped without parsing; a changed one is replaced, re-using the stored vector of
        each chunk whose text did not change (no embedding call for it); a new one is added;
        stored documents of the pipeline missing from the source are deleted unless
        ``delete_missing=False``. Items that cannot be read or parsed are reported in
        ``failed`` (their stored version stays). Commits in batches: a kill leaves the last
        committed batch and a re-run completes the rest. See docs/sync.md.
        """
        self._check_open()
        self._cell.state.pipeline(pipeline)
        if self._cell.state.config.get("index_type") == "parent_child":
            raise InvalidArgumentError(
                f"knowledge base {self.name!r} is parent_child, which sync does not support yet: use "
                "ingest_many (re-ingesting a document id replaces it) and delete_document"
            )
        if not isinstance(delete_missing, bool):
            raise InvalidTypeError(f"delete_missing must be a bool, got {type(delete_missing).__name__}")
        items = sync.source_items(source, include, exclude)
        bar = ingest.progress(len(items), f"sync {self.name}", progress)
        hooks = sync.Hooks(
            state=lambda: self._cell.state,
            embedder=lambda: self._embedder.require("sync text"),
            commit=lambda planned, vectors, spec: self._commit_synced(planned, pipeline, vectors, spec),
            delete=self._delete_live,
            bar=bar,
        )
        try:
            return sync.run(items, pipeline=pipeline, metadata=metadata, delete_missing=delete_missing, hooks=hooks)
        finally:
            bar.close()

    def _commit_synced(self, planned: Planned, pipeline: str, vectors: np.ndarray, spec: Any) -> None:
        batch = planned.batch(pipeline)
        with self._writing():
            texts = [c.text for p in planned.docs for c in p.chunks]
            vectors = self._same_embedder(spec, texts, vectors)
            commit.ingest(self._cell, batch, vectors, self._builder.mark_saved)
        self._start_builder()

    def _delete_live(self, keys: list[tuple[str, str]]) -> None:
        with self._writing():
            live = [k for k in keys if self._cell.state.doc(k) is not None]
            if live:
                commit.delete(self._cell, live, self._builder.mark_saved)

    def _same_embedder(self, spec: Any, texts: list[str], vectors: np.ndarray) -> np.ndarray:
        """``vectors`` if the manifest still records ``spec`` (the embedder they were made
        with); after a re-embed committed meanwhile, ``texts`` embedded again with the new
        embedder. Call with the writer held (so no switch happens until the commit)."""
        now = self._cell.state.manifest.get("embedder")
        if now == spec:
            return vectors
        current = self._embedder.current
        if current is None or embedder_spec(current) != now:
            raise InvalidArgumentError(
                f"knowledge base {self.name!r} was re-embedded with {now} while this ingest embedded "
                f"with {spec}: open it again (with that embedder) and ingest again"
            )
        return ingest.embed(texts, current, ingest.progress(0, "", False))

    def reembed(self, embedder: Any, *, batch_size: int = 256, progress: bool | None = None) -> ReembedReport:
        """Embeds every stored chunk's text again with ``embedder`` (an embedder, a callable or
        a name, as ``Engine`` takes) into a new index of the same metric, kind and quantization
        (any dimension), then switches to it atomically with one manifest commit that records
        the new embedder. Searches use the old index until the switch, with no lock held while
        embedding. Documents ingested or deleted meanwhile are caught up before the switch
        (the chunks added are embedded with the new embedder under the writer lock), and an
        ingest that embedded with the old embedder and commits after the switch embeds again.
        A kill at any point leaves the old or the new knowledge base. Not for a sharded one."""
        self._check_open()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
        new = as_embedder(embedder)
        spec = embedder_spec(new)
        t0 = time.perf_counter()
        state = self._cell.state
        if shards.is_sharded(state.config):
            raise InvalidArgumentError(f"knowledge base {self.name!r} is sharded: reembed supports unsharded ones")
        old_dim = state.config.get("dim")
        bar = ingest.progress(len(self), f"reembed {self.name}", progress)
        try:
            index, done, spent = reembed.build(state, new, batch_size=batch_size, bar=bar)
            with self._writing():
                caught, more = reembed.catch_up(index, self._cell.state, new, batch_size=batch_size, bar=bar)

                def swap() -> None:
                    self._embedder.switch(spec, new)
                    self._embed_epoch += 1

                commit.switch_index(self._cell, index, spec, self._builder.mark_saved, swap)
                generation = self._cell.state.generation
        finally:
            bar.close()
        self._start_builder()
        return ReembedReport(
            done + caught, caught, old_dim, int(index.dim), generation, spent + more, time.perf_counter() - t0
        )

    # -- delete, compaction, checkpoint ------------------------------------------------------
    def delete_document(self, document_id: str, *, pipeline: str | None = None, missing_ok: bool = False) -> int:
        """Deletes a document's chunks (from every pipeline, or only ``pipeline``); returns the
        number of chunks removed. Unknown ids raise ``NotFoundError`` unless ``missing_ok``."""
        if not isinstance(document_id, str):
            raise InvalidTypeError(f"document_id must be a str, got {type(document_id).__name__}")
        with self._writing():
            state = self._cell.state
            if pipeline is not None:
                state.pipeline(pipeline)
            keys = state.keys_of(document_id, pipeline) or self._archive_keys(document_id, pipeline)
            if not keys:
                if missing_ok:
                    return 0
                where = f" in pipeline {pipeline!r}" if pipeline else ""
                raise NotFoundError(f"knowledge base {self.name!r} has no document {document_id!r}{where}")
            return commit.delete(self._cell, keys, self._builder.mark_saved)

    def compact(self) -> None:
        """Rewrites the live chunks into one segment and checkpoints the index, so deleted
        chunks' text and vectors no longer take disk space. Searches keep running meanwhile."""
        with self._writing():
            commit.compact(self._cell, self._builder.mark_saved)

    def checkpoint(self) -> None:
        """Saves the index now, so that reopening replays nothing."""
        with self._writing():
            commit.checkpoint(self._cell, self._builder.mark_saved, self._builder.unsaved)

    # -- retrieval ---------------------------------------------------------------------------
    def retrieve(
        self, query: str | Any, top_k: int = 5, options: SearchOptions | None = None, **kwargs: Any
    ) -> list[Hit]:
        """The ``top_k`` chunks that best match ``query`` (a str, embedded with the knowledge
        base's embedder, or a vector), best first.

        The search is set by ``options`` and keyword arguments naming its fields (keywords
        override ``options``); see :class:`~kbcore.engine.SearchOptions` for each one and
        :mod:`kbcore.engine.retrieval` for the search types and scores. Bad options raise
        InvalidArgumentError / InvalidTypeError naming them (an unknown name too).

        Reranking (``rerank=``, ``rerank_depth=``; :mod:`kbcore.engine.reranking`): the first
        stage fetches ``max(rerank_depth, top_k)`` candidates, the reranker orders them, then
        ``score_threshold`` and ``top_k`` apply; ``score`` is the reranker's relevance mapped
        to [0, 1], ``distance`` the first stage's. A failing reranker raises RerankerError
        (RerankerUnavailableError when its service is unreachable).
        """
        opts = retrieval.options(options, kwargs)
        self._check_open()
        reranker = self._reranker.choose(opts.rerank, query) if opts.rerank is not False else None
        if reranker is None:
            return self._first_stage(query, top_k, opts)
        top_k = retrieval.check_k(top_k, "top_k")
        depth = reranking.check_depth(opts.rerank_depth, top_k)
        # The threshold applies to the reranked scores, not the first stage's.
        first_opts = opts if opts.score_threshold == 0.0 else opts._replace(score_threshold=0.0)
        hits = self._rerank_candidates(reranker, query, top_k, depth, first_opts, opts.score_threshold)
        if hits is not None:
            return hits
        first = self._first_stage(query, depth, first_opts)
        return reranking.apply(reranker, query, first, top_k, opts.score_threshold)

    def search_ids(
        self,
        query: Any,
        top_k: int = 5,
        *,
        filters: Mapping[str, Any] | None = None,
        pipelines: Sequence[str] | str | None = None,
        ef: int | None = None,
        **unsupported: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The lean path of a vector search: ``(ids, distances)`` of the ``top_k`` chunks
        nearest to the vector ``query``, an int64 and a float32 array, best first, and
        nothing else (no text, metadata or :class:`Hit`: the ids-only answer of LanceDB's or
        zvec's fastest paths).

        For the same vector, ``top_k``, ``filters``, ``pipelines`` and ``ef`` these are
        :meth:`retrieve`'s rows, in its order, with its distances (``[h.id for h in hits]``,
        ``[h.distance for h in hits]``), searched under the same read lock on one snapshot:
        fewer than ``top_k`` when fewer chunks pass, two empty arrays for an empty knowledge
        base, and the same exceptions for a bad vector (wrong dimension, NaN, not numeric) or
        bad options. A parent-child knowledge base answers, as :meth:`retrieve`, the best
        chunk of each parent. Turn ids into hits with :meth:`get_hits`.

        It skips what :meth:`retrieve` adds around the search, and refuses those options
        (InvalidArgumentError): ``deduplicate``, ``score_threshold``, ``rerank`` /
        ``rerank_depth``, ``context_window`` (a knowledge base's default context window
        changes hits' ``content`` only, not their rows) and the text and hybrid search types
        (``search_type``, ``fusion``, ``vector_weight``, ``rrf_k``, ``window``,
        ``query_vector``). A str query raises InvalidTypeError: embed it first with
        :meth:`embed_query`. Costs the native search plus a few microseconds of Python
        (docs/retrieve-cost.md).
        """
        if unsupported:
            _refuse(unsupported)
        if self._closed:
            self._check_open()
        return retrieval.nearest_ids(self._cell, query, top_k, filters, pipelines, ef)

    def get_hits(self, ids: Any, distances: Any = None) -> list[Hit]:
        """The :class:`Hit` of each chunk id, in the order given, as :meth:`retrieve` builds
        them (content, metadata, ``document_id``...; a parent-child knowledge base's hit holds
        its parent's text, a QA pair's its answer). ``distances`` (one per id, e.g. from
        :meth:`search_ids`) sets each hit's ``distance`` and ``score``; without them both are
        NaN. ``get_hits(*kb.search_ids(q, k))`` equals ``retrieve(q, k)`` unless a context
        window applies (not added here), the knowledge base is parent-child (no ``part_ids``
        here) or a write came between the two calls. Raises NotFoundError (a KeyError) if an
        id is not a stored chunk (never, or deleted since).
        """
        self._check_open()
        id_list = _id_list(ids)
        cands: list[retrieval.Candidate]
        if distances is None:
            cands = [(i, float("nan"), ()) for i in id_list]
        else:
            dist = np.asarray(distances)
            if dist.dtype.kind not in "fiu" or dist.shape != (len(id_list),):
                raise InvalidArgumentError(
                    f"distances must be {len(id_list)} numbers (one per id), got shape {list(dist.shape)} "
                    f"of dtype {dist.dtype}"
                )
            cands = [(i, d, ()) for i, d in zip(id_list, dist.astype(np.float64).tolist())]
        if not cands:
            return []
        with self._cell.rw.read():
            state = self._cell.state
            if state.index is None:
                raise NotFoundError(f"knowledge base {self.name!r} has no chunk {id_list[0]}")
            missing = next((i for i in id_list if i not in state.index), None)
            if missing is not None:
                raise NotFoundError(f"knowledge base {self.name!r} has no chunk {missing}")
            # NaN distances pass through the fused branch: distance and score both NaN.
            return retrieval.make_hits(state, cands, state.config["metric"], fused=distances is None)

    def _rerank_candidates(
        self, reranker: Any, query: str, top_k: int, depth: int, first_opts: SearchOptions, threshold: Any
    ) -> list[Hit] | None:
        """The reranked answer from the first stage's candidates: the reranker reads their
        texts and hits are built for the ``top_k`` kept (contents that are not chunk texts,
        parents or QA answers: every hit built first). None when the candidates cannot serve
        (a context window, a write or re-embed meanwhile): rerank the whole first stage."""
        short = self._candidates(query, depth, first_opts)
        if short is None:
            return None
        texts = retrieval.texts_of(short)
        if texts is None:
            first = retrieval.hits_of(self._cell, short, short.cands)
            return None if first is None else reranking.apply(reranker, query, first, top_k, threshold)
        cands = short.cands
        return reranking.apply_lazy(
            reranker,
            query,
            texts,
            short.scores,
            lambda picks: retrieval.hits_of(self._cell, short, [cands[i] for i in picks]),
            lambda: self._first_stage(query, depth, first_opts),
            top_k,
            threshold,
        )

    def _first_stage(self, query: str | Any, top_k: int, opts: SearchOptions) -> list[Hit]:
        """The search without a reranker, embedded again if a re-embed switched meanwhile."""
        epoch = self._embed_epoch
        try:
            hits = retrieval.retrieve(self._cell, query, top_k, opts, self._embed_query)
        except InvalidArgumentError:  # e.g. a query of the old dimension met the new index
            if self._embed_epoch == epoch:
                raise
            hits = None
        if self._embed_epoch != epoch:  # a re-embed switched during this query: embed it again
            hits = retrieval.retrieve(self._cell, query, top_k, opts, self._embed_query)
        return hits or []

    def _shortlist(self, query: str | Any, top_k: int, opts: SearchOptions) -> retrieval.Shortlist | None:
        """Hook of :meth:`Engine.retrieve`: :meth:`retrieve`'s candidates without their hits
        (built later by :meth:`_hits_of` for those the merge keeps), or None when this call
        is not that simple (a reranker, a context window, a re-embed meanwhile): then call
        :meth:`retrieve`."""
        self._check_open()
        if opts.rerank is not False and self._reranker.choose(opts.rerank, query) is not None:
            return None
        return self._candidates(query, top_k, opts)

    def _vector_search(self, query: str | Any, top_k: int, opts: SearchOptions) -> retrieval.VectorSearch | None:
        """Hook of :meth:`Engine.retrieve`: :meth:`_shortlist`'s search checked and ready, so
        that several knowledge bases search in one native call
        (:func:`~kbcore.engine.retrieval.shortlists`); None when it is not a vector search
        without reranker or context window: then call :meth:`_shortlist`."""
        self._check_open()
        if opts.rerank is not False and self._reranker.choose(opts.rerank, query) is not None:
            return None
        return retrieval.vector_search(self._cell, query, top_k, opts, self._embed_query)

    def _candidates(self, query: str | Any, top_k: int, opts: SearchOptions) -> retrieval.Shortlist | None:
        """The first stage's :class:`~kbcore.engine.retrieval.Shortlist` (no reranker), or
        None when hits must be built whole (a context window, a re-embed meanwhile)."""
        epoch = self._embed_epoch
        try:
            short = retrieval.shortlist(self._cell, query, top_k, opts, self._embed_query)
        except InvalidArgumentError:
            if self._embed_epoch == epoch:
                raise
            return None
        return short if self._embed_epoch == epoch else None

    def _merge_facts(self) -> tuple[tuple[str, str, float], Any, str, Any, int]:
        """Hook of :meth:`Engine.retrieve`: (search defaults, embedder spec, metric, reranker
        spec, chunks), read from one snapshot in one call; the specs are the manifest's own
        (not copied: the caller only compares them)."""
        state = self._cell.state
        manifest = state.manifest
        index = state.index
        chunks = 0 if index is None else len(index)
        return state.defaults, manifest.get("embedder"), state.config["metric"], manifest.get("reranker"), chunks

    def _hits_of(self, short: retrieval.Shortlist, cands: list[Any]) -> list[Hit] | None:
        """Hook of :meth:`Engine.retrieve`: the hits of some of ``short``'s candidates, or
        None when this knowledge base changed since (search again)."""
        return retrieval.hits_of(self._cell, short, cands)

    def _embed_query(self, text: str, what: str) -> np.ndarray:
        return self._embedder.embed_query(text, what, self.dim)

    def embed_query(self, text: str) -> np.ndarray:
        """``text`` embedded as this knowledge base embeds queries (float32 [dim]); raises
        InvalidArgumentError when it has no usable embedder. :meth:`Engine.retrieve` uses it
        to embed a query once for every knowledge base of the same :attr:`embedder_spec`."""
        return self._embedder.embed_query(text, "embed a text query", self.dim)

    @property
    def embedder_spec(self) -> dict[str, Any] | None:
        """The embedder recorded in the manifest (None: vectors only)."""
        spec = self._cell.state.manifest.get("embedder")
        return None if spec is None else dict(spec)

    def retrieve_key(
        self, query: str | Any, topk: int = 5, options: SearchOptions | None = None, **kwargs: Any
    ) -> list[KeyResult]:
        """aidb's ``retrieve_key``: the keys (document ids) of the closest chunks, with
        distance, ``part_ids`` (chunk indexes matched) and ``pipeline_name``. As in aidb,
        results are deduplicated by default: one per document and pipeline (its best part);
        ``deduplicate=False`` returns every matching part. The other search options are
        :meth:`retrieve`'s (an explicit ``options`` keeps its own ``deduplicate``)."""
        hits = self.retrieve(query, retrieval.check_k(topk, "topk"), options, **_aidb(options, kwargs))
        return [
            KeyResult(h.document_id, h.distance, h.part_ids or (h.chunk_index,), h.pipeline_name, h.score) for h in hits
        ]

    def retrieve_text(
        self, query: str | Any, topk: int = 5, options: SearchOptions | None = None, **kwargs: Any
    ) -> list[TextResult]:
        """aidb's ``retrieve_text``: :meth:`retrieve_key` plus ``value``, the document's source
        text, ``chunk``, the text of the best matching chunk, and ``intermediate_steps``, the
        stored outputs of that chunk's pipeline steps created with ``intermediate=True``
        (``{"parse": <the document text>, "chunk": ..., "<user step>": ...}``; empty when no
        step stores intermediates). Deduplicated by default, as :meth:`retrieve_key`: one
        result per document, the winning part with its own ``part_ids`` and
        ``intermediate_steps``; ``deduplicate=False`` returns every matching part with its
        own."""
        state = self._cell.state  # the snapshot the hits' rows are looked up in (immutable)
        hits = self.retrieve(query, retrieval.check_k(topk, "topk"), options, **_aidb(options, kwargs))
        out = []
        for h in hits:
            value = self.document_text(h.document_id, pipeline=h.pipeline_name)
            out.append(
                TextResult(
                    h.document_id,
                    value,
                    h.distance,
                    h.part_ids or (h.chunk_index,),
                    h.pipeline_name,
                    h.score,
                    h.content,
                    self._intermediate_steps(state, h, value),
                )
            )
        return out

    def _intermediate_steps(self, state: KbState, hit: Hit, value: str) -> dict[str, Any]:
        """The stored step outputs of a hit's chunk (looked up in ``state``, else in the
        current snapshot when the chunk was committed after it)."""
        for st in (state, self._cell.state):
            steps = st.manifest["pipelines"].get(hit.pipeline_name, {}).get("steps")
            if not steps or not st.segments or hit.id < st.segments[0].min_id:
                continue
            seg, row = st.locate(hit.id)
            if 0 <= row < seg.rows and int(seg.ids[row]) == hit.id:
                out = seg.steps_of(row)
                if any(s["name"] == "parse" and s.get("intermediate") for s in steps):
                    out = {"parse": value, **out}
                return out
        return {}

    # -- documents ---------------------------------------------------------------------------
    def document_text(self, document_id: str, *, pipeline: str = DEFAULT_PIPELINE) -> str:
        """The source text of a document: as parsed at ingest, or (for pre-embedded chunks)
        rebuilt from its chunks and their spans."""
        ref = self._cell.state.doc((pipeline, document_id))
        if ref is None:
            raise NotFoundError(
                f"knowledge base {self.name!r} has no document {document_id!r} in pipeline {pipeline!r}"
            )
        return document_text(*ref)

    def documents(self, *, pipeline: str | None = None) -> list[DocumentInfo]:
        """The stored documents (of one pipeline, or all), in ingest order."""
        return [info for seg in self._cell.state.segments for info in document_infos(seg, pipeline)]

    def __contains__(self, document_id: object) -> bool:
        return any(k[1] == document_id for k in self._cell.state.docs)

    def count(self, filters: Mapping[str, Any] | None = None) -> int:
        """Number of chunks (passing ``filters`` if given)."""
        index = self._cell.state.index
        return 0 if index is None else index.count(filters)

    def info(self) -> dict[str, Any]:
        """A summary: configuration, counts, pipelines, embedder and bytes on disk."""
        state = self._cell.state
        return {
            "name": self.name,
            "path": self.path,
            **self.search_defaults,
            **state.config,
            "chunks": len(self),
            "documents": len(state.docs),
            "pipelines": self.pipelines,
            "embedder": state.manifest.get("embedder"),
            "reranker": state.manifest.get("reranker"),
            "segments": len(state.segments),
            "generation": state.generation,
            "disk_bytes": _disk_bytes(self.path),
            "created_at": state.manifest.get("created_at"),
        }

    # -- graph building ------------------------------------------------------------------------
    @property
    def pending_graph_rows(self) -> int:
        """Chunks stored and searchable (by exact scan) but not yet linked into the HNSW graph."""
        index = self._cell.state.index
        return 0 if index is None else index.pending

    def wait_until_indexed(self, timeout: float | None = None) -> bool:
        """Waits until every chunk is linked into the HNSW graph (ingest returns as soon as
        the chunks are durable and searchable; linking continues in the background), and until
        the slot reorder that may follow the linking has ended (from 100k chunks, each time the
        index has doubled; docs/engine.md). Returns False if ``timeout`` seconds (None: no
        limit; a number >= 0) passed first."""
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise InvalidTypeError(f"timeout must be None or a number of seconds, got {type(timeout).__name__}")
            if not timeout >= 0:  # NaN too
                raise InvalidArgumentError(f"timeout must be >= 0 seconds, got {timeout!r}")
        return self._builder.wait(timeout, lambda: self.pending_graph_rows)

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Checkpoints the index if needed and releases the knowledge base. Rows not yet
        linked into the graph are saved as such and linked after the next open."""
        if self._closed:
            return
        self._builder.stop()
        try:
            state = self._cell.state
            if os.path.exists(self.path) and (tail_rows(state.manifest) or state.stale_text or self._builder.unsaved):
                self.checkpoint()
        finally:
            self._detach()

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- hooks of Engine (the directory) ---------------------------------------------------------
    def _detach(self, *, deleted: bool = False) -> None:
        """Stops the graph builder and marks the knowledge base closed (``deleted``: every
        later call says so in its InvalidArgumentError), without touching its files. Engine calls it with
        ``deleted=True`` before it deletes the knowledge base: it waits for a write in progress
        in this process (the writer RLock) to finish, and no write starts after it."""
        with self._wmutex:
            self._deleted = self._deleted or deleted
            self._closed = True
            self._builder.retire()
            self._close_shards()
        if self._on_close is not None:  # outside the RLock: Engine's mutex is taken after it
            self._on_close(self)

    def _close_shards(self) -> None:
        """Stops the shard actors of a sharded index (its files stay)."""
        index = self._cell.state.index
        if index is not None and not isinstance(index, Index):
            shards.close_index(index)

    def _attach_embedder(self, embedder: Embedder) -> None:
        """Makes ``embedder`` the first candidate to rebuild the knowledge base's embedder from."""
        self._embedder.attach(embedder)

    def _attach_reranker(self, reranker: Any) -> None:
        """Uses ``reranker`` (e.g. a custom one) as the default while the manifest records its spec."""
        self._reranker.attach(reranker)


#: The options of :meth:`KnowledgeBase.retrieve` that :meth:`KnowledgeBase.search_ids` has no
#: answer for (it returns the nearest chunks as found).
_NOT_IDS_ONLY = {
    "deduplicate": "dedup (one chunk per document)",
    "score_threshold": "a score threshold",
    "rerank": "rerank",
    "rerank_depth": "rerank",
    "context_window": "a context window",
    "search_type": "text or hybrid search",
    "fusion": "text or hybrid search",
    "vector_weight": "text or hybrid search",
    "rrf_k": "text or hybrid search",
    "window": "text or hybrid search",
    "query_vector": "text or hybrid search",
}


def _refuse(options: Mapping[str, Any]) -> None:
    """The error of a :meth:`KnowledgeBase.search_ids` call given options it cannot honour:
    InvalidArgumentError for :meth:`~KnowledgeBase.retrieve`'s, InvalidTypeError for unknown ones."""
    name = next(iter(options))
    if name not in _NOT_IDS_ONLY:
        raise InvalidTypeError(f"search_ids got an unknown option {name!r}; it takes top_k, filters, pipelines and ef")
    raise InvalidArgumentError(
        f"search_ids does not do {_NOT_IDS_ONLY[name]} ({name}=): it returns the nearest chunks as found; "
        "call retrieve for that"
    )


def _id_list(ids: Any) -> list[int]:
    """``ids`` (an int sequence or 1-D integer array) as Python ints, else InvalidTypeError /
    InvalidArgumentError."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
        raise InvalidTypeError(f"ids must be a sequence of chunk ids, got {type(ids).__name__}")
    arr = np.asarray(ids)
    if arr.size == 0:
        return []
    if arr.dtype.kind not in "iu":
        raise InvalidTypeError(f"ids must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise InvalidArgumentError(f"ids must be 1-D, got shape {list(arr.shape)}")
    return [int(i) for i in arr.tolist()]


def check_settings(m: dict[str, Any], name: str) -> None:
    """Checks a manifest about to be written against what the format holds (every field's
    type and range, e.g. chunk sizes and ``ef`` up to 2^31 - 1); InvalidArgumentError naming
    the field. Creation and configuration changes call it before touching the disk."""
    framed = dict(m, format=storage.FORMAT_NAME, version=storage.FORMAT_VERSION, checksum=0)
    try:
        storage.validate_manifest(framed, f"knowledge base {name!r}")
    except FormatError as exc:
        raise InvalidArgumentError(exc.strerror or str(exc)) from None


def _disk_bytes(path: str) -> int:
    total = 0
    for name in os.listdir(path):
        try:
            total += os.path.getsize(os.path.join(path, name))
        except OSError:
            pass
    return total


def _aidb(options: SearchOptions | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """aidb's default for ``retrieve_key`` / ``retrieve_text``: deduplicate unless the caller
    said otherwise (a keyword, or an explicit ``options``)."""
    if options is None and "deduplicate" not in kwargs:
        kwargs["deduplicate"] = True
    return kwargs
