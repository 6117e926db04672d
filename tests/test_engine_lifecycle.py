"""Knowledge-base lifecycle under races and bad settings (issue 30, items 9 and 10).

- ``delete_knowledge_base`` racing ingests in another thread, with the graph builder's thread
  start delayed (the window in which a stop used to join a thread not yet started): the delete
  always succeeds, the racing ingest completes before it or raises InvalidArgumentError ("is
  closed: it was deleted"), and nothing
  writes the directory afterwards.
- Creation is atomic: a failure in the middle (monkeypatched) or a setting the file format
  cannot hold (a huge ``chunk_size``, ``ef`` of 2^31) leaves nothing listed and nothing on disk.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from kbcore import Engine
from kbcore.engine import directory as directory_mod
from kbcore.engine import graph_builder
from kbcore.errors import InvalidArgumentError

DIM = 8


def _table(rng: np.random.Generator, n: int, tag: str) -> tuple[pa.Table, np.ndarray]:
    table = pa.table({"document_id": [f"{tag}-{i // 4}" for i in range(n)], "text": [f"text {i}" for i in range(n)]})
    return table, rng.standard_normal((n, DIM)).astype(np.float32)


def _files(root: str) -> dict[str, float]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            out[path] = os.stat(path).st_mtime_ns
    return out


class _LateStartThread(threading.Thread):
    """A graph builder thread that starts 20 ms after it is created (other threads at once)."""

    def start(self) -> None:
        if self.name.startswith("kbcore-graph-"):
            time.sleep(0.02)
        super().start()


def test_delete_racing_ingest_is_clean(tmp_path, monkeypatch):
    monkeypatch.setattr(graph_builder.threading, "Thread", _LateStartThread)
    rng = np.random.default_rng(30_9)
    trials, raced = 30, 0
    for trial in range(trials):
        engine = Engine(tmp_path / f"e{trial}")
        kb = engine.create_knowledge_base("r", embedder=False, dim=DIM)
        batches = [_table(rng, 300, f"b{j}") for j in range(4)]
        outcome: list[object] = []

        def writer(kb=kb, batches=batches, outcome=outcome) -> None:
            try:
                for table, vectors in batches:
                    kb.ingest_table(table, vectors=vectors)
                    outcome.append("ingested")
            except InvalidArgumentError as exc:  # the documented answer to a write after the delete
                outcome.append(exc)
            except BaseException as exc:  # noqa: BLE001 - reported below
                outcome.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(float(rng.uniform(0.0, 0.06)))
        engine.delete_knowledge_base("r")  # never "cannot join thread before it is started"
        thread.join(60)
        assert not thread.is_alive()
        deleted = [o for o in outcome if isinstance(o, InvalidArgumentError) and "it was deleted" in str(o)]
        bad = [o for o in outcome if isinstance(o, BaseException) and o not in deleted]
        assert not bad, bad
        raced += bool(deleted)
        assert "r" not in engine.knowledge_bases() and not os.path.exists(tmp_path / f"e{trial}" / "r")
        assert not [t for t in threading.enumerate() if t.name == "kbcore-graph-r" and t.is_alive()]
        before = _files(str(tmp_path / f"e{trial}"))
        with pytest.raises(InvalidArgumentError, match="closed: it was deleted"):
            kb.ingest_table(*batches[0][:1], vectors=batches[0][1])
        time.sleep(0.01)
        assert _files(str(tmp_path / f"e{trial}")) == before  # nothing writes after the delete
        engine.close()
    assert raced > 0  # the delete did land in the middle of ingests (else the test tests nothing)


def test_a_failure_mid_creation_leaves_nothing(tmp_path, monkeypatch):
    engine = Engine(tmp_path)

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device (injected)")

    for target in ("_open",):
        with monkeypatch.context() as m:
            m.setattr(directory_mod.Engine, target, refuse)
            with pytest.raises(OSError, match="injected"):
                engine.create_knowledge_base("half", embedder=False, dim=DIM)
        assert engine.knowledge_bases() == [] and os.listdir(tmp_path) == [".engine.lock"]
    with monkeypatch.context() as m:
        real = directory_mod.commit.write_new

        def write_then_fail(tmp, manifest):
            real(tmp, manifest)
            raise OSError(5, "I/O error (injected)")

        m.setattr(directory_mod.commit, "write_new", write_then_fail)
        with pytest.raises(OSError, match="injected"):
            engine.create_knowledge_base("half", embedder=False, dim=DIM)
    assert engine.knowledge_bases() == [] and os.listdir(tmp_path) == [".engine.lock"]
    kb = engine.create_knowledge_base("half", embedder=False, dim=DIM)  # the name is free again
    assert len(kb) == 0
    engine.close()


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"chunk_size": 1 << 40}, r"field 'config.chunk_size' must be in \[1, 2147483647\]"),
        ({"chunk_size": 10**30}, r"field 'config.chunk_size' must be in \[1, 2147483647\]"),
        # the index's own limit (kbcore.index.EF_RANGE), checked before the manifest's
        ({"ef": 1 << 31}, r"^ef must be in \[1, 1073741824\]"),
        ({"ef_construction": 1 << 31}, r"^ef_construction must be in \[1, 1073741824\]"),
    ],
)
def test_settings_the_format_cannot_hold_are_refused_before_disk(tmp_path, settings, field):
    engine = Engine(tmp_path)
    with pytest.raises(InvalidArgumentError, match=field):
        engine.create_knowledge_base("big", **settings)
    assert engine.knowledge_bases() == [] and os.listdir(tmp_path) == [".engine.lock"]
    engine.close()


def test_a_pipeline_the_format_cannot_hold_is_refused_and_the_kb_still_opens(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("p")
    with pytest.raises(InvalidArgumentError, match=r"pipelines.huge.chunk_size"):
        kb.create_pipeline("huge", chunk_size=1 << 40)
    kb.close()
    assert "huge" not in Engine(tmp_path)["p"].pipelines
