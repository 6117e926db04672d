"""Incremental sync: bring one pipeline of a knowledge base in line with a source (a folder, or
an iterable of documents) by content hashes, re-using the stored vectors of unchanged chunks.

Each stored document records (in its segment's document table, written by
:func:`kbcore.engine.segments.build_tables`): ``source_id``, the id of the source item it came
from (a ``.zip`` gives several documents one source); ``content_hash``, a BLAKE2b hash of that
item's bytes (or text) and of everything else that decides its chunks (the pipeline's
chunking settings: size, overlap, unit, separators, steps; the index type and parent size; the
tokenizer when sizes count tokens; format, filename, metadata); ``chunk_hashes``, the BLAKE2b hash of each
chunk's text. A source item whose hash equals the stored one is skipped after hashing; a
changed one is parsed and chunked again, and each chunk whose text hash is among the stored
document's takes the stored vector (``Index.get_vectors``) instead of an embedding.

This module plans and prepares; :class:`~kbcore.engine.knowledge_base.KnowledgeBase` passes
the callables that commit (through :mod:`kbcore.engine.commit`, under the writer), so every
batch is one atomic commit and a killed sync leaves the last committed batch: a re-run skips
what was committed and completes the rest.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError, KbcoreError, NotFoundError
from ..parsing import EXTENSIONS
from . import ingest
from .ingest import ChunkBatch
from .state import KbState
from .types import Document, PreparedDocument, SyncReport

#: Bytes of a chunk's text hash (BLAKE2b-128: collisions are not a practical concern).
HASH_BYTES = 16
#: Part of every content hash: a change of what is hashed changes this tag.
_HASH_TAG = b"kbcore-sync-1\0"
#: Chunks prepared before a batch is embedded and committed: as many as one commit of
#: ``ingest_many`` (a commit of at least 4,096 rows checkpoints the index, so smaller batches
#: would save the whole index more often).
BATCH_ROWS = ingest.COMMIT_ROWS
#: What reading or parsing one source item may raise: reported as failed, the sync goes on.
_ITEM_ERRORS = (KbcoreError, OSError, ValueError, UnicodeError, ImportError)


def chunk_hash(text: str) -> bytes:
    """The hash of one chunk's text (``HASH_BYTES`` bytes)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=HASH_BYTES).digest()


# -- the source -----------------------------------------------------------------------------


def folder_items(root: str, include: Sequence[str] | None, exclude: Sequence[str] | None) -> list[tuple[str, str]]:
    """(document id, path) of the files under ``root``, recursively, sorted: the id is the path
    relative to ``root`` with ``/`` separators. Hidden files and folders are skipped; a file is
    taken when its extension is a supported format (or an ``include`` pattern names it), it
    matches an ``include`` pattern (when given) and no ``exclude`` pattern. Patterns are
    ``fnmatch`` globs matched against the relative path (``*`` also crosses ``/``) and against
    the file name."""
    if not os.path.isdir(root):
        raise InvalidArgumentError(f"{root!r} is not a folder")
    out = []
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        prefix = os.path.relpath(base, root).replace(os.sep, "/") + "/"  # once per folder
        prefix = "" if prefix == "./" else prefix
        for name in sorted(files):
            if name.startswith("."):
                continue
            full = os.path.join(base, name)
            rel = prefix + name
            if include:
                if not _matches(rel, name, include):
                    continue
            elif os.path.splitext(name)[1].lower() not in EXTENSIONS:
                continue
            if exclude and _matches(rel, name, exclude):
                continue
            out.append((rel, full))
    return out


def _matches(rel: str, name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def _patterns(value: str | Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    out = tuple(value)
    if not all(isinstance(p, str) and p for p in out):
        raise InvalidTypeError(f"{what} must be a glob or a list of globs (non-empty str), got {value!r}")
    return out


def source_items(
    source: Any, include: str | Sequence[str] | None, exclude: str | Sequence[str] | None
) -> list[tuple[str, Document]]:
    """(source id, Document) of every item of a sync source, ids checked distinct.

    ``source`` is a folder (ids: relative paths) or an iterable of :class:`Document`, paths,
    dicts of Document fields or ``(id, content[, metadata])`` tuples (content: text as str, or
    a file's bytes, typed by the id's extension). A Document's id is its ``document_id``,
    else its ``filename``, else its path as given (as :meth:`KnowledgeBase.ingest_many`
    names them); text or bytes without either raises (a content hash is no stable id).
    ``include`` / ``exclude`` apply to folders only."""
    inc, exc = _patterns(include, "include"), _patterns(exclude, "exclude")
    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
        return [(rid, Document(path, document_id=rid)) for rid, path in folder_items(os.fspath(source), inc, exc)]
    if inc or exc:
        raise InvalidArgumentError("include / exclude patterns apply to a folder source only")
    if isinstance(source, (str, os.PathLike)) and not os.path.exists(source):
        raise FileNotFoundError(2, f"No such folder: {os.fspath(source)!r}", os.fspath(source))
    if isinstance(source, (str, bytes, os.PathLike)) or not isinstance(source, Iterable):
        raise InvalidTypeError(
            f"sync source must be a folder or an iterable of documents, got {type(source).__name__}"
            + (f" {os.fspath(source)!r} (not a folder)" if isinstance(source, (str, os.PathLike)) else "")
        )
    out: list[tuple[str, Document]] = []
    seen: set[str] = set()
    for item in source:
        doc = _as_document(item)
        sid = doc.document_id or doc.filename
        if sid is None and isinstance(doc.source, (str, os.PathLike)):
            sid = os.fspath(doc.source)
        if not isinstance(sid, str) or not sid:
            raise InvalidArgumentError(
                "sync needs an id for each text or bytes document (document_id= or filename=): "
                "a content hash would change with the content"
            )
        if sid in seen:
            raise InvalidArgumentError(f"document id {sid!r} appears twice in the sync source")
        seen.add(sid)
        out.append((sid, replace(doc, document_id=sid)))
    return out


def _as_document(item: Any) -> Document:
    if isinstance(item, tuple) and len(item) in (2, 3):
        doc_id, content, metadata = item if len(item) == 3 else (*item, None)
        if isinstance(content, str):
            return Document(text=content, document_id=doc_id, metadata=metadata)
        if isinstance(content, (bytes, bytearray, memoryview)):
            return Document(bytes(content), document_id=doc_id, filename=doc_id, metadata=metadata)
        raise InvalidTypeError(f"the content of {doc_id!r} must be str (text) or bytes, got {type(content).__name__}")
    return ingest.as_document(item)


#: Knowledge base settings that change how a pipeline's documents are chunked.
_CHUNKING_CONFIG = ("index_type", "parent_chunk_size")


def chunking_key(pcfg: Mapping[str, Any], config: Mapping[str, Any] | None = None, tokenizer: Any = None) -> Any:
    """What decides a document's chunks besides its content and metadata, beyond the chunk
    size and overlap: every other setting of the pipeline (``chunk_unit``, ``separators``,
    ``steps``, and any added later), the knowledge base's ``index_type`` and
    ``parent_chunk_size``, and ``tokenizer`` (the embedder's spec when sizes count tokens with
    its tokenizer). None when all are at their defaults, so that the content hashes of
    earlier syncs stay valid."""
    key: dict[str, Any] = {k: v for k, v in pcfg.items() if k not in ("chunk_size", "chunk_overlap")}
    for k in _CHUNKING_CONFIG:
        if config is not None and config.get(k) is not None:
            key[k] = config[k]
    if tokenizer is not None:
        key["tokenizer"] = tokenizer
    return key or None


def hash_item(
    doc: Document, pcfg: Mapping[str, Any], extra_meta: Mapping[str, Any] | None, chunking: Any = None
) -> tuple[str, Document]:
    """(content hash, the Document with its bytes read) of one source item: what is read
    once is hashed and later parsed, never read twice. ``chunking``: :func:`chunking_key`
    (None: computed from ``pcfg`` alone)."""
    data, text, filename, _ = ingest.read_source(doc)
    meta = ingest.check_metadata(extra_meta)
    meta.update(ingest.check_metadata(doc.metadata))
    h = hashlib.blake2b(_HASH_TAG, digest_size=HASH_BYTES)
    settings: list[Any] = [pcfg["chunk_size"], pcfg["chunk_overlap"], doc.format, filename, text is not None, meta]
    if doc.rows_as_documents:  # absent otherwise: the hashes of earlier syncs stay valid
        settings.append(["rows", doc.id_column])
    extra = chunking_key(pcfg) if chunking is None else chunking
    if extra is not None:  # absent at the defaults, as above
        settings.append(["chunking", extra])
    h.update(json.dumps(settings, sort_keys=True, default=repr).encode("utf-8") + b"\0")
    h.update(data if data is not None else (text or "").encode("utf-8", "surrogatepass"))
    if data is not None:
        loaded = Document(
            data,
            document_id=doc.document_id,
            filename=filename,
            metadata=doc.metadata,
            format=doc.format,
            rows_as_documents=doc.rows_as_documents,
            id_column=doc.id_column,
        )
    else:
        loaded = Document(text=text, document_id=doc.document_id, filename=filename, metadata=doc.metadata)
    return h.hexdigest(), loaded


# -- what is stored -------------------------------------------------------------------------


@dataclass
class Stored:
    """The live documents of one pipeline, by source id: [(document id, content hash)]."""

    by_source: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)

    @classmethod
    def of(cls, state: KbState, pipeline: str) -> Stored:
        out = cls()
        for seg in state.segments:
            names = seg.docs.column_names
            sids = seg.docs.column("source_id").to_pylist() if "source_id" in names else None
            hashes = seg.docs.column("content_hash").to_pylist() if "content_hash" in names else None
            for d in np.flatnonzero(seg.doc_live).tolist():
                if seg.doc_pipelines[d] != pipeline:
                    continue
                doc_id = seg.doc_ids[d]
                sid = (sids[d] if sids is not None else None) or doc_id
                out.by_source.setdefault(sid, []).append((doc_id, hashes[d] if hashes is not None else None))
        return out

    def unchanged(self, sid: str, content_hash: str) -> bool:
        docs = self.by_source.get(sid)
        return docs is not None and bool(docs) and all(h == content_hash for _, h in docs)


def stored_chunk_hashes(state: KbState, key: tuple[str, str]) -> tuple[np.ndarray, list[bytes]] | None:
    """(chunk ids, chunk text hashes) of a stored document, else None; the hashes are read
    from its segment, or computed from the stored texts when an older segment lacks them."""
    ref = state.doc(key)
    if ref is None:
        return None
    seg, d = ref
    ids = seg.doc_chunk_ids(d)
    blob = seg.docs.column("chunk_hashes")[d].as_py() if "chunk_hashes" in seg.docs.column_names else None
    if blob is not None and len(blob) == HASH_BYTES * len(ids):
        return ids, [blob[i : i + HASH_BYTES] for i in range(0, len(blob), HASH_BYTES)]
    return ids, [chunk_hash(t) for t in seg.doc_texts(d)]


@dataclass
class Planned:
    """A batch of prepared documents: what to embed and which stored vectors to take."""

    docs: list[PreparedDocument]
    sources: list[str]  # per document: its source id
    hashes: list[str]  # per document: its source's content hash
    chunk_hashes: list[list[bytes]]
    reuse_rows: np.ndarray  # rows of the batch whose vector is a stored one
    reuse_ids: np.ndarray  # the stored chunk id of each of those rows

    @property
    def rows(self) -> int:
        return sum(len(p.chunks) for p in self.docs)

    def embed_rows(self) -> np.ndarray:
        keep = np.ones(self.rows, dtype=bool)
        keep[self.reuse_rows] = False
        return np.flatnonzero(keep)

    def batch(self, pipeline: str) -> ChunkBatch:
        return replace(
            ChunkBatch.from_prepared(self.docs, pipeline),
            source_ids=list(self.sources),
            content_hashes=list(self.hashes),
            chunk_hashes=[b"".join(h) for h in self.chunk_hashes],
        )


def plan(state: KbState, pipeline: str, items: list[tuple[str, str, list[PreparedDocument]]]) -> Planned:
    """The batch of ``items`` ((source id, content hash, its prepared documents)), matching
    each new chunk's text hash against the stored document of the same id."""
    docs, sources, hashes, chunk_hashes = [], [], [], []
    reuse_rows: list[int] = []
    reuse_ids: list[int] = []
    row = 0
    for sid, h, prepared in items:
        for p in prepared:
            new = [chunk_hash(c.text) for c in p.chunks]
            old = stored_chunk_hashes(state, (pipeline, p.document_id))
            if old is not None and state.index is not None:
                first: dict[bytes, int] = {}
                for cid, ch in zip(old[0].tolist(), old[1]):
                    first.setdefault(ch, cid)
                for i, ch in enumerate(new):
                    cid = first.get(ch)
                    if cid is not None:
                        reuse_rows.append(row + i)
                        reuse_ids.append(cid)
            docs.append(p)
            sources.append(sid)
            hashes.append(h)
            chunk_hashes.append(new)
            row += len(new)
    return Planned(
        docs,
        sources,
        hashes,
        chunk_hashes,
        np.asarray(reuse_rows, dtype=np.int64),
        np.asarray(reuse_ids, dtype=np.int64),
    )


# -- the run --------------------------------------------------------------------------------


@dataclass
class Hooks:
    """What a sync needs from its knowledge base: the current state, the embedder, a commit of
    a batch (``(planned, vectors, embedder spec the vectors were made with)``), a delete of
    (pipeline, document id) keys still live, and the progress bar."""

    state: Callable[[], KbState]
    embedder: Callable[[], Any]
    commit: Callable[[Planned, np.ndarray, Any], None]
    delete: Callable[[list[tuple[str, str]]], None]
    bar: Any


def _embedder_or_none(hooks: Hooks) -> Any:
    """The knowledge base's embedder (its tokenizer counts tokens), or None when it has none."""
    try:
        return hooks.embedder()
    except InvalidArgumentError:
        return None


def run(
    items: list[tuple[str, Document]],
    *,
    pipeline: str,
    metadata: Mapping[str, Any] | None,
    delete_missing: bool,
    hooks: Hooks,
    batch_rows: int | None = None,
) -> SyncReport:
    """Syncs ``pipeline`` with ``items`` (see the module docstring); returns the report.
    A batch is committed once ``batch_rows`` chunks (default :data:`BATCH_ROWS`) are ready."""
    batch_rows = BATCH_ROWS if batch_rows is None else batch_rows
    state = hooks.state()
    pcfg = state.pipeline(pipeline)
    embedder = _embedder_or_none(hooks)
    chunking = ingest.chunking_for(pcfg, embedder)
    tokenizer = state.manifest.get("embedder") if "count_tokens" in chunking else None
    key = chunking_key(pcfg, state.config, tokenizer)
    stored = Stored.of(state, pipeline)
    added: list[str] = []
    changed: list[str] = []
    unchanged: list[str] = []
    failed: list[tuple[str, str]] = []
    embedded = reused = 0
    pending: list[tuple[str, str, list[PreparedDocument]]] = []
    rows = 0

    def flush() -> None:
        nonlocal embedded, reused, rows
        if not pending:
            return
        e, r = _commit_batch(pending, pipeline, stored, hooks)
        embedded, reused, rows = embedded + e, reused + r, 0
        pending.clear()

    for sid, doc in items:
        hooks.bar.update(1)
        try:
            h, loaded = hash_item(doc, pcfg, metadata, key)
            if stored.unchanged(sid, h):
                unchanged.append(sid)
                continue
            prepared, _ = ingest.prepare_documents(
                loaded, pipeline, pcfg["chunk_size"], pcfg["chunk_overlap"], metadata, chunking
            )
        except _ITEM_ERRORS as exc:
            failed.append((sid, _reason(exc)))
            continue
        (changed if sid in stored.by_source else added).append(sid)
        pending.append((sid, h, prepared))
        rows += sum(len(p.chunks) for p in prepared)
        if rows >= batch_rows:
            flush()
    flush()
    deleted: list[str] = []
    if delete_missing:
        keep = {sid for sid, _ in items}
        gone = [sid for sid in stored.by_source if sid not in keep]
        keys = [(pipeline, doc_id) for sid in gone for doc_id, _ in stored.by_source[sid]]
        if keys:
            hooks.delete(keys)
        deleted = gone
    return SyncReport(tuple(added), tuple(changed), tuple(unchanged), tuple(deleted), tuple(failed), embedded, reused)


def _commit_batch(
    pending: list[tuple[str, str, list[PreparedDocument]]], pipeline: str, stored: Stored, hooks: Hooks
) -> tuple[int, int]:
    """Embeds what is new in one batch, takes the stored vectors of the rest, commits it and
    deletes the documents its sources no longer hold; returns (embedded, reused) chunks."""
    state = hooks.state()
    planned = plan(state, pipeline, pending)
    embedder = hooks.embedder()
    spec = state.manifest.get("embedder")
    kept = None
    if len(planned.reuse_rows):
        assert state.index is not None
        try:
            kept = state.index.get_vectors(planned.reuse_ids)
        except NotFoundError:  # another writer deleted the document meanwhile: embed it all
            planned = replace(planned, reuse_rows=planned.reuse_rows[:0], reuse_ids=planned.reuse_ids[:0])
    todo = planned.embed_rows()
    texts = [c.text for p in planned.docs for c in p.chunks]
    quiet = ingest.progress(0, "", False)  # the bar counts source items
    fresh = ingest.embed([texts[i] for i in todo.tolist()], embedder, quiet) if len(todo) else None
    dim = fresh.shape[1] if fresh is not None else int(state.config["dim"])
    vectors = np.empty((planned.rows, dim), dtype=np.float32)
    if fresh is not None:
        vectors[todo] = fresh
    if kept is not None and len(planned.reuse_rows):
        vectors[planned.reuse_rows] = kept
    hooks.commit(planned, vectors, spec)
    new_ids = {p.document_id for p in planned.docs}
    stale = [
        (pipeline, doc_id)
        for sid, _, _ in pending
        for doc_id, _ in stored.by_source.get(sid, ())
        if doc_id not in new_ids
    ]
    if stale:  # e.g. members a re-synced .zip no longer holds
        hooks.delete(stale)
    return len(todo), len(planned.reuse_rows)


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"
