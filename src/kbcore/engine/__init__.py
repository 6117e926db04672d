"""The knowledge engine: persistent knowledge bases with ingest, retrieve and delete_document.

::

    from kbcore import Engine
    engine = Engine("./kb-data")                        # reopening restores every knowledge base
    kb = engine.create_knowledge_base("docs", chunk_size=500, chunk_overlap=50)
    kb.ingest("handbook.pdf", document_id="d1", metadata={"team": "infra"})
    hits = kb.retrieve("how do I rotate keys?", top_k=5, filters={"team": "infra"})
    kb.delete_document("d1"); engine.delete_knowledge_base("docs")

A knowledge base holds *chunks* of *documents*; a document is identified by its
``document_id`` within a *pipeline* (a named chunking configuration, ``"default"`` unless you
create others). Each chunk is a vector in one native :class:`~kbcore.Index` plus its text and
metadata. Every chunk's metadata carries ``document_id``, ``file_id`` (the same value),
``chunk_index``, ``filename`` and ``pipeline_name`` next to the user's metadata, and
``filters`` use the native filter language (``docs/filter-ir.md``).

Scores: ``distance`` is the index's (smaller is closer); ``score`` is in [0, 1], higher is
better: ``cosine``: ``1 - distance / 2`` (= ``(1 + cos) / 2``); ``ip``: ``1 - distance / 2``
clipped to [0, 1] (= ``(1 + dot) / 2``, exact for unit-norm vectors); ``l2``:
``1 / (1 + distance)`` (distance is the squared Euclidean distance). ``score_threshold``
keeps hits whose score is at least the threshold.

Search types (``retrieve(search_type=...)``, default per knowledge base): ``"vector"``;
``"full_text"``, BM25 over the chunk text held by the index beside the vectors, scored
``bm25 / best bm25 of the query`` (the best match scores 1); ``"hybrid"``, both legs over a
candidate window each, fused by z-score fusion (the default of new knowledge bases: each leg
standardised over its candidates, averaged; score: the normal CDF of the mean z, see
``docs/hybrid.md``), by reciprocal rank fusion (score: the RRF value over its maximum
``2 / (rrf_k + 1)``, 1 = first in both legs) or linearly (``vector_weight`` times the min-max
normalised vector score plus the rest times the min-max normalised BM25 score). For full-text
and hybrid hits ``distance`` is ``1 - score``. See ``docs/engine.md``.

Layout (one concept per module; ``docs/architecture.md`` lists what each may import):
:mod:`.types` (values, reserved names), :mod:`.scores` (distance -> score), :mod:`.locks`,
:mod:`.segments` and :mod:`.manifest` (the files as data), :mod:`.state` (an immutable
snapshot), :mod:`.ingest` (documents / Arrow -> a chunk batch), :mod:`.commit` (every write),
:mod:`.retrieval` (every search), :mod:`.graph_builder`, :mod:`.knowledge_base` (the facade),
:mod:`.directory` (:class:`Engine`).

Durability: every mutation (ingest, delete, pipeline change, compaction) is on disk when the
call returns, and a crash at any point leaves the previous or the new state (see
:mod:`kbcore.engine.storage`). Concurrency: any number of threads may retrieve while one mutates;
a search never sees a half-applied mutation (re-ingesting a document swaps its chunks
atomically). Writers are serialised across threads and processes; a process sees another
process's writes at its next mutation or :meth:`KnowledgeBase.refresh`.
"""

from __future__ import annotations

from ..index import Index  # noqa: F401 - kbcore.engine.Index, as before the split
from .directory import Engine, default_data_dir
from .knowledge_base import KnowledgeBase
from .scores import score_from_distance
from .types import (
    FUSIONS,
    RESERVED_METADATA,
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
    is_valid_name,
)

__all__ = [
    "Engine",
    "KnowledgeBase",
    "Hit",
    "KeyResult",
    "TextResult",
    "IngestResult",
    "DocumentInfo",
    "Document",
    "RESERVED_METADATA",
    "SEARCH_TYPES",
    "FUSIONS",
    "default_data_dir",
    "score_from_distance",
    "SearchOptions",
    "Step",
    "PreparedDocument",
    "KbStats",
    "is_valid_name",
    "SyncReport",
    "ReembedReport",
]
