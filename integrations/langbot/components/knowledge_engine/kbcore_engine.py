"""A LangBot knowledge engine that keeps its own kbcore index on local disk.

One kbcore knowledge base per LangBot ``kb_id``, in one data directory (see ``data_dir``). The
host is used only for two things: ``invoke_embedding`` (the embedding model picked when the
knowledge base was created; none picked means kbcore's built-in offline embedder) and
``get_knowledge_file_stream`` (the bytes of an uploaded file, when the host did not parse it).
Everything else (parsing, chunking, the index, metadata filters, deduplication) is kbcore's,
so ``filters`` are evaluated natively whatever vector store the host has.

Ingest never raises: a failure is an ``IngestionResult`` with status FAILED and an
``error_message``, and leaves the knowledge base as it was (kbcore commits a document
atomically). Retrieval returns ``distance`` (lower is closer) and ``score`` in [0, 1] (higher
is better; see :mod:`kbcore.engine` for the mapping).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from langbot_plugin.api.definition.components.knowledge_engine.engine import (
    KnowledgeEngine,
    KnowledgeEngineCapability,
)
from langbot_plugin.api.entities.builtin.provider.message import ContentElement
from langbot_plugin.api.entities.builtin.rag.context import (
    RetrievalContext,
    RetrievalResponse,
    RetrievalResultEntry,
)
from langbot_plugin.api.entities.builtin.rag.enums import DocumentStatus
from langbot_plugin.api.entities.builtin.rag.errors import RetrievalError
from langbot_plugin.api.entities.builtin.rag.models import IngestionContext, IngestionResult

from components import kbcore_home

kbcore_home.ensure_kbcore()  # the kbcore wheel the .lbpkg carries (see kbcore_home)

from kbcore import Engine  # noqa: E402
from kbcore.engine import RESERVED_METADATA, is_valid_name  # noqa: E402
from kbcore.errors import InvalidArgumentError, KbcoreError, NotFoundError  # noqa: E402
from kbcore.index import KINDS, METRICS, QUANTIZATIONS  # noqa: E402
from kbcore.parsing import parse  # noqa: E402

logger = logging.getLogger(__name__)

#: Texts per ``invoke_embedding`` call (the host's IPC times out on very large batches).
EMBEDDING_BATCH = 32
#: Kept for callers of the 0.1.0 module; the logic is in components/kbcore_home.py.
DATA_DIR_ENV = kbcore_home.DATA_DIR_ENV
resolve_data_dir = kbcore_home.resolve_data_dir

_META_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")


def kb_name(kb_id: str) -> str:
    """The kbcore knowledge-base name of a LangBot ``kb_id`` (UUIDs are used as they are;
    anything else is hashed into a valid name)."""
    if not isinstance(kb_id, str) or not kb_id:
        raise InvalidArgumentError(f"a knowledge base id must be a non-empty string, got {kb_id!r}")
    if is_valid_name(kb_id):
        return kb_id
    return "kb-" + hashlib.sha256(kb_id.encode("utf-8")).hexdigest()[:32]


# -- settings --------------------------------------------------------------------------------


def _int(settings: Mapping[str, Any], name: str, default: int, minimum: int) -> int:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgumentError(f"setting {name!r} must be an integer, got {v!r}")
    if v < minimum:
        raise InvalidArgumentError(f"setting {name!r} must be at least {minimum}, got {v}")
    return v


def _float(settings: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidArgumentError(f"setting {name!r} must be a number, got {v!r}")
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"setting {name!r} must be within [{lo}, {hi}], got {v}")
    return float(v)


def _bool(settings: Mapping[str, Any], name: str, default: bool) -> bool:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    if isinstance(v, int):
        return bool(v)
    raise InvalidArgumentError(f"setting {name!r} must be true or false, got {v!r}")


def _choice(settings: Mapping[str, Any], name: str, default: str, allowed: tuple[str, ...]) -> str:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if not isinstance(v, str) or v.strip().lower() not in allowed:
        raise InvalidArgumentError(f"setting {name!r} must be one of {', '.join(allowed)}, got {v!r}")
    return v.strip().lower()


def creation_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The creation settings with defaults applied and values checked."""
    s = settings or {}
    model = s.get("embedding_model_uuid") or ""
    if not isinstance(model, str):
        raise InvalidArgumentError(f"setting 'embedding_model_uuid' must be a string, got {model!r}")
    out = {
        "embedding_model_uuid": model.strip(),
        "chunk_size": _int(s, "chunk_size", 500, 1),
        "chunk_overlap": _int(s, "chunk_overlap", 50, 0),
        "metric": _choice(s, "metric", "cosine", tuple(METRICS)),
        "index_kind": _choice(s, "index_kind", "hnsw", tuple(KINDS)),
        "quantization": _choice(s, "quantization", "none", ("none", *QUANTIZATIONS)),
        "vectors": _choice(s, "vectors", "memory", ("memory", "disk")),
    }
    if out["chunk_overlap"] >= out["chunk_size"]:
        raise InvalidArgumentError(
            f"chunk_overlap ({out['chunk_overlap']}) must be smaller than chunk_size ({out['chunk_size']})"
        )
    if out["quantization"] != "none" and out["index_kind"] != "hnsw":
        raise InvalidArgumentError(
            f"setting 'quantization' ({out['quantization']}) needs index_kind 'hnsw', got {out['index_kind']!r}"
        )
    if out["vectors"] == "disk" and out["quantization"] == "none":
        raise InvalidArgumentError("setting 'vectors' (disk) needs a 'quantization' (sq8 or rabitq), got 'none'")
    return out


def retrieval_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The retrieval settings with defaults applied and values checked."""
    s = settings or {}
    ef = _int(s, "ef", 0, 0)
    return {
        "top_k": _int(s, "top_k", 5, 1),
        "score_threshold": _float(s, "score_threshold", 0.0, 0.0, 1.0),
        "deduplicate": _bool(s, "deduplicate", False),
        "ef": ef or None,
    }


def _file_metadata(ctx: IngestionContext, title: str | None) -> dict[str, Any]:
    """Chunk metadata from the host's file metadata: the MIME type, a title if the parser found
    one, and the scalar entries of ``extra`` (others are skipped: the index stores scalars)."""
    fm = ctx.file_object.metadata
    out: dict[str, Any] = {}
    if fm.mime_type:
        out["mime_type"] = str(fm.mime_type)
    if title:
        out["title"] = title
    reserved = set(RESERVED_METADATA)
    for key, value in (fm.extra or {}).items():
        if not isinstance(key, str) or key in reserved or key in out or not _META_KEY_RE.fullmatch(key):
            continue
        if isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value)):
            out[key] = value
    return out


# -- the component ---------------------------------------------------------------------------


class KbcoreKnowledgeEngine(KnowledgeEngine):
    """LangBot knowledge engine over local kbcore knowledge bases."""

    def __init__(self) -> None:
        super().__init__()
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()

    @classmethod
    def get_capabilities(cls) -> list[str]:
        return [KnowledgeEngineCapability.DOC_INGESTION, KnowledgeEngineCapability.DOC_PARSING]

    # -- engine and knowledge bases --------------------------------------------------------
    def data_dir(self) -> str:
        """The data directory: the one the plugin checked at start (``main.py``), else
        :func:`kbcore_home.resolve_data_dir` of the plugin config."""
        plugin = getattr(self, "plugin", None)
        checked = getattr(plugin, "data_dir", None)
        if checked:
            return str(checked)
        config: Mapping[str, Any] = {}
        if plugin is not None:
            try:
                config = plugin.get_config() or {}
            except Exception:  # noqa: BLE001 - no invocation scope: use the defaults
                config = {}
        return kbcore_home.resolve_data_dir(config)

    def engine(self) -> Engine:
        """The kbcore engine over the data directory (opened on first use; reopened after the
        last knowledge base was deleted and the directory removed)."""
        with self._engine_lock:
            if self._engine is None or not os.path.isdir(self._engine.path):
                path = self.data_dir()
                self._engine = Engine(path)
                logger.info("kbcore knowledge engine: data directory %s", path)
            return self._engine

    def _open(self, kb_id: str) -> Any | None:
        if self._engine is None and not os.path.isdir(self.data_dir()):
            return None  # nothing stored yet (or the last knowledge base was deleted)
        try:
            return self.engine().get_knowledge_base(kb_name(kb_id))
        except NotFoundError:
            return None

    def _create(self, kb_id: str, settings: Mapping[str, Any] | None) -> Any:
        s = creation_settings(settings)
        return self.engine().create_knowledge_base(
            kb_name(kb_id),
            chunk_size=s["chunk_size"],
            chunk_overlap=s["chunk_overlap"],
            metric=s["metric"],
            index=s["index_kind"],
            quantization=None if s["quantization"] == "none" else s["quantization"],
            vectors=s["vectors"],
            # a host model: vectors come from invoke_embedding; none: the built-in embedder
            embedder=False if s["embedding_model_uuid"] else None,
            description=f"LangBot knowledge base {kb_id}",
            exist_ok=True,
        )

    async def _embed(self, kb: Any, settings: Mapping[str, Any] | None, texts: list[str]) -> np.ndarray:
        """float32 [len(texts), dim]: the knowledge base's own embedder, else the host model."""
        if kb.embedder is not None:
            return await asyncio.to_thread(lambda: np.asarray(kb.embedder.embed(texts), dtype=np.float32))
        model = creation_settings(settings)["embedding_model_uuid"]
        if not model:
            raise InvalidArgumentError(
                f"knowledge base {kb.name!r} was created with a host embedding model, but no "
                "embedding_model_uuid was given in the creation settings"
            )
        out: list[list[float]] = []
        for s in range(0, len(texts), EMBEDDING_BATCH):
            batch = texts[s : s + EMBEDDING_BATCH]
            vectors = await self.plugin.invoke_embedding(model, batch)
            if not isinstance(vectors, list) or len(vectors) != len(batch):
                got = len(vectors) if isinstance(vectors, list) else type(vectors).__name__
                raise InvalidArgumentError(f"embedding model {model!r} returned {got} vectors for {len(batch)} texts")
            out.extend(vectors)
        try:
            arr = np.asarray(out, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"embedding model {model!r} returned vectors of different lengths") from None
        if arr.ndim != 2 or not np.isfinite(arr).all():
            raise InvalidArgumentError(f"embedding model {model!r} returned malformed vectors (shape {arr.shape})")
        if kb.dim is not None and arr.shape[1] != kb.dim:
            raise InvalidArgumentError(
                f"embedding model {model!r} makes {arr.shape[1]}-dimensional vectors but "
                f"knowledge base {kb.name!r} holds {kb.dim}-dimensional ones: use the model "
                "it was built with, or re-create the knowledge base"
            )
        return arr

    # -- lifecycle hooks -------------------------------------------------------------------
    async def on_knowledge_base_create(self, kb_id: str, config: dict) -> None:
        kb = await asyncio.to_thread(self._create, kb_id, config)
        logger.info("kbcore: created knowledge base %s for %s", kb.name, kb_id)

    async def on_knowledge_base_delete(self, kb_id: str) -> None:
        name = kb_name(kb_id)

        def drop() -> None:
            with self._engine_lock:
                engine = self._engine if self._engine is not None else Engine(self.data_dir())
                try:
                    engine.delete_knowledge_base(name)
                except NotFoundError:
                    pass
                if not engine.knowledge_bases():  # the last one: leave nothing behind
                    engine.close()
                    self._engine = None
                    kbcore_home.remove_if_empty(engine.path)

        await asyncio.to_thread(drop)
        logger.info("kbcore: deleted knowledge base %s for %s", name, kb_id)

    # -- ingest ----------------------------------------------------------------------------
    async def ingest(self, context: IngestionContext) -> IngestionResult:
        doc_id = context.file_object.metadata.document_id
        try:
            return await self._ingest(context)
        except Exception as exc:  # noqa: BLE001 - the host gets a FAILED result, never an exception
            logger.warning(
                "kbcore: ingest of %s (%s) failed: %s",
                doc_id,
                context.file_object.metadata.filename,
                exc,
                exc_info=not isinstance(exc, KbcoreError),
            )
            return IngestionResult(
                document_id=doc_id,
                status=DocumentStatus.FAILED,
                error_message=f"{type(exc).__name__}: {exc}",
            )

    async def _ingest(self, ctx: IngestionContext) -> IngestionResult:
        fm = ctx.file_object.metadata
        doc_id = fm.document_id
        kb = self._open(ctx.knowledge_base_id)
        if kb is None:  # created before the plugin was installed, or the hook failed
            kb = await asyncio.to_thread(self._create, ctx.knowledge_base_id, ctx.creation_settings)

        title = None
        if ctx.parsed_content is not None and ctx.parsed_content.text and ctx.parsed_content.text.strip():
            text, fmt = ctx.parsed_content.text, "host-parsed"
        else:
            data = await self.plugin.get_knowledge_file_stream(ctx.file_object.storage_path)
            parsed = await asyncio.to_thread(parse, data, filename=fm.filename or None)
            text, fmt, title = parsed.text, parsed.format, parsed.title

        meta = _file_metadata(ctx, title)
        n, dim = await self._ingest_text(kb, ctx, doc_id, text, meta)
        logger.info("kbcore: ingested %s (%s) into %s: %d chunks", doc_id, fm.filename, kb.name, n)
        return IngestionResult(
            document_id=doc_id,
            status=DocumentStatus.COMPLETED,
            chunks_created=n,
            metadata={
                "engine": "kbcore",
                "knowledge_base": kb.name,
                "format": fmt,
                "dim": dim,
            },
        )

    async def _ingest_text(
        self, kb: Any, ctx: IngestionContext, doc_id: str, text: str, meta: dict[str, Any]
    ) -> tuple[int, int]:
        """Chunks ``text`` with the knowledge base's own pipeline (``kb.prepare``), embeds the
        chunks (the host model or the knowledge base's embedder) and commits them as document
        ``doc_id`` in one atomic ``kb.ingest_prepared``; (chunks, dimension)."""
        fm = ctx.file_object.metadata
        try:
            prepared = kb.prepare(text=text, document_id=doc_id, filename=fm.filename or None, metadata=meta)
        except InvalidArgumentError as exc:
            if "nothing to ingest" not in str(exc):
                raise
            raise InvalidArgumentError(
                f"{fm.filename or doc_id!r} contains no text: there is nothing to ingest"
            ) from None
        vectors = await self._embed(kb, ctx.creation_settings, prepared.texts)
        await asyncio.to_thread(kb.ingest_prepared, prepared, vectors)
        return len(prepared.chunks), int(vectors.shape[1])

    # -- delete ----------------------------------------------------------------------------
    async def delete_document(self, kb_id: str, document_id: str) -> bool:
        """Deletes the document's chunks; True when it is gone (also if it was never there)."""
        kb = self._open(kb_id)
        if kb is None:
            return True
        try:
            removed = await asyncio.to_thread(kb.delete_document, document_id, missing_ok=True)
        except KbcoreError as exc:
            logger.warning("kbcore: delete of %s from %s failed: %s", document_id, kb.name, exc)
            return False
        logger.info("kbcore: deleted %s from %s (%d chunks)", document_id, kb.name, removed)
        return True

    # -- retrieve --------------------------------------------------------------------------
    async def retrieve(self, context: RetrievalContext) -> RetrievalResponse:
        kb_id = context.knowledge_base_id or context.get_collection_id()
        try:
            settings = retrieval_settings(context.retrieval_settings)
        except InvalidArgumentError as exc:
            raise RetrievalError(str(exc)) from None
        kb = self._open(kb_id) if kb_id else None
        if kb is None or len(kb) == 0:
            return RetrievalResponse(results=[], total_found=0, metadata={"engine": "kbcore"})
        try:
            query = (await self._embed(kb, context.creation_settings, [context.query]))[0]
            hits = await asyncio.to_thread(
                kb.retrieve,
                query,
                settings["top_k"],
                score_threshold=settings["score_threshold"],
                filters=context.filters or None,
                deduplicate=settings["deduplicate"],
                ef=settings["ef"],
            )
        except (KbcoreError, ValueError, TypeError) as exc:
            raise RetrievalError(f"kbcore retrieval in {kb.name!r} failed: {exc}") from None
        entries = []
        for h in hits:
            meta = dict(h.metadata)
            if meta.get("filename"):
                meta.setdefault("document_name", meta["filename"])
            entries.append(
                RetrievalResultEntry(
                    id=f"{h.document_id}#{h.chunk_index}",
                    content=[ContentElement.from_text(h.content)],
                    metadata=meta,
                    distance=float(h.distance),
                    score=float(h.score),  # in [0, 1] already; the engine applied the threshold
                )
            )
        return RetrievalResponse(
            results=entries,
            total_found=len(entries),
            metadata={"engine": "kbcore", "knowledge_base": kb.name},
        )
