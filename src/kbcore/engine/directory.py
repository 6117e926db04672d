"""Engine: a directory of knowledge bases (create, open, delete, list). Owns the directory's
lock and the cache of open knowledge bases; talks to a KnowledgeBase through its public API
plus the documented hooks ``_detach`` and ``_attach_embedder``.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..chunking import check_chunk_params, check_chunking
from ..embedders import Embedder, HashingEmbedder, as_embedder, embedder_spec
from ..errors import InvalidArgumentError, InvalidTypeError, NotFoundError
from ..fusion import DEFAULT_FUSION, check_vector_weight
from ..index import DIM_RANGE, KINDS, VECTORS, IndexSpec, as_index_spec
from ..rerankers import as_reranker, reranker_spec
from . import commit, manifest, multi, retrieval, storage
from .knowledge_base import KnowledgeBase, check_settings
from .shards import check_shards, require_ray
from .types import (
    DEFAULT_CHILD_CHUNK_SIZE,
    FUSIONS,
    INDEX_TYPES,
    SEARCH_TYPES,
    Hit,
    SearchOptions,
    check_choice,
    check_name,
    is_valid_name,
)

#: ``create_knowledge_base``'s default ``quantization``: SQ8 codes for an HNSW index (the walk
#: reads a quarter of the bytes; candidates are re-ranked from the float32 rows, so distances
#: and order stay exact), none for a flat one. Measured in docs/engine.md ("Index layout").
AUTO_QUANTIZATION = "auto"
#: What ``AUTO_QUANTIZATION`` means for an HNSW index.
DEFAULT_HNSW_QUANTIZATION = "sq8"


def _index_spec(
    index: str | IndexSpec | Mapping[str, Any],
    metric: str,
    M: int,
    ef_construction: int,
    ef: int,
    quantization: str | None,
    bits: int | None,
    rerank: int | None,
    vectors: str,
) -> IndexSpec:
    """The one :class:`IndexSpec` of ``create_knowledge_base``'s ``index`` and keywords (a spec
    given whole refuses a keyword that would contradict it). ``quantization`` "auto": SQ8
    for an HNSW index of the keywords, none for a flat one; a spec given whole keeps its own."""
    auto = isinstance(quantization, str) and quantization == AUTO_QUANTIZATION
    if auto:
        quantization = DEFAULT_HNSW_QUANTIZATION if index == "hnsw" else None
    given: dict[str, Any] = {
        "metric": metric,
        "M": M,
        "ef_construction": ef_construction,
        "ef": ef,
        "quantization": quantization,
        "bits": bits,
        "rerank": rerank,
        "vectors": vectors,
    }
    if isinstance(index, str):
        if index not in KINDS:  # named after this keyword, not the spec's field
            raise InvalidArgumentError(f"unknown index {index!r}; expected one of {KINDS} or an IndexSpec")
        return IndexSpec(kind=index, **given)
    spec = as_index_spec(index)
    defaults = IndexSpec().to_dict()
    clash = sorted(k for k, v in given.items() if v != defaults[k] and not (auto and k == "quantization"))
    if clash:
        raise InvalidArgumentError(f"pass either index=IndexSpec(...) or the keywords it holds, not both: {clash}")
    return spec


def default_data_dir() -> str:
    """``$KBCORE_HOME`` if set, else ``./kb-data``."""
    return os.environ.get("KBCORE_HOME") or os.path.join(os.getcwd(), "kb-data")


class Engine:
    """A directory of knowledge bases.

    ``path`` defaults to ``$KBCORE_HOME`` or ``./kb-data``. ``embedder`` is the default for new
    knowledge bases (else the built-in :class:`~kbcore.embedders.HashingEmbedder`) and is used
    to reopen knowledge bases built with a custom embedder. ``vectors`` (None, ``"memory"`` or
    ``"disk"``) overrides, in this process, where the knowledge bases it opens keep their
    float32 rows (None: as each was created; ``"disk"`` applies to quantized, unsharded
    knowledge bases, the others keep theirs in memory); see docs/quantization.md. ``mmap``
    (default True) opens each knowledge base's index checkpoint in place from its mapped file;
    False copies it into memory (:meth:`kbcore.Index.load`'s ``mmap``: a slower reopen and more
    anonymous memory, faster searches of a large knowledge base); a sharded knowledge base's
    shards reopen their checkpoints the same way (:class:`kbcore.distributed.ShardedIndex`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        embedder: Any = None,
        vectors: str | None = None,
        mmap: bool = True,
    ) -> None:
        if vectors not in (None, *VECTORS):
            raise InvalidArgumentError(f"unknown vectors {vectors!r}; expected 'memory', 'disk' or None")
        if type(mmap) is not bool:
            raise InvalidTypeError(f"mmap must be a bool, got {type(mmap).__name__}")
        self._vectors = vectors
        self._mmap = mmap
        self.path = os.path.abspath(os.fspath(path) if path is not None else default_data_dir())
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise storage.StorageError(
                exc.errno, f"cannot create data directory {self.path!r}: {exc.strerror}"
            ) from exc
        self._embedder = as_embedder(embedder) if embedder is not None else None
        self._kbs: dict[str, KnowledgeBase] = {}
        self._mutex = threading.RLock()
        self._flock = storage.FileLock(os.path.join(self.path, ".engine.lock"))
        with self._flock.hold():
            for name in os.listdir(self.path):
                if name.startswith((".tmp-", ".trash-")):
                    shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)

    def __repr__(self) -> str:
        return f"Engine({self.path!r}, knowledge_bases={self.knowledge_bases()})"

    def knowledge_bases(self) -> list[str]:
        """Names of the knowledge bases in the directory, sorted."""
        out = []
        for name in sorted(os.listdir(self.path)):
            if not name.startswith(".") and os.path.isfile(os.path.join(self.path, name, storage.MANIFEST)):
                out.append(name)
        return out

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.knowledge_bases()

    def __getitem__(self, name: str) -> KnowledgeBase:
        return self.get_knowledge_base(name)

    def create_knowledge_base(
        self,
        name: str,
        *,
        chunk_size: int = 500,
        chunk_overlap: int = 50,
        chunk_unit: str = "chars",
        separators: Sequence[str] | None = None,
        metric: str = "cosine",
        index: str | IndexSpec | Mapping[str, Any] = "hnsw",
        M: int = 16,
        ef_construction: int = 200,
        ef: int = 64,
        embedder: Any = None,
        dim: int | None = None,
        description: str = "",
        exist_ok: bool = False,
        search_type: str = "vector",
        fusion: str = DEFAULT_FUSION,
        vector_weight: float = 0.7,
        shards: int | None = None,
        quantization: str | None = AUTO_QUANTIZATION,
        bits: int | None = None,
        index_type: str = "chunk",
        parent_chunk_size: int = 2048,
        child_chunk_size: int | None = None,
        context_window: int = 0,
        reranker: Any = None,
        vectors: str = "memory",
        rerank: int | None = None,
    ) -> KnowledgeBase:
        """Creates a knowledge base (a directory) and returns it.

        ``embedder``: an embedder, callable or model name; None uses the engine's (else the
        built-in hashing embedder); ``False`` (or ``"none"``) makes a vectors-only knowledge
        base for pre-embedded data, whose dimension is ``dim`` or that of its first ingest.
        ``index``: an :class:`~kbcore.index.IndexSpec` (or its dict) configures the native index
        whole; else the kind name, and ``metric`` / ``index`` / ``M`` / ``ef_construction`` /
        ``ef`` / ``quantization`` (``"auto"``, the default: ``"sq8"`` for an hnsw index, none
        for a flat one; None: float32 rows only; ``"sq8"`` or ``"rabitq"``, hnsw only), ``bits``
        (RaBitQ's bits per dimension, 1 to 8, default 4), ``rerank`` (the exact re-rank depth of
        a quantized search) and ``vectors`` are turned into one (see :class:`kbcore.Index`);
        the spec is recorded in the manifest;
        ``vectors="disk"`` (quantized only) keeps its float32 rows out of anonymous memory, in
        the index file of each checkpoint, mapped (see docs/quantization.md), and is stored in
        the manifest so that every reopen keeps it.
        ``chunk_size`` / ``chunk_overlap`` are counted in ``chunk_unit``: ``"chars"`` or
        ``"tokens"`` (docs/formats.md); ``separators``: strings tried in order before the
        paragraph / sentence / word cut (:func:`kbcore.chunking.chunk_text`). All four are the
        default pipeline's and the default of :meth:`KnowledgeBase.create_pipeline`.
        ``search_type`` / ``fusion`` / ``vector_weight`` are the defaults of
        :meth:`KnowledgeBase.retrieve` (e.g. the Dify server's search type for this knowledge
        base); hybrid search fuses by ``"zscore"`` unless ``fusion`` says ``"rrf"`` or
        ``"linear"`` (``docs/hybrid.md``). A name already in use raises
        ``InvalidArgumentError`` unless ``exist_ok``.
        ``reranker``: the default reranker of ``retrieve`` (a reranker, a function ``(query,
        texts) -> scores``, a spec or a kind name; docs/rerankers.md), recorded in the manifest
        by its spec and rebuilt when the knowledge base is reopened (a function cannot be: it
        is recorded by name and must be set again after a reopen).

        ``shards=N`` makes a sharded knowledge base: its index is a
        :class:`~kbcore.distributed.ShardedIndex` of N Ray actors stored in ``<kb>/shards``
        (results equal those of one index, exactly for ``index="flat"``); reopening it starts
        the actors again. Ray is joined or started as :mod:`kbcore.engine.shards` describes;
        ``ImportError`` (naming ``pip install "kbcore[ray]"``) if Ray is not installed.

        ``index_type="parent_child"`` chunks each document into parents of
        ``parent_chunk_size`` characters and each parent into children of
        ``child_chunk_size`` (``chunk_overlap`` shared, capped below it): children are
        embedded and searched, hits are parents (``docs/parent-child.md``); ``chunk_size`` is
        then ignored. The default children are :data:`DEFAULT_CHILD_CHUNK_SIZE` (512)
        characters, or a quarter of ``parent_chunk_size`` when that is smaller (LangRAG's
        2048 / 256 is ``child_chunk_size=256``). ``context_window`` is :meth:`KnowledgeBase.retrieve`'s default.
        """
        check_name(name, "knowledge base")
        index_type = check_choice("index_type", index_type, INDEX_TYPES)
        context_window = retrieval.check_context_window(context_window)
        if index_type == "parent_child":
            parent_chunk_size, _ = check_chunk_params(parent_chunk_size, 0)
            if child_chunk_size is None:
                child_chunk_size = max(1, min(DEFAULT_CHILD_CHUNK_SIZE, parent_chunk_size // 4))
            chunk_size, _ = check_chunk_params(child_chunk_size, 0)
            chunk_overlap = min(chunk_overlap, chunk_size // 4)
            if context_window:
                raise InvalidArgumentError("context_window does not apply to index_type='parent_child'")
            if parent_chunk_size <= chunk_size:
                raise InvalidArgumentError(
                    f"parent_chunk_size ({parent_chunk_size}) must be larger than child_chunk_size ({chunk_size})"
                )
        search_type = check_choice("search_type", search_type, SEARCH_TYPES)
        fusion = check_choice("fusion", fusion, FUSIONS)
        vector_weight = check_vector_weight(vector_weight)
        chunk_size, chunk_overlap = check_chunk_params(chunk_size, chunk_overlap)
        chunk_unit, seps = check_chunking(chunk_unit, separators)
        spec = _index_spec(index, metric, M, ef_construction, ef, quantization, bits, rerank, vectors)
        shards = check_shards(shards)
        if shards is not None and spec.vectors == "disk":
            raise InvalidArgumentError("vectors='disk' is not available for a sharded knowledge base")
        if shards is not None:
            require_ray(name, shards)
        emb, dim = self._creation_embedder(embedder, dim)
        rr = as_reranker(reranker) if reranker is not None else None
        config = {
            **spec.to_config(),
            "dim": dim,
            "chunk_size": chunk_size,
            "chunk_overlap": chunk_overlap,
            "search_type": search_type,
            "fusion": fusion,
            "vector_weight": vector_weight,
        }
        if chunk_unit != "chars":  # absent means characters: older releases wrote no key
            config["chunk_unit"] = chunk_unit
        if seps:
            config["separators"] = list(seps)
        if shards is not None:
            config["shards"] = shards
        if context_window:
            config["context_window"] = context_window
        if index_type == "parent_child":
            config["index_type"] = index_type
            config["parent_chunk_size"] = parent_chunk_size
        if not isinstance(description, str):
            raise InvalidTypeError(f"description must be a str, got {type(description).__name__}")
        m = manifest.initial(name, config, embedder_spec(emb) if emb is not None else {"kind": "none"}, description)
        if rr is not None:
            m["reranker"] = reranker_spec(rr)
        check_settings(m, name)  # every value against what the file format holds, before any disk
        with self._mutex, self._flock.hold():
            final = os.path.join(self.path, name)
            if os.path.exists(final):
                if exist_ok and os.path.isfile(os.path.join(final, storage.MANIFEST)):
                    return self.get_knowledge_base(name)
                raise InvalidArgumentError(f"knowledge base {name!r} already exists in {self.path!r}")
            tmp = os.path.join(self.path, f".tmp-{name}-{uuid.uuid4().hex[:8]}")
            os.makedirs(tmp)
            try:
                commit.write_new(tmp, m)
                storage.load_manifest(tmp)  # what every open checks: it reads back
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            storage.fsync_dir(self.path)
            try:
                kb = self._open(name, final, emb)
            except BaseException:
                # e.g. Ray did not start, the index refused its parameters: no half-made
                # knowledge base stays listed (renamed away first, so the removal is atomic).
                self._kbs.pop(name, None)
                trash = os.path.join(self.path, f".trash-{name}-{uuid.uuid4().hex[:8]}")
                try:
                    os.rename(final, trash)
                    storage.fsync_dir(self.path)
                except OSError:  # keep the first error; remove in place instead
                    trash = final
                shutil.rmtree(trash, ignore_errors=True)
                raise
            if rr is not None:
                kb._attach_reranker(rr)
            self._kbs[name] = kb
            return kb

    def _creation_embedder(self, embedder: Any, dim: int | None) -> tuple[Any, int | None]:
        """The embedder a new knowledge base records (None: vectors only) and its dimension."""
        if embedder is False or embedder == "none":
            emb = None
        elif embedder is None:
            emb = self._embedder if self._embedder is not None else HashingEmbedder()
        else:
            emb = as_embedder(embedder)
        if emb is not None:
            if dim is not None and dim != emb.dim:
                raise InvalidArgumentError(f"dim={dim} but the embedder makes {emb.dim}-dimensional vectors")
            return emb, int(emb.dim)
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= DIM_RANGE[1]):
            raise InvalidArgumentError(f"dim must be an integer in [1, {DIM_RANGE[1]}], got {dim!r}")
        return None, dim

    def get_knowledge_base(self, name: str, *, embedder: Any = None) -> KnowledgeBase:
        """Opens a knowledge base (cached: the same object for the same name).

        ``embedder`` is needed only for a knowledge base built with a custom embedder.
        """
        with self._mutex:
            kb = self._kbs.get(name)
            if kb is not None and not kb.closed:
                if embedder is not None:
                    kb._attach_embedder(as_embedder(embedder))
                return kb
            if not is_valid_name(name):
                raise NotFoundError(f"no knowledge base named {name!r} in {self.path!r}")
            path = os.path.join(self.path, name)
            if not os.path.isfile(os.path.join(path, storage.MANIFEST)):
                known = ", ".join(self.knowledge_bases()) or "none"
                raise NotFoundError(f"no knowledge base named {name!r} in {self.path!r} (existing: {known})")
            return self._open(name, path, as_embedder(embedder) if embedder is not None else None)

    def retrieve(
        self,
        names: str | Sequence[str],
        query: Any,
        top_k: int = 5,
        options: SearchOptions | None = None,
        **kwargs: Any,
    ) -> list[Hit]:
        """The ``top_k`` best hits of ``query`` over several knowledge bases, best first.

        Each knowledge base is searched with the same options (``options`` and keywords, as
        :meth:`KnowledgeBase.retrieve`: filters, search type, dedup, context window...) in
        parallel threads, the query embedded once per distinct embedder. The lists are merged
        by score when the knowledge bases share metric, embedder spec, search type and fusion,
        else by reciprocal rank; ``metadata["knowledge_base"]`` and ``metadata["merged_by"]``
        (``"score"`` / ``"rank"``) say which (:mod:`kbcore.engine.multi`). An unknown name
        raises NotFoundError before any search.
        """
        opts = retrieval.options(options, kwargs)
        kbs = []
        for n in multi.check_names(names):
            # An open knowledge base is read from the cache without the engine's lock (a dict
            # read is atomic; get_knowledge_base's answer is no fresher once it returns).
            kb = self._kbs.get(n)
            kbs.append(kb if kb is not None and not kb.closed else self.get_knowledge_base(n))
        return multi.retrieve_many(kbs, query, top_k, opts)

    def delete_knowledge_base(self, name: str) -> None:
        """Deletes a knowledge base and its directory (atomically: it is gone or intact).

        A write racing the delete (an ingest in another thread of this process) either
        completes before it or raises :class:`~kbcore.errors.InvalidArgumentError` ("is
        closed: it was deleted"), as does every later call on the deleted
        :class:`KnowledgeBase`; a writer in another process gets
        :class:`~kbcore.errors.NotFoundError` ("was deleted")."""
        with self._mutex, self._flock.hold():
            path = os.path.join(self.path, name) if is_valid_name(name) else None
            if path is None or not os.path.isfile(os.path.join(path, storage.MANIFEST)):
                raise NotFoundError(f"no knowledge base named {name!r} in {self.path!r}")
            kb = self._kbs.pop(name, None)
            if kb is not None:
                # Waits for its write in progress, stops its graph builder; later calls on it
                # raise InvalidArgumentError, so nothing in this process writes the directory.
                kb._detach(deleted=True)
            trash = os.path.join(self.path, f".trash-{name}-{uuid.uuid4().hex[:8]}")
            lock = storage.FileLock(os.path.join(path, storage.LOCK))
            with lock.hold():  # wait for a writer in another process to finish
                os.rename(path, trash)
            storage.fsync_dir(self.path)
            shutil.rmtree(trash, ignore_errors=True)

    def _open(self, name: str, path: str, embedder: Embedder | None) -> KnowledgeBase:
        kb = KnowledgeBase(
            name,
            path,
            embedder,
            default_embedder=self._embedder,
            on_close=self._forget,
            vectors=self._vectors,
            mmap=self._mmap,
        )
        self._kbs[name] = kb
        return kb

    def _forget(self, kb: KnowledgeBase) -> None:
        with self._mutex:
            if self._kbs.get(kb.name) is kb:
                del self._kbs[kb.name]

    def close(self) -> None:
        """Closes every open knowledge base (checkpointing their indexes)."""
        for kb in list(self._kbs.values()):
            kb.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
