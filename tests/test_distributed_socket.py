"""kbcore.distributed with ``transport="socket"``: each shard serves read-only queries on its
own socket (Unix-domain on the driver's node, TCP from another; docs/scale-out.md).

The first tests run the socket server and client in this process (no Ray): framing, large
frames, TCP, timeouts, the token and malformed frames. The rest run a local Ray instance
(``ray.init(num_cpus=2)``) and compare every socket answer with the actor path's on the same
shards and with one kbcore Index holding the same rows. Failure tests (a shard killed after
an acknowledged write, a dead shard) also run on the socket transport in test_distributed.py.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
import threading
import time

import numpy as np
import pytest
from ray_support import local_ray, needs_ray, ray

import kbcore
import kbcore.distributed
from kbcore import fusion
from kbcore.distributed.sockets import AVAILABLE, NOOP, ShardServer, SocketScatter, connect, open_fds
from kbcore.distributed.transport import _COMPILED_METHODS, pack_reply, pack_request, unpack_reply, unpack_request
from kbcore.errors import InvalidArgumentError

pytestmark = pytest.mark.skipif(
    not AVAILABLE, reason="the socket transport needs Unix-domain sockets and poll(), which this platform lacks"
)

DIM = 16
WORDS = [f"w{i}" for i in range(60)]
HEADER = struct.Struct("<Q")


def make_rows(rng: np.random.Generator, n: int, *, per_doc: int = 4):
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    docs = [f"doc-{i // per_doc}" for i in range(n)]
    meta = [{"document_id": docs[i], "lang": ["en", "de", "fr"][i % 3], "year": 2000 + i % 20} for i in range(n)]
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 25)))) for _ in range(n)]
    return vectors, ids, meta, texts


def ranked_equal(ids, scores, oracle_ids, oracle_scores, *, rtol=1e-6):
    """Sharded page == oracle page up to ties at equal scores (as in test_distributed.py)."""
    k = len(ids)
    np.testing.assert_allclose(scores, oracle_scores[:k], rtol=rtol, atol=1e-6)
    assert len(set(ids.tolist())) == k
    for i in range(k):
        tied = np.abs(oracle_scores - scores[i]) <= 1e-6 + rtol * abs(scores[i])
        assert ids[i] in set(oracle_ids[tied].tolist()), (i, ids[i])


def _wait(cond, seconds: float = 30, what: str = "condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {seconds} s")


# ------------------------------------------------------------------------------------------
# the server and the client in this process (no Ray)


def _echo_server(family="unix", *, delay=0.0, methods=("search", "count", "search_text")):
    """A server whose 'search' answers the query's row sums (float32) as ids/dists."""

    def handle(method, args):
        if delay:
            time.sleep(delay)
        if method == "count":
            raise InvalidArgumentError(f"bad filter {args[0]!r}")
        q = np.atleast_2d(args[0])
        ids = np.arange(q.shape[0] * 3, dtype=np.int64).reshape(q.shape[0], 3)
        dist = np.repeat(q.sum(axis=1, keepdims=True), 3, axis=1).astype(np.float32)
        return pack_reply("search", (ids, dist))

    return ShardServer(handle, methods, decode=unpack_request, family=family, host="127.0.0.1")


@pytest.mark.parametrize("family", ["unix", "tcp"])
def test_socket_scatter_round_trips_small_and_large_frames(family):
    servers = [_echo_server(family) for _ in range(3)]
    try:
        sc = SocketScatter(3, lambda shards: {i: servers[i].describe() for i in shards}, timeout=10)
        assert sc.ready
        rng = np.random.default_rng(3)
        for rows in (1, 7, 40_000):  # 40,000 x 16 float32: a 2.5 MB request, 1.4 MB answers
            q = rng.standard_normal((rows, DIM)).astype(np.float32)
            replies = sc.call(pack_request("search", (q, 3, None, None, 1)), 10)
            assert replies is not None and len(replies) == 3
            for r in replies:
                ids, dist = unpack_reply(r)
                assert ids.shape == (rows, 3)
                np.testing.assert_allclose(dist[:, 0], q.sum(axis=1), rtol=1e-5, atol=1e-5)
        assert sc.call(b"", 5, kind=NOOP) == [b"", b"", b""]
        # A shard's own error comes back as raised there; the connections stay usable.
        with pytest.raises(InvalidArgumentError, match="bad filter 'x'"):
            sc.call(pack_request("count", ("x",)), 10)
        assert sc.fallbacks == 0 and sc.connects == 3  # one connection per shard, kept
        assert all(s.stats()["served"] == 4 for s in servers)
        fds = sc.fds()
        assert len(fds) == 3 and open_fds(fds) == 3
        sc.close()
        assert open_fds(fds) == 0
        assert sc.call(pack_request("search", (q[:1], 3, None, None, 1)), 10) is None  # closed
    finally:
        stats = [s.stop() for s in servers]
    assert all(st["connections"] == 0 and st["socket_fds"] == 0 and not st["listening"] for st in stats)
    assert not [t for t in threading.enumerate() if t.name.startswith("kbcore-shard-socket")]


def test_frame_reader_splits_pipelined_frames_across_its_buffer():
    from kbcore.distributed.sockets import _ProtocolError, _Reader

    rng = np.random.default_rng(12)
    sizes = [1, 9, 40_000, 65_530, 3, 200_000, 70_000, 17, 65_536 - 8, 5]
    bodies = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    a, b = socket.socketpair()
    try:
        stream = b"".join(HEADER.pack(len(x)) + x for x in bodies)
        sender = threading.Thread(target=a.sendall, args=(stream,))
        sender.start()
        reader = _Reader(b, 1 << 20)
        got = [bytes(reader.frame()) for _ in bodies]
        sender.join()
        assert got == bodies
        a.sendall(HEADER.pack(10) + b"short")
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(_ProtocolError, match="cut short"):
            reader.frame()
    finally:
        a.close()
        b.close()


def test_socket_scatter_times_out_and_fetches_the_address_again():
    slow = _echo_server(delay=1.5)
    fetched = []

    def fetch(shards):
        fetched.append(list(shards))
        return {0: slow.describe()}

    try:
        sc = SocketScatter(1, fetch, timeout=10)
        q = np.ones((1, DIM), np.float32)
        t0 = time.monotonic()
        assert sc.call(pack_request("search", (q, 3, None, None, 1)), 0.3) is None
        assert time.monotonic() - t0 < 1.2  # the deadline, not the shard, ended the wait
        assert not sc.ready and "no answer within 0.3 s" in sc.last_error and sc.fallbacks == 1
        assert sc.call(pack_request("search", (q, 3, None, None, 1)), 5) is None  # no address: actor path
        sc.refresh([0])
        sc.refresh([0])  # at most one fetch per second per shard
        assert fetched == [[0], [0]] and sc.ready and sc.reconnects == 1
        replies = sc.call(pack_request("search", (q, 3, None, None, 1)), 5)
        assert replies is not None and unpack_reply(replies[0])[1][0, 0] == pytest.approx(DIM)
        sc.close()
    finally:
        slow.stop()


def test_a_dead_server_makes_the_call_fall_back():
    server = _echo_server()
    sc = SocketScatter(1, lambda shards: {0: server.describe()}, timeout=5)
    q = np.ones((1, DIM), np.float32)
    assert sc.call(pack_request("search", (q, 3, None, None, 1)), 5) is not None
    server.stop()  # the kept connection is closed under the driver
    assert sc.call(pack_request("search", (q, 3, None, None, 1)), 5) is None
    assert not sc.ready and "shard 0" in sc.last_error
    sc.refresh([0])  # the same (stopped) address: connecting fails, the call falls back again
    assert sc.call(pack_request("search", (q, 3, None, None, 1)), 5) is None
    assert "connecting" in sc.last_error
    sc.close()


def _raw(desc, token=None):
    family = socket.AF_UNIX if desc["family"] == "unix" else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(desc["address"] if desc["family"] == "unix" else tuple(desc["address"]))
    if token is not None:
        body = b"H" + token
        s.sendall(HEADER.pack(len(body)) + body)
        assert s.recv(9) == HEADER.pack(1) + b"K"
    return s


def _closed_by_peer(s) -> bool:
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    finally:
        s.close()


_APPLY = b"QP" + pickle.dumps(("apply", (1, 2)), protocol=5)  # a write: never over the socket
_SHORT_SEARCH = b"QV" + struct.pack("<qqqqq", 1000, DIM, 10, -1, 1) + b"\0" * 64  # 1000 rows announced, 1 sent
# Each bad frame, sent after a correct token; the server closes that connection.
BAD_FRAMES = {
    "oversize": HEADER.pack((1 << 30) + 1) + b"Q",
    "empty": HEADER.pack(0),
    "unknown kind": HEADER.pack(3) + b"Zzz",
    "undecodable request": HEADER.pack(5) + b"Q\x80\x05xx",
    "method not served": HEADER.pack(len(_APPLY)) + _APPLY,
    "search request shorter than its rows": HEADER.pack(len(_SHORT_SEARCH)) + _SHORT_SEARCH,
}


def _check_bad_input_is_refused(desc, stats, answer_ok):
    before = stats()
    rejected, conns = before["rejected"], before["connections"]
    with pytest.raises(ConnectionRefusedError, match="refused the token"):
        connect(dict(desc, token=b"x" * 32), 5)
    s = _raw(desc)  # a token too long for a handshake frame
    s.sendall(HEADER.pack(10_000) + b"H")
    assert _closed_by_peer(s)
    for name, frame in BAD_FRAMES.items():
        s = _raw(desc, desc["token"])
        s.sendall(frame)
        assert _closed_by_peer(s), name
    s = _raw(desc, desc["token"])  # a frame cut short: the driver goes away mid-frame
    s.sendall(HEADER.pack(1000) + b"Q" + b"\0" * 10)
    s.close()
    _wait(lambda: stats()["rejected"] >= rejected + 3 + len(BAD_FRAMES), 10, "every bad input counted")
    _wait(lambda: stats()["connections"] == conns, 10, "bad connections closed")
    answer_ok()  # the shard still serves


def test_bad_token_and_malformed_frames_close_only_that_connection():
    server = _echo_server()
    desc = server.describe()

    def answer_ok():
        sc = SocketScatter(1, lambda shards: {0: desc}, timeout=5)
        assert sc.call(pack_request("search", (np.ones((1, DIM), np.float32), 3, None, None, 1)), 5) is not None
        sc.close()

    try:
        _check_bad_input_is_refused(desc, server.stats, answer_ok)
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------
# on a local Ray instance


@pytest.fixture(scope="module")
def ray_local():
    with local_ray() as ctx:
        yield ctx


@pytest.fixture(scope="module")
def corpus():
    return make_rows(np.random.default_rng(2024), 600)


def _oracle(corpus):
    vectors, ids, meta, texts = corpus
    one = kbcore.Index(DIM, "cosine", "flat")
    one.add(vectors, ids, metadata=meta, texts=texts)
    return one


WHERES = (None, {"lang": "de"}, {"year": {"$gte": 2010}, "lang": {"$in": ["en", "fr"]}})


def _answers(si, qs):
    """Every read-only query kind, as plain values."""
    out = []
    for where in WHERES:
        out.append(si.search(qs, 10, where=where))
    out.append([(g.key, g.ids, g.distances) for g in si.search_groups(qs[0], 6, group_size=2)])
    out.append(si.search_text("w3 w17 w40", 10))
    out.append(si.text_stats("w3 w17"))
    out.append(si.search_hybrid(qs[1], "w4 w9", 10, window=30))
    out.append(si.count({"lang": "en"}))
    return out


@needs_ray
@pytest.mark.parametrize("shards", [1, 2, 4])
def test_socket_transport_answers_as_the_actor_path_and_one_index(ray_local, tmp_path, corpus, shards):
    vectors, ids, meta, texts = corpus
    one = _oracle(corpus)
    qs = np.random.default_rng(shards).standard_normal((5, DIM)).astype(np.float32)
    with kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=shards, path=tmp_path / "kb", transport="socket"
    ) as si:
        si.add(vectors, ids, metadata=meta, texts=texts)
        assert si.transport == "socket"
        got = _answers(si, qs)
        st = si.transport_stats()
        assert st["ready"] and st["fallbacks"] == 0 and st["builds"] == shards, st  # all over the sockets
        served = sum(ray.get(a.socket_stats.remote())["unix"]["served"] for a in si.shard_actors())
        # 3 searches, groups, BM25 (statistics + scoring), statistics, hybrid (3), count
        assert served == shards * 11
        calls = si._calls
        sock, calls.socket = calls.socket, None  # the same shards over actor calls
        try:
            want = _answers(si, qs)
        finally:
            calls.socket = sock
    for (gi, gd), (wi, wd) in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(gd, wd)
    assert got[3] == want[3]  # groups: (key, ids, distances) lists
    np.testing.assert_array_equal(got[4][0], want[4][0])
    np.testing.assert_array_equal(got[4][1], want[4][1])
    assert got[5:] == want[5:]  # BM25 statistics, hybrid pairs, count
    # ... and one index over the same rows.
    for (gi, gd), where in zip(got[:3], WHERES):
        full_ids, full_dist = one.search(qs, 600, where=where)
        for q in range(len(qs)):
            keep = full_ids[q] >= 0
            ranked_equal(gi[q], gd[q], full_ids[q][keep], full_dist[q][keep])
    groups = one.search_groups(qs[0], 6, group_by="document_id", group_size=2)
    assert [(k, i) for k, i, _ in got[3]] == [(g.key, g.ids) for g in groups]
    ti, ts = one.search_text("w3 w17 w40", 600)
    ranked_equal(got[4][0], got[4][1], ti, ts)
    assert got[5] == one.text_stats("w3 w17")
    ids_v, dist_v = one.search(qs[1], 600)
    order = np.lexsort((ids_v, dist_v))[:30]
    tids, tsc = one.search_text("w4 w9", 600)
    torder = np.lexsort((tids, -tsc))[:30]
    fused = fusion.rrf(
        [
            list(zip(ids_v[order].tolist(), (1.0 - dist_v[order]).tolist())),
            list(zip(tids[torder].tolist(), tsc[torder].tolist())),
        ],
        k=60,
    )[:10]
    assert [i for i, _ in got[6]] == [i for i, _ in fused]
    assert got[7] == one.count({"lang": "en"})


@needs_ray
def test_socket_transport_is_chosen_by_the_environment_and_sees_acknowledged_writes(
    ray_local, tmp_path, corpus, monkeypatch
):
    from concurrent.futures import ThreadPoolExecutor

    vectors, ids, meta, texts = corpus
    monkeypatch.setenv("KBCORE_SHARD_TRANSPORT", "socket")
    with kbcore.distributed.ShardedIndex(DIM, "cosine", "flat", shards=2, path=tmp_path / "kb") as si:
        assert si.transport == "socket"
        si.add(vectors[:300], ids[:300], metadata=meta[:300], texts=texts[:300])
        # Read your writes: a search sent after add() returned finds the new row.
        rng = np.random.default_rng(77)
        for j in range(20):
            v = rng.standard_normal(DIM).astype(np.float32)
            si.add(v[None], [50_000 + j], metadata=[{"document_id": f"new-{j}"}])
            hit, dist = si.search(v, 1)
            assert hit[0] == 50_000 + j and dist[0] == pytest.approx(0, abs=1e-5)
            si.remove([50_000 + j])
            assert 50_000 + j not in si.search(v, 5)[0]
        # Concurrent searches while a writer adds: each thread takes its own connections.
        one = _oracle((vectors[:300], ids[:300], meta[:300], texts[:300]))
        rows = list(range(0, 300, 5))

        def writer():
            for lo in range(300, 600, 50):
                si.add(vectors[lo : lo + 50], ids[lo : lo + 50], metadata=meta[lo : lo + 50])

        with ThreadPoolExecutor(4) as pool:
            w = pool.submit(writer)
            got = list(pool.map(lambda r: si.search(vectors[r], 1)[0][0], rows))
            w.result()
        assert got == [ids[r] for r in rows] == [one.search(vectors[r], 1)[0][0] for r in rows]
        assert len(si) == 600
        st = si.transport_stats()
        assert st["fallbacks"] == 0 and st["builds"] >= 2, st
        # A request and answers larger than one receive buffer.
        big = rng.standard_normal((12_000, DIM)).astype(np.float32)
        np.testing.assert_array_equal(si.search(big, 10)[0], _oracle(corpus).search(big, 10)[0])
        with pytest.raises(InvalidArgumentError, match="bogus"):  # a shard's own error, as is
            si.search(vectors[0], 5, where={"lang": {"$bogus": 1}})
        assert si.transport_stats()["fallbacks"] == 0


@needs_ray
def test_socket_shard_refuses_bad_tokens_and_frames_and_keeps_serving(ray_local, tmp_path, corpus):
    vectors, ids, meta, texts = corpus
    with kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=1, path=tmp_path / "kb", transport="socket"
    ) as si:
        si.add(vectors, ids, metadata=meta, texts=texts)
        actor = si.shard_actors()[0]
        desc = ray.get(actor.serve_socket.remote(ray.get_runtime_context().get_node_id()))
        assert desc["family"] == "unix"
        if sys.platform.startswith("linux"):
            assert desc["address"].startswith("\0kbcore-shard-")  # the abstract namespace
        else:  # a socket file in a directory only this user may enter
            assert os.stat(os.path.dirname(desc["address"])).st_mode & 0o077 == 0
        pid = si.shard_nodes()[0]["pid"]
        one = _oracle(corpus)

        def answer_ok():
            np.testing.assert_array_equal(si.search(vectors[9], 10)[0], one.search(vectors[9], 10)[0])

        _check_bad_input_is_refused(desc, lambda: ray.get(actor.socket_stats.remote())["unix"], answer_ok)
        assert si.shard_nodes()[0]["pid"] == pid  # the same process: nothing crashed
        assert si.transport_stats()["fallbacks"] == 0


@needs_ray
def test_socket_transport_reconnects_after_a_restart_and_close_leaves_nothing(ray_local, tmp_path, corpus):
    vectors, ids, meta, texts = corpus
    one = _oracle(corpus)
    si = kbcore.distributed.ShardedIndex(
        DIM, "cosine", "flat", shards=2, path=tmp_path / "kb", timeout=60, transport="socket"
    )
    try:
        si.add(vectors[:400], ids[:400], metadata=meta[:400], texts=texts[:400])
        si.add(vectors[400:], ids[400:], metadata=meta[400:], texts=texts[400:])  # acknowledged, in the log
        np.testing.assert_array_equal(si.search(vectors[3], 10)[0], one.search(vectors[3], 10)[0])
        old = si.shard_nodes()[0]["pid"]
        ray.kill(si.shard_actors()[0], no_restart=False)
        _wait(lambda: si.shard_nodes()[0]["pid"] != old, 60, "shard 0 restarted")
        # The kept connection meets a dead process: this query takes the actor path, which
        # then fetches the restarted shard's new address.
        np.testing.assert_array_equal(si.search(vectors[17], 10)[0], one.search(vectors[17], 10)[0])
        st = si.transport_stats()
        assert st["fallbacks"] == 1 and st["reconnects"] == 1 and st["ready"] and "shard 0" in st["last_error"], st
        for row in (5, 250, 599):  # over the new socket, every acknowledged row is there
            np.testing.assert_array_equal(si.search(vectors[row], 10)[0], one.search(vectors[row], 10)[0])
        assert si.transport_stats()["fallbacks"] == 1 and len(si) == 600
        assert ray.get(si.shard_actors()[0].socket_stats.remote())["unix"]["served"] == 3
        # A shard that stops its server (all connections closed): the same recovery.
        stopped = ray.get(si.shard_actors()[1].stop_socket.remote())["unix"]
        assert stopped["connections"] == 0 and stopped["socket_fds"] == 0 and not stopped["listening"]
        assert stopped["threads"] == 0  # no serving thread left in that process
        np.testing.assert_array_equal(si.search(vectors[8], 10)[0], one.search(vectors[8], 10)[0])
        np.testing.assert_array_equal(si.search(vectors[9], 10)[0], one.search(vectors[9], 10)[0])
        assert si.transport_stats()["fallbacks"] == 2 and si.transport_stats()["reconnects"] == 2
        fds = si._calls.socket.fds()
        assert len(fds) == 2 and open_fds(fds) == 2
        actors = si.shard_actors()
        _wait(  # one kept connection (one thread beside the listener) per shard
            lambda: all(
                s["connections"] == 1 and s["threads"] == 2
                for s in (ray.get(a.socket_stats.remote())["unix"] for a in actors)
            ),
            10,
            "one connection per shard",
        )
    finally:
        si.close()
    assert open_fds(fds) == 0  # the driver's connections are closed
    assert not [t for t in threading.enumerate() if t.name.startswith("kbcore")]

    def gone(a) -> bool:  # ray.kill is asynchronous
        try:
            ray.get(a.socket_stats.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            return True
        return False

    _wait(lambda: all(gone(a) for a in actors), 30, "the shard processes gone")


def test_requests_round_trip_raw_for_plain_searches_and_pickled_otherwise():
    q = np.random.default_rng(1).standard_normal((3, DIM)).astype(np.float32)
    for method in ("search", "search_timed"):
        for ef in (None, 40):
            raw = pack_request(method, (q, 7, None, ef, 2))
            assert raw[:1] in (b"V", b"T") and len(raw) == 41 + q.nbytes  # no pickle
            got_method, (gq, k, where, gef, threads) = unpack_request(raw)
            assert (got_method, k, where, gef, threads) == (method, 7, None, ef, 2)
            np.testing.assert_array_equal(gq, q)
    for args in ((q, 7, {"lang": "en"}, None, 1), (q[:, :8].copy(order="F"), 7, None, None, 1)):
        raw = pack_request("search", args)
        assert raw[:1] == b"P"  # a filter, or an array that is not C-contiguous: pickled
        np.testing.assert_array_equal(unpack_request(raw)[1][0], args[0])
    assert unpack_request(pack_request("count", ({"a": 1},))) == ("count", ({"a": 1},))
    with pytest.raises(ValueError, match="does not hold"):
        unpack_request(pack_request("search", (q, 7, None, None, 1))[:-4])
    with pytest.raises(ValueError, match="unknown request kind"):
        unpack_request(b"Zzz")


def test_a_platform_without_unix_sockets_or_poll_refuses_the_socket_transport(tmp_path, monkeypatch):
    monkeypatch.setattr("kbcore.distributed.sockets.AVAILABLE", False)
    with pytest.raises(InvalidArgumentError, match="transport='socket' needs Unix-domain sockets and poll"):
        kbcore.distributed.ShardedIndex(DIM, shards=2, path=tmp_path / "kb", transport="socket")
    assert not (tmp_path / "kb").exists()  # refused before any shard started


def test_socket_methods_are_the_read_only_ones():
    assert {"search", "search_groups", "text_stats", "search_text", "count"} == _COMPILED_METHODS
    from kbcore.distributed.transport import _SOCKET_METHODS

    assert {"search_timed", "size"} == _SOCKET_METHODS - _COMPILED_METHODS
    assert not _SOCKET_METHODS & {"apply", "discard", "checkpoint", "remove_document", "build_graph"}
