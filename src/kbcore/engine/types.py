"""The engine's result and input types, the reserved names, and the checks of names and choices."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

#: Metadata fields the engine sets on every chunk; user metadata may not use these names.
RESERVED_METADATA = ("document_id", "file_id", "chunk_index", "filename", "pipeline_name")
_GROUP = "_group"  # internal: one int per (pipeline, document) ingest, the dedup key
_RESERVED = frozenset(RESERVED_METADATA) | {_GROUP}
_INTERNAL_COLUMNS = ("__id", "__text", "__start", "__end")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_DEFAULT_PIPELINE = "default"

#: ``retrieve``'s search types and hybrid fusions.
SEARCH_TYPES = ("vector", "full_text", "hybrid")
FUSIONS = ("rrf", "linear")
#: A knowledge base's search defaults when its manifest predates them.
_SEARCH_DEFAULTS: dict[str, Any] = {"search_type": "vector", "fusion": "rrf", "vector_weight": 0.7}


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved chunk.

    ``id`` is the chunk's int64 id; ``content`` its text; ``metadata`` its metadata (with
    ``document_id``, ``file_id``, ``chunk_index``, ``filename``, ``pipeline_name``);
    ``distance`` is smaller-is-closer, ``score`` in [0, 1] larger-is-better. With
    ``deduplicate=True``, ``part_ids`` holds the ``chunk_index`` of every chunk of the same
    document (and pipeline) met in the candidate set, best first; otherwise it is empty.
    """

    id: int
    document_id: str
    content: str
    metadata: dict[str, Any]
    distance: float
    score: float
    pipeline_name: str
    chunk_index: int
    part_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class KeyResult:
    """aidb-style result of :meth:`KnowledgeBase.retrieve_key`."""

    key: str
    distance: float
    part_ids: tuple[int, ...]
    pipeline_name: str
    score: float


@dataclass(frozen=True, slots=True)
class TextResult:
    """aidb-style result of :meth:`KnowledgeBase.retrieve_text`: ``value`` is the source text
    of the document, ``chunk`` the text of its best matching chunk."""

    key: str
    value: str
    distance: float
    part_ids: tuple[int, ...]
    pipeline_name: str
    score: float
    chunk: str


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What one document's ingest did."""

    document_id: str
    pipeline_name: str
    chunks: int
    replaced: bool
    format: str | None = None


@dataclass(frozen=True, slots=True)
class DocumentInfo:
    """A stored document."""

    document_id: str
    pipeline_name: str
    filename: str | None
    chunks: int
    metadata: dict[str, Any]
    format: str | None
    ingested_at: float


@dataclass
class Document:
    """One input of :meth:`KnowledgeBase.ingest_many`.

    ``source`` is a path, or bytes (or a str with ``filename=``) holding the file's content;
    ``text`` is already extracted text (no parsing). ``document_id`` defaults to
    ``filename``, else the path as given, else a hash of the content.
    """

    source: str | os.PathLike[str] | bytes | None = None
    document_id: str | None = None
    filename: str | None = None
    metadata: Mapping[str, Any] | None = None
    format: str | None = None
    text: str | None = None


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidArgumentError(
            f"{what} name {name!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name
