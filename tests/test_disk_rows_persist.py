"""vectors="disk" survives a restart: the index file records it (format version 5, rows
aligned and read in place from the mapped file), Index.load and the engine reopen it as saved
and can override, the knowledge-base manifest and the CLI carry it, and a full disk under a
row file is a StorageError, not a SIGBUS (issues 28 and 30)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import kbcore
from kbcore.engine import Engine
from kbcore.errors import FormatError, InvalidArgumentError

DIM = 32


def _data(n: int = 2500, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, DIM)).astype(np.float32)
    queries = rng.standard_normal((40, DIM)).astype(np.float32)
    return data, np.arange(n, dtype=np.int64), queries


def _same_answers(a: kbcore.Index, b: kbcore.Index, queries: np.ndarray) -> None:
    for x, y in zip(a.search(queries, 10), b.search(queries, 10)):
        np.testing.assert_array_equal(x, y)  # bit-identical ids and distances


@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
def test_memory_to_disk_to_reload_gives_bit_identical_answers(tmp_path, quantization):
    data, ids, queries = _data()
    mem = kbcore.Index(DIM, "l2", M=8, ef_construction=48, quantization=quantization)
    mem.add(data, ids, metadata=[{"k": int(i % 3)} for i in ids], threads=1)
    mem.save(tmp_path / "m.kbi")
    disk = kbcore.Index.load(tmp_path / "m.kbi", vectors="disk")  # override: a memory file onto disk
    assert disk.vectors == "disk"
    disk.save(tmp_path / "d.kbi")
    assert (tmp_path / "d.kbi").read_bytes()[8] == 7  # format version 7 (as 5) records vectors="disk"
    back = kbcore.Index.load(tmp_path / "d.kbi")  # as saved
    assert back.vectors == "disk"
    _same_answers(mem, back, queries)
    np.testing.assert_array_equal(back.get_vectors(ids[::7]), data[::7])
    assert back.count({"k": 1}) == mem.count({"k": 1})
    # The first write copies the rows out of the loaded file, which stays as it was.
    before = (tmp_path / "d.kbi").read_bytes()
    back.add(data[:5] * 2, ids[:5], threads=1)
    back.remove(ids[5:10], threads=1)
    assert (tmp_path / "d.kbi").read_bytes() == before
    np.testing.assert_array_equal(back.get_vectors(ids[:5]), data[:5] * 2)
    again = kbcore.Index.load(tmp_path / "d.kbi")
    _same_answers(mem, again, queries)
    # Saved over the file it reads in place (rename: the mapping keeps the old file).
    again.save(tmp_path / "d.kbi")
    _same_answers(mem, again, queries)
    _same_answers(mem, kbcore.Index.load(tmp_path / "d.kbi"), queries)


def test_load_overrides_where_rows_live(tmp_path):
    data, ids, queries = _data()
    ix = kbcore.Index(DIM, "cosine", M=8, ef_construction=48, quantization="sq8", vectors="disk")
    ix.add(data, ids, threads=1)
    ix.save(tmp_path / "d.kbi")
    mem = kbcore.Index.load(tmp_path / "d.kbi", vectors="memory")
    assert mem.vectors == "memory"
    _same_answers(ix, mem, queries)
    mem.save(tmp_path / "m.kbi")
    m, d = (tmp_path / "m.kbi").read_bytes(), (tmp_path / "d.kbi").read_bytes()
    assert m[8] == d[8] == 7 and (m[74], d[74]) == (0, 1)  # version 7's vectors byte: memory, disk
    assert kbcore.Index.load(tmp_path / "m.kbi").vectors == "memory"
    with pytest.raises(InvalidArgumentError, match="vectors"):
        kbcore.Index.load(tmp_path / "d.kbi", vectors="tape")


def test_an_empty_disk_index_round_trips(tmp_path):
    ix = kbcore.Index(DIM, "l2", quantization="rabitq", vectors="disk")
    ix.save(tmp_path / "e.kbi")
    back = kbcore.Index.load(tmp_path / "e.kbi")
    assert back.vectors == "disk" and len(back) == 0
    back.add(np.ones((2, DIM), np.float32), [1, 2])
    assert len(back) == 2


def _disk_file(tmp_path: Path) -> tuple[Path, int]:
    """A saved vectors="disk" index and the file offset of its first row."""
    data, ids, _ = _data(300)
    ix = kbcore.Index(DIM, "l2", M=8, ef_construction=32, quantization="sq8", vectors="disk")
    ix.add(data, ids, threads=1)
    path = tmp_path / "d.kbi"
    ix.save(path)
    header, params, vectors_byte = 32, 8 + 1 + 1 + 4 * 8, 1  # dim, metric, kind, ef, M, efC, seed
    tag = 4 + len("sq8") + 4 + 8  # the code tag: name length and bytes, no parameters, re-rank depth
    live_end = header + params + vectors_byte + tag + 8 + 300 * 9
    return path, (live_end + 63) // 64 * 64


def test_a_corrupted_row_section_is_a_format_error_naming_the_file(tmp_path):
    path, rows_at = _disk_file(tmp_path)
    raw = bytearray(path.read_bytes())
    assert not any(raw[rows_at - 8 : rows_at])  # the alignment padding is zeros
    raw[rows_at + 5] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="d.kbi"):
        kbcore.Index.load(path)
    with pytest.raises(FileNotFoundError):
        kbcore.Index.load(tmp_path / "missing.kbi")
    raw = bytearray(path.read_bytes())
    path.write_bytes(bytes(raw[: rows_at + 100]))  # truncated inside the rows
    with pytest.raises(FormatError, match="d.kbi"):
        kbcore.Index.load(path)


def test_a_newer_version_is_refused_by_its_number(tmp_path):
    # Older builds read versions 1..6 and refuse version 7 the same way ("has format version
    # 7, this kbcore reads versions 1..6; upgrade kbcore to load it").
    path, _ = _disk_file(tmp_path)
    assert int.from_bytes(path.read_bytes()[8:12], "little") == 7
    raw = bytearray(path.read_bytes())
    raw[8:12] = (8).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="format version 8.*upgrade kbcore"):
        kbcore.Index.load(path)


_REOPEN_RSS = """
import sys, numpy as np, kbcore
def anon_kib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
before = anon_kib()
ix = kbcore.Index.load(sys.argv[1])
ix.search(np.random.default_rng(1).standard_normal((20, 256)).astype(np.float32), 10)
print(anon_kib() - before, ix.vectors)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RssAnon from /proc/self/status (Linux)")
def test_a_reopened_disk_index_keeps_its_rows_out_of_anonymous_memory(tmp_path):
    n, dim = 20000, 256  # 20 MB of float32 rows
    data = np.random.default_rng(3).standard_normal((n, dim)).astype(np.float32)
    ix = kbcore.Index(dim, "l2", M=8, ef_construction=32, quantization="sq8", vectors="disk")
    ix.add(data, np.arange(n), threads=1)
    ix.save(tmp_path / "d.kbi")
    res = subprocess.run(
        [sys.executable, "-c", _REOPEN_RSS, str(tmp_path / "d.kbi")], capture_output=True, text=True, check=True
    )
    grew_kib, vectors = res.stdout.split()
    rows_kib = n * dim * 4 // 1024
    # Codes (n * dim bytes, a quarter of the rows), the graph and what a load imports stay
    # (8.9-10.3 MiB here); copying the rows in would add all 20 MiB of them (>= 25 MiB in all).
    assert vectors == "disk" and int(grew_kib) < 0.75 * rows_kib, (grew_kib, rows_kib)


def _table(n: int, seed: int) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng(seed)
    table = pa.table({"document_id": [f"d{seed}-{i // 4}" for i in range(n)], "text": [f"t{i}" for i in range(n)]})
    return table, rng.standard_normal((n, DIM)).astype(np.float32)


@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
def test_a_knowledge_base_created_with_disk_rows_reopens_with_them(tmp_path, quantization):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", embedder=False, dim=DIM, quantization=quantization, vectors="disk")
    assert kb.vectors == "disk"
    table, vecs = _table(1500, 1)
    kb.ingest_table(table, vectors=vecs)
    kb.wait_until_indexed(timeout=120)
    kb.checkpoint()
    assert kb.vectors == "disk" and kb.index.vectors == "disk"  # through commits
    queries = vecs[:20] + 0.01
    want = [[h.id for h in kb.retrieve(q, 5)] for q in queries]
    engine.close()
    manifest = json.loads((tmp_path / "kb" / "manifest.json").read_text())
    assert manifest["config"]["vectors"] == "disk"
    kbi = tmp_path / "kb" / manifest["index"]["path"]
    assert kbi.read_bytes()[8] == 7
    kb = Engine(tmp_path)["kb"]
    assert kb.vectors == "disk" and kb.index.vectors == "disk"
    assert [[h.id for h in kb.retrieve(q, 5)] for q in queries] == want
    # Ingest after the reopen (the rows leave the mapped checkpoint), then reopen again.
    table, more = _table(300, 2)
    kb.ingest_table(table, vectors=more)
    kb.wait_until_indexed(timeout=120)
    kb.checkpoint()
    n = len(kb)
    want = [[h.id for h in kb.retrieve(q, 5)] for q in queries]
    kb.close()
    kb = Engine(tmp_path)["kb"]
    assert len(kb) == n == 1800 and kb.index.vectors == "disk"
    assert [[h.id for h in kb.retrieve(q, 5)] for q in queries] == want
    kb.close()
    # The engine can override, in this process, without changing the manifest.
    kb = Engine(tmp_path, vectors="memory")["kb"]
    assert kb.vectors == "memory" and kb.index.vectors == "memory"
    assert [[h.id for h in kb.retrieve(q, 5)] for q in queries] == want
    kb.close()
    assert json.loads((tmp_path / "kb" / "manifest.json").read_text())["config"]["vectors"] == "disk"


def test_an_engine_override_puts_a_memory_knowledge_base_on_disk(tmp_path):
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, quantization="sq8")
    table, vecs = _table(1200, 3)
    kb.ingest_table(table, vectors=vecs)
    kb.checkpoint()
    kb.close()
    assert "vectors" not in json.loads((tmp_path / "kb" / "manifest.json").read_text())["config"]
    kb = Engine(tmp_path, vectors="disk")["kb"]
    assert kb.vectors == "disk" and kb.index.vectors == "disk" and len(kb) == 1200
    kb.close()
    flat = Engine(tmp_path).create_knowledge_base("flat", embedder=False, dim=DIM, index="flat")
    flat.close()
    assert Engine(tmp_path, vectors="disk")["flat"].vectors == "memory"  # not quantized: stays in memory
    with pytest.raises(InvalidArgumentError, match="vectors"):
        Engine(tmp_path, vectors="tape")


def test_a_knowledge_base_with_disk_rows_missing_its_index_file_names_it(tmp_path):
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, quantization="sq8", vectors="disk")
    table, vecs = _table(1100, 4)
    kb.ingest_table(table, vectors=vecs)
    kb.checkpoint()
    kb.close()
    name = json.loads((tmp_path / "kb" / "manifest.json").read_text())["index"]["path"]
    os.remove(tmp_path / "kb" / name)
    with pytest.raises(FormatError, match=name):
        Engine(tmp_path)["kb"]


def test_creation_checks_vectors(tmp_path):
    engine = Engine(tmp_path)
    with pytest.raises(InvalidArgumentError, match="quantization"):
        engine.create_knowledge_base("a", embedder=False, dim=DIM, quantization=None, vectors="disk")
    with pytest.raises(InvalidArgumentError, match="vectors"):
        engine.create_knowledge_base("b", embedder=False, dim=DIM, quantization="sq8", vectors="ssd")
    assert engine.knowledge_bases() == []


def test_the_manifest_check_validates_vectors(tmp_path):
    from kbcore.engine.manifest_check import validate_manifest
    from kbcore.engine.storage import load_manifest

    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, dim=DIM, quantization="sq8", vectors="disk")
    kb.close()
    good = load_manifest(str(tmp_path / "kb"))
    assert validate_manifest(json.loads(json.dumps(good)))["config"]["vectors"] == "disk"
    m = json.loads(json.dumps(good))
    m["config"]["vectors"] = "tape"
    with pytest.raises(FormatError, match="config.vectors"):
        validate_manifest(m)
    m["config"]["vectors"] = "disk"
    del m["config"]["quantization"]
    with pytest.raises(FormatError, match="config.vectors.*quantization"):
        validate_manifest(m)


def test_the_cli_creates_a_knowledge_base_with_disk_rows(tmp_path):
    doc = tmp_path / "a.txt"
    doc.write_text("disk resident vectors survive a restart. " * 40)
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "kbcore", "ingest", str(doc), "--kb", "k", "--data", str(data)]
    subprocess.run(cmd + ["--quantization", "sq8", "--vectors", "disk"], check=True, capture_output=True)
    assert json.loads((data / "k" / "manifest.json").read_text())["config"]["vectors"] == "disk"
    bad = subprocess.run(
        cmd[:-2] + ["--data", str(tmp_path / "d2"), "--quantization", "none", "--vectors", "disk"], capture_output=True
    )
    assert bad.returncode != 0 and b"quantization" in bad.stderr


_FULL_DISK = """
import numpy as np, kbcore
ix = kbcore.Index(64, "l2", M=8, ef_construction=16, quantization="sq8", vectors="disk")
data = np.random.default_rng(0).standard_normal((20000, 64)).astype(np.float32)  # 5 MB of rows
try:
    for i in range(0, 20000, 2000):
        ix.add(data[i : i + 2000], np.arange(i, i + 2000), threads=1)
except kbcore.errors.StorageError as e:
    print("StorageError:", e)
"""


def _run_on_a_full_tmpfs(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter whose TMPDIR is a 1 MiB tmpfs: mounted directly as
    root, else in an unprivileged user and mount namespace (``unshare -rm``); skips, saying
    why, where neither is allowed."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() == 0:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
        if res.returncode != 0:
            pytest.skip(f"a 1 MiB tmpfs cannot be mounted here: {res.stderr.decode().strip()}")
        try:
            return subprocess.run(
                [sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(mnt)}, capture_output=True
            )
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
    script = 'mount -t tmpfs -o size=1m tmpfs "$1" || exit 97; TMPDIR="$1" exec "$2" -c "$3"'
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(mnt), sys.executable, code]
    try:
        res = subprocess.run(cmd, capture_output=True)
    except FileNotFoundError:
        pytest.skip("neither root nor unshare(1): no 1 MiB tmpfs to fill")
    if res.returncode == 97 or (res.returncode == 1 and b"unshare" in res.stderr):
        pytest.skip(f"no unprivileged tmpfs mount here: {res.stderr.decode().strip()}")
    return res


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mounts a tmpfs (Linux)")
def test_a_full_temp_folder_is_a_storage_error_not_sigbus(tmp_path):
    res = _run_on_a_full_tmpfs(tmp_path, textwrap.dedent(_FULL_DISK))
    # Before the space was reserved, the first write to a sparse page past the 1 MiB killed
    # the process with SIGBUS (return code -7).
    assert res.returncode == 0, (res.returncode, res.stderr.decode()[-500:])
    out = res.stdout.decode()
    assert "StorageError:" in out and "kbcore-rows-" in out and "No space left" in out, out
