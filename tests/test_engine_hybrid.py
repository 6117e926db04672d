"""Knowledge-engine full-text and hybrid retrieval (issue 8): search types, fusion, filters,
dedup after fusion, consistency of the two legs under mutation, persistence and bad arguments.

The engine's answer is compared with the fusion written out here over the two native legs
(``Index.search`` / ``Index.search_text``, themselves checked against exact oracles in
test_index_search.py and test_bm25.py), and the full-text scores with a small BM25.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

import kbcore
from kbcore import Engine
from kbcore import engine as engine_mod
from kbcore.embedders import CallableEmbedder, HashingEmbedder
from kbcore.engine import storage
from kbcore.errors import InvalidArgumentError, InvalidTypeError

DIM = 16
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "apple",
    "banana",
    "cherry",
    "grape",
    "lemon",
    "mango",
]
SEARCHES = [("vector", "rrf"), ("full_text", "rrf"), ("hybrid", "zscore"), ("hybrid", "rrf"), ("hybrid", "linear")]


def _corpus(seed: int = 0, n_docs: int = 30):
    """Pre-embedded chunks: random vectors, texts of random words, 1-6 chunks per document."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 7, n_docs)
    doc = np.repeat(np.arange(n_docs), counts)
    n = len(doc)
    texts = [" ".join(rng.choice(WORDS, rng.integers(4, 16))) + f" row{i}" for i in range(n)]
    team = rng.choice(["infra", "web", "data"], n_docs)[doc]
    table = pa.table({"document_id": [f"d{d}" for d in doc], "text": texts, "team": team})
    vecs = rng.standard_normal((n, DIM)).astype(np.float32)
    return table, vecs


def _kb(tmp_path, name="kb", seed=0, **kw):
    table, vecs = _corpus(seed)
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base(name, embedder=False, index="flat", **kw)
    kb.ingest_table(table, vectors=vecs)
    return engine, kb


def _legs(kb, query, qvec, window, where=None):
    """The two native legs over ``window`` candidates, as (id, score) lists, best first."""
    index = kb.index
    ids, dist = index.search(qvec, min(window, len(index)), where=where)
    keep = ids >= 0
    vec = [(i, 1.0 - d / 2.0) for i, d in zip(ids[keep].tolist(), dist[keep].tolist())]
    tids, tsc = index.search_text(query, min(window, len(index)), where=where)
    return vec, list(zip(tids.tolist(), tsc.tolist()))


def _expected(
    kb, search_type, fusion, query, qvec, top_k, *, window=None, where=None, vector_weight=0.7, rrf_k=60, dedup=False
):
    """(chunk id, score) the engine must return, fused here from the native legs."""
    window = top_k if search_type == "vector" else window or max(4 * top_k, 50)
    vec, text = _legs(kb, query, qvec, window, where)
    if search_type == "vector":
        fused = vec
    elif search_type == "full_text":
        fused = [(i, s / text[0][1]) for i, s in text]
    elif fusion == "rrf":
        acc: dict[int, float] = {}
        best: dict[int, int] = {}
        for leg in (vec, text):
            for rank, (i, _) in enumerate(leg, start=1):
                acc[i] = acc.get(i, 0.0) + 1.0 / (rrf_k + rank)
                best[i] = min(best.get(i, rank), rank)
        top = 2.0 / (rrf_k + 1)
        fused = sorted(((i, s / top) for i, s in acc.items()), key=lambda t: (-t[1], best[t[0]], t[0]))
    elif fusion == "zscore":
        acc, best, legs = {}, {}, []
        zeros = max(len(vec) - len(text), 0)  # every match returned: the window's other chunks score 0
        for leg, pad in ((vec, 0), (text, zeros)):
            if not leg:
                continue
            s = np.array([x for _, x in leg] + [0.0] * pad)
            sd = s.std()
            z = (s - s.mean()) / sd if sd > 0 else np.zeros(len(s))
            missing = float(z[-1]) if pad else float(z.min())
            legs.append((dict(zip((i for i, _ in leg), z.tolist())), missing))
            for rank, (i, _) in enumerate(leg, start=1):
                best[i] = min(best.get(i, rank), rank)
        for i in best:
            acc[i] = sum(z.get(i, floor) for z, floor in legs) / len(legs)
        order = sorted(acc.items(), key=lambda t: (-t[1], best[t[0]], t[0]))
        fused = [(i, 0.5 * (1.0 + math.erf(m / math.sqrt(2.0)))) for i, m in order]
    else:
        acc, best = {}, {}
        for leg, w in ((vec, vector_weight), (text, 1.0 - vector_weight)):
            if not leg:
                continue
            lo, hi = min(s for _, s in leg), max(s for _, s in leg)
            for rank, (i, s) in enumerate(leg, start=1):
                norm = (s - lo) / (hi - lo) if hi > lo else 1.0
                acc[i] = acc.get(i, 0.0) + w * norm
                best[i] = min(best.get(i, rank), rank)
        fused = sorted(acc.items(), key=lambda t: (-t[1], best[t[0]], t[0]))
    if dedup:
        meta = kb.index.get_metadata([i for i, _ in fused]) if fused else []
        seen, out = set(), []
        for (i, s), m in zip(fused, meta):
            if m["document_id"] not in seen:
                seen.add(m["document_id"])
                out.append((i, s))
        fused = out
    return fused[:top_k]


def _check(hits, expected):
    assert [h.id for h in hits] == [i for i, _ in expected]
    for h, (_, s) in zip(hits, expected):
        assert h.score == pytest.approx(min(s, 1.0), abs=1e-6)


def _queries(seed, n=6):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield " ".join(rng.choice(WORDS, 3)), rng.standard_normal(DIM).astype(np.float32)


# -- each search type ------------------------------------------------------------------------


@pytest.mark.parametrize("search_type,fusion", SEARCHES)
def test_each_search_type_equals_the_fusion_of_the_native_legs(tmp_path, search_type, fusion):
    _, kb = _kb(tmp_path)
    for query, qvec in _queries(1):
        for top_k, window in ((10, None), (5, 8), (10, 4)):  # window < top_k: a short page is fine
            hits = kb.retrieve(query, top_k, search_type=search_type, fusion=fusion, query_vector=qvec, window=window)
            _check(hits, _expected(kb, search_type, fusion, query, qvec, top_k, window=window))
            assert all(0.0 <= h.score <= 1.0 for h in hits)
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            if search_type != "vector":
                assert all(h.distance == pytest.approx(1.0 - h.score) for h in hits)


def test_linear_weight_and_rrf_k_are_used(tmp_path):
    _, kb = _kb(tmp_path)
    for query, qvec in _queries(2, 3):
        for w in (0.0, 0.3, 1.0):
            hits = kb.retrieve(query, 10, search_type="hybrid", fusion="linear", vector_weight=w, query_vector=qvec)
            _check(hits, _expected(kb, "hybrid", "linear", query, qvec, 10, vector_weight=w))
        hits = kb.retrieve(query, 10, search_type="hybrid", fusion="rrf", rrf_k=0, query_vector=qvec)
        _check(hits, _expected(kb, "hybrid", "rrf", query, qvec, 10, rrf_k=0))


def _reference_bm25(texts: list[str], query: str, k1=1.2, b=0.75) -> list[float]:
    docs = [kbcore.tokenize(t) for t in texts]
    avgdl = sum(map(len, docs)) / len(docs)
    tfs = [Counter(d) for d in docs]
    df = Counter(t for c in tfs for t in c)
    out = [0.0] * len(docs)
    for term in dict.fromkeys(kbcore.tokenize(query, for_query=True)):
        if not df[term]:
            continue
        idf = math.log(1 + (len(docs) - df[term] + 0.5) / (df[term] + 0.5))
        for j, c in enumerate(tfs):
            f = c.get(term, 0)
            if f:
                out[j] += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * len(docs[j]) / avgdl))
    return out


def test_full_text_score_is_bm25_over_the_best_match(tmp_path):
    table, _ = _corpus(0)
    _, kb = _kb(tmp_path)
    texts = table.column("text").to_pylist()
    for query, _ in _queries(3):
        ref = _reference_bm25(texts, query)
        hits = kb.retrieve(query, 10, search_type="full_text")
        best = max(ref)
        assert hits and hits[0].score == 1.0
        for h in hits:
            assert h.score == pytest.approx(ref[h.id] / best, rel=1e-5)
        kth = hits[-1].score * best
        assert sum(s > kth + 1e-4 for s in ref) < len(hits)  # nothing better was left out


def _digit_blind_engine(path):
    """An engine whose embedder cannot see tokens with digits (like many real models with codes)."""
    hashing = HashingEmbedder(dim=256)
    emb = CallableEmbedder(
        lambda texts: hashing.embed([re.sub(r"\S*\d\S*", " ", t) for t in texts]), dim=256, name="digit-blind"
    )
    return Engine(path, embedder=emb)


EXACT_TERM_DOCS = {
    "errors": "Common errors when deploying: a timeout error, a permission error, a quota error.",
    "error-handling": "Error handling guide: log the error, retry the request, then report the error.",
    "ticket": "Ticket notes: the customer saw E4012 right after the firmware upgrade of the router.",
    "lunch": "Lunch is served at noon in the cafeteria on the second floor.",
    "keys": "Signing keys rotate every ninety days; the security team owns the rotation.",
    "vpn": "Connect to the VPN before opening the internal dashboard.",
    "backup": "Backups run nightly and are kept for thirty days.",
}


def test_an_error_code_the_embedder_misses_is_found_by_full_text_and_hybrid(tmp_path):
    engine = _digit_blind_engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="flat")
    for doc_id, text in EXACT_TERM_DOCS.items():
        kb.ingest(text=text, document_id=doc_id)

    def top3(search_type, fusion="rrf"):
        return [h.document_id for h in kb.retrieve("error E4012", 3, search_type=search_type, fusion=fusion)]

    assert "ticket" not in top3("vector")
    assert "ticket" in top3("full_text")
    assert "ticket" in top3("hybrid")
    # (linear fusion is no help here: min-max puts the weakest text match, the ticket, at 0)
    only = kb.retrieve("E4012", 5, search_type="full_text")
    assert [h.document_id for h in only] == ["ticket"] and only[0].score == 1.0
    assert kb.retrieve("E4012", 1, search_type="hybrid")[0].document_id == "ticket"


def test_japanese_query_finds_japanese_document_by_full_text(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="flat")
    kb.ingest(text="東京タワーは東京都港区にある電波塔です。", document_id="tower")
    kb.ingest(text="大阪城は大阪市中央区にある城です。", document_id="castle")
    kb.ingest(text="Signing keys rotate every ninety days.", document_id="keys")
    for st, fusion in (("full_text", None), ("hybrid", "rrf")):
        assert kb.retrieve("東京タワー", 1, search_type=st, fusion=fusion)[0].document_id == "tower"
        assert kb.retrieve("大阪城", 1, search_type=st, fusion=fusion)[0].document_id == "castle"
    # Z-score fusion estimates each leg's spread from its candidates: three are too few to tell
    # the hashing embedder's noise on Japanese from a match (docs/hybrid.md); a few dozen are not.
    rng = np.random.default_rng(0)
    for i in range(40):
        kb.ingest(text=" ".join(rng.choice(WORDS, 8)), document_id=f"filler{i}")
    for fusion in ("zscore", "rrf"):
        assert kb.retrieve("東京タワー", 1, search_type="hybrid", fusion=fusion)[0].document_id == "tower"
        assert kb.retrieve("大阪城", 1, search_type="hybrid", fusion=fusion)[0].document_id == "castle"


# -- filters and dedup -----------------------------------------------------------------------


@pytest.mark.parametrize("search_type,fusion", SEARCHES)
def test_filters_apply_to_both_legs(tmp_path, search_type, fusion):
    _, kb = _kb(tmp_path)
    for filters in ({"team": "infra"}, {"team": {"$in": ["web", "data"]}, "chunk_index": {"$lte": 1}}):
        for query, qvec in _queries(4, 3):
            hits = kb.retrieve(query, 10, search_type=search_type, fusion=fusion, query_vector=qvec, filters=filters)
            _check(hits, _expected(kb, search_type, fusion, query, qvec, 10, where=filters))
            assert hits
            for h in hits:
                assert (
                    kb.index.count({"$and": [filters, {"document_id": h.document_id}, {"chunk_index": h.chunk_index}]})
                    == 1
                )


@pytest.mark.parametrize("search_type,fusion", SEARCHES)
def test_dedup_after_fusion_gives_one_hit_per_document(tmp_path, search_type, fusion):
    _, kb = _kb(tmp_path)
    for query, qvec in _queries(5, 4):
        for filters in (None, {"team": "web"}):
            hits = kb.retrieve(
                query, 8, search_type=search_type, fusion=fusion, query_vector=qvec, deduplicate=True, filters=filters
            )
            docs = [h.document_id for h in hits]
            assert len(docs) == len(set(docs))
            if search_type == "vector":
                continue  # the native grouped search; checked in test_engine_retrieve.py
            _check(hits, _expected(kb, search_type, fusion, query, qvec, 8, where=filters, dedup=True))
            for h in hits:
                assert h.part_ids and h.part_ids[0] == h.chunk_index
                assert len(set(h.part_ids)) == len(h.part_ids)


@pytest.mark.parametrize("fusion", ["zscore", "rrf", "linear"])
def test_score_threshold_keeps_the_fused_hits_at_or_above_it(tmp_path, fusion):
    _, kb = _kb(tmp_path)
    for query, qvec in _queries(6, 3):
        for dedup in (False, True):
            every = kb.retrieve(query, 40, search_type="hybrid", fusion=fusion, query_vector=qvec, deduplicate=dedup)
            scores = sorted({h.score for h in every})
            for thr in (scores[0], scores[len(scores) // 2], scores[-1], 0.5, 1.01):
                kept = kb.retrieve(
                    query,
                    40,
                    search_type="hybrid",
                    fusion=fusion,
                    query_vector=qvec,
                    deduplicate=dedup,
                    score_threshold=thr,
                )
                assert [h.id for h in kept] == [h.id for h in every if h.score >= thr]


def test_dedup_widens_the_window_until_top_k_documents(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, index="flat")
    rng = np.random.default_rng(0)
    n_docs, per_doc = 12, 30  # 360 chunks all matching "alpha": a 50-chunk window holds few documents
    doc = np.repeat(np.arange(n_docs), per_doc)
    texts = ["alpha " * int(1 + d) + f"row{i}" for i, d in enumerate(doc)]  # doc 11 scores best
    table = pa.table({"document_id": [f"d{d}" for d in doc], "text": texts})
    kb.ingest_table(table, vectors=rng.standard_normal((len(doc), DIM)).astype(np.float32))
    hits = kb.retrieve("alpha", 10, search_type="full_text", deduplicate=True)
    assert [h.document_id for h in hits] == [f"d{d}" for d in range(11, 1, -1)]
    q = rng.standard_normal(DIM).astype(np.float32)
    hybrid = kb.retrieve("alpha", 10, search_type="hybrid", deduplicate=True, query_vector=q)
    assert len({h.document_id for h in hybrid}) == 10


def test_pipelines_and_retrieve_key_text_take_search_options(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="flat", chunk_size=80, chunk_overlap=0)
    kb.create_pipeline("small", chunk_size=40, chunk_overlap=0)
    text = "Signing keys rotate every ninety days. The rotation is owned by security."
    kb.ingest(text=text, document_id="keys")
    kb.ingest(text=text, document_id="keys", pipeline="small")
    kb.ingest(text="Lunch is at noon in the cafeteria.", document_id="lunch")
    hits = kb.retrieve("rotation", 5, search_type="full_text", deduplicate=True)
    assert sorted(h.pipeline_name for h in hits) == ["default", "small"]
    only = kb.retrieve("rotation", 5, search_type="hybrid", pipelines=["small"])
    assert only and all(h.pipeline_name == "small" for h in only)
    keys = kb.retrieve_key("rotation", 2, deduplicate=True, search_type="full_text")
    assert [k.key for k in keys] == ["keys", "keys"] and keys[0].score == 1.0
    texts = kb.retrieve_text("noon cafeteria", 1, search_type="hybrid", fusion="linear")
    assert texts[0].key == "lunch" and texts[0].value.startswith("Lunch")


# -- mutation and persistence ----------------------------------------------------------------


def _text_rows(kb) -> int:
    return kb.index.text_documents()


def test_delete_reingest_and_compaction_keep_both_legs_consistent(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_mod.manifest, "CKPT_MIN_ROWS", 8)  # checkpoints on the way, too
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="hnsw", chunk_size=60, chunk_overlap=0)
    for i in range(6):
        kb.ingest(text=f"Document {i} talks about zebra{i} and the common topic. " * 3, document_id=f"d{i}")
    assert _text_rows(kb) == len(kb)
    kb.delete_document("d2")
    assert _text_rows(kb) == len(kb)
    for st in ("full_text", "hybrid"):
        assert all(h.document_id != "d2" for h in kb.retrieve("zebra2 common", 20, search_type=st))
    kb.ingest(text="Replaced: now about okapi only.", document_id="d3")
    assert _text_rows(kb) == len(kb)
    assert kb.retrieve("zebra3", 5, search_type="full_text") == []
    assert [h.document_id for h in kb.retrieve("okapi", 5, search_type="full_text")] == ["d3"]
    kb.compact()
    assert _text_rows(kb) == len(kb)
    engine.close()
    kb = Engine(tmp_path).get_knowledge_base("kb")
    assert _text_rows(kb) == len(kb)
    assert [h.document_id for h in kb.retrieve("okapi", 5, search_type="full_text")] == ["d3"]
    assert kb.retrieve("zebra3 zebra2", 5, search_type="full_text") == []


@pytest.mark.parametrize("close_first", [True, False])
def test_persistence_round_trip_gives_the_same_answers(tmp_path, close_first):
    engine, kb = _kb(tmp_path, search_type="hybrid", fusion="linear", vector_weight=0.4)
    before = {}
    for st, fu in SEARCHES:
        for query, qvec in _queries(6, 3):
            before[(st, fu, query)] = [
                (h.id, h.score)
                for h in kb.retrieve(query, 10, search_type=st, fusion=fu, query_vector=qvec, deduplicate=True)
            ]
    if close_first:
        engine.close()  # checkpoint: the text leg comes back from the index file
    # else: another process opens it: the chunks are replayed from the segments with their text
    kb2 = Engine(tmp_path).get_knowledge_base("kb")
    assert _text_rows(kb2) == len(kb2)
    assert kb2.search_defaults == {"search_type": "hybrid", "fusion": "linear", "vector_weight": 0.4}
    for st, fu in SEARCHES:
        for query, qvec in _queries(6, 3):
            got = [
                (h.id, h.score)
                for h in kb2.retrieve(query, 10, search_type=st, fusion=fu, query_vector=qvec, deduplicate=True)
            ]
            want = before[(st, fu, query)]
            assert [i for i, _ in got] == [i for i, _ in want]
            assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)


def test_a_knowledge_base_written_without_text_leg_is_rebuilt_on_open(tmp_path, monkeypatch):
    original_add = engine_mod.Index.add

    def add_without_text(self, *args, texts=None, **kw):  # what the engine did before issue 8
        return original_add(self, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(engine_mod.Index, "add", add_without_text)
        engine, kb = _kb(tmp_path)
        engine.close()
    assert engine_mod.Index.add is original_add
    manifest = storage.load_manifest(str(tmp_path / "kb"))
    old_index = engine_mod.Index.load(tmp_path / "kb" / manifest["index"]["path"])
    assert len(old_index) > 0 and old_index.text_documents() == 0
    table, _ = _corpus(0)
    texts = table.column("text").to_pylist()
    kb = Engine(tmp_path).get_knowledge_base("kb")
    assert _text_rows(kb) == len(kb) == len(texts) and kb.stats().text_leg_unsaved
    query = "alpha omega"
    ref = _reference_bm25(texts, query)
    hits = kb.retrieve(query, 5, search_type="full_text")
    assert [h.id for h in hits] == sorted(range(len(ref)), key=lambda j: -ref[j])[:5]
    kb.close()  # checkpoints the rebuilt index
    monkeypatch.setattr(engine_mod.state, "_rebuild_text_leg", lambda *a: pytest.fail("the text leg was rebuilt twice"))
    kb = Engine(tmp_path).get_knowledge_base("kb")
    assert _text_rows(kb) == len(kb) and not kb.stats().text_leg_unsaved
    assert [h.id for h in kb.retrieve(query, 5, search_type="full_text")] == [h.id for h in hits]


# -- defaults and arguments ------------------------------------------------------------------


def test_knowledge_base_search_defaults(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="flat", search_type="full_text")
    kb.ingest(text="Signing keys rotate every ninety days.", document_id="keys")
    kb.ingest(text="Lunch is at noon.", document_id="lunch")
    assert kb.search_defaults == {"search_type": "full_text", "fusion": "zscore", "vector_weight": 0.7}
    assert kb.info()["search_type"] == "full_text"
    assert [h.document_id for h in kb.retrieve("rotate")] == ["keys"]  # full text: one match
    assert len(kb.retrieve("rotate", search_type="vector")) == 2
    vec = HashingEmbedder().embed(["rotate"])[0]
    assert len(kb.retrieve(vec)) == 2  # a vector query under a default text search: vector search
    kb.set_search_defaults(search_type="hybrid", vector_weight=0.2)
    engine.close()
    kb = Engine(tmp_path)["kb"]
    assert kb.search_defaults == {"search_type": "hybrid", "fusion": "zscore", "vector_weight": 0.2}
    assert len(kb.retrieve("rotate")) == 2
    assert kb.retrieve("rotate")[0].score == kb.retrieve("rotate", search_type="hybrid")[0].score


def test_manifest_records_zscore_and_older_knowledge_bases_keep_their_fusion(tmp_path):
    engine, kb = _kb(tmp_path, "new")
    query, qvec = next(_queries(9, 1))
    m = storage.load_manifest(kb.path)
    assert m["config"]["fusion"] == "zscore" and storage.validate_manifest(m) is m
    _, old = _kb(tmp_path, "old", fusion="rrf")
    _, older = _kb(tmp_path, "older")
    m = storage.load_manifest(older.path)
    del m["config"]["fusion"]  # written before the search defaults existed
    storage.save_manifest(older.path, m)
    engine.close()
    engine = Engine(tmp_path)
    for name, fusion in (("new", "zscore"), ("old", "rrf"), ("older", "rrf")):
        kb = engine.get_knowledge_base(name)
        assert kb.search_defaults["fusion"] == fusion
        hits = kb.retrieve(query, 10, search_type="hybrid", query_vector=qvec)
        _check(hits, _expected(kb, "hybrid", fusion, query, qvec, 10))


def test_bad_search_arguments_raise(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="flat")
    kb.ingest(text="something to find", document_id="a")
    vec = np.ones(kb.dim, np.float32)
    for kw in (
        {"search_type": "bm25"},
        {"fusion": "max"},
        {"vector_weight": 1.5},
        {"vector_weight": -0.1},
        {"vector_weight": float("nan")},
        {"rrf_k": -1},
        {"rrf_k": float("inf")},
        {"window": 0},
        {"search_type": "hybrid", "ef": 0},
    ):
        with pytest.raises(ValueError):
            kb.retrieve("find", 3, **kw)
    for st in ("full_text", "hybrid"):
        with pytest.raises(ValueError, match="query as a string"):
            kb.retrieve(vec, 3, search_type=st)
        with pytest.raises(ValueError, match="empty"):
            kb.retrieve("   ", 3, search_type=st)
    with pytest.raises(ValueError, match="query_vector"):
        kb.retrieve(vec, 3, query_vector=vec)
    with pytest.raises(InvalidTypeError):
        kb.retrieve("find", 3, vector_weight="high")
    with pytest.raises(InvalidTypeError):
        kb.retrieve(b"find", 3, search_type="full_text")
    for kw in ({"search_type": "semantic"}, {"fusion": "sum"}, {"vector_weight": 2}):
        with pytest.raises(ValueError):
            engine.create_knowledge_base("bad", **kw)
    with pytest.raises(ValueError):
        kb.set_search_defaults(search_type="keyword")
    bare = engine.create_knowledge_base("bare", embedder=False, index="flat")
    bare.ingest_table(pa.table({"document_id": ["x"], "text": ["find me"]}), vectors=np.ones((1, 4), np.float32))
    assert [h.document_id for h in bare.retrieve("find", 3, search_type="full_text")] == ["x"]
    with pytest.raises(InvalidArgumentError, match="query_vector"):
        bare.retrieve("find", 3, search_type="hybrid")
    assert bare.retrieve("find", 3, search_type="hybrid", fusion="rrf", query_vector=np.ones(4))[0].score == 1.0
    # z-score fusion: a lone candidate stands at its legs' mean
    assert bare.retrieve("find", 3, search_type="hybrid", query_vector=np.ones(4))[0].score == 0.5
    empty = engine.create_knowledge_base("empty")
    for st in ("vector", "full_text", "hybrid"):
        assert empty.retrieve("anything", search_type=st) == []
        assert empty.retrieve("anything", search_type=st, deduplicate=True) == []


def test_cli_query_takes_search_type_fusion_and_vector_weight(tmp_path, capsys):
    import json

    from kbcore.cli import main

    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("team", index="flat")
    for doc_id, text in EXACT_TERM_DOCS.items():
        kb.ingest(text=text, document_id=doc_id)
    engine.close()
    base = ["query", "E4012", "--kb", "team", "--data", str(tmp_path), "--json", "--top-k", "3"]
    assert main([*base, "--search-type", "full_text"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["document_id"] for h in hits] == ["ticket"] and hits[0]["score"] == 1.0
    assert main([*base, "--search-type", "hybrid", "--fusion", "linear", "--vector-weight", "0.2"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["document_id"] == "ticket"
    assert main([*base, "--search-type", "hybrid", "--vector-weight", "3"]) == 1
    assert "vector_weight" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--search-type", "bm25"])
