"""The one-query search path makes no system call per call (issue 28, per-call overhead).

A RAG request runs a loop of single-query searches; a per-call system call (the hardware
thread count was read from /sys/devices/system/cpu/online on every search) cost about as much
as the rest of the call's work outside the graph walk. Counted, not timed: the ``syscr`` of
/proc/thread-self/io is the number of read system calls this thread has made (per thread, so
that a thread left running by another test cannot add to it; a one-query search runs on the
calling thread).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import kbcore

PROC_IO = Path("/proc/thread-self/io")
CALLS = 200
# Reading /proc/thread-self/io is itself a read call or two; anything per search would add CALLS.
SLACK = 16


def read_calls() -> int:
    """The read system calls this thread has made so far."""
    for line in PROC_IO.read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise AssertionError(f"{PROC_IO} has no syscr line")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not PROC_IO.exists(),
    reason="counts read system calls in /proc/thread-self/io (Linux 3.17+)",
)
@pytest.mark.parametrize("quantization", [None, "sq8"])
@pytest.mark.parametrize("batch", [False, True], ids=["one-query", "one-row-batch"])
def test_single_query_search_makes_no_read_system_call(quantization: str | None, batch: bool) -> None:
    rng = np.random.default_rng(28)
    data = rng.standard_normal((1500, 32)).astype(np.float32)
    kw = {} if quantization is None else {"quantization": quantization}
    index = kbcore.Index(32, metric="cosine", kind="hnsw", M=8, ef_construction=40, seed=1, **kw)
    index.add(data, np.arange(len(data), dtype=np.int64), threads=1)
    queries = rng.standard_normal((CALLS, 32)).astype(np.float32)
    rows = [q[None, :] if batch else q for q in queries]
    index.search(rows[0], k=5, threads=1)  # first-call set-up (scratch, visited set) not counted
    before = read_calls()
    for q in rows:
        ids, _ = index.search(q, k=5, threads=1)
        assert ids.shape[-1] == 5
    made = read_calls() - before
    assert made <= SLACK, f"{made} read system calls for {CALLS} searches"
