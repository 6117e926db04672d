"""The fast paths of full-text and hybrid search against straightforward references.

BM25's top k is found with dynamic pruning (``Bm25Index::search_pruned``) and the hybrid RRF
fusion runs natively (``kbcore.index.fuse_rrf``). Both must give exactly what the plain
computation gives: every hit, every score (bit for bit) and the order. The references here
score every row in float32 as the native formula does (Okapi BM25 with Lucene's idf, the
terms of a row added in the index's term order), and fuse by the RRF formula in Python.
"""

from __future__ import annotations

import math
import re
import threading

import numpy as np
import pytest

from kbcore import Engine, Index
from kbcore.errors import InvalidArgumentError, InvalidTypeError
from kbcore.fusion import normalize_rrf, rrf
from kbcore.index import fuse_rrf, set_search_threads

K1 = np.float32(1.2)
B = np.float32(0.75)
DIM = 8


def _vocabulary(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        w = "".join(rng.choice(letters, int(rng.integers(2, 9))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _zipf_texts(rng: np.random.Generator, words: list[str], n: int) -> list[str]:
    """Texts whose word frequencies follow Zipf's law (a few very common words, a long tail
    of rare ones: what makes pruning skip most postings), of very different lengths."""
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    out = []
    for _ in range(n):
        length = int(rng.choice([1, 3, 8, 20, 60, 150]))
        out.append(" ".join(words[j] for j in rng.choice(len(words), length, p=p)))
    return out


def _queries(rng: np.random.Generator, words: list[str], texts: list[str], n: int) -> list[str]:
    qs = []
    for i in range(n):
        m = [1, 2, 3, 5, 8, 12, 20, 30][i % 8]
        common = [words[j] for j in rng.integers(0, 15, m // 2)]
        rare = [words[j] for j in rng.integers(15, len(words), m - m // 2)]
        qs.append(" ".join(common + rare + ["nosuchword"] * (i % 3 == 0)))
    qs.append(" ".join(words[:80]))  # more distinct terms than the pruned path takes
    qs.append(texts[0])
    return qs


class Bm25Reference:
    """Exhaustive BM25 in float32, as bm25_index.cpp computes it, over rows added in order."""

    def __init__(self) -> None:
        self.order: dict[str, int] = {}  # term -> its place in the index's term order
        self.rows: dict[int, tuple[dict[str, int], int]] = {}  # id -> (tf per term, length)

    def add(self, ids: list[int], texts: list[str]) -> None:
        # The index numbers new terms by first appearance: by row, then by bytes within a row.
        for i, text in zip(ids, texts):
            tokens = re.findall(r"[a-z0-9]+", text.lower())
            tf: dict[str, int] = {}
            for t in tokens:
                tf[t] = tf.get(t, 0) + 1
            for t in sorted(tf, key=lambda s: s.encode()):
                self.order.setdefault(t, len(self.order))
            self.rows[i] = (tf, len(tokens))

    def scores(self, query: str, allowed: set[int] | None = None) -> dict[int, np.float32]:
        n = len(self.rows)
        total = sum(length for _, length in self.rows.values())
        avgdl = np.float32(total / n)
        terms = sorted({t for t in re.findall(r"[a-z0-9]+", query.lower()) if t in self.order}, key=self.order.get)
        df = {t: sum(1 for tf, _ in self.rows.values() if t in tf) for t in terms}
        idf = {t: np.float32(math.log(1.0 + (n - df[t] + 0.5) / (df[t] + 0.5))) for t in terms if df[t]}
        out = {}
        for i, (tf, length) in self.rows.items():
            if allowed is not None and i not in allowed:
                continue
            norm = K1 * ((np.float32(1.0) - B) + (B * np.float32(length)) / avgdl)
            acc = np.float32(0.0)
            hit = False
            for t in terms:
                if t in tf and t in idf:
                    f = np.float32(tf[t])
                    weight = f * (K1 + np.float32(1.0)) / (f + norm)
                    acc = np.float32(acc + idf[t] * weight)
                    hit = True
            if hit:
                out[i] = acc
        return out

    def top(self, query: str, k: int, slot_of: dict[int, int], allowed: set[int] | None = None) -> list:
        """(id, score) of the k best, score descending, ties by slot (the native tie rule)."""
        s = self.scores(query, allowed)
        return sorted(s.items(), key=lambda kv: (-kv[1], slot_of[kv[0]]))[:k]


def _corpus(seed: int, n: int):
    rng = np.random.default_rng(seed)
    words = _vocabulary(rng, 400)
    texts = _zipf_texts(rng, words, n)
    ids = [int(x) for x in rng.permutation(10 * n)[:n]]  # ids in no relation to slots
    return rng, words, texts, ids


def test_bm25_top_k_is_exactly_the_exhaustive_float32_scoring():
    rng, words, texts, ids = _corpus(7, 1500)
    index = Index(DIM, metric="l2", kind="flat")
    index.add(rng.standard_normal((len(ids), DIM)).astype(np.float32), ids, texts=texts)
    ref = Bm25Reference()
    ref.add(ids, texts)
    slot_of = {i: s for s, i in enumerate(ids)}  # a fresh index fills slots in order
    checked = 0
    for query in _queries(rng, words, texts, 40):
        for k in (1, 10, 50, 400, 5000):
            got_ids, got_scores = index.search_text(query, k)
            want = ref.top(query, k, slot_of)
            assert got_ids.tolist() == [i for i, _ in want], (query, k)
            assert got_scores.tolist() == [float(s) for _, s in want], (query, k)  # bit for bit
            checked += len(want)
    assert checked > 10_000


def test_pruned_bm25_equals_the_exhaustive_native_scoring_after_deletes_and_with_filters():
    """Deletes leave stale postings and free slots that later rows reuse (postings then out of
    slot order); a filter removes rows before the top k. The pruned search must still equal the
    exhaustive native scoring (the path of global statistics, given this index's own)."""
    rng, words, texts, ids = _corpus(11, 1200)
    index = Index(DIM, metric="l2", kind="flat")
    vecs = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    index.add(vecs, ids, texts=texts, metadata=[{"bucket": int(b)} for b in rng.integers(0, 10, len(ids))])
    gone = [int(i) for i in rng.choice(ids, 500, replace=False)]
    index.remove(gone)
    fresh = [10 * len(ids) + j for j in range(300)]
    index.add(
        rng.standard_normal((len(fresh), DIM)).astype(np.float32),
        fresh,
        texts=_zipf_texts(rng, words, len(fresh)),
        metadata=[{"bucket": int(b)} for b in rng.integers(0, 10, len(fresh))],
    )
    for query in _queries(rng, words, texts, 24):
        stats = index.text_stats(query)
        for where in (None, {"bucket": {"$lt": 3}}, {"bucket": 5}):
            for k in (1, 10, 50, 1000):
                got = index.search_text(query, k, where=where)
                want = index.search_text(query, k, where=where, stats=stats)
                assert got[0].tolist() == want[0].tolist(), (query, k, where)
                assert got[1].tolist() == want[1].tolist(), (query, k, where)


def _ranked(ids, keys):
    """A leg as fusion.rrf takes it: padding dropped, by key, equal keys by id."""
    pairs = [(float(v), int(i)) for i, v in zip(ids, keys) if i >= 0]
    return [(i, -v) for v, i in sorted(pairs)]


@pytest.mark.parametrize("k", [0, 1, 60, 1e6])
def test_fuse_rrf_is_exactly_rrf_then_normalize_rrf(k):
    rng = np.random.default_rng(3)
    for trial in range(300):
        na, nb = int(rng.integers(0, 40)), int(rng.integers(0, 40))
        pool = rng.permutation(60)[: max(na, nb, 1)]
        ids_a = rng.choice(pool, na).astype(np.int64)  # repeats in a leg, ids shared by the legs
        ids_b = rng.choice(pool, nb).astype(np.int64)
        dist = np.sort(rng.integers(0, 6, na).astype(np.float32))  # many equal values
        score = np.sort(rng.integers(0, 6, nb).astype(np.float32))[::-1].copy()
        if na and trial % 4 == 0:
            ids_a[-min(na, 3) :] = -1  # a search's padding
        got_ids, got_scores = fuse_rrf(ids_a, dist, ids_b, score, k)
        vec = [(i, -v) for i, v in _ranked(ids_a, dist)]
        text = [(i, -v) for i, v in _ranked(ids_b, -score)]
        want = normalize_rrf(rrf([vec, text], k=k), 2, k)
        assert got_ids.tolist() == [i for i, _ in want]
        assert got_scores.tolist() == [s for _, s in want]  # bit for bit


def test_fuse_rrf_rejects_bad_arguments():
    ids = np.arange(3, dtype=np.int64)
    vals = np.zeros(3, dtype=np.float32)
    with pytest.raises(ValueError, match="rrf k"):
        fuse_rrf(ids, vals, ids, vals, -1.0)
    with pytest.raises(ValueError, match="rrf k"):
        fuse_rrf(ids, vals, ids, vals, float("nan"))
    with pytest.raises(TypeError, match="rrf k"):
        fuse_rrf(ids, vals, ids, vals, "60")
    with pytest.raises(ValueError, match="as long as ids"):
        fuse_rrf(ids, vals[:2], ids, vals, 60)


@pytest.mark.parametrize("window", [None, 17, 5000])
def test_hybrid_rrf_is_exhaustive_bm25_and_the_rrf_formula(tmp_path, window):
    import pyarrow as pa

    rng, words, texts, _ = _corpus(5, 900)
    vecs = rng.standard_normal((len(texts), DIM)).astype(np.float32)
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, index="flat", chunk_size=100_000)
    kb.ingest_table(pa.table({"document_id": [f"d{i}" for i in range(len(texts))], "text": texts}), vectors=vecs)
    index = kb.index
    n = len(index)
    all_ids, _ = index.search(vecs[0], n)
    meta = index.get_metadata(all_ids)
    text_of = {int(i): texts[int(m["document_id"][1:])] for i, m in zip(all_ids.tolist(), meta)}
    chunk_ids = sorted(text_of)  # the engine numbers chunks (and fills slots) in ingest order
    ref = Bm25Reference()
    ref.add(chunk_ids, [text_of[i] for i in chunk_ids])
    slot_of = {i: s for s, i in enumerate(chunk_ids)}
    rrf_k = 60
    for query in _queries(rng, words, texts, 24)[:-2]:
        qvec = rng.standard_normal(DIM).astype(np.float32)
        for top_k in (1, 10, 40):
            w = min(max(4 * top_k, 50) if window is None else window, n)
            hits = kb.retrieve(query, top_k, search_type="hybrid", fusion="rrf", query_vector=qvec, window=window)
            ids, dist = index.search(qvec, w)  # the vector leg (exact: a flat index)
            vec_leg = sorted((float(d), int(i)) for i, d in zip(ids, dist) if i >= 0)
            text_leg = ref.top(query, w, slot_of)
            acc: dict[int, float] = {}
            best: dict[int, int] = {}
            for leg in ([i for _, i in vec_leg], [i for i, _ in sorted(text_leg, key=lambda kv: (-kv[1], kv[0]))]):
                for rank, i in enumerate(leg, start=1):
                    acc[i] = acc.get(i, 0.0) + 1.0 / (rrf_k + rank)
                    best[i] = min(best.get(i, rank), rank)
            top = 2.0 / (rrf_k + 1.0)
            fused = sorted(acc, key=lambda i: (-acc[i], best[i], i))[:top_k]
            assert [h.id for h in hits] == fused, (query, top_k)
            assert [h.score for h in hits] == [min(1.0, acc[i] / top) for i in fused], (query, top_k)


@pytest.fixture
def pool_sizes():
    """Each test leaves the process's search pool at its default size."""
    yield (1, 2, 3)
    set_search_threads(0)


def _hybrid_index(seed: int, n: int):
    """An SQ8 HNSW index (the engine's default kind) with texts and a bucket field."""
    rng, words, texts, ids = _corpus(seed, n)
    index = Index(DIM, metric="cosine", kind="hnsw", M=8, ef_construction=64, quantization="sq8")
    buckets = rng.integers(0, 100, n)
    index.add(
        rng.standard_normal((n, DIM)).astype(np.float32),
        ids,
        texts=texts,
        metadata=[{"bucket": int(b)} for b in buckets],
    )
    return rng, words, texts, index


# Filters: none, ~30 % of rows, ~1 % (the vector leg pads: fewer passing rows than k), none pass.
_WHERES = (None, {"bucket": {"$lt": 30}}, {"bucket": 7}, {"bucket": 1000})


def test_search_hybrid_rrf_is_the_two_searches_then_fuse_rrf(pool_sizes):
    """One native call, the legs run concurrently or one after the other: the same ids, scores
    (bit for bit) and order as Index.search + Index.search_text + fuse_rrf, and each leg's hit
    count, with filters, padding, every pool size and rrf_k; search_hybrid_legs returns the two
    searches' arrays themselves."""
    rng, words, texts, index = _hybrid_index(13, 1500)
    queries = _queries(rng, words, texts, 12)
    vectors = rng.standard_normal((len(queries), DIM)).astype(np.float32)
    checked = 0
    for threads in pool_sizes:
        set_search_threads(threads)
        for query, qvec in zip(queries, vectors):
            for where in _WHERES:
                for k, ef, rrf_k in ((1, None, 60), (10, 16, 0), (50, None, 60), (2000, 40, 1e6)):
                    got = index.search_hybrid_rrf(qvec, query, k, where=where, ef=ef, rrf_k=rrf_k)
                    ids, dist = index.search(qvec, k, where=where, ef=ef, threads=1)
                    tids, tscores = index.search_text(query, k, where=where)
                    want_ids, want_scores = fuse_rrf(ids, dist, tids, tscores, rrf_k)
                    assert got[0].dtype == np.int64 and got[1].dtype == np.float64
                    assert got[0].tolist() == want_ids.tolist(), (threads, query, where, k)
                    assert got[1].tolist() == want_scores.tolist(), (threads, query, where, k)
                    assert got[2:] == (int(np.count_nonzero(ids >= 0)), len(tids)), (threads, query, where, k)
                    legs = index.search_hybrid_legs(qvec, query, k, where=where, ef=ef)
                    for leg, want in zip(legs, (ids, dist, tids, tscores)):
                        assert leg.dtype == want.dtype and leg.tolist() == want.tolist(), (threads, query, where, k)
                    checked += len(want_ids)
    assert checked > 50_000


def test_search_hybrid_rrf_from_many_threads_at_once(pool_sizes):
    """Calls from several Python threads share the process's pool: each gets its own answer."""
    rng, words, texts, index = _hybrid_index(17, 800)
    queries = _queries(rng, words, texts, 16)
    vectors = rng.standard_normal((len(queries), DIM)).astype(np.float32)
    set_search_threads(1)
    want = [index.search_hybrid_rrf(v, q, 50, where=_WHERES[j % 3]) for j, (q, v) in enumerate(zip(queries, vectors))]
    set_search_threads(2)
    errors: list[str] = []

    def worker(t: int) -> None:
        for rep in range(20):
            j = (t * 5 + rep) % len(queries)
            got = index.search_hybrid_rrf(vectors[j], queries[j], 50, where=_WHERES[j % 3])
            if got[0].tolist() != want[j][0].tolist() or got[1].tolist() != want[j][1].tolist():
                errors.append(f"thread {t} query {j}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_search_hybrid_rrf_rejects_bad_arguments():
    _, _, _, index = _hybrid_index(19, 50)
    q = np.zeros(DIM, dtype=np.float32)
    q[0] = 1.0
    with pytest.raises(InvalidArgumentError, match="rrf k"):
        index.search_hybrid_rrf(q, "a", 10, rrf_k=-1.0)
    with pytest.raises(InvalidArgumentError, match="rrf k"):
        index.search_hybrid_rrf(q, "a", 10, rrf_k=float("inf"))
    with pytest.raises(InvalidTypeError, match="rrf k"):
        index.search_hybrid_rrf(q, "a", 10, rrf_k="60")
    with pytest.raises(InvalidTypeError, match="query_text"):
        index.search_hybrid_rrf(q, b"a", 10)
    with pytest.raises(InvalidArgumentError, match="dimension"):
        index.search_hybrid_rrf(q[:-1], "a", 10)
    with pytest.raises(InvalidArgumentError, match="one query vector"):
        index.search_hybrid_rrf(np.stack([q, q]), "a", 10)
    with pytest.raises(InvalidArgumentError, match="k must be"):
        index.search_hybrid_rrf(q, "a", 0)
    with pytest.raises(InvalidArgumentError, match="ef must be"):
        index.search_hybrid_rrf(q, "a", 10, ef=2**31)
    with pytest.raises(InvalidArgumentError):
        index.search_hybrid_rrf(np.full(DIM, np.nan, dtype=np.float32), "a", 10)
    with pytest.raises(InvalidArgumentError):
        index.search_hybrid_rrf(q, "a", 10, where={"bucket": {"$bogus": 1}})
    # A 2-D [1, dim] query and a float64 vector are converted once, as search does.
    got = index.search_hybrid_rrf(q[None, :].astype(np.float64), "a", 10)
    assert got[0].tolist() == index.search_hybrid_rrf(q, "a", 10)[0].tolist()


def _dedup_reference(index, qvec, query, top_k, where, rrf_k=60.0):
    """The engine's hybrid RRF with deduplicate=True written out with the public calls: legs
    of `window` candidates, fuse_rrf, the first chunk of each document in fused order, the
    window widened 4x while too few documents come back and a leg was full."""
    n = len(index)
    window = max(4 * top_k, 50)
    while True:
        w = min(window, n)
        ids, dist = index.search(qvec, w, where=where, threads=1)
        tids, tscores = index.search_text(query, w, where=where)
        fids, fscores = fuse_rrf(ids, dist, tids, tscores, rrf_k)
        seen: dict[str, tuple[int, float]] = {}
        for i, s, m in zip(fids.tolist(), fscores.tolist(), index.get_metadata(fids) if len(fids) else []):
            if m["document_id"] not in seen:
                seen[m["document_id"]] = (i, s)
        picked = list(seen.values())[:top_k]
        full = len(tids) == w or int(np.count_nonzero(ids >= 0)) == w
        if len(picked) >= top_k or not full or w >= n:
            return picked
        window = w * 4


def test_hybrid_rrf_with_dedup_and_filters_is_the_reference(tmp_path):
    """The engine's hybrid RRF path (one native call for both legs) with deduplicate=True and
    filters, including a narrow filter that widens the window: the documented computation."""
    import pyarrow as pa

    rng, words, texts, _ = _corpus(23, 1200)
    vecs = rng.standard_normal((len(texts), DIM)).astype(np.float32)
    docs = [f"d{i // 6}" for i in range(len(texts))]  # six chunks per document
    buckets = rng.integers(0, 100, len(texts))
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, chunk_size=100_000)
    kb.ingest_table(
        pa.table(
            {
                "document_id": docs,
                "chunk_index": pa.array([i % 6 for i in range(len(texts))], pa.int64()),
                "text": texts,
                "bucket": pa.array(buckets, pa.int64()),
            }
        ),
        vectors=vecs,
        span_columns=None,
        metadata_columns=["bucket"],
    )
    kb.wait_until_indexed()
    index = kb.index
    checked = 0
    for query in _queries(rng, words, texts, 10):
        qvec = rng.standard_normal(DIM).astype(np.float32)
        for where in (None, {"bucket": {"$lt": 20}}, {"bucket": {"$lt": 2}}):
            for top_k in (1, 10, 30):
                hits = kb.retrieve(
                    query, top_k, search_type="hybrid", fusion="rrf", query_vector=qvec, deduplicate=True, filters=where
                )
                want = _dedup_reference(index, qvec, query, top_k, where)
                assert [(h.id, h.score) for h in hits] == want, (query, where, top_k)
                assert len({h.document_id for h in hits}) == len(hits)
                checked += len(want)
    engine.close()
    assert checked > 500


@pytest.mark.parametrize("fusion", ["zscore", "linear"])
def test_hybrid_zscore_and_linear_are_the_documented_fusion_of_the_two_searches(tmp_path, fusion):
    """The engine's z-score and linear hybrid (both legs from one native call) against the
    fusion of the two public searches written out: the vector leg's scores from its distances,
    each leg ranked with ties by id, z-score with the BM25 leg's floor of zeros."""
    import pyarrow as pa

    from kbcore.engine.scores import score_from_distance
    from kbcore.fusion import linear, zscore

    rng, words, texts, _ = _corpus(29, 700)
    vecs = rng.standard_normal((len(texts), DIM)).astype(np.float32)
    buckets = rng.integers(0, 100, len(texts))
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, chunk_size=100_000)
    kb.ingest_table(
        pa.table({"document_id": [f"d{i}" for i in range(len(texts))], "text": texts, "bucket": buckets}),
        vectors=vecs,
        span_columns=None,
        metadata_columns=["bucket"],
    )
    kb.wait_until_indexed()
    index = kb.index
    for query in _queries(rng, words, texts, 12):
        qvec = rng.standard_normal(DIM).astype(np.float32)
        for where in (None, {"bucket": {"$lt": 25}}, {"bucket": 3}):
            hits = kb.retrieve(query, 10, search_type="hybrid", fusion=fusion, query_vector=qvec, filters=where)
            w = min(50, len(index))
            ids, dist = index.search(qvec, w, where=where)
            pairs = sorted((float(d), int(i)) for i, d in zip(ids, dist) if i >= 0)
            vec_leg = [(i, float(score_from_distance(d, "cosine"))) for d, i in pairs]
            tids, tscores = index.search_text(query, w, where=where)
            text_leg = [(i, -v) for v, i in sorted((-float(v), int(i)) for i, v in zip(tids, tscores))]
            if fusion == "zscore":
                unmatched = len(vec_leg) - len(tids)
                fused = zscore([vec_leg, text_leg], floors=[None, (0.0, unmatched) if unmatched > 0 else None])
            else:
                fused = linear(vec_leg, text_leg, 0.7)
            assert [(h.id, h.score) for h in hits] == fused[:10], (query, where)
    engine.close()
