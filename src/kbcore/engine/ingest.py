"""Ingest helpers: reading sources, metadata checks, Arrow conversion, progress bars."""

from __future__ import annotations

import hashlib
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..chunking import Chunk, chunk_text
from ..errors import InvalidArgumentError, InvalidTypeError
from ..parsing import parse
from .segments import _combine
from .types import _RESERVED, RESERVED_METADATA, Document

_COMMIT_ROWS = 16384  # ingest_many commits at most this many chunks at a time


def _progress(total: int, desc: str, enabled: bool | None) -> Any:
    """A tqdm bar on a terminal (stderr), else a no-op with the same update/close methods."""
    if enabled is None:
        enabled = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc=desc, unit="chunk", leave=False, dynamic_ncols=True)
        except ImportError:
            pass
    return _NoBar()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class _Prepared:
    document_id: str
    filename: str | None
    text: str
    format: str
    metadata: dict[str, Any]
    chunks: list[Chunk]


@dataclass
class _DocsIn:
    ids: list[str]
    filenames: list[str | None]
    texts: list[str | None]
    formats: list[str | None]
    metadata: list[str]
    counts: np.ndarray
    filename_rows: Any = None


def _as_document(item: Any) -> Document:
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


def _check_meta_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"metadata keys must be non-empty str, got {key!r}")
    if key in _RESERVED:
        raise InvalidArgumentError(
            f"metadata key {key!r} is reserved: the engine sets {', '.join(RESERVED_METADATA)} itself"
        )
    if key.startswith("__") or key.startswith("$"):
        raise InvalidArgumentError(f"metadata key {key!r} may not start with '__' or '$'")


def _check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidTypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    out = {}
    for k, v in metadata.items():
        _check_meta_key(k)
        if v is None or isinstance(v, (str, bool, int)):
            pass
        elif isinstance(v, float):
            if math.isnan(v):
                raise InvalidArgumentError(f"metadata {k!r}: NaN is not allowed (use None for missing)")
        elif isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
            v = list(v)
        else:
            raise InvalidTypeError(
                f"metadata {k!r}: values must be str, int, float, bool, a list of str or None, got "
                f"{type(v).__name__}"
            )
        out[k] = v
    return out


def _read_source(doc: Document) -> tuple[bytes | None, str | None, str | None, str | None]:
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
            hint = ("; to ingest a string as content, pass filename= (e.g. filename='notes.txt')"
                    if isinstance(src, str) and ("\n" in src or len(src) > 255) else "")
            raise FileNotFoundError(2, f"No such file: {path[:200]!r}{hint}", path[:200])
        if os.path.isdir(path):
            raise InvalidArgumentError(f"{path!r} is a directory; ingest the files in it (kbcore ingest does)")
        with open(path, "rb") as f:
            data = f.read()
        return data, None, doc.filename or os.path.basename(path), path
    raise InvalidTypeError(f"source must be a path, bytes or str, got {type(src).__name__}")


def _prepare(doc: Document, chunk_size: int, chunk_overlap: int,
             extra_meta: Mapping[str, Any] | None) -> _Prepared:
    data, text, filename, path = _read_source(doc)
    if text is not None:
        fmt = "text"
        if not text.strip():
            raise InvalidArgumentError("the text is empty: there is nothing to ingest")
    else:
        assert data is not None
        parsed = parse(data, filename=filename, format=doc.format)
        text, fmt = parsed.text, parsed.format
    document_id = doc.document_id
    if document_id is None:
        document_id = doc.filename or path or hashlib.sha256(
            data if data is not None else text.encode("utf-8")).hexdigest()[:16]
    if not isinstance(document_id, str) or not document_id:
        raise InvalidArgumentError(f"document_id must be a non-empty str, got {document_id!r}")
    metadata = _check_metadata(extra_meta)
    metadata.update(_check_metadata(doc.metadata))
    chunks = chunk_text(text, chunk_size=chunk_size, chunk_overlap=chunk_overlap, document_id=document_id)
    if not chunks:
        raise InvalidArgumentError(f"document {document_id!r} contains no text: there is nothing to ingest")
    return _Prepared(document_id, filename, text, fmt, metadata, chunks)


def _user_metadata_table(metas: list[dict[str, Any]], doc_of_row: np.ndarray) -> Any:
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


def _as_table(data: Any) -> Any:
    import pyarrow as pa

    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not os.path.exists(path):
            raise FileNotFoundError(2, "No such file", path)
        if path.lower().endswith((".arrow", ".feather", ".ipc")):
            import pyarrow.feather as feather

            return feather.read_table(path)
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path)
        except pa.ArrowInvalid as exc:
            raise InvalidArgumentError(f"{path!r} is not a Parquet file: {exc}") from None
    raise InvalidTypeError(
        f"expected a pyarrow Table / RecordBatch or a Parquet / Arrow file path, got {type(data).__name__}"
    )


def _vectors_from_column(col: Any) -> np.ndarray:
    import pyarrow as pa

    arr = _combine(col)
    t = arr.type
    if arr.null_count:
        raise InvalidArgumentError("the vector column has null rows")
    if pa.types.is_fixed_size_list(t):
        dim = t.list_size
        flat = arr.flatten() if arr.offset == 0 else arr.flatten()
        values = flat.to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(values.reshape(len(arr), dim), dtype=np.float32)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = np.asarray(arr.value_lengths().to_numpy(zero_copy_only=False))
        if len(lengths) and (lengths != lengths[0]).any():
            raise InvalidArgumentError("the vectors in the vector column have different lengths")
        dim = int(lengths[0]) if len(lengths) else 0
        values = arr.flatten().to_numpy(zero_copy_only=False)
        return np.ascontiguousarray(values.reshape(len(arr), dim), dtype=np.float32)
    raise InvalidTypeError(f"the vector column must be a list of floats, got {t}")
