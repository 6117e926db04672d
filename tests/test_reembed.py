"""KnowledgeBase.reembed: a new index generation from the stored chunk texts, switched to with one
manifest commit; queries answered throughout from the old or the new index; ingests during it
embedded with the new embedder; a SIGKILL at any point leaves the old or the new knowledge base
(docs/sync.md)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from kbcore import Engine
from kbcore.embedders import HashingEmbedder
from kbcore.errors import InvalidArgumentError

OLD_DIM, NEW_DIM = 16, 24


class SlowEmbedder:
    """HashingEmbedder that sleeps per call and can be held at a gate (to interleave threads)."""

    def __init__(self, dim: int, delay: float = 0.0) -> None:
        self.inner = HashingEmbedder(dim=dim)
        self.dim = dim
        self.delay = delay
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.calls = 0

    def spec(self) -> dict:
        return self.inner.spec()

    def embed(self, texts):
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(60)
        time.sleep(self.delay)
        return self.inner.embed(texts)


def _texts(n: int, seed: int = 5) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = "alpha beta gamma delta omega sigma kappa lambda theta zeta".split()
    return [(f"d{i:03d}", " ".join(rng.choice(words) for _ in range(30)) + f" item{i}") for i in range(n)]


def _build(path: str, n: int = 60, **kw) -> None:
    engine = Engine(path)
    kb = engine.create_knowledge_base("kb", embedder=HashingEmbedder(dim=OLD_DIM), index="flat", chunk_size=400, **kw)
    kb.sync(_texts(n))
    engine.close()


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def check_consistent(kb) -> int:
    """The index holds every stored chunk's text embedded by the embedder the manifest records;
    returns that embedder's dimension."""
    spec = kb.info()["embedder"]
    assert spec["kind"] == "hashing" and spec["dim"] == kb.dim == kb.index.dim
    ids = np.sort(kb.index.ids())
    vecs = kb.index.get_vectors(ids)
    texts = [kb.retrieve(v, 1)[0].content for v in vecs]
    np.testing.assert_allclose(vecs, _unit(HashingEmbedder(dim=kb.dim).embed(texts)), atol=1e-5)
    assert len(ids) == sum(d.chunks for d in kb.documents())
    return kb.dim


def test_reembed_switches_dimension_and_embedder_durably(tmp_path):
    path = str(tmp_path / "data")
    _build(path)
    engine = Engine(path)
    kb = engine.get_knowledge_base("kb")
    before = {f for f in os.listdir(kb.path) if f.endswith((".kbi", ".npy"))}
    report = kb.reembed(HashingEmbedder(dim=NEW_DIM), batch_size=7)
    assert (report.chunks, report.caught_up, report.old_dim, report.new_dim) == (60, 0, OLD_DIM, NEW_DIM)
    assert kb.dim == NEW_DIM and kb.embedder.dim == NEW_DIM
    check_consistent(kb)
    assert kb.retrieve("item7", 1, search_type="full_text")[0].document_id == "d007"  # the BM25 leg too
    engine.close()
    engine = Engine(path)
    kb = engine.get_knowledge_base("kb")
    assert check_consistent(kb) == NEW_DIM
    assert not before & set(os.listdir(kb.path))  # the old generation's index / vectors were collected
    engine.close()


def test_queries_during_a_reembed_come_from_the_old_or_the_new_index(tmp_path):
    path = str(tmp_path / "data")
    _build(path)
    queries = [t for _, t in _texts(60)[:8]]
    answers = {}
    for dim in (OLD_DIM, NEW_DIM):  # the oracle: a knowledge base built directly with each embedder
        engine = Engine(str(tmp_path / f"oracle{dim}"))
        kb = engine.create_knowledge_base("kb", embedder=HashingEmbedder(dim=dim), index="flat", chunk_size=400)
        kb.sync(_texts(60))
        answers[dim] = [tuple(h.document_id for h in kb.retrieve(q, 3)) for q in queries]
        engine.close()
    assert answers[OLD_DIM] != answers[NEW_DIM]
    engine = Engine(path)
    kb = engine.get_knowledge_base("kb")
    seen: dict[int, int] = {OLD_DIM: 0, NEW_DIM: 0}
    errors: list[BaseException] = []
    stop = threading.Event()

    def query() -> None:
        i = 0
        while not stop.is_set():
            j = i % len(queries)
            try:
                got = tuple(h.document_id for h in kb.retrieve(queries[j], 3))
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)
                return
            match = [d for d in (OLD_DIM, NEW_DIM) if answers[d][j] == got]
            if not match:
                errors.append(AssertionError(f"query {j}: {got} is neither the old nor the new answer"))
                return
            seen[match[0]] += 1
            i += 1

    threads = [threading.Thread(target=query) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    kb.reembed(SlowEmbedder(NEW_DIM, delay=0.02), batch_size=4)
    time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert seen[OLD_DIM] and seen[NEW_DIM]
    engine.close()


def test_documents_ingested_during_a_reembed_get_the_new_embedder(tmp_path):
    path = str(tmp_path / "data")
    _build(path)
    old = SlowEmbedder(OLD_DIM)
    engine = Engine(path, embedder=old)
    kb = engine.get_knowledge_base("kb")
    assert kb.embedder is old
    # 1. committed while the new index is being built: caught up before the switch
    new = SlowEmbedder(NEW_DIM, delay=0.01)
    done = threading.Event()

    def ingest_early() -> None:
        assert new.entered.wait(30)
        kb.ingest(text="early document about zeta", document_id="early")
        done.set()

    t = threading.Thread(target=ingest_early)
    t.start()
    report = kb.reembed(new, batch_size=4)
    t.join()
    assert done.is_set() and report.caught_up >= 1
    check_consistent(kb)
    # 2. embedded with the old embedder, committed after the switch: embedded again at commit
    kb.reembed(old, batch_size=64)  # back to OLD_DIM, with `old` as the current embedder
    old.gate = threading.Event()
    old.entered.clear()
    late: list[BaseException] = []

    def ingest_late() -> None:
        try:
            kb.ingest(text="late document about theta", document_id="late")
        except BaseException as exc:  # noqa: BLE001
            late.append(exc)

    t = threading.Thread(target=ingest_late)
    t.start()
    assert old.entered.wait(30)  # the ingest is inside the old embedder
    kb.reembed(HashingEmbedder(dim=NEW_DIM), batch_size=64)
    old.gate.set()
    t.join()
    assert not late, late
    assert "late" in kb and check_consistent(kb) == NEW_DIM
    engine.close()


def test_reembed_rejects_bad_arguments(tmp_path):
    path = str(tmp_path / "data")
    _build(path, n=3)
    engine = Engine(path)
    kb = engine.get_knowledge_base("kb")
    with pytest.raises(InvalidArgumentError, match="batch_size"):
        kb.reembed(HashingEmbedder(dim=8), batch_size=0)
    with pytest.raises(InvalidArgumentError, match="returned shape"):
        kb.reembed(lambda texts: np.zeros((len(texts) + 1, 8), np.float32))
    assert check_consistent(kb) == OLD_DIM  # nothing changed
    engine.close()


_KILLED = textwrap.dedent(
    """
    import os, sys, time
    from kbcore import Engine
    from kbcore.embedders import HashingEmbedder
    from kbcore.engine import commit
    point, arg = sys.argv[2], sys.argv[3]
    inner = HashingEmbedder(dim={new})
    class Killer:
        dim = {new}
        calls = 0
        def spec(self):
            return inner.spec()
        def embed(self, texts):
            Killer.calls += 1
            if point == "embed" and Killer.calls == int(arg):
                os.kill(os.getpid(), 9)
            return inner.embed(texts)
    if point in ("index-written", "manifest-committed"):
        def hook(p):
            if p == point:
                os.kill(os.getpid(), 9)
        commit.fault_hook = hook
    kb = Engine(sys.argv[1]).get_knowledge_base("kb")
    print("ready", flush=True)
    kb.reembed(Killer(), batch_size=5)
    print("done", flush=True)
    time.sleep(60)
    """
).format(new=NEW_DIM)


def _kill_points(n: int, seed: int) -> list[tuple[str, str]]:
    """Kill points: inside the embedder at a random batch, at the two commit points, and at
    random times (a timer in the parent)."""
    rng = random.Random(seed)
    fixed = [("index-written", "0"), ("manifest-committed", "0")]
    out = fixed + [("embed", str(rng.randint(1, 12))) for _ in range(max(0, (n - 2) // 2))]
    out += [("time", f"{rng.uniform(0.0, 0.5):.3f}") for _ in range(n - len(out))]
    return out


def _run_kill_points(tmp_path, n: int, seed: int) -> set[int]:
    path = str(tmp_path / "data")
    _build(path, n=60)
    outcomes = set()
    for point, arg in _kill_points(n, seed):
        proc = subprocess.Popen(
            [sys.executable, "-c", _KILLED, path, point, arg],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if point == "time":
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
            time.sleep(float(arg))
            proc.kill()
        proc.wait(timeout=120)
        proc.stdout.close()
        err = proc.stderr.read()
        proc.stderr.close()
        assert proc.returncode == -9, err
        engine = Engine(path)  # no embedder given: the manifest's spec rebuilds it
        kb = engine.get_knowledge_base("kb")
        dim = check_consistent(kb)
        outcomes.add(dim)
        if point == "manifest-committed":
            assert dim == NEW_DIM
        elif point in ("index-written", "embed"):
            assert dim == OLD_DIM
        if dim == NEW_DIM:  # back to the old embedder for the next point
            kb.reembed(HashingEmbedder(dim=OLD_DIM))
        engine.close()
    return outcomes


def test_a_reembed_killed_at_random_points_leaves_the_old_or_the_new(tmp_path):
    assert _run_kill_points(tmp_path, 5, seed=11) == {OLD_DIM, NEW_DIM}


@pytest.mark.slow
def test_a_reembed_killed_at_20_random_points_leaves_the_old_or_the_new(tmp_path):
    assert _run_kill_points(tmp_path, 20, seed=2026) == {OLD_DIM, NEW_DIM}


def test_reembed_of_an_empty_knowledge_base_records_the_new_embedder(tmp_path):
    path = str(tmp_path / "data")
    engine = Engine(path)
    kb = engine.create_knowledge_base("kb", embedder=HashingEmbedder(dim=OLD_DIM))
    report = kb.reembed(HashingEmbedder(dim=NEW_DIM))
    assert (report.chunks, report.new_dim) == (0, NEW_DIM)
    kb.ingest(text="after the switch", document_id="a")
    engine.close()
    engine = Engine(path)
    kb = engine.get_knowledge_base("kb")
    assert check_consistent(kb) == NEW_DIM and len(kb) == 1
    engine.close()


def test_the_new_generation_keeps_text_search_and_metadata_of_every_live_chunk(tmp_path, monkeypatch):
    """The texts reach the new index's BM25 leg from Arrow buffers, in batches queued behind a
    worker; rows of a segment with a deleted document take the non-contiguous path."""
    from kbcore.engine import reembed

    monkeypatch.setattr(reembed, "IN_FLIGHT", 3)
    path = str(tmp_path / "data")
    engine = Engine(path)
    kb = engine.create_knowledge_base("kb", embedder=HashingEmbedder(dim=OLD_DIM), index="flat", chunk_size=400)
    docs = _texts(40)
    kb.sync([(i, t, {"n": k}) for k, (i, t) in enumerate(docs)])
    kb.delete_document("d007")
    before = [h.document_id for k in range(len(docs)) for h in kb.retrieve(f"item{k}", 1, search_type="full_text")]
    kb.reembed(HashingEmbedder(dim=NEW_DIM), batch_size=3, progress=False)
    engine.close()
    engine = Engine(path)
    kb = engine.get_knowledge_base("kb")
    assert check_consistent(kb) == NEW_DIM
    after = []
    for k, (doc_id, _) in enumerate(docs):
        hits = kb.retrieve(f"item{k}", 1, search_type="full_text")
        assert (hits[0].document_id, hits[0].metadata["n"]) == (doc_id, k) if doc_id != "d007" else not hits
        after.extend(h.document_id for h in hits)
    assert after == before and "d007" not in after
    engine.close()
