"""Seeded chunk tables for engine tests: documents of several chunks each, with a team column and
random vectors, as ``KnowledgeBase.ingest_table(table, vectors=...)`` takes them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def chunk_table(
    n_docs: int, per_doc: int, seed: int, dim: int, topics: Sequence[str] = ()
) -> tuple[pa.Table, np.ndarray]:
    """``n_docs`` documents ``d0``... of ``per_doc`` chunks each (text ``doc D chunk I``, followed by
    a topic word when ``topics`` is given), team ``a`` / ``b`` alternating by document, and one
    standard-normal float32 vector of ``dim`` per chunk from ``seed``."""
    rng = np.random.default_rng(seed)
    doc = np.repeat(np.arange(n_docs), per_doc)
    idx = np.tile(np.arange(per_doc), n_docs)
    suffix = [f" {topics[(d + i) % len(topics)]}" if topics else "" for d, i in zip(doc, idx)]
    table = pa.table(
        {
            "document_id": [f"d{d}" for d in doc],
            "chunk_index": idx,
            "text": [f"doc {d} chunk {i}{s}" for d, i, s in zip(doc, idx, suffix)],
            "team": [("a", "b")[d % 2] for d in doc],
        }
    )
    return table, rng.standard_normal((len(doc), dim)).astype(np.float32)
