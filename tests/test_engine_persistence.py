"""Knowledge engine persistence: reopen, crash safety (kill -9 of a writer), atomic re-ingest,
failed commits, corruption, checkpoints and compaction."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from kbcore import Engine
from kbcore import engine as engine_mod
from kbcore.chunking import chunk_text
from kbcore.engine import Document, storage
from kbcore.errors import FormatError

CHUNK_SIZE = 100


def _doc_text(doc: str, version: int) -> str:
    n = 3 + (sum(map(ord, doc)) + version) % 9
    return " ".join(f"{doc} version {version} sentence {s} about keys." for s in range(n))


def _op(j: int):
    if j % 5 == 4:
        return ("many", [f"m{j}-{x}" for x in range(6)])
    if j % 7 == 6:
        return ("delete", f"d{j - 3}")
    if j % 4 == 3:
        return ("ingest", f"d{j - 1}", 2)
    return ("ingest", f"d{j}", 1)


def _simulate(n_ops: int) -> dict[str, int]:
    state: dict[str, int] = {}
    for j in range(n_ops):
        op = _op(j)
        if op[0] == "many":
            state.update({d: 1 for d in op[1]})
        elif op[0] == "delete":
            state.pop(op[1], None)
        else:
            state[op[1]] = op[2]
    return state


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import kbcore.engine as eng
    from test_engine_persistence import _op, _doc_text
    eng.manifest.CKPT_MIN_ROWS = 40        # checkpoint and compact often: more crash windows
    eng.manifest.MAX_SEGMENTS = 6
    kb = eng.Engine({path!r}).get_knowledge_base("kb")
    j = {start}
    while True:
        op = _op(j)
        if op[0] == "many":
            kb.ingest_many([eng.Document(text=_doc_text(d, 1), document_id=d, metadata={{"v": 1}})
                            for d in op[1]])
        elif op[0] == "delete":
            kb.delete_document(op[1], missing_ok=True)
        else:
            kb.ingest(text=_doc_text(op[1], op[2]), document_id=op[1], metadata={{"v": op[2]}})
        print(j, flush=True)
        j += 1
    """
)


def _live_ids_on_disk(path) -> np.ndarray:
    """The chunk ids of the live documents, read from the manifest and the segment files."""
    m = storage.load_manifest(str(path))
    parts = []
    for entry in m["segments"]:
        ids = storage.read_arrow(str(path), entry["files"]["chunks"]).column("__id").to_numpy()
        counts = storage.read_arrow(str(path), entry["files"]["docs"]).column("n_chunks").to_numpy()
        live = np.ones(len(counts), bool)
        live[entry["deleted_docs"]] = False
        parts.append(ids[np.repeat(live, counts)])
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)


def _check_consistent(kb) -> dict[str, int]:
    """The knowledge base agrees with itself; returns document -> version."""
    state = {}
    total = 0
    for info in kb.documents():
        v = info.metadata["v"]
        expect = len(chunk_text(_doc_text(info.document_id, v), chunk_size=CHUNK_SIZE, chunk_overlap=10))
        assert info.chunks == expect, info
        assert kb.count({"document_id": info.document_id}) == expect
        state[info.document_id] = v
        total += info.chunks
    assert len(kb) == total
    live = _live_ids_on_disk(kb.path)
    np.testing.assert_array_equal(np.sort(kb.index.ids()) if kb.index is not None else [], live)
    if state:
        hits = kb.retrieve("sentence about keys", top_k=20)
        assert hits and all(state.get(h.document_id) == h.metadata["v"] for h in hits)
    return state


def test_kill_9_during_ingest_leaves_the_last_good_state(tmp_path):
    path = str(tmp_path / "data")
    Engine(path).create_knowledge_base("kb", chunk_size=CHUNK_SIZE, chunk_overlap=10)
    rng = random.Random(1234)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    start = 0
    for round_ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER.format(tests=tests_dir, path=path, start=start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        acked = []
        reader = threading.Thread(target=lambda acked=acked, proc=proc: acked.extend(int(x) for x in proc.stdout))
        reader.start()
        deadline = time.monotonic() + 30
        while not acked and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert acked, f"the writer made no progress: {proc.stderr.read()}"
        time.sleep(rng.uniform(0.05, 0.6))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join()
        proc.stdout.close()
        proc.stderr.close()
        last = acked[-1]
        kb = Engine(path).get_knowledge_base("kb")  # opens: no lock left behind, files consistent
        state = _check_consistent(kb)
        # every acknowledged operation is there; at most the one in flight is too
        if state == _simulate(last + 1):
            start = last + 1
        else:
            assert state == _simulate(last + 2), f"round {round_}: state after op {last} lost or mixed"
            start = last + 2
        kb.close()
    assert len(os.listdir(os.path.join(path, "kb"))) < 20  # leftovers were collected


def test_reopen_restores_everything(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", chunk_size=CHUNK_SIZE, chunk_overlap=10)
    kb.create_pipeline("p2", chunk_size=50, chunk_overlap=0)
    kb.ingest(text=_doc_text("a", 1), document_id="a", metadata={"v": 1})
    kb.ingest(text=_doc_text("b", 1), document_id="b", metadata={"v": 1}, pipeline="p2")
    before = [(h.id, h.document_id, h.content, h.metadata) for h in kb.retrieve("sentence 3", top_k=10)]
    # a second engine (as after a crash: no close, so the index is replayed from vector files)
    assert kb.stats().tail_rows > 0
    again = Engine(tmp_path).get_knowledge_base("kb")
    assert again is not kb
    assert [(h.id, h.document_id, h.content, h.metadata) for h in again.retrieve("sentence 3", top_k=10)] == before
    assert again.pipelines == kb.pipelines
    engine.close()  # checkpoints
    assert not any(n.endswith(".vectors.npy") for n in os.listdir(kb.path))
    third = Engine(tmp_path)
    assert third.knowledge_bases() == ["kb"]
    kb3 = third["kb"]
    assert [(h.id, h.document_id, h.content, h.metadata) for h in kb3.retrieve("sentence 3", top_k=10)] == before
    assert {d.document_id for d in kb3.documents()} == {"a", "b"}
    assert kb3.embedder is not None and kb3.embedder.spec() == kb.embedder.spec()


def test_checkpoints_bound_replay_and_drop_vector_files(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_mod.manifest, "CKPT_MIN_ROWS", 20)
    kb = Engine(tmp_path).create_knowledge_base("kb", chunk_size=CHUNK_SIZE, chunk_overlap=10)
    for i in range(12):
        kb.ingest(text=_doc_text(f"d{i}", 1), document_id=f"d{i}", metadata={"v": 1})
        assert kb.stats().tail_rows < 20 + 12
    assert kb.stats().checkpoint_rows > 0
    names = os.listdir(kb.path)
    assert sum(n.endswith(".kbi") for n in names) == 1
    assert sum(n.endswith(".vectors.npy") for n in names) == kb.stats().vector_files
    assert _check_consistent(Engine(tmp_path)["kb"]) == _simulate_docs(12)


def _simulate_docs(n):
    return {f"d{i}": 1 for i in range(n)}


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_failed_commit_changes_nothing(tmp_path, monkeypatch, checkpoint):
    if checkpoint:
        monkeypatch.setattr(engine_mod.manifest, "CKPT_MIN_ROWS", 1)
    kb = Engine(tmp_path).create_knowledge_base("kb", chunk_size=CHUNK_SIZE, chunk_overlap=10)
    kb.ingest(text=_doc_text("a", 1), document_id="a", metadata={"v": 1})
    files = sorted(os.listdir(kb.path))
    ids = np.sort(kb.index.ids())
    state = _check_consistent(kb)

    def boom(*args, **kwargs):
        raise storage.StorageError(28, "No space left on device")

    monkeypatch.setattr(storage, "save_manifest", boom)
    monkeypatch.setattr(storage, "install_manifest", boom)  # an ingest's manifest, written ahead
    with pytest.raises(OSError, match="No space"):
        kb.ingest(text=_doc_text("a", 2), document_id="a", metadata={"v": 2})  # a replacement
    with pytest.raises(OSError, match="No space"):
        kb.delete_document("a")
    monkeypatch.undo()
    assert sorted(os.listdir(kb.path)) == files
    np.testing.assert_array_equal(np.sort(kb.index.ids()), ids)
    assert _check_consistent(kb) == state
    assert _check_consistent(Engine(tmp_path)["kb"]) == state


def test_corruption_is_detected_on_open(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb")
    kb.ingest(text="some text to store", document_id="a")
    seg = next(n for n in os.listdir(kb.path) if n.endswith(".chunks.arrow"))
    with open(os.path.join(kb.path, seg), "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(FormatError, match="corrupted"):
        Engine(tmp_path).get_knowledge_base("kb")
    manifest = os.path.join(kb.path, storage.MANIFEST)
    with open(manifest) as f:
        m = json.load(f)
    m["next_id"] += 1  # edited by hand: the checksum no longer matches
    with open(manifest, "w") as f:
        json.dump(m, f)
    with pytest.raises(FormatError, match="checksum"):
        Engine(tmp_path).get_knowledge_base("kb")


def test_reingest_is_atomic_for_concurrent_readers(tmp_path):
    kb = Engine(tmp_path).create_knowledge_base("kb", chunk_size=60, chunk_overlap=0, index="flat")
    body = " ".join(f"Sentence {i} about rotating keys." for i in range(12))
    kb.ingest(text=body, document_id="doc", metadata={"v": 0})
    n_chunks = len(kb)
    stop = threading.Event()
    errors: list[str] = []

    def reader():
        while not stop.is_set():
            hits = kb.retrieve("rotating keys", top_k=50, filters={"document_id": "doc"})
            versions = {h.metadata["v"] for h in hits}
            if len(versions) != 1 or len(hits) != n_chunks:
                errors.append(f"{len(hits)} hits of versions {versions}")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for v in range(1, 30):
        kb.ingest(text=body, document_id="doc", metadata={"v": v})
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:5]


def test_writes_of_another_engine_are_seen_after_refresh(tmp_path):
    a = Engine(tmp_path).create_knowledge_base("kb")
    b = Engine(tmp_path).get_knowledge_base("kb")
    a.ingest(text="written by a", document_id="x")
    assert len(b) == 0
    b.refresh()
    assert len(b) == 1
    b.ingest(text="written by b", document_id="y")  # syncs first: nothing of a's is lost
    a.refresh()
    assert {d.document_id for d in a.documents()} == {"x", "y"}


def test_compaction_reclaims_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_mod.manifest, "MAX_SEGMENTS", 1000)
    kb = Engine(tmp_path).create_knowledge_base("kb", chunk_size=CHUNK_SIZE, chunk_overlap=10)
    kb.ingest_many(
        [Document(text=_doc_text(f"d{i}", 1) * 4, document_id=f"d{i}", metadata={"v": 1}) for i in range(60)]
    )
    kb.ingest(text=_doc_text("z", 1), document_id="z", metadata={"v": 1})
    kb.checkpoint()
    for i in range(0, 60, 4):  # a quarter: below the automatic threshold
        kb.delete_document(f"d{i}")
    size_before = kb.info()["disk_bytes"]
    results = [(h.id, h.content) for h in kb.retrieve("sentence 2 about keys", top_k=10)]
    kb.compact()
    assert kb.stats().segments == 1
    assert kb.info()["disk_bytes"] < size_before
    assert [(h.id, h.content) for h in kb.retrieve("sentence 2 about keys", top_k=10)] == results
    reopened = Engine(tmp_path)["kb"]
    assert [(h.id, h.content) for h in reopened.retrieve("sentence 2 about keys", top_k=10)] == results
    assert len(reopened.documents()) == 46


def _toy_embed(texts):
    """A custom embedder: letter counts (deterministic, 26-d)."""
    out = np.zeros((len(texts), 26), np.float32)
    for i, t in enumerate(texts):
        for ch in t.lower():
            if "a" <= ch <= "z":
                out[i, ord(ch) - 97] += 1
        out[i, 0] += 1e-3
    return out


def test_custom_embedder_must_be_passed_again_on_reopen(tmp_path):
    kb = Engine(tmp_path, embedder=_toy_embed).create_knowledge_base("kb")
    assert kb.dim == 26
    kb.ingest(text="zzz zzz", document_id="z")
    kb.ingest(text="aaa bbb", document_id="a")
    assert kb.retrieve("zz", top_k=1)[0].document_id == "z"
    kb.close()
    blind = Engine(tmp_path)["kb"]
    assert blind.retrieve(_toy_embed(["zz"])[0], top_k=1)[0].document_id == "z"  # vectors still work
    with pytest.raises(ValueError, match="pass embedder="):
        blind.retrieve("zz")
    again = Engine(tmp_path, embedder=_toy_embed)["kb"]
    assert again.retrieve("zz", top_k=1)[0].document_id == "z"


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import kbcore.engine as eng
    from kbcore.engine import storage
    from test_engine_persistence import _doc_text

    def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    kb = eng.Engine({path!r}).get_knowledge_base("kb")
    point = {point!r}
    if point == "fsync":          # inside the commit's fsync group: nothing durable yet
        os.fsync = die
    elif point == "written":      # the segment and the manifest's temp file durable, not renamed
        real = storage.write_files
        storage.write_files = lambda *a, **k: (real(*a, **k), die())
    else:                         # renamed: the commit point passed, the directory not fsynced
        def install(dirpath, temp):
            os.replace(os.path.join(dirpath, temp), os.path.join(dirpath, storage.MANIFEST))
            die()
        storage.install_manifest = install
    kb.ingest(text=_doc_text("new", 1), document_id="new", metadata={{"v": 1}})
    print("not killed", flush=True)
    """
)


@pytest.mark.parametrize("point", ["fsync", "written", "renamed"])
def test_kill_inside_a_grouped_commit_leaves_the_old_or_the_new_state(tmp_path, point):
    """An ingest commit writes its segment and its manifest (as a temp file) in one fsync group,
    then renames the manifest: a writer killed in the group or before the rename leaves the
    old state, killed after the rename the new one; the next commit collects the leftovers."""
    path = str(tmp_path / "data")
    kb = Engine(path).create_knowledge_base("kb", chunk_size=CHUNK_SIZE, chunk_overlap=10)
    kb.ingest(text=_doc_text("a", 1), document_id="a", metadata={"v": 1})
    assert kb.stats().tail_rows > 0  # the next ingest takes the no-checkpoint path
    kb.close()
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-c", KILLER.format(tests=tests_dir, path=path, point=point)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    kb = Engine(path).get_knowledge_base("kb")
    expect = {"a": 1, "new": 1} if point == "renamed" else {"a": 1}
    assert _check_consistent(kb) == expect
    leftovers = [n for n in os.listdir(kb.path) if n.startswith(storage.MANIFEST + ".tmp")]
    assert leftovers if point == "written" else True  # the temp manifest was durable
    kb.ingest(text=_doc_text("b", 1), document_id="b", metadata={"v": 1})
    assert _check_consistent(kb) == {**expect, "b": 1}
    assert not [n for n in os.listdir(kb.path) if ".tmp" in n]  # collected by the next commit
    kb.close()
    assert _check_consistent(Engine(path).get_knowledge_base("kb")) == {**expect, "b": 1}


@pytest.mark.parametrize("kind", [".chunks.arrow", ".docs.arrow", ".vectors.npy", ".kbi", "manifest.json"])
@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_a_flipped_byte_in_any_file_raises_format_error(tmp_path, monkeypatch, kind, where):
    """Whatever file kind a byte flips in (the index checkpoint is checked by its own checksum,
    the others by the manifest's CRC-32), opening or the first use raises FormatError."""
    monkeypatch.setattr(engine_mod.manifest, "CKPT_MIN_ROWS", 1)
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", chunk_size=CHUNK_SIZE, chunk_overlap=10, quantization="sq8")
    kb.ingest(text=_doc_text("a", 1), document_id="a", metadata={"v": 1})  # checkpointed
    monkeypatch.setattr(engine_mod.manifest, "CKPT_MIN_ROWS", 10**6)
    kb.ingest(text=_doc_text("b", 1), document_id="b", metadata={"v": 1})  # a tail with vectors
    # not closed: close() would checkpoint the tail (no vector file left)
    names = sorted(n for n in os.listdir(kb.path) if n.endswith(kind))
    assert names, os.listdir(kb.path)
    target = os.path.join(kb.path, names[-1])
    size = os.path.getsize(target)
    with open(target, "r+b") as f:
        pos = int(size * where)
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x5A]))
    with pytest.raises(FormatError):
        kb2 = Engine(tmp_path).get_knowledge_base("kb")
        kb2.retrieve("sentence about keys", top_k=5)
        kb2.documents()


def test_a_file_rewritten_after_a_checked_open_is_checked_again(tmp_path):
    """A process remembers which segment files it checked in full (by path, inode, size, times
    and the manifest's CRC-32) and does not re-read them on the next open; a byte changed in
    place since (its mtime restored: the ctime still moves) is found on that next open."""
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb")
    kb.ingest(text="some text to store", document_id="a")
    kb.close()
    Engine(tmp_path).get_knowledge_base("kb").close()  # checked in full, remembered
    seg = next(n for n in os.listdir(kb.path) if n.endswith(".chunks.arrow"))
    target = os.path.join(kb.path, seg)
    st = os.stat(target)
    time.sleep(0.01)
    with open(target, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(FormatError, match="corrupted"):
        Engine(tmp_path).get_knowledge_base("kb")


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("quantization, vectors", [(None, "memory"), ("sq8", "disk"), ("rabitq", "disk")])
def test_reopen_gives_the_same_answers_and_documents(tmp_path, quantization, vectors, mmap):
    """What a reopened knowledge base answers (hits, their text and scores, the document list)
    is what it answered before closing, whatever it loads lazily, with its index checkpoint
    read in place (``mmap=True``) or copied into memory."""
    kb = Engine(tmp_path).create_knowledge_base(
        "kb", chunk_size=CHUNK_SIZE, chunk_overlap=10, quantization=quantization, vectors=vectors
    )
    for i in range(12):
        kb.ingest(text=_doc_text(f"d{i}", 1), document_id=f"d{i}", metadata={"v": i})
    kb.ingest(text=_doc_text("d4", 2), document_id="d4", metadata={"v": 99})  # a replacement
    kb.delete_document("d3")
    kb.wait_until_indexed()
    queries = ["sentence about keys", "d5 version 1", "d4 version 2 sentence 3"]

    def answers(k):
        return [
            [(h.id, h.document_id, h.content, round(h.score, 5), h.metadata["v"]) for h in k.retrieve(q, top_k=8)]
            for q in queries
        ]

    before, docs_before = answers(kb), kb.documents()
    kb.close()
    kb2 = Engine(tmp_path, mmap=mmap).get_knowledge_base("kb")
    # (A float32 index is written as format version 1, whose links are always copied.)
    assert kb2.index is not None and kb2.index._native._links_in_place == (mmap and quantization is not None)
    assert answers(kb2) == before
    assert kb2.documents() == docs_before
    assert "d3" not in kb2 and "d4" in kb2
    kb2.close()


def test_engine_rejects_a_non_bool_mmap(tmp_path):
    with pytest.raises(TypeError, match="mmap must be a bool"):
        Engine(tmp_path, mmap="no")  # type: ignore[arg-type]


def test_a_commit_leaves_no_thread_behind(tmp_path):
    # The grouped fsyncs of a commit run on threads; none may outlive the commit (a host that
    # checks for leaked threads after close, like the distributed tests, must see none).
    engine = Engine(str(tmp_path / "data"))
    kb = engine.create_knowledge_base("t", chunk_size=200, chunk_overlap=0)
    for i in range(3):
        kb.ingest(f"document {i} about lighthouses and keepers", document_id=f"d{i}", filename="a.txt")
    assert kb.retrieve("lighthouses", top_k=3)
    engine.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("kbcore-fsync")]
