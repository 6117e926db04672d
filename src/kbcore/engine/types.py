"""The engine's public value types, reserved names and the checks of names and choices.

Imports nothing from the rest of :mod:`kbcore.engine`; holds nothing mutable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import fusion as _fusion
from ..chunking import Chunk
from ..errors import InvalidArgumentError, InvalidTypeError

#: Metadata fields the engine sets on every chunk; user metadata may not use these names.
RESERVED_METADATA = ("document_id", "file_id", "chunk_index", "filename", "pipeline_name")
#: Internal metadata field: one int per (pipeline, document) ingest, the dedup key.
GROUP_FIELD = "_group"
#: Parent-child knowledge bases: each child chunk's parent (its rank in the document, a
#: metadata field) and the internal field grouping the children of one parent across the
#: knowledge base (``_group * PARENT_STRIDE + parent_index``): the key of the native grouping.
PARENT_INDEX = "parent_index"
PARENT_FIELD = "_parent"
PARENT_STRIDE = 1 << 24
RESERVED = frozenset(RESERVED_METADATA) | {GROUP_FIELD, PARENT_INDEX, PARENT_FIELD}
#: How a knowledge base chunks: plain chunks, or small children returned as their parents.
INDEX_TYPES = ("chunk", "parent_child")
#: A parent-child knowledge base's default child size in characters (parents: 2048). Within
#: 0.01 nDCG@10 of 500-character plain chunks on SciFact and ArguAna, where LangRAG's 256 loses
#: up to 0.07 (benches/eval_parent_child.py, docs/parent-child.md).
DEFAULT_CHILD_CHUNK_SIZE = 512
#: Columns of a segment's chunk table that are not chunk metadata.
INTERNAL_COLUMNS = ("__id", "__text", "__start", "__end")
#: Optional internal columns of a segment's chunk table (absent from older segments):
#: ``__content``, the text a hit returns when it is not the searched text (a QA pair's
#: answer; the searched ``__text`` is its question), and ``__steps``, the JSON object of a
#: pipeline's stored intermediate step outputs for the chunk.
EXTRA_CHUNK_COLUMNS = ("__content", "__steps")
#: The built-in steps of a pipeline (docs/engine.md, "Pipelines with steps").
BUILTIN_STEPS = ("parse", "chunk")
#: The most steps a pipeline may have (aidb's limit: step_1 ... step_10).
MAX_STEPS = 10
DEFAULT_PIPELINE = "default"

#: ``retrieve``'s search types and hybrid fusions (defined with the fusions).
SEARCH_TYPES = _fusion.SEARCH_TYPES
FUSIONS = _fusion.FUSIONS
#: A knowledge base's search defaults when its manifest predates them.
SEARCH_DEFAULTS: dict[str, Any] = {"search_type": "vector", "fusion": "rrf", "vector_weight": 0.7}

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_valid_name(name: object) -> bool:
    """Whether ``name`` is a valid knowledge base or pipeline name (the whole string must
    match: a trailing newline is not accepted)."""
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None


def check_name(name: Any, what: str) -> str:
    """``name`` if valid, else InvalidArgumentError naming the rule."""
    if not is_valid_name(name):
        raise InvalidArgumentError(
            f"{what} name {name!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else InvalidArgumentError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


# -- results ---------------------------------------------------------------------------------


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


@dataclass(slots=True)
class _MutableHit:
    """Hit's layout (the same slots in the same order), mutable: what :func:`new_hit` fills."""

    id: int
    document_id: str
    content: str
    metadata: dict[str, Any]
    distance: float
    score: float
    pipeline_name: str
    chunk_index: int
    part_ids: tuple[int, ...]


if _MutableHit.__slots__ != Hit.__slots__:  # pragma: no cover - a guard for whoever edits Hit
    raise AssertionError("_MutableHit must have Hit's fields in Hit's order")

_set_attr = object.__setattr__


def new_hit(
    id: int,
    document_id: str,
    content: str,
    metadata: dict[str, Any],
    distance: float,
    score: float,
    pipeline_name: str,
    chunk_index: int,
    part_ids: tuple[int, ...],
) -> Hit:
    """``Hit(...)`` for the per-hit path of a search, about three times cheaper: a frozen
    dataclass's ``__init__`` assigns every field through ``object.__setattr__`` (a wrapped C
    call each); this fills the mutable twin with plain slot stores and retypes it to
    :class:`Hit` (one call; the layouts are identical, checked at import). The result is an
    ordinary, frozen Hit."""
    h = _MutableHit(id, document_id, content, metadata, distance, score, pipeline_name, chunk_index, part_ids)
    _set_attr(h, "__class__", Hit)
    return h  # type: ignore[return-value]


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
    of the document, ``chunk`` the text of its best matching chunk. ``intermediate_steps``
    holds, for that chunk, the output of each step of its pipeline that was created with
    ``intermediate=True`` (step name -> text), empty when no step stores intermediates."""

    key: str
    value: str
    distance: float
    part_ids: tuple[int, ...]
    pipeline_name: str
    score: float
    chunk: str
    intermediate_steps: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class IngestResult:
    """What one document's ingest did."""

    document_id: str
    pipeline_name: str
    chunks: int
    replaced: bool
    format: str | None = None
    #: For a ``.zip``: the result of each member ingested (``document_id`` is
    #: ``<archive id>/<path inside>``) and the members skipped, as (path, reason).
    members: tuple[IngestResult, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What :meth:`KnowledgeBase.sync` did: document ids by outcome, and chunk counts.

    ``failed`` holds (source id, reason) for each source item that could not be read or
    parsed (its stored version, if any, is kept). ``chunks_embedded`` counts the chunk texts
    sent to the embedder, ``chunks_reused`` the chunks of changed documents whose stored
    vector was kept because their text did not change.
    """

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    chunks_embedded: int = 0
    chunks_reused: int = 0


@dataclass(frozen=True, slots=True)
class ReembedReport:
    """What :meth:`KnowledgeBase.reembed` did: chunks embedded (``caught_up``: of them, the
    chunks ingested while it ran, embedded under the writer lock before the switch), the old
    and new dimensions, the new manifest generation and the seconds spent in the embedder
    and in total."""

    chunks: int
    caught_up: int
    old_dim: int | None
    new_dim: int
    generation: int
    embed_seconds: float
    total_seconds: float


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


@dataclass(frozen=True, slots=True)
class KbStats:
    """Storage counters of a knowledge base (:meth:`KnowledgeBase.stats`).

    ``segments``: segment files sets on disk; ``tail_rows``: chunks stored in segments that
    still have a vector file, i.e. not covered by the index checkpoint (reopening replays
    them); ``checkpoint_rows``: rows in the index checkpoint (0: none); ``vector_files``:
    segments with a vector file; ``pending_graph_rows``: chunks not yet linked into the HNSW
    graph; ``text_leg_unsaved``: the index's BM25 leg was rebuilt on load and is not yet
    checkpointed; ``generation``: the manifest generation (one per committed mutation).
    """

    chunks: int
    documents: int
    segments: int
    tail_rows: int
    checkpoint_rows: int
    vector_files: int
    pending_graph_rows: int
    text_leg_unsaved: bool
    generation: int


# -- inputs ----------------------------------------------------------------------------------


@dataclass
class Document:
    """One input of :meth:`KnowledgeBase.ingest_many`.

    ``source`` is a path, or bytes (or a str with ``filename=``) holding the file's content;
    ``text`` is already extracted text (no parsing). ``document_id`` defaults to
    ``filename``, else the path as given, else a hash of the content.
    ``rows_as_documents`` (``.csv`` / ``.tsv`` / ``.xlsx``): each data row becomes its own
    document ``<document_id>/<row id>`` (the row id from ``id_column``, else the row number)
    with its cells as typed metadata (docs/formats.md).
    """

    source: str | os.PathLike[str] | bytes | None = None
    document_id: str | None = None
    filename: str | None = None
    metadata: Mapping[str, Any] | None = None
    format: str | None = None
    text: str | None = None
    rows_as_documents: bool = False
    id_column: str | None = None


@dataclass(frozen=True)
class PreparedDocument:
    """A document read, parsed and chunked by :meth:`KnowledgeBase.prepare`, waiting for its
    chunks' vectors (:meth:`KnowledgeBase.ingest_prepared`).

    ``texts`` are the chunk texts to embed, in order; ``pipeline`` the pipeline whose chunking
    made them. ``metadata`` is the checked user metadata.
    """

    document_id: str
    pipeline: str
    filename: str | None
    text: str
    format: str
    metadata: dict[str, Any]
    chunks: tuple[Chunk, ...]
    #: The id of the ``.zip`` this document is a member of (or of the spreadsheet it is a row
    #: of, with ``rows_as_documents``), else None.
    archive: str | None = None
    #: Per chunk, the text a hit returns instead of the searched chunk text (a QA pair's
    #: answer), or None for all chunks.
    contents: tuple[str, ...] | None = None
    #: Per chunk, the JSON object of its stored intermediate step outputs, or None.
    steps: tuple[str | None, ...] | None = None
    #: The format of the file named by ``archive`` (``"zip"``, or the spreadsheet's).
    archive_format: str = "zip"

    @property
    def texts(self) -> list[str]:
        """The chunks' texts (what to embed), in chunk order."""
        return [c.text for c in self.chunks]


@dataclass(frozen=True)
class Step:
    """One step of a pipeline (:meth:`KnowledgeBase.create_pipeline`).

    ``name`` is ``"parse"`` or ``"chunk"`` (the built-in steps, ``fn`` None) or a user step's
    name with ``fn``, a callable ``(text) -> text`` run on each chunk after the chunk step (a
    summary, a clean-up). ``intermediate=True`` stores the step's output beside each chunk
    (aidb's ``intermediate_destination``); ``retrieve_text`` returns it in
    ``intermediate_steps``.
    """

    name: str
    fn: Callable[[str], str] | None = None
    intermediate: bool = False


class SearchOptions(NamedTuple):
    """The knobs of :meth:`KnowledgeBase.retrieve` (and ``retrieve_key`` / ``retrieve_text``).

    - ``filters``: a native ``where`` filter over chunk metadata (``docs/filter-ir.md``);
      ``pipelines``: the pipelines searched (None: all);
    - ``deduplicate``: at most one chunk (the best) per document and pipeline, ``top_k``
      distinct documents when there are that many (after fusion for hybrid search);
    - ``score_threshold``: drop hits scoring below it; ``ef``: HNSW search breadth;
    - ``search_type`` (None: the knowledge base's default): ``"vector"`` (nearest neighbours
      of the query's embedding), ``"full_text"`` (BM25 over the chunks' text; needs a str
      query, no embedder) or ``"hybrid"`` (both legs, each over ``window`` candidates, default
      ``max(4 * top_k, 50)``, under the same filters, fused by ``fusion``: ``"zscore"``,
      each leg's scores standardised over its candidates and averaged (the default of new
      knowledge bases), ``"rrf"``, reciprocal rank fusion with 1-based ranks and constant
      ``rrf_k``, or ``"linear"``, ``vector_weight * minmax(vector score) + (1 -
      vector_weight) * minmax(BM25)``);
    - ``query_vector``: the vector leg's query for a str query (a knowledge base without
      embedder, or a precomputed embedding);
    - ``context_window``: each hit's ``content`` extended with up to this many chunks of the
      same document before and after it, in chunk order, read from the stored chunk texts
      (0: none; None: the knowledge base's default, set at creation). A chunk is shown once
      per result list: a neighbour that is itself a hit, or
      already shown around a better hit, is left out. ``metadata["context_chunks"]`` lists
      the ``chunk_index`` of the chunks the content holds.
    - ``rerank``: None (the knowledge base's default reranker, if any, for a text query), True
      (the default, required), False (no rerank) or a reranker / function ``(query, texts) ->
      scores`` / spec; ``rerank_depth``: the first stage's candidates (default 50, at least
      ``top_k``). See :mod:`kbcore.engine.reranking` and docs/rerankers.md.

    Values are checked when a search uses them; errors name the option. Immutable (a
    NamedTuple: cheap to build per call); ``opts._replace(deduplicate=True)`` derives one.
    """

    score_threshold: float = 0.0
    filters: Mapping[str, Any] | None = None
    deduplicate: bool = False
    pipelines: Sequence[str] | str | None = None
    ef: int | None = None
    search_type: str | None = None
    fusion: str | None = None
    vector_weight: float | None = None
    rrf_k: float = 60
    window: int | None = None
    query_vector: Any = None
    context_window: int | None = None
    rerank: Any = None
    rerank_depth: int | None = None


def check_steps(steps: Any) -> tuple[list[dict[str, Any]], dict[str, Callable[[str], str]]]:
    """(the steps as the manifest records them, the user steps' functions by name) of
    ``create_pipeline(steps=...)``: a sequence of :class:`Step` (or step names); ``"parse"``
    first if given, ``"chunk"`` exactly once and before every user step, names unique, at
    most :data:`MAX_STEPS`. InvalidArgumentError / InvalidTypeError naming the step."""
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise InvalidTypeError(f"steps must be a list of Step, got {type(steps).__name__}")
    if not 1 <= len(steps) <= MAX_STEPS:
        raise InvalidArgumentError(f"a pipeline has 1 to {MAX_STEPS} steps, got {len(steps)}")
    records: list[dict[str, Any]] = []
    fns: dict[str, Callable[[str], str]] = {}
    for i, step in enumerate(steps):
        if isinstance(step, str):
            step = Step(step)
        if not isinstance(step, Step):
            raise InvalidTypeError(f"steps[{i}] must be a Step or a step name, got {type(step).__name__}")
        name = check_name(step.name, "step")
        if not isinstance(step.intermediate, bool):
            raise InvalidTypeError(f"step {name!r}: intermediate must be True or False, got {step.intermediate!r}")
        if any(r["name"] == name for r in records):
            raise InvalidArgumentError(f"step {name!r} appears twice")
        if name in BUILTIN_STEPS:
            if step.fn is not None:
                raise InvalidArgumentError(f"step {name!r} is built in: it takes no fn")
            if name == "parse" and i != 0:
                raise InvalidArgumentError("step 'parse' must be the first step")
        else:
            if not callable(step.fn):
                raise InvalidArgumentError(f"step {name!r} needs fn, a callable (text) -> text")
            if not any(r["name"] == "chunk" for r in records):
                raise InvalidArgumentError(f"step {name!r} comes before 'chunk': user steps run on each chunk")
            fns[name] = step.fn
        records.append({"name": name, "intermediate": step.intermediate})
    if not any(r["name"] == "chunk" for r in records):
        raise InvalidArgumentError("a pipeline's steps must include 'chunk'")
    return records, fns
