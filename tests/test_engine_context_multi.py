"""``retrieve(context_window=N)`` and ``Engine.retrieve`` over several knowledge bases,
against oracles built from the stored chunks and from each knowledge base's own retrieve."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from chunk_tables import chunk_table

from kbcore import Engine
from kbcore.errors import InvalidArgumentError, InvalidTypeError, NotFoundError

DIM = 8


def _table(n_docs: int, per_doc: int, seed: int) -> tuple[pa.Table, np.ndarray]:
    return chunk_table(n_docs, per_doc, seed, DIM)


@pytest.fixture
def kb(tmp_path):
    engine = Engine(tmp_path / "data")
    kb = engine.create_knowledge_base("kb", embedder=False, index="flat")
    table, vecs = _table(6, 7, seed=1)
    kb.ingest_table(table, vectors=vecs)
    yield kb, vecs
    engine.close()


def test_context_window_adds_neighbours_of_the_same_document_in_order(kb):
    kb, vecs = kb
    rng = np.random.default_rng(2)
    for _ in range(20):
        q = rng.standard_normal(DIM).astype(np.float32)
        plain = kb.retrieve(q, 1)
        n = int(rng.integers(1, 4))
        got = kb.retrieve(q, 1, context_window=n)
        h, g = plain[0], got[0]
        assert (g.id, g.score, g.document_id) == (h.id, h.score, h.document_id)
        d = h.document_id[1:]
        want = [i for i in range(7) if abs(i - h.chunk_index) <= n]
        assert g.metadata["context_chunks"] == want
        assert g.content == "\n".join(f"doc {d} chunk {i}" for i in want)


def test_context_window_never_repeats_a_chunk_across_hits(kb):
    kb, vecs = kb
    rng = np.random.default_rng(3)
    for _ in range(20):
        q = rng.standard_normal(DIM).astype(np.float32)
        hits = kb.retrieve(q, 8, context_window=2)
        own = {(h.document_id, h.chunk_index) for h in hits}
        seen: set[tuple[str, int]] = set()
        for h in hits:
            shown = [(h.document_id, i) for i in h.metadata["context_chunks"]]
            assert (h.document_id, h.chunk_index) in shown
            # a neighbour that is itself another hit stays with that hit
            assert not [s for s in shown if s in own and s != (h.document_id, h.chunk_index)]
            assert not seen & set(shown)
            seen |= set(shown)
            assert shown == sorted(shown)


def test_context_window_zero_changes_nothing_and_bad_values_raise(kb):
    kb, vecs = kb
    q = vecs[5]
    assert kb.retrieve(q, 3, context_window=0) == kb.retrieve(q, 3)
    with pytest.raises(InvalidArgumentError, match="context_window"):
        kb.retrieve(q, 3, context_window=-1)
    with pytest.raises(InvalidTypeError, match="context_window"):
        kb.retrieve(q, 3, context_window=1.5)


def test_context_window_on_hybrid_text_search(tmp_path):
    engine = Engine(tmp_path / "d")
    kb = engine.create_knowledge_base("t", chunk_size=40, chunk_overlap=0)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    kb.ingest(text="\n\n".join(f"{w} is the word of paragraph {i}." for i, w in enumerate(words)), document_id="x")
    hit = kb.retrieve("delta", 1, search_type="full_text", context_window=1)[0]
    assert hit.metadata["context_chunks"] == [hit.chunk_index - 1, hit.chunk_index, hit.chunk_index + 1]
    assert "charlie" in hit.content and "delta" in hit.content and "echo" in hit.content
    engine.close()


# -- several knowledge bases -------------------------------------------------------------------


def _three(tmp_path, metrics=("cosine", "cosine", "cosine")):
    engine = Engine(tmp_path / "multi")
    for i, m in enumerate(metrics):
        kb = engine.create_knowledge_base(f"k{i}", embedder=False, index="flat", metric=m)
        table, vecs = _table(5, 4, seed=10 + i)
        kb.ingest_table(table, vectors=vecs)
    return engine


def test_multi_kb_merges_by_score_when_the_scales_match(tmp_path):
    engine = _three(tmp_path)
    rng = np.random.default_rng(4)
    names = ["k0", "k1", "k2"]
    for _ in range(10):
        q = rng.standard_normal(DIM).astype(np.float32)
        got = engine.retrieve(names, q, top_k=6, filters={"team": "a"})
        union = [(h.score, n, h.id) for n in names for h in engine[n].retrieve(q, 6, filters={"team": "a"})]
        union.sort(key=lambda t: -t[0])
        assert [(h.score, h.metadata["knowledge_base"], h.id) for h in got] == union[:6]
        assert {h.metadata["merged_by"] for h in got} == {"score"}
        assert all(h.metadata["team"] == "a" for h in got)
    engine.close()


def test_multi_kb_merges_by_rank_when_metrics_differ(tmp_path):
    engine = _three(tmp_path, ("cosine", "l2", "ip"))
    q = np.random.default_rng(5).standard_normal(DIM).astype(np.float32)
    names = ["k0", "k1", "k2"]
    got = engine.retrieve(names, q, top_k=7)
    lists = {n: engine[n].retrieve(q, 7) for n in names}
    # rank 1 of every knowledge base first (ties by score), then rank 2, ...
    want = []
    for r in range(7):
        row = [(lists[n][r], n) for n in names if r < len(lists[n])]
        row.sort(key=lambda t: -t[0].score)
        want += [(n, h.id) for h, n in row]
    assert [(h.metadata["knowledge_base"], h.id) for h in got] == want[:7]
    assert {h.metadata["merged_by"] for h in got} == {"rank"}
    engine.close()


def test_multi_kb_dedups_per_knowledge_base_and_document(tmp_path):
    engine = _three(tmp_path)
    q = np.random.default_rng(6).standard_normal(DIM).astype(np.float32)
    got = engine.retrieve(["k0", "k1", "k2"], q, top_k=12, deduplicate=True)
    keys = [(h.metadata["knowledge_base"], h.document_id) for h in got]
    assert len(keys) == len(set(keys)) == 12
    assert len({h.document_id for h in got}) < 12  # the same ids exist in each knowledge base
    engine.close()


def test_multi_kb_embeds_once_per_embedder_and_runs_hybrid(tmp_path):
    calls = []

    class Counting:
        dim = 16

        def embed(self, texts):
            calls.append(list(texts))
            out = np.zeros((len(texts), 16), np.float32)
            for r, t in enumerate(texts):
                for w in t.split():
                    out[r, hash(w) % 16] += 1.0
            return out + 1e-3

    engine = Engine(tmp_path / "e", embedder=Counting())
    for name in ("x", "y", "z"):
        kb = engine.create_knowledge_base(name, search_type="hybrid")
        kb.ingest(text=f"the {name} report about rockets and engines", document_id=f"doc-{name}")
    calls.clear()
    got = engine.retrieve(["x", "y", "z"], "rockets", top_k=3)
    assert calls == [["rockets"]]
    assert sorted(h.metadata["knowledge_base"] for h in got) == ["x", "y", "z"]
    engine.close()


def test_multi_kb_bad_names(tmp_path):
    engine = _three(tmp_path)
    q = np.zeros(DIM, np.float32) + 1
    with pytest.raises(NotFoundError, match="nope"):
        engine.retrieve(["k0", "nope"], q)
    with pytest.raises(InvalidArgumentError, match="twice"):
        engine.retrieve(["k0", "k0"], q)
    with pytest.raises(InvalidArgumentError, match="empty"):
        engine.retrieve([], q)
    with pytest.raises(InvalidTypeError):
        engine.retrieve([1], q)
    assert [h.id for h in engine.retrieve("k1", q, 3)] == [h.id for h in engine["k1"].retrieve(q, 3)]
    engine.close()


def test_multi_kb_threads_give_the_sequential_answer(tmp_path, monkeypatch):
    from kbcore.engine import multi

    engine = _three(tmp_path, ("cosine", "l2", "cosine"))
    rng = np.random.default_rng(7)
    queries = [rng.standard_normal(DIM).astype(np.float32) for _ in range(10)]
    names = ["k0", "k1", "k2"]
    sequential = [engine.retrieve(names, q, top_k=5) for q in queries]
    monkeypatch.setattr(multi, "PARALLEL_MIN_CHUNKS", 0)
    threaded = [engine.retrieve(names, q, top_k=5) for q in queries]
    assert threaded == sequential and all(len(hits) == 5 for hits in threaded)
    with pytest.raises(NotFoundError):  # an error in a thread reaches the caller
        engine.retrieve(names, queries[0], top_k=5, pipelines=["nope"])
    engine.close()


def test_multi_kb_reranks_once_over_the_merged_list(tmp_path):
    engine = Engine(tmp_path / "r")
    for name in ("x", "y", "z"):
        kb = engine.create_knowledge_base(name, index="flat")
        for i in range(6):
            kb.ingest(text=f"{name} note {i} about rockets and engines, page {i}", document_id=f"{name}{i}")
    calls = []

    def by_length(query, texts):  # a reranker that prefers longer texts, then later ones
        calls.append(len(texts))
        return [len(t) + i * 1e-3 for i, t in enumerate(texts)]

    got = engine.retrieve(["x", "y", "z"], "rockets", top_k=4, rerank=by_length, rerank_depth=5)
    assert calls == [5]  # once, over the merged first stage of rerank_depth candidates
    first = engine.retrieve(["x", "y", "z"], "rockets", top_k=5, rerank=False)
    scores = by_length("rockets", [h.content for h in first])
    want = [first[i] for i in sorted(range(5), key=lambda i: -scores[i])[:4]]
    assert [(h.metadata["knowledge_base"], h.id) for h in got] == [(h.metadata["knowledge_base"], h.id) for h in want]
    assert all(0.0 <= h.score <= 1.0 for h in got)
    with pytest.raises(InvalidArgumentError, match="text"):
        engine.retrieve(["x", "y"], np.zeros(384, np.float32), rerank=by_length)
    engine.close()


def _merged_oracle(engine, names, query, top_k, by_score, **kw):
    """Each knowledge base's own retrieve, merged by the documented rule (score, or reciprocal
    rank with ties on score), as (knowledge base, every field of the hit)."""
    rows = []
    for i, n in enumerate(names):
        for r, h in enumerate(engine[n].retrieve(query, top_k, **kw)):
            primary = h.score if by_score else 1.0 / (60 + r + 1)
            rows.append((-primary, -h.score, i, r, n, h))
    rows.sort(key=lambda t: t[:4])
    return [
        (n, h.id, h.document_id, h.content, h.metadata, h.distance, h.score, h.part_ids) for *_, n, h in rows[:top_k]
    ]


@pytest.mark.parametrize("metrics", [("cosine", "cosine", "cosine"), ("cosine", "l2", "ip")])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"deduplicate": True},
        {"filters": {"team": "b"}, "score_threshold": 0.4},
        {"search_type": "hybrid", "deduplicate": True},
        {"search_type": "full_text"},
    ],
)
def test_multi_kb_hits_are_each_knowledge_bases_own_hits_merged(tmp_path, metrics, kw):
    engine = _three(tmp_path, metrics)
    names = ["k0", "k1", "k2"]
    rng = np.random.default_rng(11)
    for j in range(8):
        vec = rng.standard_normal(DIM).astype(np.float32)
        if kw.get("search_type") in ("hybrid", "full_text"):
            query, extra = (
                f"doc {j % 5} chunk {j % 4}",
                ({"query_vector": vec} if kw["search_type"] == "hybrid" else {}),
            )
        else:
            query, extra = vec, {}
        got = engine.retrieve(names, query, 7, **kw, **extra)
        by_score = len(set(metrics)) == 1
        want = _merged_oracle(engine, names, query, 7, by_score, **kw, **extra)
        rows = []
        for h in got:
            meta = dict(h.metadata)
            assert (meta.pop("knowledge_base"), meta.pop("merged_by")) == (
                h.metadata["knowledge_base"],
                "score" if by_score else "rank",
            )
            rows.append(
                (h.metadata["knowledge_base"], h.id, h.document_id, h.content, meta, h.distance, h.score, h.part_ids)
            )
        assert rows == want
        assert len(got) == len(want) > 0
    engine.close()


def test_multi_kb_searches_again_when_a_knowledge_base_changes_before_its_hits_are_built(tmp_path, monkeypatch):
    from kbcore.engine import KnowledgeBase

    engine = _three(tmp_path)
    names = ["k0", "k1", "k2"]
    q = np.random.default_rng(12).standard_normal(DIM).astype(np.float32)
    # A hybrid first stage: its hits are built after the read lock is released (the vector
    # searches build theirs under the locks of the search, where no write can come between).
    kw = {"search_type": "hybrid", "query_vector": q}
    first = engine.retrieve(names, "doc 1 chunk 2", 4, **kw)
    victim = first[0].metadata["knowledge_base"], first[0].document_id
    original = KnowledgeBase._hits_of
    calls = []

    def deleting(self, short, cands):
        if not calls:
            engine[victim[0]].delete_document(victim[1])  # a write between the search and the hits
        calls.append(self.name)
        return original(self, short, cands)

    monkeypatch.setattr(KnowledgeBase, "_hits_of", deleting)
    got = engine.retrieve(names, "doc 1 chunk 2", 4, **kw)
    monkeypatch.setattr(KnowledgeBase, "_hits_of", original)
    assert calls  # the merge of candidates ran, met the change and searched again
    assert (victim[0], victim[1]) not in {(h.metadata["knowledge_base"], h.document_id) for h in got}
    assert [(h.id, h.score) for h in got] == [(h.id, h.score) for h in engine.retrieve(names, "doc 1 chunk 2", 4, **kw)]
    engine.close()


@pytest.mark.parametrize("metrics", [("cosine", "cosine", "cosine"), ("cosine", "l2", "ip")])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"score_threshold": 0.55},
        # 2 passing rows per knowledge base, 6 in all: fewer than top_k (padded native answers)
        {"filters": {"$and": [{"chunk_index": 0}, {"document_id": {"$in": ["d0", "d1"]}}]}},
        {"deduplicate": True},
        {"deduplicate": True, "score_threshold": 0.5},
    ],
)
def test_multi_kb_merged_vector_hits_equal_the_merge_of_whole_hit_lists(tmp_path, monkeypatch, metrics, kw):
    """The vector fast path (one native search, the merge on scores, hits built for the kept
    candidates only: ``retrieval.merged_hits``) against the general path (every knowledge
    base's whole hit list, merged) and the oracle of each knowledge base's own retrieve, on
    HNSW indexes holding the same rows (so scores tie exactly across knowledge bases) and one
    empty knowledge base."""
    from kbcore.engine import multi

    engine = Engine(tmp_path / "hnsw")
    table, vecs = _table(6, 5, seed=21)
    names = []
    for i, m in enumerate(metrics):
        kb = engine.create_knowledge_base(f"h{i}", embedder=False, metric=m)
        kb.ingest_table(table, vectors=vecs)
        names.append(kb.name)
    engine.create_knowledge_base("empty", embedder=False)
    names.insert(1, "empty")
    fast_calls = []
    fast = multi.merged_hits

    def counting(*a):
        fast_calls.append(1)
        return fast(*a)

    def rows(hits):
        return [
            (h.metadata["knowledge_base"], h.id, h.content, h.metadata, h.distance, h.score, h.part_ids) for h in hits
        ]

    rng = np.random.default_rng(22)
    for _ in range(6):
        q = rng.standard_normal(DIM).astype(np.float32)
        monkeypatch.setattr(multi, "merged_hits", counting)
        got = engine.retrieve(names, q, 8, **kw)
        monkeypatch.setattr(multi, "_merge_shortlists", lambda *a: None)
        whole = engine.retrieve(names, q, 8, **kw)
        monkeypatch.undo()
        assert fast_calls  # the fast path ran (and did not fall back)
        fast_calls.clear()
        assert rows(got) == rows(whole)
        want = _merged_oracle(engine, names, q, 8, len(set(metrics)) == 1, **kw)
        assert [(n, i, c, {**m}, d, s, p) for n, i, _, c, m, d, s, p in want] == [
            (n, i, c, {k: v for k, v in m.items() if k not in ("knowledge_base", "merged_by")}, d, s, p)
            for n, i, c, m, d, s, p in rows(got)
        ]
        assert len(got) > 0
    engine.close()
