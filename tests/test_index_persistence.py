"""Index.save / Index.load: round trip, atomic write, and rejection of damaged files (docs/index.md)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import KINDS, METRICS, assert_search_matches_oracle, build, make_clustered

import kbcore
from kbcore import errors

# File header (cpp/binary_io.h): magic[8] | u32 format_version | u32 flags | u64 payload_bytes |
# u64 checksum, all little-endian.
VERSION_OFFSET = 8


def assert_same_index(a, b, queries, k=10):
    assert len(b) == len(a)
    assert sorted(b.ids().tolist()) == sorted(a.ids().tolist())
    assert (b.dim, b.metric, b.kind) == (a.dim, a.metric, a.kind)
    assert (b.M, b.ef_construction, b.ef) == (a.M, a.ef_construction, a.ef)
    a_ids, a_dist = a.search(queries, k=k)
    b_ids, b_dist = b.search(queries, k=k)
    np.testing.assert_array_equal(b_ids, a_ids)
    np.testing.assert_array_equal(b_dist, a_dist)
    some = a.ids()[:50]
    if len(some):
        np.testing.assert_array_equal(b.get_vectors(some), a.get_vectors(some))


# --------------------------------------------------------------------------------------------
# round trip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_save_load_round_trip_gives_identical_results_and_parameters(tmp_path, kind, metric):
    data, queries = make_clustered(51, 2000, 16, n_queries=50)
    index = build(data, metric=metric, kind=kind, M=12, ef_construction=100, ef=48)
    index.ef = 40  # a changed ef is part of the saved state
    path = tmp_path / "index.kbi"
    index.save(path)
    assert path.is_file()
    loaded = kbcore.Index.load(path)
    assert isinstance(loaded, kbcore.Index)
    assert (loaded.M, loaded.ef_construction, loaded.ef) == (12, 100, 40)
    assert_same_index(index, loaded, queries)
    if kind == "flat":
        ids, dist = loaded.search(queries, k=10)
        assert_search_matches_oracle(ids, dist, data, np.arange(2000), queries, 10, metric)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_save_load_round_trip_after_removes_keeps_removed_ids_out(tmp_path, kind, metric):
    data, queries = make_clustered(52, 2000, 16, n_queries=50)
    index = build(data, metric=metric, kind=kind)
    removed = np.random.default_rng(53).choice(2000, 500, replace=False)
    index.remove(removed)
    index.save(tmp_path / "index.kbi")
    loaded = kbcore.Index.load(tmp_path / "index.kbi")
    assert len(loaded) == 1500
    assert not any(int(i) in loaded for i in removed[:100])
    assert_same_index(index, loaded, np.concatenate([data[removed[:50]], queries]))
    ids, _ = loaded.search(data[removed], k=10)
    assert not set(removed.tolist()) & set(ids.ravel().tolist())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("metric", METRICS)
def test_save_load_round_trip_after_removes_and_reuse_of_freed_slots(tmp_path, kind, metric):
    data, queries = make_clustered(60, 2600, 16, n_queries=50)
    index = build(data[:2000], metric=metric, kind=kind)
    index.remove(np.arange(0, 2000, 3))
    index.add(data[2000:], np.arange(2000, 2600))  # fills freed slots
    index.add(data[:5] + 0.5, np.arange(1, 6))  # and some upserts
    index.save(tmp_path / "index.kbi")
    loaded = kbcore.Index.load(tmp_path / "index.kbi")
    assert_same_index(index, loaded, queries)
    np.testing.assert_array_equal(loaded.ids().size, index.ids().size)


@pytest.mark.parametrize("kind", KINDS)
def test_loaded_index_accepts_further_adds_and_removes(tmp_path, kind):
    data, queries = make_clustered(54, 1500, 16, n_queries=30)
    index = build(data[:1000], metric="l2", kind=kind)
    index.save(tmp_path / "index.kbi")
    loaded = kbcore.Index.load(tmp_path / "index.kbi")
    loaded.add(data[1000:], np.arange(1000, 1500))
    loaded.remove(np.arange(0, 100))
    assert len(loaded) == 1400
    ids, _ = loaded.search(data[1000:1100], k=1)
    np.testing.assert_array_equal(ids[:, 0], np.arange(1000, 1100))
    if kind == "flat":
        ids, dist = loaded.search(queries, k=10)
        assert_search_matches_oracle(ids, dist, data[100:], np.arange(100, 1500), queries, 10, "l2")


@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_of_empty_index(tmp_path, kind):
    index = kbcore.Index(dim=12, metric="cosine", kind=kind)
    index.save(tmp_path / "empty.kbi")
    loaded = kbcore.Index.load(tmp_path / "empty.kbi")
    assert len(loaded) == 0 and loaded.dim == 12 and loaded.metric == "cosine" and loaded.kind == kind
    ids, dist = loaded.search(np.ones(12, dtype=np.float32), k=3)
    assert (ids == -1).all() and np.isposinf(dist).all()


def test_save_and_load_accept_str_and_pathlike_paths(tmp_path):
    data, queries = make_clustered(55, 100, 8, n_queries=5)
    index = build(data, metric="l2", kind="flat")
    index.save(str(tmp_path / "a.kbi"))
    index.save(tmp_path / "b.kbi")
    assert_same_index(index, kbcore.Index.load(tmp_path / "a.kbi"), queries)
    assert_same_index(index, kbcore.Index.load(str(tmp_path / "b.kbi")), queries)


# --------------------------------------------------------------------------------------------
# committed files of every released format version (written by tests/data/make_format_fixtures.py)

FIXTURES = sorted((Path(__file__).parent / "data").glob("index_v*_*.kbi"))


def test_format_fixtures_exist_for_the_current_format_version(tmp_path):
    data, _ = make_clustered(62, 10, 8)
    build(data, metric="l2", kind="flat").save(tmp_path / "now.kbi")
    (version,) = struct.unpack_from("<I", (tmp_path / "now.kbi").read_bytes(), VERSION_OFFSET)
    names = {p.name for p in FIXTURES}
    for kind in KINDS:
        assert any(n.startswith(f"index_v{version}_{kind}_") for n in names), (
            f"no committed {kind} fixture for format version {version}: "
            "run tests/data/make_format_fixtures.py and commit its output"
        )


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_committed_format_fixture_still_loads_with_its_contents(path):
    _, _, kind, metric = path.stem.split("_")
    data = np.random.default_rng(20240601).standard_normal((30, 8)).astype(np.float32)
    live = [i for i in range(30) if i not in (4, 17)]
    index = kbcore.Index.load(path)
    assert (index.dim, index.metric, index.kind) == (8, metric, kind)
    assert (index.M, index.ef_construction, index.ef) == (4, 32, 20)
    assert len(index) == 28
    assert sorted(index.ids().tolist()) == [100 + i for i in live]
    stored = data[live] / np.linalg.norm(data[live], axis=1, keepdims=True) if metric == "cosine" else data[live]
    np.testing.assert_allclose(index.get_vectors([100 + i for i in live]), stored, atol=1e-6)
    queries = np.random.default_rng(1).standard_normal((10, 8)).astype(np.float32)
    ids, dist = index.search(queries, k=28)
    assert_search_matches_oracle(ids, dist, data[live], np.array(live) + 100, queries, 28, metric)


# --------------------------------------------------------------------------------------------
# atomic write


def test_save_overwrites_existing_file_and_leaves_no_temp_files(tmp_path):
    data, queries = make_clustered(56, 300, 8, n_queries=5)
    path = tmp_path / "index.kbi"
    build(data[:100], metric="l2", kind="hnsw").save(path)
    bigger = build(data, metric="l2", kind="hnsw")
    bigger.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.kbi"]
    assert_same_index(bigger, kbcore.Index.load(path), queries)


def test_save_into_missing_directory_raises_oserror_and_leaves_no_temp_files(tmp_path):
    data, _ = make_clustered(57, 100, 8)
    index = build(data, metric="l2", kind="hnsw")
    target = tmp_path / "no_such_dir" / "index.kbi"
    with pytest.raises(OSError):
        index.save(target)
    assert not (tmp_path / "no_such_dir").exists()
    assert list(tmp_path.rglob("*")) == [], f"left behind: {list(tmp_path.rglob('*'))}"
    assert len(index) == 100  # the index itself is untouched


def test_save_onto_an_existing_directory_raises_oserror_and_leaves_it_unchanged(tmp_path):
    data, _ = make_clustered(61, 50, 8)
    index = build(data, metric="l2", kind="flat")
    target = tmp_path / "taken"
    target.mkdir()
    (target / "keep.txt").write_text("x")
    with pytest.raises(OSError):
        index.save(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


def test_load_of_a_directory_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        kbcore.Index.load(tmp_path)


# --------------------------------------------------------------------------------------------
# damaged files


@pytest.fixture(params=KINDS)
def saved_bytes(request, tmp_path):
    """(bytes of a saved 200 x 8 index, scratch dir)."""
    data, _ = make_clustered(58, 200, 8)
    index = build(data, metric="l2", kind=request.param)
    path = tmp_path / "good.kbi"
    index.save(path)
    return path.read_bytes(), tmp_path


def write(tmp_path: Path, name: str, blob: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(blob)
    return p


def assert_format_error(path: Path, match: str | None = None):
    with pytest.raises(errors.FormatError, match=match) as info:
        kbcore.Index.load(path)
    assert isinstance(info.value, OSError)
    assert isinstance(info.value, errors.KbcoreError)
    return info.value


@pytest.mark.parametrize("where", ["0", "4", "10", "half", "len-1"])
def test_load_of_truncated_file_raises_format_error(saved_bytes, where):
    blob, tmp_path = saved_bytes
    cut = {"0": 0, "4": 4, "10": 10, "half": len(blob) // 2, "len-1": len(blob) - 1}[where]
    assert_format_error(write(tmp_path, "cut.kbi", blob[:cut]))


def test_load_of_file_with_a_flipped_byte_in_the_middle_raises_format_error(saved_bytes):
    blob, tmp_path = saved_bytes
    bad = bytearray(blob)
    bad[len(bad) // 2] ^= 0xFF
    assert_format_error(write(tmp_path, "flip.kbi", bytes(bad)))


def test_load_of_file_with_appended_garbage_raises_format_error(saved_bytes):
    blob, tmp_path = saved_bytes
    assert_format_error(write(tmp_path, "long.kbi", blob + b"\x00" * 16))


def test_load_of_file_with_wrong_magic_raises_format_error(saved_bytes):
    blob, tmp_path = saved_bytes
    bad = bytearray(blob)
    bad[0] ^= 0xFF
    assert_format_error(write(tmp_path, "magic.kbi", bytes(bad)), match="(?i)magic|not a kbcore")
    assert_format_error(write(tmp_path, "text.kbi", b"hello, this is not an index at all\n" * 4))


def test_load_of_file_from_a_future_format_version_raises_format_error(saved_bytes):
    blob, tmp_path = saved_bytes
    bad = bytearray(blob)
    (version,) = struct.unpack_from("<I", bad, VERSION_OFFSET)
    assert 0 < version < 100, f"unexpected header layout: version field reads {version}"
    struct.pack_into("<I", bad, VERSION_OFFSET, 9999)
    assert_format_error(write(tmp_path, "future.kbi", bytes(bad)), match="(?i)version")


def test_load_of_nonexistent_path_raises_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        kbcore.Index.load(tmp_path / "missing.kbi")


# Every truncation and every single-bit flip (low and high bit of each byte) of a saved file,
# loaded in a child process so that a crash (segfault, abort, out-of-memory from a trusted
# count) is reported instead of killing the test run.
SWEEP = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import kbcore
    from kbcore import errors

    path, kind = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(59)
    index = kbcore.Index(dim=4, metric="l2", kind=kind, M=4, ef_construction=16)
    index.add(rng.standard_normal((40, 4)).astype(np.float32), np.arange(40))
    index.remove([3, 17])
    index.save(path)
    blob = open(path, "rb").read()
    cases = [("cut", i, blob[:i]) for i in range(len(blob))]
    for pos in range(len(blob)):
        for mask in (0x01, 0x80):
            b = bytearray(blob); b[pos] ^= mask
            cases.append(("flip", pos, bytes(b)))
    bad = []
    for what, pos, data in cases:
        with open(path, "wb") as f:
            f.write(data)
        try:
            kbcore.Index.load(path)
            out = "loaded"
        except errors.FormatError:
            continue
        except BaseException as e:
            out = type(e).__name__ + ": " + str(e)[:80]
        bad.append([what, pos, out])
    print(json.dumps({"size": len(blob), "cases": len(cases), "bad": bad}))
    """
)
HEADER_BYTES = 32  # magic[8] u32 version, u32 flags, u64 payload_bytes, u64 checksum


@pytest.fixture(scope="module", params=KINDS)
def sweep(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"sweep-{request.param}")
    script = tmp / "sweep.py"
    script.write_text(SWEEP)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp / "victim.kbi"), request.param],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc


def _summary(bad):
    by_outcome = {}
    for what, pos, out in bad:
        by_outcome.setdefault(f"{what} -> {out}", []).append(pos)
    return {k: sorted(set(v))[:20] for k, v in by_outcome.items()}


def test_load_never_crashes_on_any_truncation_or_bit_flip(sweep):
    assert sweep.returncode == 0, f"child died with {sweep.returncode}: {sweep.stderr[-2000:]}"
    report = json.loads(sweep.stdout.strip().splitlines()[-1])
    assert report["cases"] > 3 * report["size"] - 1


def test_load_rejects_every_truncation_and_payload_bit_flip_with_format_error(sweep):
    assert sweep.returncode == 0, f"child died with {sweep.returncode}: {sweep.stderr[-2000:]}"
    report = json.loads(sweep.stdout.strip().splitlines()[-1])
    bad = [b for b in report["bad"] if b[0] == "cut" or b[1] >= HEADER_BYTES]
    assert not bad, f"{report['size']}-byte file; outcome -> offsets: {_summary(bad)}"


def test_load_rejects_a_bit_flip_in_any_header_byte_with_format_error(sweep):
    assert sweep.returncode == 0, f"child died with {sweep.returncode}: {sweep.stderr[-2000:]}"
    report = json.loads(sweep.stdout.strip().splitlines()[-1])
    bad = [b for b in report["bad"] if b[0] == "flip" and b[1] < HEADER_BYTES]
    assert not bad, f"header bytes whose corruption goes unnoticed: {_summary(bad)}"


# --------------------------------------------------------------------------------------------
# load refuses what add refuses (crafted files with a recomputed checksum)


def _reseal(blob: bytearray) -> bytes:
    struct.pack_into("<QQ", blob, 16, len(blob) - HEADER_BYTES, kbcore._core.checksum64(bytes(blob[HEADER_BYTES:])))
    return bytes(blob)


@pytest.mark.parametrize("defect", ["nan", "inf", "id_minus_one", "str_not_utf8"])
def test_load_rejects_what_add_rejects_even_with_a_valid_checksum(tmp_path, defect):
    dim, n = 4, 6
    index = kbcore.Index(dim=dim, metric="l2", kind="flat")
    vecs = np.arange(n * dim, dtype=np.float32).reshape(n, dim) + 1
    index.add(vecs, np.arange(10, 10 + n), metadata=[{"s": "zzzz"} for _ in range(n)], threads=1)
    index.save(tmp_path / "ok.kbi")
    blob = bytearray((tmp_path / "ok.kbi").read_bytes())
    # Payload: u64 dim, u8 metric, u8 kind, 4 x u64 parameters, u64 slots, ids, live flags, vectors.
    ids_at = HEADER_BYTES + 8 + 1 + 1 + 4 * 8 + 8
    vec_at = ids_at + 8 * n + n
    if defect == "nan":
        struct.pack_into("<f", blob, vec_at + 4 * dim * 2, float("nan"))
    elif defect == "inf":
        struct.pack_into("<f", blob, vec_at + 4 * dim * 3 + 4, float("-inf"))
    elif defect == "id_minus_one":
        struct.pack_into("<q", blob, ids_at + 8, -1)
    else:
        at = bytes(blob).index(b"zzzz")
        blob[at + 1] = 0xFF
    (tmp_path / "bad.kbi").write_bytes(_reseal(blob))
    assert kbcore.Index.load(tmp_path / "ok.kbi").get_metadata([10]) == [{"s": "zzzz"}]
    with pytest.raises(errors.FormatError):
        kbcore.Index.load(tmp_path / "bad.kbi")


# --------------------------------------------------------------------------------------------
# concurrent builds (issue 30, item 1)


@pytest.mark.parametrize("quantization", [None, "sq8", "rabitq"])
def test_two_thread_builds_with_repeated_vectors_always_save_a_file_that_loads(tmp_path, quantization):
    # Many identical vectors leave nodes that a two-thread build cannot reach by search; the
    # reachability repair used to append one of them twice to a list, and load refused the
    # file ("repeated link in one list") in most of these builds.
    path = tmp_path / "a.kbi"
    failures = []
    for seed in range(12):
        rng = np.random.default_rng(seed)
        data = rng.integers(-1, 2, size=(1200, 4)).astype(np.float32)
        data[:, 0] += 3.0  # no zero rows under cosine
        index = kbcore.Index(4, "cosine", M=4, ef_construction=16, seed=seed, quantization=quantization)
        index.add(data, np.arange(len(data)), threads=2)
        index.save(path)
        try:
            loaded = kbcore.Index.load(path)
        except errors.FormatError as exc:
            failures.append((seed, str(exc)))
            continue
        assert len(loaded) == len(data)
        ids, _ = loaded.search(data[:20], k=5)
        assert (ids >= 0).all()
    assert not failures
