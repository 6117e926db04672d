"""``Engine.retrieve`` over several knowledge bases (the merge over candidates, hits built for
the kept ones only) against an oracle built from each knowledge base's own ``retrieve``: the
same hits, scores, order and metadata, on knowledge bases of one segment, of several segments
and with deleted chunks, with filters, dedup and thresholds; and the per-search score mapping
bit for bit on every kind of float."""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import pytest
from chunk_tables import chunk_table

from kbcore import Engine
from kbcore.engine import retrieval
from kbcore.engine.scores import score_from_distance

DIM = 8
TOPICS = ["rockets", "volcanoes", "glaciers", "orchids"]


def _engine(tmp_path, metric: str) -> Engine:
    """k0: one segment; k1: two ingests (several segments); k2: a document deleted."""
    engine = Engine(tmp_path / metric)
    for i in range(3):
        kb = engine.create_knowledge_base(f"k{i}", embedder=False, metric=metric)
        table, vecs = chunk_table(10, 4, 40 + i, DIM, TOPICS)
        if i == 1:
            half = len(table) // 2
            kb.ingest_table(table.slice(0, half), vectors=vecs[:half])
            kb.ingest_table(table.slice(half), vectors=vecs[half:])
        else:
            kb.ingest_table(table, vectors=vecs)
        if i == 2:
            kb.delete_document("d3")
        kb.wait_until_indexed()
    return engine


def _oracle(engine: Engine, names: list[str], q: np.ndarray, top_k: int, **kw) -> list[tuple]:
    """Each knowledge base's own hits, merged by score (ties: the order of names, then rank)."""
    tagged = []
    for i, name in enumerate(names):
        for r, h in enumerate(engine[name].retrieve(q, top_k, **kw)):
            tagged.append((-h.score, i, r, name, h))
    tagged.sort(key=lambda t: t[:3])
    return [_row(h, name) for _, _, _, name, h in tagged[:top_k]]


def _row(h, name: str | None = None) -> tuple:
    meta = dict(h.metadata)
    if name is not None:  # the oracle's hit: tagged as the merge tags it
        meta["knowledge_base"], meta["merged_by"] = name, "score"
    return (h.id, h.document_id, h.content, meta, h.distance, h.score, h.chunk_index, h.part_ids)


@pytest.mark.parametrize("metric", ["cosine", "l2"])
@pytest.mark.parametrize(
    "kw",
    [{}, {"deduplicate": True}, {"filters": {"team": "b"}}, {"score_threshold": "median"}, {"pipelines": "default"}],
)
def test_merged_retrieve_equals_the_merge_of_each_knowledge_bases_hits(tmp_path, metric, kw):
    median = kw.get("score_threshold") == "median"
    engine = _engine(tmp_path, metric)
    names = ["k0", "k1", "k2"]
    assert len(engine["k1"]._cell.state.segments) > 1  # the several-segment path is exercised
    rng = np.random.default_rng(11)
    met = dropped = 0
    for _ in range(12):
        q = rng.standard_normal(DIM).astype(np.float32)
        if median:  # a threshold that keeps some hits and drops some
            scores = [h.score for h in engine.retrieve(names, q, 30)]
            kw = {"score_threshold": scores[len(scores) // 2]}
        for top_k in (1, 7, 30):
            got = [_row(h) for h in engine.retrieve(names, q, top_k, **kw)]
            want = _oracle(engine, names, q, top_k, **kw)
            assert got == want
            met += len(got)
            dropped += top_k - len(got)
    assert met > 0 and (dropped > 0 or not median)
    engine.close()


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_scores_equal_score_from_distance_on_every_kind_of_float(metric):
    rng = random.Random(20261206)
    edges = [0.0, -0.0, 2.0, -2.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324, 2.0000000000000004]
    bits = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(3000)]
    dist = edges + bits + [rng.uniform(-3.0, 5.0) for _ in range(3000)]
    got = retrieval._scores(dist, metric)
    want = [score_from_distance(d, metric) for d in dist]
    assert [s.hex() for s in got] == [s.hex() for s in want]
