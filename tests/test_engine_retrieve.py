"""Knowledge engine retrieval against an exact numpy oracle: scores, thresholds, filters, dedup."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from kbcore import Engine
from kbcore.errors import InvalidArgumentError, InvalidTypeError

N_DOCS, DIM = 40, 16


def _corpus(seed: int):
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 6, N_DOCS)
    doc = np.repeat(np.arange(N_DOCS), counts)
    n = len(doc)
    vecs = rng.standard_normal((n, DIM)).astype(np.float32)
    team = rng.choice(["infra", "web", "data"], N_DOCS)[doc]
    year = rng.integers(2015, 2025, N_DOCS)[doc]
    order = rng.permutation(n)  # rows of a document are scattered in the input table
    table = pa.table(
        {
            "document_id": [f"d{d}" for d in doc[order]],
            "text": [f"row {i}" for i in order],
            "team": team[order],
            "year": year[order],
        }
    )
    return table, vecs[order], {"doc": doc, "team": team, "year": year, "vecs": vecs, "order": order}


def _kb(tmp_path, metric, seed=0):
    table, vecs, truth = _corpus(seed)
    engine = Engine(tmp_path / metric)
    kb = engine.create_knowledge_base("kb", embedder=False, index="flat", metric=metric)
    kb.ingest_table(table, vectors=vecs)
    return kb, truth


def _oracle_dist(vecs, q, metric):
    v = vecs.astype(np.float64)
    q = q.astype(np.float64)
    if metric == "cosine":
        return 1 - (v / np.linalg.norm(v, axis=1, keepdims=True)) @ (q / np.linalg.norm(q))
    if metric == "ip":
        return 1 - v @ q
    return ((v - q) ** 2).sum(1)


def _oracle_score(d, metric):
    if metric == "l2":
        return 1 / (1 + d)
    return np.clip(1 - d / 2, 0, 1)


def _row_of(hit):
    return int(hit.content.split()[1])


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_chunks_scores_and_thresholds_match_the_oracle(tmp_path, metric):
    kb, t = _kb(tmp_path, metric)
    rng = np.random.default_rng(5)
    for _ in range(10):
        q = rng.standard_normal(DIM).astype(np.float32) * (0.3 if metric == "ip" else 1)
        dist = _oracle_dist(t["vecs"], q, metric)
        hits = kb.retrieve(q, top_k=12)
        expect = np.argsort(dist, kind="stable")[:12]
        assert [_row_of(h) for h in hits] == expect.tolist()
        for h in hits:
            r = _row_of(h)
            assert h.distance == pytest.approx(dist[r], abs=1e-4)
            assert h.score == pytest.approx(_oracle_score(dist[r], metric), abs=1e-4)
            assert 0 <= h.score <= 1 and h.document_id == f"d{t['doc'][r]}"
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        thr = float(np.median([h.score for h in hits]))
        kept = kb.retrieve(q, top_k=12, score_threshold=thr)
        assert [h.id for h in kept] == [h.id for h in hits if h.score >= thr]
        assert kb.retrieve(q, top_k=12, score_threshold=1.01) == []


def test_filters_use_the_native_language(tmp_path):
    kb, t = _kb(tmp_path, "cosine")
    q = np.random.default_rng(9).standard_normal(DIM).astype(np.float32)
    dist = _oracle_dist(t["vecs"], q, "cosine")
    for filters, mask in [
        ({"team": "infra"}, t["team"] == "infra"),
        ({"year": {"$gte": 2020}, "team": {"$in": ["web", "data"]}}, (t["year"] >= 2020) & (t["team"] != "infra")),
        ({"$or": [{"document_id": "d3"}, {"file_id": "d7"}]}, np.isin(t["doc"], [3, 7])),
        ({"chunk_index": 0}, None),
    ]:
        hits = kb.retrieve(q, top_k=8, filters=filters)
        if mask is None:
            assert hits and all(h.chunk_index == 0 for h in hits)
            continue
        allowed = np.flatnonzero(mask)
        expect = allowed[np.argsort(dist[allowed], kind="stable")][:8]
        assert [_row_of(h) for h in hits] == expect.tolist()
    with pytest.raises(InvalidArgumentError, match="unknown operator"):
        kb.retrieve(q, filters={"team": {"$like": "x"}})


@pytest.mark.parametrize("top_k", [1, 5, 40, 60])
def test_dedup_returns_documents_ranked_by_their_best_chunk(tmp_path, top_k):
    kb, t = _kb(tmp_path, "cosine", seed=3)
    rng = np.random.default_rng(11)
    for _ in range(5):
        q = rng.standard_normal(DIM).astype(np.float32)
        dist = _oracle_dist(t["vecs"], q, "cosine")
        best = {}
        for r in np.argsort(dist, kind="stable"):
            best.setdefault(int(t["doc"][r]), r)
        expect = list(best.items())[:top_k]
        hits = kb.retrieve(q, top_k=top_k, deduplicate=True)
        assert [(h.document_id, _row_of(h)) for h in hits] == [(f"d{d}", r) for d, r in expect]
        for h in hits:
            # part ids: chunk indexes of this document, the best chunk first
            assert h.part_ids and h.part_ids[0] == h.chunk_index
            assert set(h.part_ids) <= set(range(int((t["doc"] == int(h.document_id[1:])).sum())))
        plain = kb.retrieve(q, top_k=top_k)
        assert [_row_of(h) for h in plain] == np.argsort(dist, kind="stable")[:top_k].tolist()
        assert all(h.part_ids == () for h in plain)


def test_dedup_with_filters_and_thresholds(tmp_path):
    kb, t = _kb(tmp_path, "cosine", seed=4)
    q = np.random.default_rng(2).standard_normal(DIM).astype(np.float32)
    dist = _oracle_dist(t["vecs"], q, "cosine")
    allowed = np.flatnonzero(t["team"] == "web")
    best = {}
    for r in allowed[np.argsort(dist[allowed], kind="stable")]:
        best.setdefault(int(t["doc"][r]), r)
    hits = kb.retrieve(q, top_k=5, deduplicate=True, filters={"team": "web"}, score_threshold=0.5)
    expect = [(f"d{d}", r) for d, r in list(best.items())[:5] if _oracle_score(dist[r], "cosine") >= 0.5]
    assert [(h.document_id, _row_of(h)) for h in hits] == expect


def test_retrieve_key_and_text(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", chunk_size=60, chunk_overlap=0, index="flat")
    text = ("Signing keys rotate every ninety days. " * 4) + "\n\nLunch is at noon in the cafeteria."
    kb.ingest(text=text, document_id="handbook")
    kb.ingest(text="Deploys roll back with shipit. " * 3, document_id="deploys")
    keys = kb.retrieve_key("signing keys rotate", topk=2, deduplicate=True)
    assert [k.key for k in keys] == ["handbook", "deploys"]
    assert keys[0].pipeline_name == "default" and len(keys[0].part_ids) >= 2
    assert keys[0].distance < keys[1].distance and keys[0].score > keys[1].score
    texts = kb.retrieve_text("signing keys rotate", topk=1, deduplicate=True)
    assert texts[0].key == "handbook" and texts[0].value == text
    assert "Signing keys" in texts[0].chunk and texts[0].chunk in text
    per_chunk = kb.retrieve_key("signing keys rotate", topk=3, deduplicate=False)
    assert all(len(k.part_ids) == 1 for k in per_chunk)
    assert [k.key for k in per_chunk].count("handbook") >= 2  # every matching part comes back


def test_retrieve_key_and_text_deduplicate_by_default_as_aidb(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", chunk_size=60, chunk_overlap=0, index="flat")
    kb.ingest(text=("Signing keys rotate every ninety days. " * 4), document_id="handbook")
    kb.ingest(text="Deploys roll back with shipit. " * 3, document_id="deploys")
    oracle = kb.retrieve_key("signing keys rotate", topk=5, deduplicate=True)
    keys = kb.retrieve_key("signing keys rotate", topk=5)
    assert [(k.key, k.part_ids) for k in keys] == [(k.key, k.part_ids) for k in oracle]
    assert len({k.key for k in keys}) == len(keys) == 2 and len(keys[0].part_ids) >= 2
    texts = kb.retrieve_text("signing keys rotate", topk=5)
    assert [t.key for t in texts] == ["handbook", "deploys"]
    assert len(kb.retrieve_text("signing keys rotate", topk=5, deduplicate=False)) > 2


def test_pre_embedded_document_text_is_rebuilt_from_spans(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False)
    doc = "alpha beta gamma delta epsilon"
    table = pa.table(
        {
            "document_id": ["d", "d"],
            "text": [doc[0:16], doc[11:30]],
            "chunk_index": [0, 1],
            "char_start": [0, 11],
            "char_end": [16, 30],
        }
    )
    kb.ingest_table(table, vectors=np.eye(2, 4, dtype=np.float32))
    assert kb.document_text("d") == doc


def test_bad_retrieve_arguments(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb")
    kb.ingest(text="something to find", document_id="a")
    assert kb.retrieve("nothing in common", top_k=3)  # a hit is a hit, scores say how good
    with pytest.raises(InvalidArgumentError, match="top_k"):
        kb.retrieve("x", top_k=0)
    with pytest.raises(InvalidTypeError, match="top_k"):
        kb.retrieve("x", top_k=2.5)
    with pytest.raises(InvalidArgumentError, match="empty"):
        kb.retrieve("  ")
    with pytest.raises(InvalidTypeError):
        kb.retrieve(b"bytes")
    with pytest.raises(InvalidTypeError, match="score_threshold"):
        kb.retrieve("x", score_threshold="high")
    with pytest.raises(InvalidArgumentError, match="dimension"):
        kb.retrieve(np.ones(7, np.float32))
    empty = engine.create_knowledge_base("empty")
    assert empty.retrieve("anything") == [] and empty.retrieve("x", deduplicate=True) == []


# -- the per-hit path's fast helpers are the slow ones' equals ------------------------------


@pytest.mark.parametrize("large", [False, True])
def test_segment_text_of_reads_each_row_like_arrow(large):
    from kbcore.engine.segments import Segment

    texts = ["", "a", "ünïcødé ✓ 漢字", "x" * 700, "last"]
    typ = pa.large_string() if large else pa.string()
    arr = pa.array(["skipped", *texts], type=typ).slice(1)  # an offset into the buffers
    seg = object.__new__(Segment)
    seg.text = arr
    from kbcore.engine.segments import _string_views

    seg.text_views = _string_views(arr)
    assert seg.text_views is not None
    assert [seg.text_of(r) for r in range(len(texts))] == texts
    with_null = pa.array(["a", None, "c"], type=typ)
    seg.text, seg.text_views = with_null, _string_views(with_null)
    assert seg.text_views is None  # nulls: read through Arrow scalars
    assert [seg.text_of(r) for r in range(3)] == ["a", None, "c"]


@pytest.mark.parametrize("max_gaps", [None, 3])
def test_segment_row_of_ids_with_gaps_is_their_position(monkeypatch, max_gaps):
    """A merged segment's ids have gaps (dropped chunks): row() finds each id's position
    from the list of missing ids, or by a binary search past MAX_GAPS of them."""
    from kbcore.engine import segments
    from kbcore.engine.segments import Segment, _missing_ids

    if max_gaps is not None:
        monkeypatch.setattr(segments, "MAX_GAPS", max_gaps)
    rng = np.random.default_rng(5)
    for ids in (
        np.array([4, 5, 7, 8, 9, 12, 20], np.int64),
        np.array([0, 2], np.int64),
        np.sort(rng.choice(np.arange(100, 400), 150, replace=False)).astype(np.int64),
    ):
        seg = object.__new__(Segment)
        seg.ids, seg.min_id, seg.max_id = ids, int(ids[0]), int(ids[-1])
        seg.contiguous = False
        seg._gaps = segments._UNSET
        missing = sorted(set(range(int(ids[0]), int(ids[-1]) + 1)) - set(ids.tolist()))
        gaps = seg.gaps
        if len(missing) > segments.MAX_GAPS:
            assert gaps is None
        else:
            assert list(gaps) == missing and list(_missing_ids(ids, seg.min_id, seg.max_id)) == missing
        assert [seg.row(c) for c in ids.tolist()] == list(range(len(ids)))
        assert seg.rows_of(ids).tolist() == list(range(len(ids)))


def test_new_hit_builds_an_ordinary_frozen_hit():
    import dataclasses

    from kbcore.engine import Hit
    from kbcore.engine.types import new_hit

    args = (7, "d1", "text", {"k": 1}, 0.25, 0.875, "default", 3, (3, 5))
    fast, slow = new_hit(*args), Hit(*args)
    assert type(fast) is Hit and fast == slow and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == args
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.score = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_hits_over_several_segments_equal_the_general_path(tmp_path, metric):
    """make_hits' inlined path (bisect, text slice, score formula, Hit fill) builds what
    locate + text_of + score_from_distance + Hit(...) build, for hits spread over segments,
    then over segments whose ids have gaps."""
    table, vecs, _ = _corpus(5)
    engine = Engine(tmp_path / metric)
    kb = engine.create_knowledge_base("kb", embedder=False, index="flat", metric=metric)
    docs = table.column("document_id").to_pylist()
    cuts = [0] + [i for i in range(1, len(docs)) if docs[i] != docs[i - 1]][::7] + [len(docs)]
    for lo, hi in zip(cuts, cuts[1:]):
        if lo < hi:
            kb.ingest_table(table.slice(lo, hi - lo), vectors=vecs[lo:hi])
    state = kb._cell.state
    assert len(state.segments) > 2
    rng = np.random.default_rng(11)
    _check_hits_equal_general_path(kb, state, rng, metric)
    # Deleted documents dropped by a compaction: the merged segments' ids have gaps.
    for doc in sorted(set(docs))[1::3]:
        kb.delete_document(doc)
    kb.compact()
    state = kb._cell.state
    assert any(not s.contiguous for s in state.segments)
    _check_hits_equal_general_path(kb, state, rng, metric)


def _check_hits_equal_general_path(kb, state, rng, metric):
    from kbcore.engine import Hit
    from kbcore.engine.scores import score_from_distance

    for q in rng.standard_normal((5, DIM)).astype(np.float32):
        hits = kb.retrieve(q, 12)
        ids, dist = state.index.search(q, 12)
        assert [h.id for h in hits] == ids.tolist()
        for h, cid, d, meta in zip(hits, ids.tolist(), dist.tolist(), state.index.get_metadata(ids)):
            seg, row = state.locate(cid)
            meta = {k: v for k, v in meta.items() if not k.startswith("_")}
            want = Hit(
                cid,
                meta["document_id"],
                seg.text_of(row),
                meta,
                d,
                score_from_distance(d, metric),
                meta["pipeline_name"],
                meta["chunk_index"],
                (),
            )
            assert type(h) is Hit and h == want
