"""The shard write-ahead log (kbcore.distributed.wal) against damage: nothing acknowledged is lost.

Every bit of every record frame and JSON header of a small log is flipped, one at a time:
reading (and recovering a shard from) the damaged log must either give back every
acknowledged record or raise FormatError naming the offset (and the shard), and the file is
never truncated on error. A torn tail (any prefix of the file, or zeros after it) is dropped,
as a crash mid-append leaves it. Hypothesis mutates whole logs (a fixed seed for CI). No Ray.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib

import numpy as np
import pytest

from kbcore.distributed.shard import ShardState
from kbcore.distributed.wal import WalRecord, WalWriter, encode_record, read_log
from kbcore.errors import FormatError

hypothesis = pytest.importorskip("hypothesis", reason="the WAL fuzz target needs hypothesis (pip install .[test])")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

DIM = 4
HEADER = 12  # file magic + version
EXAMPLES = int(os.environ.get("KBCORE_FUZZ_EXAMPLES", "150"))


def _record(seq: int) -> WalRecord:
    rng = np.random.default_rng(seq)
    n = 2
    return WalRecord(
        seq,
        "add",
        rng.standard_normal((n, DIM)).astype(np.float32),
        np.arange(seq * 10, seq * 10 + n, dtype=np.int64),
        np.empty(0, np.int64),
        [{"document_id": f"d{seq}"} for _ in range(n)],
        None,
    )


def _same(a: WalRecord, b: WalRecord) -> bool:
    return (
        a.seq == b.seq
        and a.op == b.op
        and np.array_equal(a.vectors, b.vectors)
        and np.array_equal(a.ids, b.ids)
        and np.array_equal(a.discard, b.discard)
        and a.metadata == b.metadata
        and a.texts == b.texts
    )


def _write_log(path: str, recs: list[WalRecord]) -> bytes:
    w = WalWriter(path)
    for r in recs:
        w.append(r)
    w.close()
    with open(path, "rb") as f:
        return f.read()


def _header_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each record's frame + JSON header in a log of RECS."""
    spans, at = [], HEADER
    for rec in RECS:
        hlen, plen = struct.unpack_from("<IQ", data, at + 4)
        frame = len(encode_record(rec)) - hlen - plen
        spans.append((at, at + frame + hlen))
        at += frame + hlen + plen
    return spans


RECS = [_record(s) for s in (1, 2, 3)]


def test_every_header_bit_flip_replays_all_or_raises(tmp_path):
    path = str(tmp_path / "w.log")
    good = _write_log(path, RECS)
    spans = _header_spans(good)
    assert len(spans) == 3
    errors = 0
    fd = os.open(path, os.O_RDWR)
    try:
        for start, end in spans:
            for byte in range(start, end):
                for bit in range(8):
                    os.pwrite(fd, bytes([good[byte] ^ (1 << bit)]), byte)  # one flipped bit
                    try:
                        got, valid = read_log(path)
                    except FormatError as exc:
                        assert "byte" in str(exc)
                        errors += 1
                    else:
                        assert len(got) == len(RECS) and valid == len(good), (byte, bit)
                        assert all(_same(a, b) for a, b in zip(got, RECS))
                    assert os.fstat(fd).st_size == len(good)  # reading never truncates
                    os.pwrite(fd, good[byte : byte + 1], byte)
    finally:
        os.close(fd)
    assert errors == sum(8 * (e - s) for s, e in spans)  # every flip is caught by a checksum


def test_a_damaged_length_fails_shard_recovery_and_keeps_the_file(tmp_path):
    opts = dict(shard=3, dim=DIM, metric="l2", kind="flat", index_options={})
    s = ShardState(str(tmp_path), **opts)
    for r in RECS:
        s.apply(r.vectors, r.ids, r.metadata, None, np.empty(0, np.int64))
    del s
    (log,) = [n for n in os.listdir(tmp_path) if n.startswith("wal-")]
    path = str(tmp_path / log)
    with open(path, "rb") as f:
        good = f.read()
    first = _header_spans(good)[0][0]
    for field, width in ((4, 4), (8, 8)):  # header length, payload length
        for bit in range(width * 8):
            bad = bytearray(good)
            bad[first + field + bit // 8] ^= 1 << (bit % 8)
            with open(path, "wb") as f:
                f.write(bad)
            with pytest.raises(FormatError, match=rf"shard 3: .*byte {first}\b"):
                ShardState(str(tmp_path), **opts)
            assert os.path.getsize(path) == len(good)  # never truncated on error
    with open(path, "wb") as f:
        f.write(good)
    r = ShardState(str(tmp_path), **opts)
    assert sorted(r.ids().tolist()) == sorted(int(i) for rec in RECS for i in rec.ids)


def test_a_torn_tail_is_dropped_and_only_a_tail(tmp_path):
    path = str(tmp_path / "w.log")
    good = _write_log(path, RECS)
    bounds = [HEADER] + [s for s, _ in _header_spans(good)[1:]] + [len(good)]
    for cut in range(HEADER, len(good) + 1):
        # Zeros after the last whole record: a file extended before its data reached disk.
        for tail in (b"", b"\x00" * 4096) if cut in bounds else (b"",):
            with open(path, "wb") as f:
                f.write(good[:cut] + tail)
            got, valid = read_log(path)
            whole = sum(1 for b in bounds[1:] if b <= cut)
            assert len(got) == whole and valid == bounds[whole], cut
            assert all(_same(a, b) for a, b in zip(got, RECS))
    # A torn record followed by a valid one is not a tail: an error, not a drop.
    start2 = bounds[1]
    with open(path, "wb") as f:
        f.write(good[: start2 + 30] + good[start2:])
    with pytest.raises(FormatError, match=rf"byte {start2}\b"):
        read_log(path)


def test_format_1_logs_are_read_and_appended_in_format_1(tmp_path):
    path = str(tmp_path / "w.log")
    with open(path, "wb") as f:
        f.write(b"KBWAL\x00\x00\x00" + struct.pack("<I", 1) + b"".join(encode_record(r, 1) for r in RECS[:2]))
    w = WalWriter(path)
    w.append(RECS[2])
    w.close()
    got, valid = read_log(path)
    assert [r.seq for r in got] == [1, 2, 3] and valid == os.path.getsize(path)
    with open(path, "rb") as f:
        data = f.read()
    # Format 1 has no frame checksum; a damaged length before a valid record is still caught.
    bad = bytearray(data)
    bad[HEADER + 11] ^= 0x01  # the first record's payload length grows past the file's end
    with open(path, "wb") as f:
        f.write(bad)
    with pytest.raises(FormatError, match="valid record follows"):
        read_log(path)


FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=not os.environ.get("KBCORE_FUZZ_RANDOM"),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    cut=st.one_of(st.none(), st.integers(0, 10_000)),
)
def test_fuzz_mutated_logs(tmp_path, edits, cut):
    """Overwritten bytes: every record or FormatError. Cut short as well: a prefix or FormatError."""
    path = str(tmp_path / "fuzz.log")
    good = _write_log(path, RECS)
    bad = bytearray(good)
    for at, value in edits:
        bad[at % len(bad)] = value
    if cut is not None:
        bad = bad[: cut % (len(bad) + 1)]
    with open(path, "wb") as f:
        f.write(bad)
    try:
        got, valid = read_log(path)
    except FormatError:
        return
    assert valid <= len(bad) and all(_same(a, b) for a, b in zip(got, RECS))
    if cut is None and bad[:HEADER] == good[:HEADER]:
        assert len(got) == len(RECS)  # nothing acknowledged is dropped without an error


def _fix_checksums(data: bytearray) -> None:
    """Recomputes every format-2 record's CRCs in place, so mutations reach the decoder."""
    at = HEADER
    while at + 24 <= len(data):
        hlen, plen = struct.unpack_from("<IQ", data, at + 4)
        end = at + 24 + hlen + plen
        if data[at : at + 4] != b"KBWR" or end > len(data):
            return
        struct.pack_into("<I", data, at + 16, zlib.crc32(bytes(data[at + 24 : end])))
        struct.pack_into("<I", data, at + 20, zlib.crc32(bytes(data[at : at + 20])))
        at = end


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6))
def test_fuzz_records_with_valid_checksums_replay_or_raise_format_error(tmp_path, edits):
    """Crafted records (checksums recomputed): reading and replaying into a shard raise only
    FormatError, never another exception or a crash (Arrow metadata is validated in full)."""
    opts = dict(shard=1, dim=DIM, metric="l2", kind="flat", index_options={})
    directory = tmp_path / "shard"
    if directory.exists():
        shutil.rmtree(directory)
    s = ShardState(str(directory), **opts)
    import pyarrow as pa

    s.apply(RECS[0].vectors, RECS[0].ids, RECS[0].metadata, ["a", None], np.empty(0, np.int64))
    s.apply(RECS[1].vectors, RECS[1].ids, pa.table({"document_id": ["x", "y"], "k": [1, 2]}), None, np.array([10]))
    s.discard(RECS[1].ids[:1])
    del s
    (log,) = [n for n in os.listdir(directory) if n.startswith("wal-")]
    path = str(directory / log)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for at, value in edits:
        data[HEADER + at % (len(data) - HEADER)] = value
    _fix_checksums(data)
    with open(path, "wb") as f:
        f.write(data)
    try:
        read_log(path)
        ShardState(str(directory), **opts)
    except FormatError:
        pass
