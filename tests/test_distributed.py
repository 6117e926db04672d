"""kbcore.distributed: a ShardedIndex over Ray actors against a single-index oracle.

Every sharded answer is compared to one kbcore Index holding the same rows (itself checked
against brute force elsewhere), and HNSW recall to exact brute force. Ray runs on loopback
only: one local instance for the module (``ray.init(num_cpus=2)``), and once a two-node
cluster (``ray start`` head + worker on 127.0.0.2 / 127.0.0.3) in a child process.

The write-ahead log and shard recovery tests need no Ray and always run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest
from ray_support import local_ray, needs_ray, ray

import kbcore
import kbcore.distributed
from kbcore import fusion
from kbcore.distributed.routing import route, shard_of_id, shard_of_key
from kbcore.distributed.shard import ShardState
from kbcore.distributed.sockets import AVAILABLE as SOCKETS
from kbcore.distributed.wal import WalRecord, WalWriter, read_log
from kbcore.errors import (
    FormatError,
    InvalidArgumentError,
    InvalidTypeError,
    NotFoundError,
    StorageError,
)

TRANSPORTS = [
    "actor",
    "compiled",
    pytest.param(
        "socket",
        marks=pytest.mark.skipif(
            not SOCKETS, reason="the socket transport needs Unix-domain sockets and poll(), which this platform lacks"
        ),
    ),
]

DIM = 16
WORDS = [f"w{i}" for i in range(60)]


def make_rows(rng: np.random.Generator, n: int, *, per_doc: int = 4):
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    docs = [f"doc-{i // per_doc}" for i in range(n)]
    meta = [{"document_id": docs[i], "lang": ["en", "de", "fr"][i % 3], "year": 2000 + i % 20} for i in range(n)]
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 25)))) for _ in range(n)]
    return vectors, ids, meta, texts


def ranked_equal(ids, scores, oracle_ids, oracle_scores, *, rtol=1e-6):
    """Sharded page == oracle page up to ties: same scores; same ids except among rows tied
    at the page boundary, where the sharded ids must be among the oracle's tied ids."""
    k = len(ids)
    np.testing.assert_allclose(scores, oracle_scores[:k], rtol=rtol, atol=1e-6)
    assert len(set(ids.tolist())) == k
    last = scores[-1] if k else None
    for i in range(k):
        tied_to_last = abs(scores[i] - last) <= 1e-6 + rtol * abs(last)
        if not tied_to_last:
            tied = np.abs(oracle_scores - scores[i]) <= 1e-6 + rtol * abs(scores[i])
            assert ids[i] in set(oracle_ids[tied].tolist()), (i, ids[i])
    tail = np.abs(oracle_scores - last) <= 1e-6 + rtol * abs(last) if k else []
    for i in range(k):
        if abs(scores[i] - last) <= 1e-6 + rtol * abs(last):
            assert ids[i] in set(oracle_ids[tail].tolist())


# ------------------------------------------------------------------------------------------
# routing, write-ahead log and shard recovery (no Ray)


def test_routing_is_stable_and_keeps_a_document_on_one_shard():
    # Fixed expectations: the hash must not change between processes or releases.
    assert [shard_of_key("doc-1", 4), shard_of_key(7, 4), shard_of_id(7, 4)] == [
        shard_of_key("doc-1", 4),
        shard_of_key(7, 4),
        shard_of_id(7, 4),
    ]
    code = "from kbcore.distributed.routing import shard_of_key as s; print(s('doc-1', 97), s(7, 97))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == [str(shard_of_key("doc-1", 97)), str(shard_of_key(7, 97))]
    ids = np.arange(200, dtype=np.int64)
    meta = [{"document_id": f"d{i // 5}"} if i % 7 else {} for i in range(200)]
    where = route(ids, meta, "document_id", 5)
    for d in {m["document_id"] for m in meta if m}:
        rows = [i for i, m in enumerate(meta) if m.get("document_id") == d]
        assert len(set(where[rows].tolist())) == 1
    assert all(where[i] == shard_of_id(i, 5) for i in range(200) if not meta[i])
    assert len(set(where.tolist())) == 5  # rows spread over every shard
    assert shard_of_key(5, 1000) != shard_of_key("5", 1000) or shard_of_key(6, 1000) != shard_of_key("6", 1000)
    with pytest.raises(InvalidTypeError, match="int or str"):
        route(ids[:1], [{"document_id": 1.5}], "document_id", 3)


def test_merge_of_one_query_equals_its_row_of_a_batch_merge():
    from kbcore.distributed.merge import merge_top_k

    rng = np.random.default_rng(31)
    for _ in range(300):  # ties (few distinct distances), fewer candidates than k (padding)
        k, cols, n = int(rng.integers(1, 12)), int(rng.integers(0, 8)), int(rng.integers(0, 5))
        parts = [
            (rng.integers(0, 40, (2, cols)).astype(np.int64), rng.integers(0, 4, (2, cols)).astype(np.float32))
            for _ in range(n)
        ]
        batch_ids, batch_dist = merge_top_k(parts, k, 2)
        for row in (0, 1):
            ids, dist = merge_top_k([(p[0][row : row + 1], p[1][row : row + 1]) for p in parts], k, 1)
            assert ids.shape == (1, k) and ids.dtype == np.int64 and dist.dtype == np.float32
            np.testing.assert_array_equal(ids[0], batch_ids[row])
            np.testing.assert_array_equal(dist[0], batch_dist[row])
            assert (np.diff(dist[0][np.isfinite(dist[0])]) >= 0).all()


def _record(rng, n=5, seq=1):
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return WalRecord(
        seq,
        "add",
        v,
        np.arange(n, dtype=np.int64),
        np.array([99], np.int64),
        [{"document_id": f"d{i}", "n": i} for i in range(n)],
        [f"t {i}" for i in range(n)],
    )


def test_wal_replays_records_and_drops_a_torn_tail(tmp_path, rng):
    path = str(tmp_path / "w.log")
    w = WalWriter(path)
    recs = [_record(rng, seq=s) for s in (1, 2, 3)]
    for r in recs:
        w.append(r)
    w.close()
    size = os.path.getsize(path)
    got, valid = read_log(path)
    assert valid == size and [r.seq for r in got] == [1, 2, 3]
    np.testing.assert_array_equal(got[1].vectors, recs[1].vectors)
    assert got[2].metadata == recs[2].metadata and got[2].texts == recs[2].texts
    np.testing.assert_array_equal(got[0].discard, [99])
    # A crash in the middle of the last append: that write was never acknowledged.
    with open(path, "r+b") as f:
        f.truncate(size - 7)
    got, valid = read_log(path)
    assert [r.seq for r in got] == [1, 2] and valid < size - 7
    w = WalWriter(path, valid_length=valid)  # truncates the torn tail, appends after it
    w.append(_record(rng, seq=3))
    w.close()
    assert [r.seq for r in read_log(path)[0]] == [1, 2, 3]


def test_wal_corruption_before_the_end_is_an_error(tmp_path, rng):
    path = str(tmp_path / "w.log")
    w = WalWriter(path)
    for s in (1, 2):
        w.append(_record(rng, seq=s))
    w.close()
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[40] ^= 0xFF  # inside the first record, which is followed by another
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(FormatError, match="checksum|corrupted"):
        read_log(path)
    with open(path, "wb") as f:
        f.write(b"not a log at all")
    with pytest.raises(FormatError, match="not a kbcore write-ahead log"):
        read_log(path)


@pytest.mark.parametrize("durability", ["wal", "save"])
def test_shard_recovers_every_acknowledged_write(tmp_path, rng, durability):
    vectors, ids, meta, texts = make_rows(rng, 120)
    opts = dict(
        shard=0, dim=DIM, metric="cosine", kind="flat", index_options={}, durability=durability, checkpoint_bytes=20_000
    )
    s = ShardState(str(tmp_path), **opts)
    s.apply(vectors[:60], ids[:60], meta[:60], texts[:60], np.empty(0, np.int64))
    s.apply(vectors[60:], ids[60:], meta[60:], texts[60:], np.array([ids[0]], np.int64))
    s.discard(ids[1:3])
    import pyarrow as pa

    extra = rng.standard_normal((3, DIM)).astype(np.float32)
    table = pa.table({"document_id": ["arrow-doc"] * 3, "n": [1, 2, 3]})
    s.apply(extra, np.array([7, 8, 9], np.int64), table, None, np.empty(0, np.int64))
    want = sorted(s.ids().tolist())
    q = rng.standard_normal(DIM).astype(np.float32)
    want_hits = s.search(q, 7, None, None, 1)
    del s  # no clean shutdown: what is on disk must be enough
    r = ShardState(str(tmp_path), **opts)
    assert sorted(r.ids().tolist()) == want and len(want) == 120
    assert r.get_metadata(np.array([8]))[8] == {"document_id": "arrow-doc", "n": 2}
    np.testing.assert_array_equal(r.search(q, 7, None, None, 1)[0], want_hits[0])
    assert r.get_metadata(np.array([ids[5]]))[int(ids[5])]["document_id"] == meta[5]["document_id"]
    if durability == "wal":
        assert r.info()["replayed"] >= 1  # some writes came back from the log, not the checkpoint
    files = sorted(os.listdir(tmp_path))
    assert "state.json" in files and sum(f.startswith("index-") for f in files) == 1
    with pytest.raises(FormatError, match="expected hnsw"):
        ShardState(str(tmp_path), **dict(opts, kind="hnsw"))


def test_shard_that_cannot_log_refuses_writes_and_recovers_without_the_lost_one(tmp_path, rng, monkeypatch):
    vectors, ids, meta, texts = make_rows(rng, 40)
    opts = dict(shard=3, dim=DIM, metric="cosine", kind="flat", index_options={})
    s = ShardState(str(tmp_path), **opts)
    s.apply(vectors[:20], ids[:20], meta[:20], texts[:20], np.empty(0, np.int64))

    def full_disk(self, rec):
        raise StorageError(28, "No space left on device")

    monkeypatch.setattr(WalWriter, "append", full_disk)
    with pytest.raises(StorageError, match="shard 3 could not make a write durable"):
        s.apply(vectors[20:], ids[20:], meta[20:], texts[20:], np.empty(0, np.int64))
    assert s.broken
    monkeypatch.undo()
    with pytest.raises(StorageError, match="must be restarted"):
        s.discard(ids[:1])
    r = ShardState(str(tmp_path), **opts)  # what a restart sees: the acknowledged rows only
    assert sorted(r.ids().tolist()) == ids[:20].tolist()


def test_text_stats_hook_scores_parts_as_one_index(rng):
    vectors, ids, meta, texts = make_rows(rng, 300)
    one = kbcore.Index(DIM, "cosine", "flat")
    one.add(vectors, ids, texts=texts)
    parts = [kbcore.Index(DIM, "cosine", "flat") for _ in range(3)]
    for p in range(3):
        rows = np.arange(p, 300, 3)
        parts[p].add(vectors[rows], ids[rows], texts=[texts[i] for i in rows])
    for query in ("w7", "w7 w30 w30 w2"):
        stats = [p.text_stats(query) for p in parts]
        total = (
            sum(s[0] for s in stats),
            sum(s[1] for s in stats),
            {t: sum(s[2][t] for s in stats) for t in stats[0][2]},
        )
        assert total == one.text_stats(query)
        want = dict(zip(*(a.tolist() for a in one.search_text(query, 300))))
        for p in parts:
            got_ids, got = p.search_text(query, 300, stats=total)
            assert len(got_ids) and all(np.isclose(want[i], s, rtol=1e-6) for i, s in zip(got_ids.tolist(), got))
            local_ids, local = p.search_text(query, 300)  # per-part statistics score otherwise
            assert not np.allclose(sorted(local), sorted(want[i] for i in local_ids.tolist()))
    with pytest.raises(InvalidArgumentError, match="lack"):
        parts[0].search_text("w7", 5, stats=(1000, 10_000, {}))
    with pytest.raises(InvalidArgumentError, match="fewer rows"):
        parts[0].search_text("w7", 5, stats=(1, 10_000, {"w7": 1}))
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        parts[0].search_text("w7", 5, stats=(1000, -1, {"w7": 1}))
    with pytest.raises(InvalidTypeError, match="stats must be"):
        parts[0].search_text("w7", 5, stats="everything")


# ------------------------------------------------------------------------------------------
# the sharded index on a local Ray instance


@pytest.fixture(scope="module")
def ray_local():
    with local_ray() as ctx:
        yield ctx


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(1717)
    return make_rows(rng, 600)


def _oracle(kind, corpus, **opts):
    vectors, ids, meta, texts = corpus
    one = kbcore.Index(DIM, "cosine", kind, **opts)
    one.add(vectors, ids, metadata=meta, texts=texts)
    return one


@pytest.fixture(scope="module")
def flat3(ray_local, corpus, tmp_path_factory):
    vectors, ids, meta, texts = corpus
    si = kbcore.distributed.ShardedIndex(DIM, "cosine", "flat", shards=3, path=tmp_path_factory.mktemp("flat3") / "kb")
    si.add(vectors[:250], ids[:250], metadata=meta[:250], texts=texts[:250])
    si.add(vectors[250:], ids[250:], metadata=meta[250:], texts=texts[250:])
    yield si
    si.close()


@needs_ray
def test_sharded_flat_search_equals_one_index(flat3, corpus):
    one = _oracle("flat", corpus)
    assert len(flat3) == len(one) == 600 == flat3.text_documents()
    assert sorted(i["rows"] for i in flat3.shard_info()) != [0, 0, 600]  # really spread
    rng = np.random.default_rng(5)
    qs = rng.standard_normal((6, DIM)).astype(np.float32)
    for where in (None, {"lang": "de"}, {"year": {"$gte": 2015}, "lang": {"$in": ["en", "fr"]}}):
        ids, dist = flat3.search(qs, 10, where=where)
        full_ids, full_dist = one.search(qs, 600, where=where)
        for q in range(len(qs)):
            keep = full_ids[q] >= 0
            ranked_equal(ids[q], dist[q], full_ids[q][keep], full_dist[q][keep])
        one_ids, one_dist = flat3.search(qs[0], 10, where=where)  # a single query: 1-D
        np.testing.assert_array_equal(one_ids, ids[0])
        np.testing.assert_array_equal(one_dist, dist[0])
    ids, dist = flat3.search(qs[0], 5, where={"lang": "xx"})
    assert (ids == -1).all() and np.isinf(dist).all()
    assert flat3.count({"lang": "de"}) == one.count({"lang": "de"}) == 200


@needs_ray
def test_sharded_grouped_search_equals_one_index(flat3, corpus):
    one = _oracle("flat", corpus)
    q = np.random.default_rng(6).standard_normal(DIM).astype(np.float32)
    for where in (None, {"lang": {"$ne": "fr"}}):
        got = flat3.search_groups(q, 8, group_size=2, where=where)
        want = one.search_groups(q, 8, group_by="document_id", group_size=2, where=where)
        assert [g.key for g in got] == [g.key for g in want]
        for a, b in zip(got, want):
            assert a.ids == b.ids and np.allclose(a.distances, b.distances)
            assert set(a.part_ids) == set(b.part_ids)  # every part of a source is on one shard


@needs_ray
def test_sharded_bm25_uses_global_statistics(flat3, corpus):
    one = _oracle("flat", corpus)
    for query in ("w3", "w3 w17 w40", "w59 w1 w1 w2", "zzz w8"):
        for where in (None, {"lang": "en"}):
            ids, scores = flat3.search_text(query, 10, where=where)
            fi, fs = one.search_text(query, 600, where=where)
            ranked_equal(ids, scores, fi, fs)
        # Per-shard statistics would score differently: the hook is what makes them equal.
        docs, total, df = flat3.text_stats(query)
        assert (docs, total, df) == one.text_stats(query)
    assert flat3.search_text("nothing-matches", 5)[0].size == 0


@needs_ray
def test_sharded_hybrid_fuses_after_the_merge(flat3, corpus):
    one = _oracle("flat", corpus)
    rng = np.random.default_rng(8)
    for word in ("w4", "w22"):  # one term: scores are bit-identical, ties broken by id
        q = rng.standard_normal(DIM).astype(np.float32)
        got = flat3.search_hybrid(q, word, 10, window=30)
        ids, dist = one.search(q, 600)
        order = np.lexsort((ids, dist))[:30]
        vec_leg = list(zip(ids[order].tolist(), (1.0 - dist[order]).tolist()))
        tids, tscores = one.search_text(word, 600)
        torder = np.lexsort((tids, -tscores))[:30]
        text_leg = list(zip(tids[torder].tolist(), tscores[torder].tolist()))
        want = fusion.rrf([vec_leg, text_leg], k=60)[:10]
        assert [i for i, _ in got] == [i for i, _ in want]
        assert np.allclose([s for _, s in got], [s for _, s in want])


@needs_ray
def test_sharded_linear_hybrid_equals_linear_fusion_of_one_index(flat3, corpus):
    one = _oracle("flat", corpus)
    rng = np.random.default_rng(9)
    for word, w in (("w4", 0.7), ("w22", 0.25)):
        q = rng.standard_normal(DIM).astype(np.float32)
        got = flat3.search_hybrid(q, word, 10, window=30, fusion="linear", vector_weight=w)
        ids, dist = one.search(q, 600)
        order = np.lexsort((ids, dist))[:30]
        vec_leg = list(zip(ids[order].tolist(), (1.0 - dist[order]).tolist()))
        tids, tscores = one.search_text(word, 600)
        torder = np.lexsort((tids, -tscores))[:30]
        text_leg = list(zip(tids[torder].tolist(), tscores[torder].tolist()))
        want = fusion.linear(vec_leg, text_leg, vector_weight=w)[:10]
        assert len(got) == 10
        assert [i for i, _ in got] == [i for i, _ in want]
        assert np.allclose([s for _, s in got], [s for _, s in want])
    with pytest.raises(InvalidArgumentError, match="vector_weight"):
        flat3.search_hybrid(q, "w4", 10, fusion="linear", vector_weight=1.5)


@needs_ray
def test_sharded_hnsw_recall_matches_one_index(ray_local, tmp_path):
    rng = np.random.default_rng(11)
    n = 3000
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    ids = np.arange(n, dtype=np.int64)
    meta = [{"document_id": i // 3} for i in range(n)]
    qs = rng.standard_normal((40, DIM)).astype(np.float32)
    exact = kbcore.Index(DIM, "cosine", "flat")
    exact.add(vectors, ids)
    truth, _ = exact.search(qs, 10)
    one = kbcore.Index(DIM, "cosine", "hnsw", M=8, ef_construction=40, ef=16)
    one.add(vectors, ids, metadata=meta)
    with kbcore.distributed.ShardedIndex(
        DIM, "cosine", "hnsw", shards=2, path=tmp_path / "kb", M=8, ef_construction=40, ef=16
    ) as si:
        si.add(vectors[:2500], ids[:2500], metadata=meta[:2500])
        si.add(vectors[2500:], ids[2500:], metadata=meta[2500:], defer_graph=True, threads=1)
        assert si.pending == 500  # stored, searchable (scanned exactly), not yet linked
        assert si.build_graph() == 0 and si.pending == 0
        got, _ = si.search(qs, 10)

    def recall(found):
        return np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found.tolist(), truth.tolist())])

    r_one, r_sharded = recall(one.search(qs, 10)[0]), recall(got)
    assert r_sharded >= r_one - 0.03, (r_sharded, r_one)
    assert r_sharded > 0.5


@needs_ray
def test_sharded_remove_upsert_and_document_delete(ray_local, tmp_path, corpus):
    vectors, ids, meta, texts = corpus
    with kbcore.distributed.ShardedIndex(DIM, "cosine", "flat", shards=3, path=tmp_path / "kb") as si:
        si.add(vectors, ids, metadata=meta, texts=texts)
        si.remove(ids[:10])
        assert len(si) == 590 and ids[0] not in si
        with pytest.raises(NotFoundError, match=str(ids[0])):
            si.remove([ids[0], ids[20]])
        assert ids[20] in si  # a failed remove changes nothing
        # Upsert an id under a document that lives on another shard: no stale copy remains.
        row = 30
        old_doc = meta[row]["document_id"]
        new_doc = next(f"moved-{j}" for j in range(100) if shard_of_key(f"moved-{j}", 3) != shard_of_key(old_doc, 3))
        si.add(vectors[row] * -1, [ids[row]], metadata=[{"document_id": new_doc}], texts=["fresh"])
        assert len(si) == 590
        assert sum(i["rows"] for i in si.shard_info()) == 590
        assert si.get_metadata([ids[row]]) == [{"document_id": new_doc}]
        hit, _ = si.search(-vectors[row], 3)
        assert list(hit).count(ids[row]) == 1
        # A document's rows are on one shard, and deleting it is that shard's work alone.
        doc = meta[100]["document_id"]
        n_doc = sum(m["document_id"] == doc for m in meta)
        assert si.remove_document(doc) == n_doc
        assert si.count({"document_id": doc}) == 0 and len(si) == 590 - n_doc
        assert si.remove_document("no-such-doc") == 0
        with pytest.raises(NotFoundError):
            si.get_metadata([ids[0]])
        with pytest.raises(InvalidArgumentError, match="dimension"):
            si.add(np.zeros((1, DIM + 1), np.float32), [1])
        with pytest.raises(InvalidArgumentError, match="duplicate id"):
            si.add(vectors[:2], [5, 5])
        with pytest.raises(ValueError):  # NaN is rejected by the shard, re-raised as is
            si.add(np.full((1, DIM), np.nan, np.float32), [7])
        assert len(si) == 590 - n_doc


@needs_ray
def test_sharded_save_and_load_round_trip(ray_local, tmp_path, corpus):
    vectors, ids, meta, texts = corpus
    path = tmp_path / "kb"
    q = np.random.default_rng(3).standard_normal(DIM).astype(np.float32)
    si = kbcore.distributed.ShardedIndex(DIM, "cosine", "flat", shards=2, path=path)
    si.add(vectors[:300], ids[:300], metadata=meta[:300], texts=texts[:300])
    si.save()
    si.add(vectors[300:], ids[300:], metadata=meta[300:], texts=texts[300:])  # only in the logs
    want = si.search(q, 10)
    want_text = si.search_text("w5 w6", 10)
    si.close()
    with pytest.raises(InvalidArgumentError, match="ShardedIndex.load"):
        kbcore.distributed.ShardedIndex(DIM, "cosine", "flat", shards=2, path=path)
    back = kbcore.distributed.ShardedIndex.load(path)
    try:
        assert len(back) == 600 and back.shards == 2 and back.kind == "flat"
        np.testing.assert_array_equal(back.search(q, 10)[0], want[0])
        np.testing.assert_array_equal(back.search_text("w5 w6", 10)[0], want_text[0])
        assert sum(i["replayed"] for i in back.shard_info()) >= 1
    finally:
        back.close()
    with pytest.raises(FileNotFoundError):
        kbcore.distributed.ShardedIndex.load(tmp_path / "nothing")
    with open(path / "shard-0001" / "state.json", "wb") as f:
        f.write(b"{not json")
    with pytest.raises(FormatError, match="shard state .*shard-0001"):
        kbcore.distributed.ShardedIndex.load(path)


@needs_ray
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_shard_restarts_with_every_acknowledged_write(ray_local, tmp_path, corpus, transport):
    vectors, ids, meta, texts = corpus
    with kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=2, path=tmp_path / "kb", timeout=60, transport=transport
    ) as si:
        si.add(vectors[:200], ids[:200], metadata=meta[:200], texts=texts[:200])
        si.save()
        si.add(vectors[200:], ids[200:], metadata=meta[200:], texts=texts[200:])  # acknowledged
        si.remove(ids[:5])
        q = vectors[250]
        want = si.search(q, 10)
        before = si.shard_info()
        for actor in si.shard_actors():  # crash both shards, no checkpoint since the save
            ray.kill(actor, no_restart=False)
        got = si.search(q, 10)  # waits for the restarts (or meets a shard not yet killed)
        deadline = time.monotonic() + 60
        old_pids = {b["pid"] for b in before}
        while {n["pid"] for n in si.shard_nodes()} & old_pids and time.monotonic() < deadline:
            time.sleep(0.2)  # ray.kill is asynchronous
        np.testing.assert_array_equal(got[0], want[0])
        after = si.shard_info()
        assert not {a["pid"] for a in after} & old_pids
        np.testing.assert_array_equal(si.search(q, 10)[0], want[0])
        assert [a["rows"] for a in after] == [b["rows"] for b in before]
        assert all(a["replayed"] >= 1 for a in after)
        assert len(si) == 595 and ids[0] not in si and ids[599] in si


@needs_ray
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dead_shard_fails_with_its_name_or_a_marked_partial_page(ray_local, tmp_path, corpus, transport):
    vectors, ids, meta, texts = corpus
    si = kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=3, path=tmp_path / "kb", max_restarts=0, timeout=3, transport=transport
    )
    try:
        si.add(vectors, ids, metadata=meta, texts=texts)
        rows = [i["rows"] for i in si.shard_info()]
        dead = si.shard_actors()[1]
        pid = si.shard_nodes()[1]["pid"]
        ray.kill(dead, no_restart=True)
        _wait_dead(dead)  # ray.kill is asynchronous: a search right after may still reach it
        # Ray reports the actor dead before its process has exited; until then the process's
        # socket server may still answer (with everything the shard held). Wait for the exit.
        _wait_process_gone(pid)
        t0 = time.monotonic()
        with pytest.raises(kbcore.distributed.ShardUnavailableError, match="shard 1 ") as err:
            si.search(vectors[0], 5)
        assert err.value.shards == (1,)
        assert isinstance(err.value, ConnectionError)
        assert time.monotonic() - t0 < 10
        with pytest.raises(kbcore.distributed.ShardUnavailableError, match="shard 1 "):
            si.search_text("w1", 5)
        part = si.search(vectors[0], 600, allow_partial=True)
        assert part.missing_shards == (1,)
        found = part.value[0][part.value[0] >= 0]
        assert len(found) == rows[0] + rows[2]  # everything the live shards hold, nothing else
        text = si.search_text("w1 w2", 5, allow_partial=True)
        assert text.missing_shards == (1,)
        complete = si.search(vectors[0], 5, allow_partial=True)
        assert complete.missing_shards == (1,)
        with pytest.raises(kbcore.distributed.ShardUnavailableError):
            si.add(vectors[:1], ids[:1], metadata=meta[:1])
        assert not si.transport_stats()["ready"]  # a dead shard: no graph to rebuild, no address
    finally:
        si.close()


def _wait_dead(actor, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=5)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"actor {actor} still answers {seconds:g} s after ray.kill")


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not reaped yet) holds no sockets
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _wait_process_gone(pid: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _process_alive(pid):
            return
        time.sleep(0.05)
    raise AssertionError(f"shard process {pid} still runs {seconds:g} s after ray.kill")


def _wait_compiled(si, builds: int, seconds: float = 60) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        st = si.transport_stats()
        if st["ready"] and st["builds"] >= builds:
            return st
        time.sleep(0.1)
    raise AssertionError(f"no compiled graph #{builds} within {seconds} s: {si.transport_stats()}")


@needs_ray
def test_compiled_transport_answers_every_query_as_one_index(ray_local, tmp_path, corpus):
    vectors, ids, meta, texts = corpus
    one = _oracle("flat", corpus)
    with kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=3, path=tmp_path / "kb", transport="compiled", compiled_idle=None
    ) as si:
        si.add(vectors, ids, metadata=meta, texts=texts)
        assert si.transport == "compiled"
        start = si.transport_stats()
        assert start["ready"] and start["builds"] == 1, start
        rng = np.random.default_rng(9)
        qs = rng.standard_normal((4, DIM)).astype(np.float32)
        for q in qs:  # one query per call (the path a RAG request takes)
            got, want = si.search(q, 10), one.search(q, 10)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
        got, want = si.search(qs, 7, where={"lang": "en"}), one.search(qs, 7, where={"lang": "en"})
        np.testing.assert_array_equal(got[0], want[0])
        assert [g.key for g in si.search_groups(qs[0], 5)] == [g.key for g in one.search_groups(qs[0], 5)]
        np.testing.assert_array_equal(si.search_text("w1 w2", 5)[0], one.search_text("w1 w2", 5)[0])
        assert si.count({"lang": "en"}) == one.count({"lang": "en"})
        # A request and answers larger than the channels' first buffers (1 MB): they grow.
        big = rng.standard_normal((12_000, DIM)).astype(np.float32)
        np.testing.assert_array_equal(si.search(big, 10)[0], one.search(big, 10)[0])
        # A shard's own error comes back as the actor path raises it; the graph stays usable.
        with pytest.raises(InvalidArgumentError, match="bogus"):
            si.search(qs[0], 5, where={"lang": {"$bogus": 1}})
        np.testing.assert_array_equal(si.search(qs[0], 10)[0], one.search(qs[0], 10)[0])
        end = si.transport_stats()
        assert end["ready"] and end["builds"] == 1 and end["fallbacks"] == 0, end


@needs_ray
def test_compiled_transport_falls_back_and_rebuilds_after_a_restart(ray_local, tmp_path, corpus):
    vectors, ids, meta, texts = corpus
    one = _oracle("flat", corpus)
    q = vectors[17]
    with kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=2, path=tmp_path / "kb", timeout=60, transport="compiled", compiled_idle=None
    ) as si:
        si.add(vectors, ids, metadata=meta, texts=texts)
        _wait_compiled(si, 1)
        old = si.shard_nodes()[0]["pid"]
        ray.kill(si.shard_actors()[0], no_restart=False)
        deadline = time.monotonic() + 60
        while si.shard_nodes()[0]["pid"] == old and time.monotonic() < deadline:
            time.sleep(0.2)  # ray.kill is asynchronous
        # The graph over the dead process is gone: the query takes the actor path.
        np.testing.assert_array_equal(si.search(q, 10)[0], one.search(q, 10)[0])
        st = _wait_compiled(si, 2)  # rebuilt over the restarted shard
        fallbacks = st["fallbacks"]
        assert fallbacks >= 1 and st["last_error"], st
        for row in (3, 250, 599):
            np.testing.assert_array_equal(si.search(vectors[row], 10)[0], one.search(vectors[row], 10)[0])
        assert si.transport_stats()["fallbacks"] == fallbacks  # answered by the new graph


@needs_ray
def test_compiled_transport_serves_concurrent_threads_and_idles_down(ray_local, tmp_path, corpus):
    from concurrent.futures import ThreadPoolExecutor

    vectors, ids, meta, texts = corpus
    one = _oracle("flat", corpus)
    with kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=2, path=tmp_path / "kb", transport="compiled", compiled_idle=1.0
    ) as si:
        si.add(vectors, ids, metadata=meta, texts=texts)
        rows = list(range(0, 600, 10))
        with ThreadPoolExecutor(4) as pool:  # one graph, one execution at a time: others fall back
            got = list(pool.map(lambda r: si.search(vectors[r], 5)[0], rows))
        for r, g in zip(rows, got):
            np.testing.assert_array_equal(g, one.search(vectors[r], 5)[0])
        deadline = time.monotonic() + 30
        while si.transport_stats()["ready"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not si.transport_stats()["ready"]  # torn down after 1 s without a query
        np.testing.assert_array_equal(si.search(vectors[5], 5)[0], one.search(vectors[5], 5)[0])
        assert _wait_compiled(si, 2)["builds"] >= 2  # that query asked for a new graph


@needs_ray
def test_bad_transport_is_rejected(ray_local, tmp_path):
    with pytest.raises(InvalidArgumentError, match="'actor', 'compiled' or 'socket'"):
        kbcore.distributed.ShardedIndex(DIM, shards=2, path=tmp_path / "kb", transport="carrier-pigeon")
    with pytest.raises(InvalidArgumentError, match="compiled_idle"):
        kbcore.distributed.ShardedIndex(DIM, shards=2, path=tmp_path / "kb2", compiled_idle=0)
    for many in (kbcore.distributed.MAX_SHARDS + 1, 1 << 80):  # one actor each: none is started
        with pytest.raises(InvalidArgumentError, match="shards must be at most 1024"):
            kbcore.distributed.ShardedIndex(DIM, shards=many, path=tmp_path / "kb3")
    assert not (tmp_path / "kb3").exists()


# ------------------------------------------------------------------------------------------
# a real two-node cluster on loopback

_CLUSTER_DRIVER = textwrap.dedent("""
    import json, sys, numpy as np, ray, kbcore
    from kbcore.distributed import ShardedIndex
    address, path = sys.argv[1], sys.argv[2]
    ray.init(address=address, _node_ip_address="127.0.0.2", log_to_driver=False)
    rng = np.random.default_rng(4)
    v = rng.standard_normal((400, 16)).astype(np.float32)
    ids = np.arange(400)
    meta = [{"document_id": i // 4} for i in range(400)]
    # Node-local storage: each shard is pinned to the node whose disk holds it.
    si = ShardedIndex(16, "l2", "flat", shards=4, path=path, storage="local")
    si.add(v, ids, metadata=meta)
    one = kbcore.Index(16, "l2", "flat")
    one.add(v, ids, metadata=meta)
    q = rng.standard_normal((5, 16)).astype(np.float32)
    same = bool((si.search(q, 10)[0] == one.search(q, 10)[0]).all())
    nodes = [n["node_id"] for n in si.shard_nodes()]
    ips = sorted({n["ip"] for n in si.shard_nodes()})
    si.close()
    # Reopened with a compiled graph, whose channels span both nodes.
    back = ShardedIndex.load(path, transport="compiled", compiled_idle=None)
    same = same and [n["node_id"] for n in back.shard_nodes()] == nodes
    same = same and bool((back.search(q, 10)[0] == one.search(q, 10)[0]).all()) and len(back) == 400
    same = same and all(bool((back.search(x, 10)[0] == one.search(x, 10)[0]).all()) for x in q)
    st = back.transport_stats()
    back.close()
    # And over sockets: Unix-domain to the shards on the driver's node, TCP to the others.
    sock = ShardedIndex.load(path, transport="socket")
    same = same and bool((sock.search(q, 10)[0] == one.search(q, 10)[0]).all())
    same = same and all(bool((sock.search(x, 10)[0] == one.search(x, 10)[0]).all()) for x in q)
    families = sorted(f for a in sock.shard_actors() for f in ray.get(a.socket_stats.remote()))
    ss = sock.transport_stats()
    sock.close()
    print(json.dumps({"same": same, "nodes": len(set(nodes)), "ips": ips, "rows": len(one),
                      "compiled": [st["ready"], st["builds"], st["fallbacks"]],
                      "socket": [ss["ready"], ss["builds"], ss["fallbacks"]], "families": families}))
""")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stops a `ray start --block` process and everything it started (its process group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # raylet, GCS and worker processes of that node
    except ProcessLookupError:
        pass
    proc.wait()


@needs_ray
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="the cluster test stops its nodes by process group (POSIX)")
def test_two_node_cluster_places_shards_on_both_nodes(tmp_path):
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    if not os.path.exists(ray_bin):
        pytest.skip(f"the ray command line is not installed next to {sys.executable}")
    port = _free_port("127.0.0.2")
    temp = tempfile.mkdtemp(prefix="kbr", dir="/tmp")  # short: Ray's socket paths must fit
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1", RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats"]
    procs = []
    try:
        with open(tmp_path / "head.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [
                        ray_bin,
                        "start",
                        "--head",
                        "--node-ip-address",
                        "127.0.0.2",
                        "--port",
                        str(port),
                        "--include-dashboard",
                        "false",
                        "--temp-dir",
                        temp,
                        *common,
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        address = f"127.0.0.2:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.2", port)) == 0:
                    break
            time.sleep(0.5)
        with open(tmp_path / "worker.log", "w") as log:
            procs.append(
                subprocess.Popen(
                    [ray_bin, "start", "--address", address, "--node-ip-address", "127.0.0.3", *common],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        wait_nodes = textwrap.dedent("""
            import sys, time, ray
            ray.init(address=sys.argv[1], _node_ip_address="127.0.0.2", log_to_driver=False)
            end = time.monotonic() + 60
            while sum(n["Alive"] for n in ray.nodes()) < 2 and time.monotonic() < end:
                time.sleep(0.5)
            print(sum(n["Alive"] for n in ray.nodes()))
        """)
        out = subprocess.run(
            [sys.executable, "-c", wait_nodes, address],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.stdout.strip().splitlines()[-1:] == ["2"], out.stderr[-2000:]
        out = subprocess.run(
            [sys.executable, "-c", _CLUSTER_DRIVER, address, str(tmp_path / "kb")],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=420,  # a driver, two raylets and four shards on 2 cores; slow under load
        )
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result == {
            "same": True,
            "nodes": 2,
            "ips": ["127.0.0.2", "127.0.0.3"],
            "rows": 400,
            "compiled": [True, 1, 0],
            "socket": [True, 4, 0],
            "families": ["tcp", "tcp", "unix", "unix"],
        }
    finally:
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(temp, ignore_errors=True)


@needs_ray
def test_a_closed_sharded_index_says_so(ray_local, tmp_path, corpus):
    vectors, ids, meta, _ = corpus
    si = kbcore.distributed.ShardedIndex(DIM, "cosine", "flat", shards=2, path=tmp_path / "kb")
    si.add(vectors[:10], ids[:10], metadata=meta[:10])
    si.close()
    with pytest.raises(InvalidArgumentError, match="is closed; open it with ShardedIndex.load"):
        si.search(vectors[0], 3)
    with pytest.raises(InvalidArgumentError, match="is closed"):
        si.add(vectors[:1], ids[:1], metadata=meta[:1])
    si.close()  # twice is fine
    again = kbcore.distributed.ShardedIndex.load(tmp_path / "kb")
    try:
        assert len(again) == 10
    finally:
        again.close()


@needs_ray
def test_sharded_load_reopens_each_shard_in_place_or_copied_as_mmap_says(ray_local, tmp_path, corpus):
    # mmap is how each shard reopens its checkpoint (Index.load's mmap): in place from the
    # file by default, copied into the shard's memory with mmap=False; the answers are the same
    vectors, ids, meta, texts = corpus
    path = tmp_path / "kb"
    q = np.random.default_rng(4).standard_normal(DIM).astype(np.float32)
    with kbcore.distributed.ShardedIndex(DIM, "cosine", "hnsw", shards=2, path=path, quantization="sq8", M=8) as si:
        si.add(vectors, ids, metadata=meta, texts=texts)
        si.save()
        want = si.search(q, 10, ef=64)
        assert [i["in_place"] for i in si.shard_info()] == [False, False]  # built in memory
    for mmap in (True, False):
        with kbcore.distributed.ShardedIndex.load(path, mmap=mmap) as back:
            assert [i["in_place"] for i in back.shard_info()] == [mmap, mmap]
            got = back.search(q, 10, ef=64)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(TypeError, match="mmap must be a bool"):
        kbcore.distributed.ShardedIndex.load(path, mmap="no")  # type: ignore[arg-type]
