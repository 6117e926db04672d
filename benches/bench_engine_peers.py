"""The knowledge engine as users call it, against embedded vector databases (issue 28).

Run from the repository root on a quiet machine::

    python -m benches.bench_engine_peers [--data DIR] [--peers kbcore,zvec,lancedb,chroma,milvus-lite]
                                         [--rounds 3] [--n N] [--nq N] [--json OUT]

SciFact chunks, pre-embedded (19,369 x 384 MiniLM vectors, 5,183 documents, 300 queries), each
chunk with its text, its document id and a seeded integer ``bucket`` uniform in [0, 1000). Every
system runs in this process through what its documentation gives as the fastest Python path,
with one search thread where it has the setting. For each system:

1. **Durable ingest in 1k-row batches** (rows/s): the chunks in batches of about 1,000 rows, cut
   at document boundaries (kbcore replaces a document that is ingested again), each batch made
   durable before the next as the system allows (its ``DURABILITY`` says what it actually
   guarantees). Index building that the system does after the writes (zvec ``optimize``,
   LanceDB ``create_index``, kbcore's background graph) is timed separately (``index s``).
2. **Operating point**: the system's search knob (ef, nprobes) swept upwards until unfiltered
   recall@10 against the exact top-10 reaches 0.95; every retrieve below uses it.
3. **p50 latency** (ms) of single-query calls, ``--rounds`` passes over the queries, GC paused:
   ``vector`` (each system's fastest path, which returns ids only: kbcore's ``kb.search_ids``);
   ``vector with text`` (the same search returning each hit's text and document id, what a
   knowledge base's caller uses: kbcore's ``kb.retrieve``); ``filter 10%`` (``bucket < 100``)
   and ``filter 1%`` (``bucket < 10``), through the ``vector`` path with a filter, with their
   recall against the exact filtered top-10; ``one per document`` (the 10 best documents, each by
   its best chunk, through the system's group-by where it has one, otherwise over-fetched and
   collapsed in Python, said in the path); ``hybrid`` (vector + BM25 full text fused by RRF)
   where the system has full text.
4. **Reopen + first query** (s): close, open the same directory in this process, one vector query.
   Close releases what the system would keep for that path in this process (Chroma's shared
   System through ``Client.close()``, Milvus Lite's in-process server), so that the reopen reads
   the directory as a restarted server would (files in the page cache).

A system that is not installed, or a case it cannot run, is reported with the reason, never
dropped. Nothing asserts; each row of the table names the path and its limits.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benches.datasets import scifact_dir

K = 10
M = 16
EF_CONSTRUCTION = 200
TARGET = 0.95
BATCH_ROWS = 1000
BUCKET_SEED = 20261205
FILTERS = {"filter 10%": 100, "filter 1%": 10}
GROUP_FETCH = 50  # chunks over-fetched when a system has no group-by (collapsed to documents in Python)
CASES = ("vector", "vector with text", "filter 10%", "filter 1%", "one per document", "hybrid")
WITH_TEXT = "vector with text"  # the ten hits with their text and document id, as a chatbot needs them
DEFAULT_PEERS = ("kbcore", "zvec", "lancedb", "chroma", "milvus-lite")


# ----------------------------------------------------------------------------------------------
# data


@dataclass
class Data:
    vectors: np.ndarray  # float32 [n, d], unit rows
    doc_ids: list[str]  # per chunk
    chunk_index: list[int]
    texts: list[str]
    bucket: np.ndarray  # int64 [n]
    queries: np.ndarray  # float32 [nq, d]
    query_texts: list[str]
    batches: list[tuple[int, int]]  # [start, end) row ranges of whole documents, ~BATCH_ROWS each

    @property
    def n(self) -> int:
        return int(self.vectors.shape[0])


def load(data: str | None, n: int | None, nq: int | None) -> Data:
    folder = scifact_dir(data)
    with gzip.open(folder / "chunks.jsonl.gz", "rt", encoding="utf-8") as f:
        chunks = [json.loads(line) for line in f]
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line) for line in f]
    vectors = np.ascontiguousarray(np.load(folder / "chunk_embeddings.npy"), dtype=np.float32)
    qv = np.ascontiguousarray(np.load(folder / "query_embeddings.npy"), dtype=np.float32)
    if n is not None:
        # a prefix that ends on a document boundary
        end = min(n, len(chunks))
        while 0 < end < len(chunks) and chunks[end]["doc_id"] == chunks[end - 1]["doc_id"]:
            end += 1
        chunks, vectors = chunks[:end], vectors[:end]
    if nq is not None:
        queries, qv = queries[:nq], qv[:nq]
    doc_ids = [str(c["doc_id"]) for c in chunks]
    batches, start = [], 0
    for i in range(1, len(doc_ids) + 1):
        if i == len(doc_ids) or (i - start >= BATCH_ROWS and doc_ids[i] != doc_ids[i - 1]):
            batches.append((start, i))
            start = i
    bucket = np.random.default_rng(BUCKET_SEED).integers(0, 1000, size=len(chunks), dtype=np.int64)
    return Data(
        vectors=vectors,
        doc_ids=doc_ids,
        chunk_index=[int(c["chunk_index"]) for c in chunks],
        texts=[c["text"] for c in chunks],
        bucket=bucket,
        queries=qv,
        query_texts=[q["text"] for q in queries],
        batches=batches,
    )


def exact(data: Data) -> dict[str, list[list[Any]]]:
    """Exact answers per case: row ids (vector, filters) or document ids (one per document)."""
    scores = data.queries @ data.vectors.T
    out: dict[str, list[list[Any]]] = {"vector": [list(np.argsort(-s, kind="stable")[:K]) for s in scores]}
    for case, t in FILTERS.items():
        rows = np.flatnonzero(data.bucket < t)
        out[case] = [list(rows[np.argsort(-s[rows], kind="stable")[:K]]) for s in scores]
    docs = np.asarray(data.doc_ids)
    per_doc = []
    for s in scores:
        order = np.argsort(-s, kind="stable")
        seen: list[str] = []
        for r in order:
            if docs[r] not in seen:
                seen.append(str(docs[r]))
                if len(seen) == K:
                    break
        per_doc.append(seen)
    out["one per document"] = per_doc
    out[WITH_TEXT] = out["vector"]
    return out


def recall(got: Sequence[Sequence[Any]], truth: Sequence[Sequence[Any]]) -> float:
    return float(np.mean([len(set(g) & set(t)) / max(1, len(t)) for g, t in zip(got, truth)]))


def collapse(rows: Sequence[int], doc_ids: Sequence[str]) -> list[str]:
    """Document ids of the first K distinct documents among ranked rows."""
    seen: list[str] = []
    for r in rows:
        d = doc_ids[r]
        if d not in seen:
            seen.append(d)
            if len(seen) == K:
                break
    return seen


# ----------------------------------------------------------------------------------------------
# systems: each returns row ids (or document ids for "one per document")


class Peer:
    name = ""
    #: What a returned ingest call guarantees on disk, as read in the system's code / docs.
    DURABILITY = ""
    #: The Python path timed, and the system's limits for these cases.
    PATH = ""
    knobs: Sequence[int] = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

    def __init__(self, root: str, data: Data) -> None:
        self.root = root
        self.data = data
        self.knob = self.knobs[0]

    def ingest_batch(self, start: int, end: int) -> None:
        raise NotImplementedError

    def finish_ingest(self) -> None:
        """Index building after the writes (timed as ``index s``)."""

    def set_knob(self, knob: int) -> None:
        self.knob = knob

    def fn(self, case: str) -> Callable[[int], Any] | None:
        """The per-query callable of a case (argument: the query number); None: not supported."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def reopen(self) -> None:
        raise NotImplementedError


class Kbcore(Peer):
    name = "kbcore"
    DURABILITY = (
        "ingest_table returns after fsync of the new segment files, the manifest and the directory "
        "(observed: 6 fsync per batch, benches/peers_fsync.py)"
    )
    PATH = (
        "Engine.create_knowledge_base(embedder=False, quantization='sq8'); ingest_table per batch; "
        "kb.search_ids(q, 10, ef=, filters=) (vector, filter 10%, filter 1%: chunk ids and distances, "
        "like the peers' ids-only paths; chunk id -> row through a map built once, as zvec's); "
        "kb.retrieve(q, 10, ef=) (vector with text: ten Hits with text and metadata); "
        "kb.retrieve(q, 10, ef=, deduplicate=True) (one per document); "
        "kb.retrieve(text, 10, ef=, search_type='hybrid', fusion='rrf', query_vector=) (hybrid)"
    )

    def __init__(self, root: str, data: Data) -> None:
        super().__init__(root, data)
        import pyarrow as pa

        from kbcore.engine import Engine

        self.engine = Engine(root)
        self.kb = self.engine.create_knowledge_base(
            "kb", embedder=False, dim=data.vectors.shape[1], quantization="sq8", M=M, ef_construction=EF_CONSTRUCTION
        )
        self.table = pa.table(
            {
                "document_id": data.doc_ids,
                "chunk_index": pa.array(data.chunk_index, pa.int64()),
                "text": data.texts,
                "bucket": pa.array(data.bucket, pa.int64()),
            }
        )
        self.row = {(d, c): i for i, (d, c) in enumerate(zip(data.doc_ids, data.chunk_index))}
        self._row_map: np.ndarray | None = None

    def ingest_batch(self, start: int, end: int) -> None:
        self.kb.ingest_table(
            self.table.slice(start, end - start),
            vectors=self.data.vectors[start:end],
            span_columns=None,
            metadata_columns=["bucket"],
        )

    def finish_ingest(self) -> None:
        self.kb.wait_until_indexed()

    def _rows(self) -> np.ndarray:
        """Bench row of each chunk id (-1: none), from the stored metadata: the ids-only
        cases map their answers through it, as zvec's map its internal ids. Built once (chunk
        ids are stored: a reopen keeps them), outside the timed calls."""
        if self._row_map is None:
            self._row_map = self._build_rows()
        return self._row_map

    def _build_rows(self) -> np.ndarray:
        index = self.kb.index
        assert index is not None
        ids = index.ids()
        rows = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        for i, m in zip(ids.tolist(), index.get_metadata(ids)):
            rows[i] = self.row[m["document_id"], m["chunk_index"]]
        return rows

    def fn(self, case: str) -> Callable[[int], Any] | None:
        kb, qs, ef, row = self.kb, self.data.queries, self.knob, self.row
        texts = self.data.query_texts
        if case == "vector" or case in FILTERS:  # ids only, as the peers' fastest paths
            flt = None if case == "vector" else {"bucket": {"$lt": FILTERS[case]}}
            rows, search_ids = self._rows(), kb.search_ids
            return lambda i: rows[search_ids(qs[i], K, ef=ef, filters=flt)[0]].tolist()
        if case == WITH_TEXT:  # the ten hits with their text and document id
            return lambda i: [row[h.document_id, h.chunk_index] for h in kb.retrieve(qs[i], K, ef=ef)]
        if case == "one per document":
            return lambda i: [h.document_id for h in kb.retrieve(qs[i], K, ef=ef, deduplicate=True)]
        return lambda i: [
            row[h.document_id, h.chunk_index]
            for h in kb.retrieve(texts[i], K, ef=ef, search_type="hybrid", fusion="rrf", query_vector=qs[i])
        ]

    def close(self) -> None:
        self.engine.close()

    def reopen(self) -> None:
        from kbcore.engine import Engine

        self.engine = Engine(self.root)
        self.kb = self.engine.get_knowledge_base("kb")


class Zvec(Peer):
    name = "zvec"
    DURABILITY = (
        "insert, then Collection.flush() per batch (observed: ~10 fsync + ~20 fdatasync + msync + "
        "sync_file_range per batch, benches/peers_fsync.py)"
    )
    PATH = (
        "HNSW INT8 (m=16, ef_construction=200) + invert index on bucket + FTS on text, optimized, reopened "
        "read-only; "
        "query_internal_ids (vector, filter str), query(output_fields=[doc_id, text]) (vector with text), "
        "group_by_query (one per document), "
        "query([vector, fts], reranker=RrfReRanker) (hybrid)"
    )

    def __init__(self, root: str, data: Data) -> None:
        super().__init__(root, data)
        import zvec as zv
        from zvec.typing import DataType, MetricType, QuantizeType

        self.zv = zv
        self.path = os.path.join(root, "c")
        params = zv.HnswIndexParam(
            metric_type=MetricType.COSINE, m=M, ef_construction=EF_CONSTRUCTION, quantize_type=QuantizeType.INT8
        )
        schema = zv.CollectionSchema(
            name="bench",
            fields=[
                zv.FieldSchema("doc_id", DataType.STRING),
                zv.FieldSchema(
                    "bucket", DataType.INT64, index_param=zv.InvertIndexParam(enable_range_optimization=True)
                ),
                zv.FieldSchema("text", DataType.STRING, index_param=zv.FtsIndexParam()),
            ],
            vectors=zv.VectorSchema("v", DataType.VECTOR_FP32, data.vectors.shape[1], index_param=params),
        )
        self.coll = zv.create_and_open(self.path, schema)
        self.rows = np.zeros(0, dtype=np.int64)

    def ingest_batch(self, start: int, end: int) -> None:
        d = self.data
        docs = [
            self.zv.Doc(
                id=str(i),
                vectors={"v": d.vectors[i]},
                fields={"doc_id": d.doc_ids[i], "bucket": int(d.bucket[i]), "text": d.texts[i]},
            )
            for i in range(start, end)
        ]
        for b in range(0, len(docs), 1024):  # zvec 0.8 caps one write at 1024 docs
            self.coll.insert(docs[b : b + 1024])
        self.coll.flush()

    def finish_ingest(self) -> None:
        self.coll.optimize(option=self.zv.OptimizeOption(concurrency=2))
        self.coll.flush()
        # query_internal_ids (the fastest path) and its id map need a read-only collection
        self.close()
        self.reopen()

    def _map(self) -> None:
        keys = self.coll.resolve_internal_ids(np.arange(self.data.n, dtype=np.int64))
        self.rows = np.array([-1 if k is None else int(k) for k in keys], dtype=np.int64)

    def fn(self, case: str) -> Callable[[int], Any] | None:
        zv, coll, qs, rows = self.zv, self.coll, self.data.queries, self.rows
        param = zv.HnswQueryParam(ef=self.knob)
        if case == "vector" or case in FILTERS:
            flt = None if case == "vector" else f"bucket < {FILTERS[case]}"
            search = coll.query_internal_ids
            return lambda i: rows[
                np.asarray(search(zv.Query("v", vector=qs[i], param=param), topk=K, filter=flt))[:K]
            ].tolist()
        if case == WITH_TEXT:

            def with_text(i: int) -> list[int]:
                docs = coll.query(zv.Query("v", vector=qs[i], param=param), topk=K, output_fields=["doc_id", "text"])
                return [int(d.id) for d in docs if isinstance(d.field("text"), str)][:K]

            return with_text
        if case == "one per document":
            group = coll.group_by_query

            def one(i: int) -> list[str]:
                res = group(zv.Query("v", vector=qs[i], param=param), "doc_id", group_count=K, topk_per_group=1)
                return [str(g.group_by_value) for g in res][:K]

            return one
        texts = self.data.query_texts
        rr = zv.RrfReRanker()

        def hybrid(i: int) -> list[int]:
            docs = coll.query(
                [zv.Query("v", vector=qs[i], param=param), zv.Query("text", fts=zv.Fts(match_string=texts[i]))],
                topk=K,
                reranker=rr,
            )
            return [int(d.id) for d in docs][:K]

        return hybrid

    def close(self) -> None:
        self.coll = None
        gc.collect()

    def reopen(self) -> None:
        self.coll = self.zv.open(self.path, self.zv.CollectionOption(read_only=True))
        self._map()


class LanceDB(Peer):
    name = "lancedb"
    DURABILITY = (
        "Table.add per batch writes a fragment and a new manifest version, but no sync call was observed "
        "(benches/peers_fsync.py): in the page cache on return, so it survives a process crash, not a "
        "power loss or an OS crash"
    )
    PATH = (
        "HnswSq index (IVF_HNSW_SQ, one partition per 100k rows, m=16, ef_construction=200, cosine), BTree on bucket, "
        "native FTS on "
        "text; tbl.search(q).limit(10).ef().where(prefilter=True).select([]).to_arrow(); "
        "with text: .select(['row', 'doc_id', 'text']); "
        "hybrid: search(query_type='hybrid') with RRF; no group-by (over-fetch 50, collapse in Python)"
    )
    knobs = (16, 32, 64, 128, 256, 512)

    def __init__(self, root: str, data: Data) -> None:
        super().__init__(root, data)
        os.environ.setdefault("LANCE_LOG", "error")  # Lance's per-query deprecation warnings
        import lancedb
        import pyarrow as pa

        self.lancedb = lancedb
        self.pa = pa
        self.db = lancedb.connect(root)
        d = data.vectors.shape[1]
        self.table_data = pa.table(
            {
                "row": pa.array(np.arange(data.n), pa.int64()),
                "doc_id": data.doc_ids,
                "bucket": pa.array(data.bucket, pa.int64()),
                "text": data.texts,
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(data.vectors.ravel(), pa.float32()), d),
            }
        )
        self.tbl = None

    def ingest_batch(self, start: int, end: int) -> None:
        part = self.table_data.slice(start, end - start)
        if self.tbl is None:
            self.tbl = self.db.create_table("t", data=part)
        else:
            self.tbl.add(part)

    def finish_ingest(self) -> None:
        from lancedb.index import FTS, BTree, HnswSq

        # one partition below 100k rows: the HNSW graph then spans the whole table, as the others'
        parts = max(1, self.data.n // 100_000)
        hnsw = HnswSq(distance_type="cosine", num_partitions=parts, m=M, ef_construction=EF_CONSTRUCTION)
        self.tbl.create_index("vector", config=hnsw)
        self.tbl.create_index("bucket", config=BTree())
        self.tbl.create_index("text", config=FTS())

    def fn(self, case: str) -> Callable[[int], Any] | None:
        tbl, qs, ef = self.tbl, self.data.queries, self.knob
        if case == "vector" or case in FILTERS:
            flt = None if case == "vector" else f"bucket < {FILTERS[case]}"

            def one(i: int) -> list[int]:
                s = tbl.search(qs[i]).limit(K).ef(ef).select(["row"])
                if flt is not None:
                    s = s.where(flt, prefilter=True)
                return s.to_arrow()["row"].to_pylist()

            return one
        if case == WITH_TEXT:

            def with_text(i: int) -> list[int]:
                t = tbl.search(qs[i]).limit(K).ef(ef).select(["row", "doc_id", "text"]).to_arrow()
                return [r for r, x in zip(t["row"].to_pylist(), t["text"].to_pylist()) if isinstance(x, str)]

            return with_text
        if case == "one per document":
            doc_ids = self.data.doc_ids
            return lambda i: collapse(
                tbl.search(qs[i])
                .limit(GROUP_FETCH)
                .ef(max(ef, GROUP_FETCH))
                .select(["row"])
                .to_arrow()["row"]
                .to_pylist(),
                doc_ids,
            )
        texts = self.data.query_texts
        return lambda i: (
            tbl.search(query_type="hybrid").vector(qs[i]).text(texts[i]).limit(K).select(["row"]).to_arrow()["row"]
        ).to_pylist()

    def close(self) -> None:
        self.tbl = None
        self.db = None
        gc.collect()

    def reopen(self) -> None:
        self.db = self.lancedb.connect(self.root)
        self.tbl = self.db.open_table("t")


class Chroma(Peer):
    name = "chroma"
    DURABILITY = (
        "collection.add per batch commits to SQLite (observed: 20-24 fsync per batch, "
        "benches/peers_fsync.py); its HNSW segment is persisted in batches in the background"
    )
    PATH = (
        "PersistentClient; HNSW (max_neighbors=16, ef_construction=200, cosine, num_threads=1); "
        "collection.query(query_embeddings=[q], n_results=10, where=, include=[]) "
        "(with text: include=['documents', 'metadatas']); no group-by "
        "(over-fetch 50, collapse in Python); no hybrid in the local client"
    )

    def __init__(self, root: str, data: Data) -> None:
        super().__init__(root, data)
        import chromadb

        self.chromadb = chromadb
        self.client = chromadb.PersistentClient(path=root)
        self.coll = self.client.create_collection(
            "chunks",
            configuration={
                "hnsw": {"space": "cosine", "max_neighbors": M, "ef_construction": EF_CONSTRUCTION, "num_threads": 1}
            },
        )

    def ingest_batch(self, start: int, end: int) -> None:
        d = self.data
        self.coll.add(
            ids=[str(i) for i in range(start, end)],
            embeddings=d.vectors[start:end],
            metadatas=[{"doc_id": d.doc_ids[i], "bucket": int(d.bucket[i])} for i in range(start, end)],
            documents=d.texts[start:end],
        )

    def set_knob(self, knob: int) -> None:
        super().set_knob(knob)
        self.coll.modify(configuration={"hnsw": {"ef_search": knob}})

    def fn(self, case: str) -> Callable[[int], Any] | None:
        query, qs = self.coll.query, self.data.queries
        if case == "vector" or case in FILTERS:
            where = None if case == "vector" else {"bucket": {"$lt": FILTERS[case]}}
            return lambda i: [
                int(x) for x in query(query_embeddings=[qs[i]], n_results=K, where=where, include=[])["ids"][0]
            ]
        if case == WITH_TEXT:

            def with_text(i: int) -> list[int]:
                r = query(query_embeddings=[qs[i]], n_results=K, include=["documents", "metadatas"])
                return [int(x) for x, t in zip(r["ids"][0], r["documents"][0]) if isinstance(t, str)]

            return with_text
        if case == "one per document":
            doc_ids = self.data.doc_ids
            return lambda i: collapse(
                [int(x) for x in query(query_embeddings=[qs[i]], n_results=GROUP_FETCH, include=[])["ids"][0]], doc_ids
            )
        return None

    def close(self) -> None:
        # Client.close() stops the shared System once no client holds it; without it a new
        # PersistentClient on the same path reuses the cached in-memory System (its SQLite
        # connection and loaded HNSW segments), and a "reopen" would read nothing from disk.
        if self.client is not None:
            self.client.close()
        self.coll = None
        self.client = None
        gc.collect()

    def reopen(self) -> None:
        self.client = self.chromadb.PersistentClient(path=self.root)
        self.coll = self.client.get_collection("chunks")
        self.coll.modify(configuration={"hnsw": {"ef_search": self.knob}})


class MilvusLite(Peer):
    name = "milvus-lite"
    DURABILITY = (
        "insert, then flush() per batch (observed: 3 fsync per batch in the Milvus Lite server process, "
        "benches/peers_fsync.py)"
    )
    PATH = (
        "MilvusClient('file.db'); HNSW (M=16, efConstruction=200, COSINE) + BM25 function on text; "
        "client.search(data=[q], limit=10, filter=, search_params={'ef'}, group_by_field='doc_id'; "
        "with text: output_fields=['doc_id', 'text']); "
        "hybrid_search with RRFRanker. Limits: Milvus Lite serves the file from a gRPC server it starts "
        "in this process (each call is a local gRPC round trip); its only scalar index is INVERTED; "
        "before the reopen that server is stopped (release_server), so the collection loads from disk"
    )

    def __init__(self, root: str, data: Data) -> None:
        super().__init__(root, data)
        from pymilvus import DataType, Function, FunctionType, MilvusClient

        self.MilvusClient = MilvusClient
        self.uri = os.path.join(root, "milvus.db")
        self.client = MilvusClient(self.uri)
        schema = MilvusClient.create_schema(auto_id=False)
        schema.add_field("row", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=int(data.vectors.shape[1]))
        schema.add_field("doc_id", DataType.VARCHAR, max_length=64)
        schema.add_field("bucket", DataType.INT64)
        schema.add_field("text", DataType.VARCHAR, max_length=8192, enable_analyzer=True)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(
            Function(
                name="bm25", function_type=FunctionType.BM25, input_field_names=["text"], output_field_names=["sparse"]
            )
        )
        index = self.client.prepare_index_params()
        index.add_index(
            "vector", index_type="HNSW", metric_type="COSINE", params={"M": M, "efConstruction": EF_CONSTRUCTION}
        )
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        index.add_index("bucket", index_type="INVERTED")  # Milvus Lite's only scalar index
        self.client.create_collection("c", schema=schema, index_params=index)

    def ingest_batch(self, start: int, end: int) -> None:
        d = self.data
        rows = [
            {"row": i, "vector": d.vectors[i], "doc_id": d.doc_ids[i], "bucket": int(d.bucket[i]), "text": d.texts[i]}
            for i in range(start, end)
        ]
        self.client.insert("c", rows)
        self.client.flush("c")

    def finish_ingest(self) -> None:
        self.client.load_collection("c")

    def fn(self, case: str) -> Callable[[int], Any] | None:
        search, qs = self.client.search, self.data.queries
        sp = {"metric_type": "COSINE", "params": {"ef": self.knob}}
        if case == "vector" or case in FILTERS:
            flt = "" if case == "vector" else f"bucket < {FILTERS[case]}"
            return lambda i: [
                _pk(h) for h in search("c", data=[qs[i]], limit=K, filter=flt, search_params=sp, anns_field="vector")[0]
            ]
        if case == WITH_TEXT:
            return lambda i: [
                _pk(h)
                for h in search(
                    "c", data=[qs[i]], limit=K, search_params=sp, anns_field="vector", output_fields=["doc_id", "text"]
                )[0]
                if isinstance(h["entity"]["text"], str)
            ]
        if case == "one per document":
            return lambda i: [
                h["entity"]["doc_id"]
                for h in search(
                    "c",
                    data=[qs[i]],
                    limit=K,
                    search_params=sp,
                    anns_field="vector",
                    group_by_field="doc_id",
                    output_fields=["doc_id"],
                )[0]
            ]
        from pymilvus import AnnSearchRequest, RRFRanker

        texts, client, ranker = self.data.query_texts, self.client, RRFRanker()

        def hybrid(i: int) -> list[int]:
            reqs = [
                AnnSearchRequest(data=[qs[i]], anns_field="vector", param=sp, limit=K),
                AnnSearchRequest(data=[texts[i]], anns_field="sparse", param={"metric_type": "BM25"}, limit=K),
            ]
            return [_pk(h) for h in client.hybrid_search("c", reqs, ranker=ranker, limit=K)[0]]

        return hybrid

    def close(self) -> None:
        self.client.close()
        self.client = None
        # Milvus Lite serves each .db file from an in-process server that outlives the client;
        # stop it, so that a reopen loads the collection from disk as a restart would.
        from milvus_lite.server_manager import server_manager_instance

        server_manager_instance.release_server(self.uri)

    def reopen(self) -> None:
        self.client = self.MilvusClient(self.uri)
        self.client.load_collection("c")


def _pk(hit: Any) -> int:
    """The primary key ("row") of a pymilvus hit (older clients name it "id")."""
    return int(hit["row"] if "row" in hit else hit["id"])


PEERS: dict[str, type[Peer]] = {
    "kbcore": Kbcore,
    "zvec": Zvec,
    "lancedb": LanceDB,
    "chroma": Chroma,
    "milvus-lite": MilvusLite,
}


# ----------------------------------------------------------------------------------------------
# measurement


def p50_ms(fn: Callable[[int], Any], nq: int, rounds: int) -> float:
    times = []
    gc.disable()
    try:
        for _ in range(rounds):
            for i in range(nq):
                t0 = time.perf_counter()
                fn(i)
                times.append(time.perf_counter() - t0)
    finally:
        gc.enable()
    return statistics.median(times) * 1e3


def run_peer(name: str, data: Data, truth: dict, rounds: int) -> dict[str, Any]:
    cls = PEERS[name]
    out: dict[str, Any] = {"path": cls.PATH, "durability": cls.DURABILITY, "cases": {}}
    root = tempfile.mkdtemp(prefix=f"bench-peer-{name}-")
    nq = data.queries.shape[0]
    try:
        try:
            peer = cls(root, data)
        except ImportError as exc:
            out["skipped"] = f"not installed: {exc}"
            return out
        t0 = time.perf_counter()
        for start, end in data.batches:
            peer.ingest_batch(start, end)
        ingest_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        peer.finish_ingest()
        out["ingest_rows_per_s"] = data.n / ingest_s
        out["index_s"] = time.perf_counter() - t1
        print(f"  {name}: ingest {data.n / ingest_s:,.0f} rows/s, index {out['index_s']:.1f} s", flush=True)
        knob = None
        for k in peer.knobs:
            peer.set_knob(k)
            fn = peer.fn("vector")
            r = recall([fn(i) for i in range(nq)], truth["vector"])
            if r >= TARGET:
                knob, out["unfiltered_recall"] = k, r
                break
        if knob is None:
            out["unfiltered_recall"] = r
            out["note"] = f"unfiltered recall {r:.3f} < {TARGET} at the largest knob {peer.knobs[-1]}"
            knob = peer.knobs[-1]
        out["knob"] = knob
        for case in CASES:
            try:
                fn = peer.fn(case)
                if fn is None:
                    out["cases"][case] = {"na": "not supported"}
                    continue
                got = [fn(i) for i in range(nq)]  # also the warm-up
                entry: dict[str, Any] = {"p50_ms": p50_ms(fn, nq, rounds)}
                if case in truth:
                    entry["recall"] = recall(got, truth[case])
                out["cases"][case] = entry
            except Exception as exc:  # a case a system cannot run is reported with its error
                out["cases"][case] = {"na": f"{type(exc).__name__}: {str(exc)[:200]}"}
            print(f"    {case:<17s} {out['cases'][case]}", flush=True)
        peer.close()
        gc.collect()
        t0 = time.perf_counter()
        peer.reopen()
        peer.set_knob(knob)
        peer.fn("vector")(0)
        out["reopen_first_query_s"] = time.perf_counter() - t0
        peer.close()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        out["traceback"] = traceback.format_exc()
        print(f"  {name} FAILED: {out['error']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    lines = ["| p50 ms | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def cell(r: dict[str, Any], case: str) -> str:
        if "skipped" in r:
            return "skipped"
        if "error" in r and case not in r.get("cases", {}):
            return "failed"
        c = r["cases"].get(case, {})
        if "na" in c:
            return "n/a"
        if "p50_ms" not in c:
            return "n/a"
        rec = f" (recall {c['recall']:.2f})" if "recall" in c and c["recall"] < TARGET else ""
        return f"{c['p50_ms']:.3f}{rec}"

    for case in CASES:
        lines.append(f"| {case} | " + " | ".join(cell(results[n], case) for n in names) + " |")
    lines.append(
        "| durable ingest, 1k-row batches (rows/s) | "
        + " | ".join(
            f"{results[n]['ingest_rows_per_s']:,.0f}" if "ingest_rows_per_s" in results[n] else "n/a" for n in names
        )
        + " |"
    )
    lines.append(
        "| index build after ingest (s) | "
        + " | ".join(f"{results[n]['index_s']:.1f}" if "index_s" in results[n] else "n/a" for n in names)
        + " |"
    )
    lines.append(
        "| reopen + first query (s) | "
        + " | ".join(
            f"{results[n]['reopen_first_query_s']:.3f}" if "reopen_first_query_s" in results[n] else "n/a"
            for n in names
        )
        + " |"
    )
    lines.append(
        "| knob (ef / nprobes) at unfiltered recall ≥ 0.95 | "
        + " | ".join(str(results[n].get("knob", "n/a")) for n in names)
        + " |"
    )
    lines.append("")
    for n in names:
        r = results[n]
        lines.append(f"- **{n}**: {r.get('skipped') or r.get('error') or ''}")
        lines.append(f"  - path: {PEERS[n].PATH}")
        lines.append(f"  - durability: {PEERS[n].DURABILITY}")
        for case, c in r.get("cases", {}).items():
            if "na" in c:
                lines.append(f"  - {case}: n/a ({c['na']})")
        if "note" in r:
            lines.append(f"  - {r['note']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="data root holding scifact/ (default $KBCORE_DATA)")
    ap.add_argument("--peers", default=",".join(DEFAULT_PEERS), help=f"known: {','.join(PEERS)}")
    ap.add_argument("--rounds", type=int, default=3, help="timed passes over the queries per case")
    ap.add_argument("--n", type=int, default=None, help="a prefix of the chunks (smoke runs)")
    ap.add_argument("--nq", type=int, default=None, help="a prefix of the queries (smoke runs)")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--kbcore-threads",
        type=int,
        default=0,
        help="kbcore's search pool size (kbcore.set_search_threads; 0: its default, which runs a hybrid "
        "call's two legs side by side on an idle core; 1: everything on the calling thread)",
    )
    ap.add_argument(
        "--kbcore-no-merge",
        action="store_true",
        help="kbcore keeps one segment per batch (no size-tiered merges): what the merges cost the ingest",
    )
    args = ap.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        ap.error(f"unknown peers {unknown}; known: {list(PEERS)}")
    folder = scifact_dir(args.data)
    if not (folder / "chunk_embeddings.npy").exists():
        print(f"SciFact not found at {folder}; pass --data or set KBCORE_DATA", file=sys.stderr)
        return 2
    if args.kbcore_threads:
        from kbcore.index import set_search_threads

        set_search_threads(args.kbcore_threads)
        print(f"kbcore search threads: {args.kbcore_threads}", flush=True)
    if args.kbcore_no_merge:
        from kbcore.engine import manifest as policy

        policy.MERGE_FACTOR = 1 << 62  # a run of that many alike segments never forms
        print("kbcore: size-tiered merges off", flush=True)
    load0 = os.getloadavg()
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    data = load(args.data, args.n, args.nq)
    truth = exact(data)
    print(f"SciFact: {data.n} chunks, {len(data.batches)} batches, {data.queries.shape[0]} queries", flush=True)
    results = {p: run_peer(p, data, truth, args.rounds) for p in peers}
    load1 = os.getloadavg()
    md = table(results)
    print("\n" + md)
    print(f"\nload average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"n": data.n, "load_start": load0, "load_end": load1, "results": results}, indent=1)
        )
    failed = [p for p, r in results.items() if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
