"""Sharded knowledge bases (``create_knowledge_base(..., shards=N)``) against an unsharded twin.

Every sharded answer is compared to a knowledge base with a flat ``kbcore.Index`` holding the
same data (ingested in the same order, so chunk ids match): retrieval of every search type,
filters, deduplication, ``retrieve_key`` / ``retrieve_text``, after replacing, deleting,
compacting and reopening. Crash recovery runs the writer in a child process that is killed
(``os._exit``) at a commit point through ``kbcore.engine.commit.fault_hook``; reopening must
re-sync the shards with the manifest. ``kbcore serve`` serves a sharded knowledge base over
HTTP once. Ray runs locally on loopback (``ray.init(num_cpus=2)``); child processes join it
through ``RAY_ADDRESS`` (the engine's ``ray.init(address="auto")``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from ray_support import local_ray, ray, ray_mark, skip_without_ray

from kbcore import Engine
from kbcore.engine import SearchOptions
from kbcore.errors import InvalidArgumentError, InvalidTypeError

pytestmark = [ray_mark, skip_without_ray]

WORDS = [f"term{i}" for i in range(40)] + ["pump", "noise", "heat", "valve", "leak", "filter"]
TEAMS = ["infra", "data", "web"]
QUERIES = ["heat pump noise", "valve leak term3 term7", "filter term12 term5 pump", "term30 term31"]


@pytest.fixture(scope="module")
def ray_address():
    with local_ray():
        yield ray.get_runtime_context().gcs_address


def corpus(seed: int, n: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(8, 60)))
        docs.append(
            {
                "document_id": f"doc-{i}",
                "text": " ".join(words),
                "metadata": {"team": TEAMS[i % 3], "year": 2000 + i % 7},
            }
        )
    return docs


def fill(kb, docs) -> None:
    for d in docs:
        kb.ingest(text=d["text"], document_id=d["document_id"], metadata=d["metadata"])


def make_pair(engine: Engine, tag: str = "", **kw):
    common = dict(index="flat", chunk_size=80, chunk_overlap=10, **kw)
    return (
        engine.create_knowledge_base(f"one{tag}", **common),
        engine.create_knowledge_base(f"sharded{tag}", shards=2, **common),
    )


def assert_same_hits(got, want, *, exact_parts: bool = True) -> None:
    """The sharded page equals the unsharded one up to ties: the same scores in order (BM25
    up to float rounding of the summed terms); a run of equal scores holds the same chunks
    (at the page's end, as many); hits with the same id carry the same fields. ``part_ids``
    of fused dedup hits name the chunks met in the candidate window, whose cut among tied
    scores is the index's choice: compared only where ``exact_parts``."""
    assert len(got) == len(want)
    gs = np.array([h.score for h in got])
    ws = np.array([h.score for h in want])
    np.testing.assert_allclose(gs, ws, rtol=1e-5, atol=1e-6)
    tol = 1e-5
    for s in ws:
        g = {h.id for h in got if abs(h.score - s) <= tol}
        w = {h.id for h in want if abs(h.score - s) <= tol}
        assert len(g) == len(w) and (abs(s - ws[-1]) <= tol or g == w), (s, g, w)
    by_id = {h.id: h for h in want}
    for h in got:
        if h.id in by_id:
            o = by_id[h.id]
            assert (h.document_id, h.content, h.metadata, h.pipeline_name, h.chunk_index) == (
                o.document_id,
                o.content,
                o.metadata,
                o.pipeline_name,
                o.chunk_index,
            )
            if exact_parts:
                assert h.part_ids == o.part_ids
            else:
                assert h.chunk_index in h.part_ids or not h.part_ids


OPTION_SETS = [
    SearchOptions(),
    SearchOptions(deduplicate=True),
    SearchOptions(search_type="full_text"),
    SearchOptions(search_type="full_text", deduplicate=True),
    SearchOptions(search_type="hybrid"),
    SearchOptions(search_type="hybrid", fusion="linear", vector_weight=0.4),
    SearchOptions(search_type="hybrid", deduplicate=True, window=8),
    SearchOptions(filters={"team": "infra"}),
    SearchOptions(search_type="hybrid", filters={"year": {"$gte": 2003}, "team": {"$ne": "web"}}),
    SearchOptions(search_type="full_text", filters={"team": {"$in": ["data", "web"]}}, deduplicate=True),
    SearchOptions(score_threshold=0.3),
]


def assert_twins(one, sharded, top_k: int = 7) -> None:
    assert len(sharded) == len(one)
    assert sharded.count({"team": "infra"}) == one.count({"team": "infra"})
    assert [d.document_id for d in sharded.documents()] == [d.document_id for d in one.documents()]
    for q in QUERIES:
        for opts in OPTION_SETS:
            assert_same_hits(
                sharded.retrieve(q, top_k, opts), one.retrieve(q, top_k, opts), exact_parts=opts.search_type is None
            )


@pytest.fixture(scope="module")
def twins(ray_address, tmp_path_factory):
    engine = Engine(tmp_path_factory.mktemp("kb"))
    one, sharded = make_pair(engine)
    docs = corpus(7, 40)
    fill(one, docs)
    fill(sharded, docs)
    yield one, sharded
    engine.close()


def test_sharded_kb_answers_every_search_type_like_an_unsharded_flat_kb(twins):
    one, sharded = twins
    assert len(one) > 40  # several chunks per document: dedup and part_ids are exercised
    assert type(sharded.index).__name__ == "ShardedIndex" and sharded.index.shards == 2
    assert_twins(one, sharded)


def test_retrieve_key_and_retrieve_text_match_on_a_sharded_kb(twins):
    one, sharded = twins
    for q in QUERIES:
        for dedup in (False, True):
            got = sharded.retrieve_key(q, 5, deduplicate=dedup)
            want = one.retrieve_key(q, 5, deduplicate=dedup)
            assert [(k.key, round(k.distance, 5)) for k in got] == [(k.key, round(k.distance, 5)) for k in want]
            gt = sharded.retrieve_text(q, 5, deduplicate=dedup, search_type="hybrid")
            wt = one.retrieve_text(q, 5, deduplicate=dedup, search_type="hybrid")
            assert [(t.key, t.value, t.chunk) for t in gt] == [(t.key, t.value, t.chunk) for t in wt]


def test_replace_delete_compact_and_reopen_keep_a_sharded_kb_equal_to_unsharded(ray_address, tmp_path):
    engine = Engine(tmp_path)
    one, sharded = make_pair(engine)
    docs = corpus(11, 30)
    for kb in (one, sharded):
        fill(kb, docs)
        fill(kb, corpus(12, 6))  # replaces doc-0..doc-5 with other text
        kb.delete_document("doc-7")
        kb.delete_document("doc-8")
        kb.create_pipeline("short", chunk_size=40, chunk_overlap=0)
        kb.ingest(text=docs[9]["text"], document_id="doc-9", pipeline="short", metadata={"team": "web"})
    assert_twins(one, sharded)
    for kb in (one, sharded):
        kb.compact()
    assert sharded.stats().segments == 1
    assert_twins(one, sharded)
    engine.close()
    engine = Engine(tmp_path)  # reopening starts the shard actors again
    one, sharded = engine["one"], engine["sharded"]
    assert type(sharded.index).__name__ == "ShardedIndex"
    assert_twins(one, sharded)
    for kb in (one, sharded):
        kb.delete_document("doc-9", pipeline="short")
    assert_twins(one, sharded)
    engine.delete_knowledge_base("sharded")
    assert "sharded" not in engine
    engine.close()


def test_engine_mmap_reaches_a_sharded_kbs_shards(ray_address, tmp_path):
    # Engine(mmap=False) copies a sharded knowledge base's shard checkpoints into memory as it
    # does an unsharded one's index; the default reads them in place; the answers are the same
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="hnsw", quantization="sq8", chunk_size=80, shards=2)
    fill(kb, corpus(23, 20))
    kb.compact()  # one checkpoint per shard covering every row
    want = [[h.id for h in kb.retrieve(q, 8)] for q in QUERIES]
    engine.close()
    for mmap in (True, False):
        engine = Engine(tmp_path, mmap=mmap)
        kb = engine["kb"]
        assert {i["in_place"] for i in kb.index.shard_info()} == {mmap}
        assert [[h.id for h in kb.retrieve(q, 8)] for q in QUERIES] == want
        engine.close()


def test_a_vectors_only_sharded_kb_gets_its_dimension_at_the_first_ingest(ray_address, tmp_path):
    engine = Engine(tmp_path)
    one, sharded = make_pair(engine, embedder=False)
    assert sharded.index is None
    rng = np.random.default_rng(3)
    for i, d in enumerate(corpus(5, 12)):
        for kb in (one, sharded):
            p = kb.prepare(text=d["text"], document_id=d["document_id"], metadata=d["metadata"])
            kb.ingest_prepared(p, np.random.default_rng(i).standard_normal((len(p.texts), 12)))
    q = rng.standard_normal(12)
    for dedup in (False, True):
        assert_same_hits(sharded.retrieve(q, 6, deduplicate=dedup), one.retrieve(q, 6, deduplicate=dedup))
    assert sharded.dim == 12
    engine.close()


def test_a_sharded_kb_has_one_owner_at_a_time(ray_address, tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", index="flat", shards=2)
    kb.ingest(text="one owner at a time", document_id="d")
    with pytest.raises(InvalidArgumentError, match="already open"):
        Engine(tmp_path)["kb"]  # a second Engine would start a second set of shard actors
    kb.close()
    other = Engine(tmp_path)["kb"]  # closing released the shards
    assert [h.document_id for h in other.retrieve("owner", 1)] == ["d"]
    other.close()


def test_an_hnsw_sharded_kb_finds_what_exact_search_finds(ray_address, tmp_path):
    engine = Engine(tmp_path)
    one = engine.create_knowledge_base("one", index="flat", chunk_size=80, chunk_overlap=10)
    sharded = engine.create_knowledge_base("sharded", index="hnsw", ef=200, chunk_size=80, chunk_overlap=10, shards=2)
    docs = corpus(41, 25)
    fill(one, docs)
    fill(sharded, docs)
    assert sharded.wait_until_indexed(60) and sharded.pending_graph_rows == 0
    found = total = 0
    for q in QUERIES:
        want = {h.id for h in one.retrieve(q, 10)}
        found += len(want & {h.id for h in sharded.retrieve(q, 10)})
        total += len(want)
    assert found / total >= 0.95  # a few hundred rows per shard, ef=200: recall ~1
    engine.close()


def test_bad_shards_values_are_rejected_before_anything_is_created(ray_address, tmp_path):
    engine = Engine(tmp_path)
    with pytest.raises(InvalidArgumentError, match="shards must be at least 1"):
        engine.create_knowledge_base("a", shards=0)
    with pytest.raises(InvalidTypeError, match="shards must be None or an integer"):
        engine.create_knowledge_base("a", shards=True)
    with pytest.raises(InvalidTypeError, match="shards must be None or an integer"):
        engine.create_knowledge_base("a", shards="2")
    for many in (1025, 1 << 80):  # one Ray actor each: refused before any starts
        with pytest.raises(InvalidArgumentError, match="shards must be at most 1024"):
            engine.create_knowledge_base("a", shards=many)
    assert engine.knowledge_bases() == []


def test_without_ray_a_sharded_kb_names_the_extra_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    engine = Engine(tmp_path)
    with pytest.raises(ImportError, match=r'pip install "kbcore\[ray\]"'):
        engine.create_knowledge_base("a", shards=2)
    assert engine.knowledge_bases() == []


# -- crash recovery ---------------------------------------------------------------------------

EXTRA = "an extra document about term1 term2 heat valve " * 4

CHILD = f"EXTRA = {EXTRA!r}\n" + textwrap.dedent("""
    import os, sys
    import numpy as np
    from kbcore import Engine
    from kbcore.engine import commit

    data, scenario, docs = sys.argv[1], sys.argv[2], __import__("json").loads(sys.argv[3])
    kb = Engine(data)["sharded"]
    if scenario == "shards-lost-rows":
        res = kb.ingest(text=EXTRA, document_id="extra")  # committed, its vector file kept
        ids = np.sort(np.asarray(kb.index.ids()))[-res.chunks:]
        kb.index.remove(ids)  # damage the shards behind the engine's back, then die
        os._exit(17)
    point = "manifest-committed" if scenario == "delete" else "index-written"
    def crash(at):
        if at == point:
            os._exit(17)
    commit.fault_hook = crash
    if scenario == "ingest-new":
        kb.ingest(text="a brand new heat pump document", document_id="new-doc")
    elif scenario == "ingest-replace":
        kb.ingest(text=docs[0]["text"], document_id="doc-1", metadata=docs[0]["metadata"])
    elif scenario == "delete":
        kb.delete_document("doc-2")
    elif scenario == "first-ingest":  # a vectors-only KB: the shards are created by this ingest
        p = kb.prepare(text="the very first document", document_id="first")
        kb.ingest_prepared(p, np.ones((len(p.texts), 8)))
    os._exit(0)  # the crash point was not reached
""")


@pytest.mark.parametrize(
    "scenario",
    [
        "ingest-new",  # killed before the manifest: shards hold rows the manifest does not
        "ingest-replace",  # the same, with doc-1's old rows still live
        "delete",  # killed after the manifest dropped doc-2: the shards still hold it
        "shards-lost-rows",  # shards lack live rows: re-added from the segment's vector file
    ],
)
def test_reopening_after_a_crash_resyncs_the_shards_with_the_manifest(ray_address, tmp_path, scenario):
    engine = Engine(tmp_path)
    one, sharded = make_pair(engine)
    docs = corpus(21, 12)
    fill(one, docs)
    fill(sharded, docs)
    sharded.close()  # the child process owns the shards now
    env = dict(os.environ, RAY_ADDRESS=ray_address)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), scenario, json.dumps(docs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 17, proc.stderr[-3000:]
    if scenario == "delete":
        one.delete_document("doc-2")  # what the crashed commit made durable
    if scenario == "shards-lost-rows":
        one.ingest(text=EXTRA, document_id="extra")
    sharded = Engine(tmp_path)["sharded"]
    if scenario == "shards-lost-rows":
        assert sharded.stats().vector_files > 0  # what made the re-adding possible
    assert "new-doc" not in sharded
    assert_twins(one, sharded)
    assert sorted(sharded.index.ids().tolist()) == sorted(one.index.ids().tolist())
    sharded.ingest(text="after recovery heat pump valve", document_id="later")
    one.ingest(text="after recovery heat pump valve", document_id="later")
    assert_twins(one, sharded)
    engine.close()
    sharded.close()


# -- serving ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kbcore_serve_serves_a_sharded_kb_over_http(ray_address, tmp_path):
    httpx = pytest.importorskip("httpx", reason="the HTTP test needs httpx (pip install 'kbcore[test]')")
    pytest.importorskip("uvicorn", reason="kbcore serve needs uvicorn (pip install 'kbcore[server]')")
    engine = Engine(tmp_path)
    one, sharded = make_pair(engine)
    docs = corpus(31, 20)
    fill(one, docs)
    fill(sharded, docs)
    sharded.close()  # kbcore serve owns the shards
    port = _free_port()
    env = dict(os.environ, RAY_ADDRESS=ray_address, KBCORE_API_KEYS="sharded-key-123456")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kbcore",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data",
            str(tmp_path),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "kbcore serve did not start"
            time.sleep(0.1)
        auth = {"Authorization": "Bearer sharded-key-123456"}
        for q in QUERIES[:2]:
            condition = {
                "logical_operator": "and",
                "conditions": [{"name": ["team"], "comparison_operator": "is", "value": "infra"}],
            }
            resp = httpx.post(
                f"{url}/retrieval",
                headers=auth,
                timeout=60,
                json={
                    "knowledge_id": "sharded",
                    "query": q,
                    "metadata_condition": condition,
                    "retrieval_setting": {"top_k": 4, "score_threshold": 0.0},
                },
            )
            assert resp.status_code == 200, resp.text
            records = resp.json()["records"]
            want = one.retrieve(q, 4, filters={"team": "infra"})
            assert len(records) == len(want) > 0
            np.testing.assert_allclose([r["score"] for r in records], [h.score for h in want], rtol=1e-5, atol=1e-6)
            assert {r["content"] for r in records} <= {h.content for h in one.retrieve(q, 8, filters={"team": "infra"})}
            assert all(r["metadata"]["team"] == "infra" for r in records)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    engine.close()


def test_cli_ingest_creates_a_sharded_kb_and_query_reopens_it(ray_address, tmp_path, capsys):
    from kbcore.cli import main

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "keys.md").write_text("# Keys\n\nRotate signing keys every ninety days.")
    (docs / "lunch.txt").write_text("Lunch is served at noon in the canteen.")
    data = str(tmp_path / "data")
    assert main(["ingest", str(docs), "--kb", "team", "--data", data, "--shards", "2", "--index", "flat"]) == 0
    assert "ingested 2 documents" in capsys.readouterr().out
    # kbcore query in its own process reopens the shards (joining this Ray through RAY_ADDRESS)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kbcore",
            "query",
            "rotate signing keys",
            "--kb",
            "team",
            "--data",
            data,
            "--top-k",
            "1",
            "--json",
        ],
        env=dict(os.environ, RAY_ADDRESS=ray_address),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)[0]["document_id"] == "keys.md"
    with Engine(data) as engine:
        info = engine["team"].info()
    assert info["shards"] == 2 and info["documents"] == 2


def test_shards_left_by_an_uncommitted_first_ingest_are_replaced(ray_address, tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("sharded", embedder=False, index="flat", shards=2)
    assert kb.index is None  # no dimension yet: no shards
    kb.close()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), "first-ingest", "[]"],
        env=dict(os.environ, RAY_ADDRESS=ray_address),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 17, proc.stderr[-3000:]
    assert os.path.exists(tmp_path / "sharded" / "shards" / "sharded-index.json")  # 8-d, not committed
    kb = Engine(tmp_path)["sharded"]
    assert kb.index is None and kb.dim is None and len(kb) == 0
    p = kb.prepare(text="a first document of another dimension", document_id="other")
    kb.ingest_prepared(p, np.eye(len(p.texts), 5) + 0.1)
    assert kb.dim == 5 and kb.index.dim == 5 and len(kb) == len(p.texts)
    assert [h.document_id for h in kb.retrieve(np.eye(5)[0] + 0.1, 1)] == ["other"]
    kb.close()
