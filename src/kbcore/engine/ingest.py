"""Ingest as a pipeline of pure steps: input -> :class:`PreparedDocument` (read, parse, chunk,
check metadata) -> vectors (embedding, or given) -> :class:`ChunkBatch`, the columnar batch
that :mod:`kbcore.engine.commit` stores. :meth:`ChunkBatch.from_table` makes the same batch
from pre-embedded Arrow rows without a Python loop over rows.

Nothing here writes a file, touches an index or takes a lock; it reads the input files.
Imports parsing, chunking, embedders and the engine's types.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..chunking import Chunk, chunk_text
from ..embedders import check_embeddings
from ..errors import InvalidArgumentError, InvalidTypeError
from ..parsing import detect_format, parse, parse_archive, parse_records
from ..sections import chunk_sections
from .columns import combined, to_numpy
from .types import PARENT_INDEX, RESERVED, RESERVED_METADATA, Document, PreparedDocument

COMMIT_ROWS = 16384  # ingest_many commits at most this many chunks at a time


@dataclass(frozen=True, eq=False)
class ChunkBatch:
    """Documents of one pipeline and their chunks, column by column (one entry per document,
    one row per chunk, documents' rows adjacent and in document order).

    ``texts`` is a pyarrow large_string array without nulls; ``text_list`` the same as a list
    when the producer had it (saves a conversion for the BM25 leg); ``doc_metadata`` holds
    each document's user metadata as JSON; ``user`` the chunk metadata columns (a pyarrow
    Table or None); ``filename_rows`` a per-chunk filename column that replaces the
    per-document ``filenames`` in the chunk table when given.
    """

    pipeline: str
    doc_ids: list[str]
    filenames: list[str | None]
    doc_texts: list[str | None]
    formats: list[str | None]
    doc_metadata: list[str]
    counts: np.ndarray
    texts: Any
    starts: np.ndarray
    ends: np.ndarray
    chunk_index: np.ndarray
    user: Any = None
    filename_rows: Any = None
    text_list: list[str] | None = None
    #: Optional per-chunk columns (pyarrow large_string arrays, nulls allowed): the content a
    #: hit returns (QA answers), the stored intermediate step outputs (JSON).
    contents: Any = None
    steps: Any = None
    #: Sync bookkeeping (:mod:`kbcore.engine.sync`), one entry per document, or None: the
    #: id of the source item it came from, the hash of that item's content, and its chunks'
    #: text hashes (``HASH_BYTES`` bytes per chunk, concatenated).
    source_ids: list[str] | None = None
    content_hashes: list[str] | None = None
    chunk_hashes: list[bytes] | None = None

    @property
    def rows(self) -> int:
        return len(self.chunk_index)

    @classmethod
    def from_prepared(cls, docs: Sequence[PreparedDocument], pipeline: str) -> ChunkBatch:
        """The batch of prepared documents (all of ``pipeline``)."""
        import pyarrow as pa

        texts = [c.text for p in docs for c in p.chunks]
        n = len(texts)
        counts = np.fromiter((len(p.chunks) for p in docs), dtype=np.int64, count=len(docs))
        doc_of_row = np.repeat(np.arange(len(docs)), counts)
        return cls(
            pipeline=pipeline,
            doc_ids=[p.document_id for p in docs],
            filenames=[p.filename for p in docs],
            doc_texts=[p.text for p in docs],
            formats=[p.format for p in docs],
            doc_metadata=[json.dumps(p.metadata, sort_keys=True, ensure_ascii=False) for p in docs],
            counts=counts,
            texts=pa.array(texts, pa.large_string()),
            starts=np.fromiter((c.start for p in docs for c in p.chunks), np.int64, n),
            ends=np.fromiter((c.end for p in docs for c in p.chunks), np.int64, n),
            chunk_index=np.fromiter((c.index for p in docs for c in p.chunks), np.int64, n),
            user=_with_structure(user_metadata_table([p.metadata for p in docs], doc_of_row), docs),
            text_list=texts,
            contents=_per_chunk(docs, "contents"),
            steps=_per_chunk(docs, "steps"),
        )

    @classmethod
    def from_table(
        cls,
        data: Any,
        vectors: Any,
        *,
        pipeline: str,
        dim: int | None,
        kb_name: str,
        vector_column: str,
        text_column: str,
        document_id_column: str,
        chunk_index_column: str | None,
        span_columns: tuple[str, str] | None,
        filename_column: str | None,
        metadata_columns: Sequence[str] | None,
    ) -> tuple[ChunkBatch, np.ndarray] | None:
        """(batch, vectors [rows, dim]) of pre-embedded chunk rows (see
        :meth:`KnowledgeBase.ingest_table`); None for an empty table. Rows are grouped by
        document (first seen first) with a stable sort, only when they are not already."""
        import pyarrow as pa

        table = as_table(data)
        n = table.num_rows
        if n == 0:
            return None
        names = set(table.column_names)
        for c in (text_column, document_id_column):
            if c not in names:
                raise InvalidArgumentError(f"the table has no column {c!r} (columns: {sorted(names)})")
        vecs = _table_vectors(table, vectors, vector_column, dim, kb_name)
        codes, doc_ids = _document_codes(table, document_id_column)
        order = np.argsort(codes, kind="stable")  # groups rows by document, first seen first
        counts = np.bincount(codes, minlength=len(doc_ids)).astype(np.int64)
        take = pa.array(order) if n > 1 and not np.all(order[1:] > order[:-1]) else None
        if take is not None:
            vecs = vecs[order]

        def col(name: str) -> Any:
            c = combined(table.column(name))
            return c.take(take) if take is not None else c

        doc_starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        if chunk_index_column and chunk_index_column in names:
            chunk_index = to_numpy(col(chunk_index_column), np.int64)
        else:
            chunk_index = np.arange(n, dtype=np.int64) - np.repeat(doc_starts, counts)
        if span_columns and span_columns[0] in names and span_columns[1] in names:
            starts, ends = to_numpy(col(span_columns[0]), np.int64), to_numpy(col(span_columns[1]), np.int64)
        else:
            starts, ends = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        filenames: list[str | None] = [None] * len(doc_ids)
        fname_rows = None
        if filename_column and filename_column in names:
            fname_rows = col(filename_column).cast(pa.string())
            filenames = fname_rows.take(pa.array(doc_starts)).to_pylist()
        used = {
            text_column,
            document_id_column,
            vector_column,
            chunk_index_column,
            filename_column,
            *(span_columns or ()),
        }
        meta_names = _metadata_column_names(table, used, metadata_columns)
        nd = len(doc_ids)
        batch = cls(
            pipeline=pipeline,
            doc_ids=doc_ids,
            filenames=filenames,
            doc_texts=[None] * nd,
            formats=[None] * nd,
            doc_metadata=["{}"] * nd,
            counts=counts,
            texts=_text_column(col(text_column), text_column),
            starts=starts,
            ends=ends,
            chunk_index=chunk_index,
            user=pa.table({c: col(c) for c in meta_names}) if meta_names else None,
            filename_rows=fname_rows,
        )
        return batch, vecs


def _per_chunk(docs: Sequence[PreparedDocument], field: str) -> Any:
    """A large_string column of an optional per-chunk field of the documents (null where a
    document has none), or None when no document has it."""
    import pyarrow as pa

    if all(getattr(p, field) is None for p in docs):
        return None
    values: list[str | None] = []
    for p in docs:
        got = getattr(p, field)
        values.extend(got if got is not None else [None] * len(p.chunks))
    return pa.array(values, pa.large_string())


# -- documents -> prepared documents ---------------------------------------------------------


def prepare(
    doc: Document,
    pipeline: str,
    chunk_size: int,
    chunk_overlap: int,
    extra_meta: Mapping[str, Any] | None,
    chunking: Mapping[str, Any] | None = None,
) -> PreparedDocument:
    """Reads, parses and chunks one document and checks its metadata (``extra_meta`` first,
    the document's own on top). Raises on bad input before anything is stored; a ``.zip``
    (several documents) raises: :func:`prepare_documents` takes it."""
    docs, _ = prepare_documents(doc, pipeline, chunk_size, chunk_overlap, extra_meta, chunking)
    if len(docs) != 1 or docs[0].archive is not None:
        raise InvalidArgumentError(
            f"{docs[0].archive!r} is a zip archive, which holds several documents: ingest it with ingest() "
            "or ingest_many()"
        )
    return docs[0]


def prepare_documents(
    doc: Document,
    pipeline: str,
    chunk_size: int,
    chunk_overlap: int,
    extra_meta: Mapping[str, Any] | None,
    chunking: Mapping[str, Any] | None = None,
) -> tuple[list[PreparedDocument], tuple[tuple[str, str], ...]]:
    """(the prepared documents of one input, its skipped archive members): one document, or
    for a ``.zip`` one per supported member, with id ``<archive id>/<path inside>``, filename
    ``<archive file name>/<path inside>`` and the metadata ``archive`` (the archive's id, unless
    the metadata sets it). A bad member refuses the whole archive. ``chunking``: the
    pipeline's ``chunk_unit`` / ``separators`` (absent: characters, no separators)."""
    data, text, filename, path = read_source(doc)
    if doc.rows_as_documents:
        if data is None:
            raise InvalidArgumentError("rows_as_documents needs a .csv, .tsv or .xlsx file, not text")
        return _prepare_rows(doc, data, filename, path, pipeline, chunk_size, chunk_overlap, extra_meta, chunking), ()
    if doc.id_column is not None:
        raise InvalidArgumentError("id_column is only used with rows_as_documents=True")
    if text is None:
        assert data is not None
        fmt = doc.format or (detect_format(filename, data) if data.strip() else None)
        if fmt == "zip":
            return _prepare_archive(
                doc, data, filename, path, pipeline, chunk_size, chunk_overlap, extra_meta, chunking
            )
    return [
        _prepare_one(doc, data, text, filename, path, pipeline, chunk_size, chunk_overlap, extra_meta, chunking)
    ], ()


def _prepare_archive(
    doc: Document,
    data: bytes,
    filename: str | None,
    path: str | None,
    pipeline: str,
    chunk_size: int,
    chunk_overlap: int,
    extra_meta: Mapping[str, Any] | None,
    chunking: Mapping[str, Any] | None = None,
) -> tuple[list[PreparedDocument], tuple[tuple[str, str], ...]]:
    archive = parse_archive(data, filename=filename)
    archive_id = doc.document_id or doc.filename or path or hashlib.sha256(data).hexdigest()[:16]
    if not isinstance(archive_id, str) or not archive_id:
        raise InvalidArgumentError(f"document_id must be a non-empty str, got {archive_id!r}")
    metadata = check_metadata(extra_meta)
    metadata.update(check_metadata(doc.metadata))
    metadata.setdefault("archive", archive_id)
    out = []
    for member in archive.members:
        p = member.parsed
        member_id = f"{archive_id}/{member.path}"
        chunks = _chunks(p.text, p.sections, chunk_size, chunk_overlap, member_id, chunking)
        out.append(
            PreparedDocument(
                member_id,
                pipeline,
                f"{filename or archive_id}/{member.path}",
                p.text,
                p.format,
                dict(metadata),
                tuple(chunks),
                archive=archive_id,
            )
        )
    return out, archive.skipped


def chunking_for(pcfg: Mapping[str, Any], embedder: Any) -> Mapping[str, Any]:
    """A pipeline's chunking for :func:`prepare_documents`: ``pcfg``, plus the embedder's
    ``count_tokens`` (``texts -> token counts``) when the pipeline counts tokens and the
    embedder has a tokenizer (the built-in MiniLM does); else tokens are approximated."""
    fn = getattr(embedder, "count_tokens", None)
    if pcfg.get("chunk_unit") != "tokens" or not callable(fn):
        return pcfg
    return {**pcfg, "count_tokens": fn}


def _prepare_rows(
    doc: Document,
    data: bytes,
    filename: str | None,
    path: str | None,
    pipeline: str,
    chunk_size: int,
    chunk_overlap: int,
    extra_meta: Mapping[str, Any] | None,
    chunking: Mapping[str, Any] | None,
) -> list[PreparedDocument]:
    """One document per data row of a spreadsheet: id ``<file id>/<row id>``, text the row's
    ``header: value`` lines, metadata the given metadata, then the row's typed cells, then
    ``archive`` = the file id (which groups the rows for delete and re-ingest)."""
    fmt = doc.format or detect_format(filename, data)
    records = parse_records(data, filename=filename, format=fmt, id_column=doc.id_column)
    file_id = doc.document_id or doc.filename or path or hashlib.sha256(data).hexdigest()[:16]
    if not isinstance(file_id, str) or not file_id:
        raise InvalidArgumentError(f"document_id must be a non-empty str, got {file_id!r}")
    metadata = check_metadata(extra_meta)
    metadata.update(check_metadata(doc.metadata))
    out = []
    for rec in records:
        row_id = f"{file_id}/{rec.key}"
        meta = dict(metadata)
        meta.update(check_metadata(rec.fields))
        meta["archive"] = file_id
        chunks = _chunks(rec.text, (), chunk_size, chunk_overlap, row_id, chunking)
        out.append(
            PreparedDocument(
                row_id, pipeline, filename, rec.text, fmt, meta, tuple(chunks), archive=file_id, archive_format=fmt
            )
        )
    return out


def _chunks(
    text: str,
    sections: Any,
    chunk_size: int,
    chunk_overlap: int,
    document_id: str,
    chunking: Mapping[str, Any] | None = None,
) -> list[Any]:
    opts: dict[str, Any] = {"chunk_size": chunk_size, "chunk_overlap": chunk_overlap, "document_id": document_id}
    if chunking:
        opts["chunk_unit"] = chunking.get("chunk_unit", "chars")
        opts["separators"] = chunking.get("separators")
        opts["count_tokens"] = chunking.get("count_tokens")
    if sections:
        chunks: list[Any] = chunk_sections(text, sections, **opts)
    else:
        chunks = chunk_text(text, **opts)
    if not chunks:
        raise InvalidArgumentError(f"document {document_id!r} contains no text: there is nothing to ingest")
    return chunks


def _prepare_one(
    doc: Document,
    data: bytes | None,
    text: str | None,
    filename: str | None,
    path: str | None,
    pipeline: str,
    chunk_size: int,
    chunk_overlap: int,
    extra_meta: Mapping[str, Any] | None,
    chunking: Mapping[str, Any] | None = None,
) -> PreparedDocument:
    sections: Any = ()
    if text is not None:
        fmt = "text"
        if not text.strip():
            raise InvalidArgumentError("the text is empty: there is nothing to ingest")
    else:
        assert data is not None
        parsed = parse(data, filename=filename, format=doc.format)
        text, fmt, sections = parsed.text, parsed.format, parsed.sections
    document_id = doc.document_id
    if document_id is None:
        document_id = (
            doc.filename or path or hashlib.sha256(data if data is not None else text.encode("utf-8")).hexdigest()[:16]
        )
    if not isinstance(document_id, str) or not document_id:
        raise InvalidArgumentError(f"document_id must be a non-empty str, got {document_id!r}")
    metadata = check_metadata(extra_meta)
    metadata.update(check_metadata(doc.metadata))
    chunks = _chunks(text, sections, chunk_size, chunk_overlap, document_id, chunking)
    return PreparedDocument(document_id, pipeline, filename, text, fmt, metadata, tuple(chunks))


def prepare_all(
    items: Iterable[Any], pipeline: str, pcfg: Mapping[str, int], extra_meta: Mapping[str, Any] | None
) -> tuple[list[PreparedDocument], dict[str, tuple[tuple[str, str], ...]]]:
    """(every document prepared, the skipped members of each archive by its id), so that bad
    input raises before anything is stored; a document id given twice raises."""
    prepared: list[PreparedDocument] = []
    skipped: dict[str, tuple[tuple[str, str], ...]] = {}
    seen: set[str] = set()
    for item in items:
        docs, skips = prepare_documents(
            as_document(item), pipeline, pcfg["chunk_size"], pcfg["chunk_overlap"], extra_meta, pcfg
        )
        for prep in docs:
            if prep.document_id in seen:
                raise InvalidArgumentError(f"document id {prep.document_id!r} appears twice in one ingest call")
            seen.add(prep.document_id)
            prepared.append(prep)
        if docs and docs[0].archive is not None:
            if docs[0].archive in seen:
                raise InvalidArgumentError(f"document id {docs[0].archive!r} appears twice in one ingest call")
            seen.add(docs[0].archive)
            skipped[docs[0].archive] = skips
    return prepared, skipped


def prepare_qa(
    source: str | os.PathLike[str] | bytes,
    pipeline: str,
    *,
    filename: str | None,
    format: str | None,
    question_column: str,
    answer_column: str,
    document_id: str | None,
    metadata: Mapping[str, Any] | None,
) -> PreparedDocument:
    """One document of question-answer pairs: a chunk per row whose text (embedded, searched
    by BM25) is the question and whose content (what a hit returns) is the answer. The
    document text is the pairs as ``Q: ...`` / ``A: ...`` blocks; each chunk spans its block.
    Raises on a bad row, naming it, before anything is stored."""
    from ..parsers.qa import read_qa

    data, _, filename, path = read_source(Document(source, filename=filename))
    assert data is not None
    pairs = read_qa(
        data,
        filename=filename or path,
        format=format,
        question_column=question_column,
        answer_column=answer_column,
    )
    if document_id is None:
        document_id = filename or path or hashlib.sha256(data).hexdigest()[:16]
    if not isinstance(document_id, str) or not document_id:
        raise InvalidArgumentError(f"document_id must be a non-empty str, got {document_id!r}")
    meta = check_metadata(metadata)
    if "question" in meta:
        raise InvalidArgumentError("metadata key 'question' is reserved in QA pairs: a hit carries its question there")
    blocks: list[str] = []
    chunks: list[Chunk] = []
    pos = 0
    for i, pair in enumerate(pairs):
        block = f"Q: {pair.question}\nA: {pair.answer}"
        if blocks:
            pos += 2
        chunks.append(Chunk(pair.question, i, pos, pos + len(block), document_id))
        blocks.append(block)
        pos += len(block)
    return PreparedDocument(
        document_id,
        pipeline,
        filename or (os.path.basename(path) if path else None),
        "\n\n".join(blocks),
        "qa",
        meta,
        tuple(chunks),
        contents=tuple(p.answer for p in pairs),
    )


def apply_steps(
    prepared: PreparedDocument, steps: Sequence[Mapping[str, Any]], fns: Mapping[str, Any]
) -> PreparedDocument:
    """``prepared`` after its pipeline's user steps: each user step (after the chunk step)
    maps every chunk's text to a new text, in order; the chunk keeps the last output. The
    outputs of the steps stored as intermediates (``chunk``: the text before the user steps)
    are kept per chunk as a JSON object. A pipeline without steps returns ``prepared``."""
    if not steps:
        return prepared
    user = [s for s in steps if s["name"] not in ("parse", "chunk")]
    keep_chunk = any(s["name"] == "chunk" and s.get("intermediate") for s in steps)
    stored = keep_chunk or any(s.get("intermediate") for s in user)
    if not user and not stored:
        return prepared
    new_chunks, records = [], []
    for chunk in prepared.chunks:
        text = chunk.text
        record: dict[str, str] = {"chunk": text} if keep_chunk else {}
        for step in user:
            name = step["name"]
            fn = fns.get(name)
            if fn is None:
                raise InvalidArgumentError(
                    f"pipeline {prepared.pipeline!r}: step {name!r} has no function in this process; "
                    f"give it with kb.set_step_function({prepared.pipeline!r}, {name!r}, fn)"
                )
            out = fn(text)
            if not isinstance(out, str) or not out.strip():
                raise InvalidArgumentError(
                    f"pipeline {prepared.pipeline!r}: step {name!r} must return a non-empty str, got "
                    f"{out!r:.80} for chunk {chunk.index} of document {prepared.document_id!r}"
                )
            text = out
            if step.get("intermediate"):
                record[name] = text
        new_chunks.append(replace(chunk, text=text) if text != chunk.text else chunk)
        records.append(json.dumps(record, ensure_ascii=False) if record else None)
    return replace(
        prepared, chunks=tuple(new_chunks), steps=tuple(records) if any(r is not None for r in records) else None
    )


def commit_groups(docs: list[PreparedDocument]) -> Iterator[list[PreparedDocument]]:
    """The documents in consecutive groups of about COMMIT_ROWS chunks (one commit each)."""
    start, rows = 0, 0
    for i, doc in enumerate(docs):
        rows += len(doc.chunks)
        if rows >= COMMIT_ROWS or i == len(docs) - 1:
            yield docs[start : i + 1]
            start, rows = i + 1, 0


def as_document(item: Any) -> Document:
    """A :class:`Document` from a Document, a path or a dict of its fields."""
    if isinstance(item, Document):
        return item
    if isinstance(item, (str, os.PathLike)):
        return Document(item)
    if isinstance(item, Mapping):
        try:
            return Document(**item)
        except TypeError as exc:
            raise InvalidArgumentError(f"bad document description {dict(item)!r}: {exc}") from None
    raise InvalidTypeError(f"expected a path, a Document or a dict, got {type(item).__name__}")


def read_source(doc: Document) -> tuple[bytes | None, str | None, str | None, str | None]:
    """(data, text, filename, path) of one input."""
    src = doc.source
    if doc.text is not None:
        if src is not None:
            raise InvalidArgumentError("give either a source or text=, not both")
        if not isinstance(doc.text, str):
            raise InvalidTypeError(f"text must be a str, got {type(doc.text).__name__}")
        return None, doc.text, doc.filename, None
    if src is None:
        raise InvalidArgumentError("nothing to ingest: give a path, bytes (with filename=) or text=")
    if isinstance(src, (bytes, bytearray, memoryview)):
        return bytes(src), None, doc.filename, None
    if isinstance(src, str) and doc.filename is not None:
        return src.encode("utf-8"), None, doc.filename, None
    if isinstance(src, (str, os.PathLike)):
        path = os.fspath(src)
        if not os.path.exists(path):
            hint = (
                "; to ingest a string as content, pass filename= (e.g. filename='notes.txt')"
                if isinstance(src, str) and ("\n" in src or len(src) > 255)
                else ""
            )
            raise FileNotFoundError(2, f"No such file: {path[:200]!r}{hint}", path[:200])
        if os.path.isdir(path):
            raise InvalidArgumentError(f"{path!r} is a directory; ingest the files in it (kbcore ingest does)")
        with open(path, "rb") as f:
            data = f.read()
        return data, None, doc.filename or os.path.basename(path), path
    raise InvalidTypeError(f"source must be a path, bytes or str, got {type(src).__name__}")


# -- metadata --------------------------------------------------------------------------------


def check_meta_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"metadata keys must be non-empty str, got {key!r}")
    if key in RESERVED:
        raise InvalidArgumentError(
            f"metadata key {key!r} is reserved: the engine sets {', '.join(RESERVED_METADATA)} itself"
        )
    if key.startswith("__") or key.startswith("$"):
        raise InvalidArgumentError(f"metadata key {key!r} may not start with '__' or '$'")


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A checked copy of one document's user metadata."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidTypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    out = {}
    for k, v in metadata.items():
        check_meta_key(k)
        if v is None or isinstance(v, (str, bool, int)):
            pass
        elif isinstance(v, float):
            if math.isnan(v):
                raise InvalidArgumentError(f"metadata {k!r}: NaN is not allowed (use None for missing)")
        elif isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            v = list(v)
        else:
            raise InvalidTypeError(
                f"metadata {k!r}: values must be str, int, float, bool, a list of str or None, got {type(v).__name__}"
            )
        out[k] = v
    return out


def user_metadata_table(metas: list[dict[str, Any]], doc_of_row: np.ndarray) -> Any:
    """The per-chunk user metadata columns (each document's values repeated over its rows)."""
    import pyarrow as pa

    keys: list[str] = []
    for meta in metas:
        for k in meta:
            if k not in keys:
                keys.append(k)
    if not keys:
        return None
    take = pa.array(doc_of_row)
    cols = {}
    for k in keys:
        values = [meta.get(k) for meta in metas]
        try:
            arr = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            kinds = sorted({type(v).__name__ for v in values if v is not None})
            raise InvalidArgumentError(
                f"metadata {k!r} holds values of different types ({', '.join(kinds)}) across the "
                "documents of one ingest call; ingest them in separate calls or use one type"
            ) from None
        if pa.types.is_null(arr.type):
            continue
        cols[k] = arr.take(take)
    return pa.table(cols) if cols else None


@dataclass(frozen=True, slots=True)
class ChildChunk(Chunk):
    """A child chunk of a parent-child knowledge base: ``parent_index`` is its parent's rank
    in the document; ``section`` / ``page`` are the parent's."""

    parent_index: int = 0
    section: str | None = None
    page: int | None = None


def split_parents(
    doc: PreparedDocument, child_size: int, child_overlap: int, chunking: Mapping[str, Any] | None = None
) -> PreparedDocument:
    """``doc`` (chunked into parents) with each parent split into child chunks of
    ``child_size`` characters (``child_overlap`` shared), numbered across the document. A
    child's span is its place in the document text when the parent's text is that span of it
    (plain and Markdown text), else the parent's span (e.g. a table parent that repeats its
    header), so the parent is always the document text between its children's spans.
    ``chunking``: the pipeline's ``chunk_unit`` / ``separators``, for the children too."""
    opts: dict[str, Any] = {}
    if chunking:
        opts = {k: chunking.get(k) for k in ("separators", "count_tokens")}
        opts["chunk_unit"] = chunking.get("chunk_unit", "chars")
    children: list[Chunk] = []
    text = doc.text
    for p, parent in enumerate(doc.chunks):
        exact = text[parent.start : parent.end] == parent.text
        section = getattr(parent, "section", None)
        page = getattr(parent, "page", None)
        for c in chunk_text(parent.text, chunk_size=child_size, chunk_overlap=child_overlap, **opts):
            start, end = (parent.start + c.start, parent.start + c.end) if exact else (parent.start, parent.end)
            children.append(ChildChunk(c.text, len(children), start, end, doc.document_id, p, section, page))
    return replace(doc, chunks=tuple(children))


def _with_structure(user: Any, docs: Sequence[PreparedDocument]) -> Any:
    """``user`` plus the chunks' ``section`` (heading path) and ``page`` columns when a parser
    found them; a document's own ``section`` / ``page`` metadata takes precedence."""
    import pyarrow as pa

    for key, typ in (("section", pa.string()), ("page", pa.int64()), (PARENT_INDEX, pa.int64())):
        found = [getattr(c, key, None) for p in docs for c in p.chunks]
        if all(v is None for v in found):
            continue
        own = [key in p.metadata for p in docs for _ in p.chunks]
        if user is not None and key in user.column_names:
            values = user.column(key).to_pylist()
            found = [u if mine else f for u, f, mine in zip(values, found, own, strict=True)]
            try:
                arr = pa.array(found)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                raise InvalidArgumentError(
                    f"metadata {key!r} is set by a document and found by the parser with another type; "
                    "use one type or another key"
                ) from None
            user = user.set_column(user.column_names.index(key), key, arr)
        else:
            arr = pa.array(found, typ)
            user = pa.table({key: arr}) if user is None else user.append_column(key, arr)
    return user


# -- vectors ---------------------------------------------------------------------------------


def check_vectors(vectors: Any, n: int, dim: int | None, kb_name: str) -> np.ndarray:
    """``vectors`` as C-contiguous float32 [n, dim]; raises naming the problem (shape, dtype,
    the knowledge base's dimension, NaN / inf)."""
    vecs = np.asarray(vectors)
    if vecs.ndim != 2 or vecs.shape[0] != n:
        raise InvalidArgumentError(f"vectors must have shape [{n}, dim], got {list(vecs.shape)}")
    if vecs.dtype.kind not in "fiu":  # float, signed or unsigned int
        raise InvalidTypeError(f"vectors must be a float array, got dtype {vecs.dtype}")
    vecs = np.ascontiguousarray(vecs, dtype=np.float32)
    check_dim(vecs, dim, kb_name)
    return vecs


def check_dim(vecs: np.ndarray, dim: int | None, kb_name: str) -> None:
    if dim is not None and vecs.shape[1] != dim:
        raise InvalidArgumentError(f"vectors have dimension {vecs.shape[1]}, knowledge base {kb_name!r} has {dim}")
    if not np.isfinite(vecs).all():  # the SIMD loop; cheaper than any one-pass reduction
        raise InvalidArgumentError("vectors contain NaN or infinite values")


def embed(texts: list[str], embedder: Any, bar: Any) -> np.ndarray:
    """Embeddings [len(texts), dim] in the embedder's batch size, advancing ``bar``."""
    bs = int(getattr(embedder, "batch_size", 256) or 256)
    dim = int(embedder.dim)
    out = np.empty((len(texts), dim), dtype=np.float32)
    for s in range(0, len(texts), bs):
        part = texts[s : s + bs]
        out[s : s + len(part)] = check_embeddings(embedder.embed(part), len(part), dim, repr(embedder))
        bar.update(len(part))
    return out


def progress(total: int, desc: str, enabled: bool | None) -> Any:
    """A tqdm bar on a terminal (stderr), else a no-op with the same update/close methods."""
    if enabled is None:
        enabled = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if enabled:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit="chunk", leave=False, dynamic_ncols=True)
    return _NoBar()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


# -- Arrow input -----------------------------------------------------------------------------


def as_table(data: Any) -> Any:
    """A pyarrow Table from a Table, a RecordBatch or a Parquet / Arrow IPC file path, fully
    validated before any of it is used (see :func:`validate_table`)."""
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return validate_table(data, "the table")
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([validate_table(data, "the record batch")])
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such file", path)
        if path.lower().endswith((".arrow", ".feather", ".ipc")):
            import pyarrow.feather as feather

            try:
                # Read, not memory-mapped: a file changed under a mapping is SIGBUS at a touch.
                table = feather.read_table(path, memory_map=False)
            except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, OverflowError) as exc:
                raise InvalidArgumentError(f"{path!r} is not a readable Arrow IPC / Feather file: {exc}") from None
            return validate_table(table, repr(path))
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path, memory_map=False)
        except (pa.ArrowException, OSError, ValueError, TypeError, IndexError, OverflowError) as exc:
            raise InvalidArgumentError(f"{path!r} is not a Parquet file: {exc}") from None
        return validate_table(table, repr(path))
    raise InvalidTypeError(
        f"expected a pyarrow Table / RecordBatch or a Parquet / Arrow file path, got {type(data).__name__}"
    )


def validate_table(table: Any, source: str) -> Any:
    """``table`` (a pyarrow Table or RecordBatch) after a full validation of every column
    (``validate(full=True)``: offsets within their data and increasing, lengths, child arrays,
    dictionary indices, UTF-8), then of the whole (equal column lengths). Arrow input may
    come from a crafted file or a memory-mapped one someone else wrote; native kernels trust
    what they are given, so nothing is computed on it before this. Raises
    InvalidArgumentError naming the column."""
    import pyarrow as pa

    errors = (pa.ArrowException, ValueError, TypeError, IndexError, OverflowError)
    for name, column in zip(table.schema.names, table.columns):
        try:
            column.validate(full=True)
        except errors as exc:
            raise InvalidArgumentError(f"column {name!r} of {source} is not valid Arrow data: {exc}") from None
    try:
        table.validate(full=True)
    except errors as exc:
        raise InvalidArgumentError(f"{source} is not a valid Arrow table: {exc}") from None
    return table


def _table_vectors(table: Any, vectors: Any, vector_column: str, dim: int | None, kb_name: str) -> np.ndarray:
    if vectors is not None:
        return check_vectors(vectors, table.num_rows, dim, kb_name)
    if vector_column not in table.column_names:
        raise InvalidArgumentError(
            f"the table has no vector column {vector_column!r}; name it with vector_column= or pass vectors="
        )
    vecs = _vectors_from_column(table.column(vector_column))
    check_dim(vecs, dim, kb_name)
    return vecs


def _vectors_from_column(col: Any) -> np.ndarray:
    import pyarrow as pa

    arr = combined(col)
    t = arr.type
    if arr.null_count:
        raise InvalidArgumentError("the vector column has null rows")
    if pa.types.is_fixed_size_list(t):
        values = arr.flatten().to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(values.reshape(len(arr), t.list_size), dtype=np.float32)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = np.asarray(arr.value_lengths().to_numpy(zero_copy_only=False))
        if len(lengths) and (lengths != lengths[0]).any():
            raise InvalidArgumentError("the vectors in the vector column have different lengths")
        dim = int(lengths[0]) if len(lengths) else 0
        values = arr.flatten().to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(values.reshape(len(arr), dim), dtype=np.float32)
    raise InvalidTypeError(f"the vector column must be a list of floats, got {t}")


def _document_codes(table: Any, column: str) -> tuple[np.ndarray, list[str]]:
    """(per-row document code, document ids by code) of the document id column."""
    import pyarrow as pa

    doc_col = combined(table.column(column))
    if pa.types.is_dictionary(doc_col.type):
        doc_col = doc_col.cast(doc_col.type.value_type)
    if pa.types.is_integer(doc_col.type):
        doc_col = doc_col.cast(pa.string())
    if not (pa.types.is_string(doc_col.type) or pa.types.is_large_string(doc_col.type)):
        raise InvalidTypeError(f"column {column!r} must hold strings or integers, got {doc_col.type}")
    if doc_col.null_count:
        raise InvalidArgumentError(f"column {column!r} has null document ids")
    enc = doc_col.dictionary_encode()
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    doc_ids = enc.dictionary.cast(pa.string()).to_pylist()
    if any(d == "" for d in doc_ids):
        raise InvalidArgumentError(f"column {column!r} has empty document ids")
    return codes, doc_ids


def _text_column(texts: Any, column: str) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(texts.type):
        texts = texts.cast(texts.type.value_type)
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        raise InvalidTypeError(f"column {column!r} must hold strings, got {texts.type}")
    texts = texts.cast(pa.large_string())
    return pc.fill_null(texts, "") if texts.null_count else texts


def _metadata_column_names(table: Any, used: set[Any], metadata_columns: Sequence[str] | None) -> list[str]:
    if metadata_columns is None:
        names = [c for c in table.column_names if c not in used]
    else:
        names = list(metadata_columns)
        for c in names:
            if c not in table.column_names:
                raise InvalidArgumentError(f"metadata column {c!r} is not in the table")
    for c in names:
        check_meta_key(c)
    return names
