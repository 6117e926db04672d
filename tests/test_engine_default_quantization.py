"""A new HNSW knowledge base walks SQ8 codes by default (quantization="auto"), re-ranked from
its float32 rows: exact distances and order, the float32 index's recall; a flat one, an
explicit None and every existing knowledge base keep what they say (docs/engine.md)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

from kbcore import Engine
from kbcore.errors import InvalidArgumentError
from kbcore.index import IndexSpec

DIM = 32
ROWS = 2_000  # past the 1,000 rows at which a quantized index trains its codes
K = 10


def _config(kb) -> dict:
    with open(os.path.join(kb.path, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)["config"]


def _vectors(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(20, DIM))
    x = centres[rng.integers(0, 20, n)] + 0.35 * rng.normal(size=(n, DIM))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _ingest(kb, data: np.ndarray) -> None:
    ids = [f"d{i}" for i in range(len(data))]
    kb.ingest_table(pa.table({"document_id": ids, "text": ids}), vectors=data)
    kb.wait_until_indexed()


def test_a_new_hnsw_knowledge_base_is_sq8_and_a_flat_one_is_not(tmp_path):
    engine = Engine(tmp_path)
    assert _config(engine.create_knowledge_base("default", embedder=False, dim=DIM))["quantization"] == "sq8"
    assert (
        _config(engine.create_knowledge_base("flat", embedder=False, dim=DIM, index="flat")).get("quantization") is None
    )
    plain = engine.create_knowledge_base("plain", embedder=False, dim=DIM, quantization=None)
    assert _config(plain).get("quantization") is None
    rabitq = engine.create_knowledge_base("rabitq", embedder=False, dim=DIM, quantization="rabitq")
    assert _config(rabitq)["quantization"] == "rabitq"
    # A spec given whole is kept as it is (IndexSpec's own default stays float32).
    whole = engine.create_knowledge_base("whole", embedder=False, dim=DIM, index=IndexSpec(M=8))
    assert _config(whole).get("quantization") is None
    with pytest.raises(InvalidArgumentError, match="quantization"):
        engine.create_knowledge_base("bad", embedder=False, dim=DIM, index="flat", quantization="sq8")
    engine.close()


def test_an_existing_float32_knowledge_base_stays_float32_when_reopened(tmp_path):
    engine = Engine(tmp_path)
    _ingest(engine.create_knowledge_base("old", embedder=False, dim=DIM, quantization=None), _vectors(1, 1_200))
    engine.close()
    again = Engine(tmp_path)
    kb = again.get_knowledge_base("old")
    assert _config(kb).get("quantization") is None
    assert kb.index.spec.quantization is None
    again.close()


def test_the_default_answers_with_exact_distances_and_the_float32_recall(tmp_path):
    data = _vectors(7, ROWS)
    queries = _vectors(8, 50)
    engine = Engine(tmp_path)
    default = engine.create_knowledge_base("default", embedder=False, dim=DIM)
    plain = engine.create_knowledge_base("plain", embedder=False, dim=DIM, quantization=None)
    for kb in (default, plain):
        _ingest(kb, data)
    assert default.index.quantizer_trained
    exact = np.argsort(1.0 - queries @ data.T, axis=1, kind="stable")[:, :K]
    recall = {}
    for kb in (default, plain):
        found = 0
        for q, best in zip(queries, exact):
            hits = kb.retrieve(q, K)
            rows = [int(h.document_id[1:]) for h in hits]
            # Distances re-ranked from the float32 rows: exact, in exact order.
            want = 1.0 - data[rows] @ q
            np.testing.assert_allclose([h.distance for h in hits], want, rtol=0, atol=1e-5)
            assert [h.distance for h in hits] == sorted(h.distance for h in hits)
            found += len(set(rows) & set(best.tolist()))
        recall[kb.name] = found / (K * len(queries))
    assert recall["plain"] >= 0.9, recall
    assert recall["default"] >= recall["plain"] - 0.01, recall
    engine.close()
