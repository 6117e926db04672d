"""ingest_table on crafted Arrow input: a clear InvalidArgumentError naming the column, never a crash.

Crafted input is built from a valid file by patching bytes of its ``document_id`` offsets
buffer (seeded), then handed to ``ingest_table`` in every form it accepts: an ``.arrow`` /
``.feather`` path, a Table read from a memory map, a RecordBatch, a Table built on the bad
buffers. Each case runs in a child process, so a SIGSEGV (what this did before validation)
is a test failure rather than the end of the test run. A hypothesis target mutates whole IPC
files the same way (fixed seed in CI; KBCORE_FUZZ_EXAMPLES / KBCORE_FUZZ_RANDOM as in
tests/test_fuzz_kb_load.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("hypothesis", reason="the Arrow fuzz target needs hypothesis (pip install .[test])")

EXAMPLES = int(os.environ.get("KBCORE_FUZZ_EXAMPLES", "150"))

# Shared by the child scripts: a valid file, a crafted copy, and a knowledge base to ingest into.
PRELUDE = textwrap.dedent(
    """
    import os, struct, sys
    import numpy as np
    import pyarrow as pa
    import pyarrow.feather as feather
    from kbcore import Engine
    from kbcore.errors import KbcoreError

    work = sys.argv[1]
    N = 40
    def good_file(path):
        rng = np.random.default_rng(7)
        vecs = rng.standard_normal((N, 4)).astype(np.float32)
        t = pa.table({
            "document_id": [f"d{i:02d}" for i in range(N)],
            "text": [f"text {i}" for i in range(N)],
            "vector": pa.array(list(vecs), pa.list_(pa.float32(), 4)),
        })
        feather.write_feather(t, path, compression="uncompressed")
        with open(path, "rb") as f:
            return bytearray(f.read())

    def crafted(seed):
        # Patches one offset of document_id (int32 0, 3, 6, ...) to a huge or negative value.
        data = good_file(os.path.join(work, "good.arrow"))
        at = data.find(struct.pack("<4i", 0, 3, 6, 9))
        assert at > 0, "the offsets buffer was not found"
        rng = np.random.default_rng(seed)
        slot = int(rng.integers(1, N + 1))
        value = int(rng.choice([rng.integers(1 << 20, 1 << 31), -int(rng.integers(1, 1 << 31))]))
        struct.pack_into("<i", data, at + 4 * slot, value)
        return bytes(data)

    kb = Engine(os.path.join(work, "engine")).create_knowledge_base("t", embedder=False, index="flat", dim=4)

    def attempt(label, data):
        try:
            kb.ingest_table(data)
        except KbcoreError as exc:
            print(label, type(exc).__name__, exc, flush=True)
        else:
            print(label, "accepted", flush=True)
    """
)


def _run(tmp_path, body: str, *args: str, timeout: float = 300) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == 0, f"the child died (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout.splitlines()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_crafted_offsets_are_an_error_naming_the_column_in_every_form(tmp_path, seed):
    lines = _run(
        tmp_path,
        """
        import pyarrow.ipc as ipc
        bad = crafted(int(sys.argv[2]))
        for ext in (".arrow", ".feather", ".ipc"):
            path = os.path.join(work, "bad" + ext)
            with open(path, "wb") as f:
                f.write(bad)
            attempt("path" + ext, path)
        mapped = ipc.open_file(pa.memory_map(path)).read_all()  # what a user may pass
        attempt("mmap-table", mapped)
        attempt("record-batch", mapped.to_batches()[0])  # no compute on the bad data before ingest
        # A Table built directly on a bad offsets buffer, no file involved.
        offsets = np.arange(0, 3 * N + 1, 3, dtype=np.int32)
        offsets[N // 2] = 1 << 30
        buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"x" * 3 * N)]
        bad_ids = pa.Array.from_buffers(pa.string(), N, buffers)
        table = pa.table({"document_id": bad_ids, "text": ["t"] * N, "vector": mapped.column("vector")})
        attempt("from-buffers", table)
        assert len(kb) == 0, "nothing was ingested"
        """,
        str(seed),
    )
    assert len(lines) == 6, lines
    for line in lines:
        assert "InvalidArgumentError column 'document_id'" in line, line


def test_a_file_that_is_not_arrow_or_parquet_is_a_clear_error(tmp_path):
    lines = _run(
        tmp_path,
        """
        for name in ("junk.arrow", "junk.parquet"):
            path = os.path.join(work, name)
            with open(path, "wb") as f:
                f.write(b"PAR1" + bytes(range(256)) * 4)
            attempt(name, path)
        """,
    )
    assert len(lines) == 2 and all("InvalidArgumentError" in line for line in lines), lines


def test_fuzz_mutated_ipc_files_never_crash(tmp_path):
    """Hypothesis mutates a valid IPC file (byte overwrites, a cut); each must be ingested or
    raise a kbcore error. The child prints every example before trying it, so a crash names it."""
    lines = _run(
        tmp_path,
        """
        from hypothesis import HealthCheck, given, settings, strategies as st
        good = bytes(good_file(os.path.join(work, "good.arrow")))
        path = os.path.join(work, "fuzz.arrow")
        edits_st = st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(0, 255)), min_size=1, max_size=8)

        @settings(max_examples=int(sys.argv[2]), derandomize=not os.environ.get("KBCORE_FUZZ_RANDOM"),
                  deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(edits=edits_st, cut=st.one_of(st.none(), st.integers(0, len(good))))
        def run(edits, cut):
            data = bytearray(good)
            for at, value in edits:
                data[at] = value
            if cut is not None:
                data = data[:cut]
            print("example", edits, cut, file=sys.stderr, flush=True)
            with open(path, "wb") as f:
                f.write(data)
            try:
                kb.ingest_table(path)
            except KbcoreError:
                pass

        run()
        print("done", flush=True)
        """,
        str(EXAMPLES),
        timeout=600,
    )
    assert lines[-1] == "done"
