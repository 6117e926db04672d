"""Faults beyond SIGKILL: disk full (ENOSPC) and I/O errors (EIO) during a commit.

A fault injector wraps the file primitives a commit goes through (os.open / os.write /
os.fsync / os.close / os.replace in kbcore.engine.storage, and the native Index.save) and fails the
N-th call; N sweeps over every call one commit makes (counted by a fault-free run first), for
each kind of commit. After each fault: the commit either raised StorageError (an OSError,
errno kept) and changed nothing, in memory or on disk, or the fault hit a step after the commit
point and the commit is whole; the knowledge base reopens; the same commit succeeds once the
fault is gone. One more test fills a real size-limited tmpfs (root only; skipped with the
reason otherwise).
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
import warnings

import numpy as np
import pytest

from kbcore import Engine
from kbcore import engine as engine_mod
from kbcore.engine import storage
from kbcore.errors import StorageError
from kbcore.index import Index

PRIMITIVES = ("open", "write", "fsync", "close", "replace")


class FaultInjector:
    """Counts calls of the file primitives and makes the ``fail_at``-th one raise OSError."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.fail_at: int | None = None
        self.errno = errno.ENOSPC
        self.failed: str | None = None
        self.seen: set[str] = set()
        for name in PRIMITIVES:
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(name, real))
        real_save = Index.save

        def save(index, path):
            self._tick("Index.save")
            return real_save(index, path)

        monkeypatch.setattr(Index, "save", save)

    def _tick(self, name: str) -> None:
        if self.fail_at is None:
            return
        self.calls += 1
        self.seen.add(name)
        if self.calls == self.fail_at:
            self.failed = name
            if name == "Index.save":
                raise StorageError(self.errno, f"injected: {os.strerror(self.errno)}")
            raise OSError(self.errno, os.strerror(self.errno))

    def _wrap(self, name, real):
        def wrapper(*args, **kwargs):
            if name == "close":  # the descriptor is closed, then the deferred error reported
                real(*args, **kwargs)
                self._tick(name)
                return None
            self._tick(name)
            return real(*args, **kwargs)

        return wrapper

    def arm(self, fail_at: int | None, err: int = errno.ENOSPC) -> None:
        self.calls = 0
        self.seen = set()
        self.failed = None
        self.fail_at = fail_at
        self.errno = err

    def count_only(self) -> None:
        self.arm(10**9)

    def disarm(self) -> None:
        self.fail_at = None


def _text(name: str, n: int = 4) -> str:
    return " ".join(f"{name} sentence {s} about quiet rivers." for s in range(n))


def _build(path: str) -> str:
    eng = Engine(path)
    kb = eng.create_knowledge_base("kb", chunk_size=60, chunk_overlap=5)
    kb.ingest_many([engine_mod.Document(text=_text(f"d{i}"), document_id=f"d{i}", metadata={"v": i}) for i in range(3)])
    kb.checkpoint()
    for i in range(3, 5):
        kb.ingest(text=_text(f"d{i}"), document_id=f"d{i}", metadata={"v": i})
    _drop(eng, kb)
    return os.path.join(path, "kb")


def _drop(eng, kb) -> None:
    """Forgets a knowledge base without close() (which would checkpoint: a write)."""
    kb._builder.retire()
    kb._closed = True
    eng._forget(kb)


def _snapshot(kb) -> tuple:
    docs = sorted((i.document_id, i.pipeline_name, i.chunks, i.metadata["v"]) for i in kb.documents())
    q = kb.embedder.embed(["quiet rivers sentence"])[0]
    hits = sorted((h.id, h.document_id, h.content) for h in kb.retrieve(q, top_k=200))
    return docs, len(kb), hits, sorted(kb.pipelines.items()), kb._cell.state.manifest["generation"]


def _on_disk(data_dir: str) -> tuple:
    eng = Engine(data_dir)
    kb = eng.get_knowledge_base("kb")
    try:
        return _snapshot(kb)
    finally:
        _drop(eng, kb)


OPS = {
    "ingest": lambda kb: kb.ingest(text=_text("new", 6), document_id="new", metadata={"v": 9}),
    "ingest_with_checkpoint": lambda kb: kb.ingest(text=_text("new", 6), document_id="new", metadata={"v": 9}),
    "reingest": lambda kb: kb.ingest(text=_text("d1", 7), document_id="d1", metadata={"v": 11}),
    "delete": lambda kb: kb.delete_document("d3"),
    "compact": lambda kb: kb.compact(),
    "checkpoint": lambda kb: kb.checkpoint(),
    "create_pipeline": lambda kb: kb.create_pipeline("p2", chunk_size=40, chunk_overlap=0),
}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    return _build(str(tmp_path_factory.mktemp("faultbase") / "data"))


@pytest.mark.parametrize("op", sorted(OPS))
def test_fault_at_every_primitive_call_of_a_commit_loses_nothing(base_dir, tmp_path, monkeypatch, op):
    if op == "ingest_with_checkpoint":
        monkeypatch.setattr(engine_mod.manifest, "CKPT_MIN_ROWS", 1)
    warnings.simplefilter("ignore", RuntimeWarning)  # a fault after the commit point only warns
    inj = FaultInjector(monkeypatch)

    def fresh() -> tuple[str, object, object]:
        data = str(tmp_path / f"run-{uuid.uuid4().hex[:8]}")
        shutil.copytree(os.path.dirname(base_dir), data)
        eng = Engine(data)
        return data, eng, eng.get_knowledge_base("kb")

    # the fault-free run: how many primitive calls the commit makes, and its result
    data, eng, kb = fresh()
    before = _snapshot(kb)
    inj.count_only()
    OPS[op](kb)
    total = inj.calls
    saves_index = "Index.save" in inj.seen
    inj.disarm()
    assert saves_index == (op in ("ingest_with_checkpoint", "compact", "checkpoint")), (op, inj.seen)
    after = _snapshot(kb)
    _drop(eng, kb)
    assert _on_disk(data) == after
    assert total >= 5 and (after != before or op in ("compact", "checkpoint")), (total, op)

    raised = committed = 0
    for n in range(1, total + 1):
        err = errno.ENOSPC if n % 2 else errno.EIO
        data, eng, kb = fresh()
        inj.arm(n, err)
        try:
            OPS[op](kb)
        except StorageError as exc:
            inj.disarm()
            raised += 1
            assert isinstance(exc, OSError) and exc.errno in (err, None), (n, inj.failed, exc)
            assert _snapshot(kb) == before, f"call {n} ({inj.failed}): the failed commit changed memory"
            assert _on_disk(data) == before, f"call {n} ({inj.failed}): the failed commit changed the disk"
            OPS[op](kb)  # space is back: the same commit succeeds
        else:
            inj.disarm()
            committed += 1  # the fault hit a step after the commit point (directory fsync, collection)
        assert _snapshot(kb) == after, f"call {n} ({inj.failed})"
        assert _on_disk(data) == after, f"call {n} ({inj.failed})"
        _drop(eng, kb)
        shutil.rmtree(data)
    assert raised >= total // 2, (raised, committed, total)
    print(
        f"{op}: {total} primitive calls; a fault at {raised} of them raised StorageError, "
        f"at {committed} (after the commit point) left the commit whole"
    )


def test_storage_error_keeps_the_errno_and_names_the_file(tmp_path, monkeypatch):
    inj = FaultInjector(monkeypatch)
    inj.arm(2, errno.ENOSPC)  # os.open succeeds, the first os.write fails
    with pytest.raises(StorageError) as e:
        storage.atomic_write_bytes(str(tmp_path / "f.json"), b"x" * 100)
    inj.disarm()
    assert e.value.errno == errno.ENOSPC and "f.json" in str(e.value)
    assert os.listdir(tmp_path) == []  # the temp file is gone


def _mount_tmpfs(path: str, size: str) -> str | None:
    """Mounts a size-limited tmpfs; returns why not, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a size-limited tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount command"
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True, timeout=30
    )
    if r.returncode != 0:
        return f"mount -t tmpfs is not permitted here: {r.stderr.strip()}"
    return None


def test_disk_full_on_a_real_small_filesystem(tmp_path):
    mnt = str(tmp_path / "mnt")
    os.makedirs(mnt)
    why = _mount_tmpfs(mnt, "3m")
    if why:
        pytest.skip(why)
    try:
        data = os.path.join(mnt, "data")
        eng = Engine(data)
        kb = eng.create_knowledge_base("kb", chunk_size=200, chunk_overlap=0)
        kb.ingest_many(
            [engine_mod.Document(text=_text(f"d{i}", 20), document_id=f"d{i}", metadata={"v": i}) for i in range(20)]
        )
        kb.checkpoint()
        committed = _snapshot(kb)
        # fill the file system, leaving a few KiB
        filler = os.path.join(mnt, "filler")
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        os.truncate(filler, max(os.path.getsize(filler) - 8192, 0))
        failures = 0
        rng = np.random.default_rng(5)
        for i in range(12):  # ingest and checkpoint until the disk is full
            words = " ".join(f"w{x}" for x in rng.integers(0, 10**6, 3000))
            try:
                kb.ingest(text=words, document_id=f"big{i}", metadata={"v": 100 + i})
                kb.checkpoint()
                committed = _snapshot(kb)
            except StorageError as exc:
                failures += 1
                assert exc.errno in (errno.ENOSPC, None) and (exc.errno or "No space" in str(exc)), exc
                assert _snapshot(kb) == committed  # in memory: the last committed state
        assert failures, "the file system never filled up"
        _drop(eng, kb)
        assert _on_disk(data) == committed  # nothing committed was lost; it opens
        os.unlink(filler)  # space returns
        eng = Engine(data)
        kb = eng.get_knowledge_base("kb")
        kb.ingest(text=_text("after", 5), document_id="after", metadata={"v": 1})
        kb.checkpoint()
        want = _snapshot(kb)
        assert ("after", "default") in {(d[0], d[1]) for d in want[0]}
        _drop(eng, kb)
        assert _on_disk(data) == want
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True, timeout=30)


def test_a_manifest_temp_file_left_by_a_crash_is_collected_by_the_next_commit(tmp_path):
    eng = Engine(str(tmp_path / "data"))
    kb = eng.create_knowledge_base("kb", chunk_size=60, chunk_overlap=5)
    leftover = os.path.join(kb.path, storage.MANIFEST + ".tmp-3f2a9c1b7d4e")  # killed mid-write
    with open(leftover, "w") as f:
        f.write('{"half": ')
    kb.ingest(text=_text("a"), document_id="a", metadata={"v": 1})
    assert not os.path.exists(leftover)
    assert os.path.exists(os.path.join(kb.path, storage.MANIFEST))
    _drop(eng, kb)
