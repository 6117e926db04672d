"""Huge-page backing of the large native arrays (cpp/aligned.h): with the process-wide switch
on, a large index's rows, SQ8 codes and level-0 links are mapped for transparent huge pages,
so the process's AnonHugePages grows; off, they are not; and the answers are the same bit for
bit either way (only the page size differs)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import kbcore
from kbcore import _core

THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
SMAPS_ROLLUP = Path("/proc/self/smaps_rollup")


def _thp_mode() -> str | None:
    """The bracketed THP mode ("always", "madvise", "never"), or None without THP."""
    try:
        text = THP_ENABLED.read_text()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _anon_huge_kb() -> int:
    for line in SMAPS_ROLLUP.read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("smaps_rollup has no AnonHugePages line")


@pytest.fixture
def restore_switch() -> Iterator[None]:
    was = _core.huge_pages()
    yield
    _core.set_huge_pages(was)


def _flat_index(data: np.ndarray) -> kbcore.Index:
    index = kbcore.Index(data.shape[1], "l2", kind="flat")
    index.add(data, np.arange(len(data), dtype=np.int64), threads=1)
    return index


def test_switch_round_trips_and_reports_support(restore_switch: None) -> None:
    _core.set_huge_pages(False)
    assert _core.huge_pages() is False
    _core.set_huge_pages(True)
    assert _core.huge_pages() is True
    assert _core.huge_pages_supported() is sys.platform.startswith("linux")


@pytest.mark.parametrize(("value", "expected"), [("0", False), ("off", False), ("1", True)])
def test_environment_variable_sets_the_switch_at_import(value: str, expected: bool) -> None:
    env = dict(os.environ, KBCORE_HUGE_PAGES=value)
    out = subprocess.run(
        [sys.executable, "-c", "import kbcore._core as c; print(c.huge_pages())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == str(expected)


def test_large_index_grows_anon_huge_pages_only_with_the_switch_on(restore_switch: None) -> None:
    if not SMAPS_ROLLUP.exists():
        pytest.skip("no /proc/self/smaps_rollup on this system (not Linux, or a kernel before 4.14)")
    mode = _thp_mode()
    if mode not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are {mode or 'absent'}: no huge pages to observe")
    rng = np.random.default_rng(11)
    # 24000 x 256 float32 rows: 24.6 MB, twelve 2 MiB pages; the data is made (and numpy's own
    # huge pages taken) before each baseline.
    data = rng.standard_normal((24000, 256), dtype=np.float32)
    growth = {}
    kept = []
    for on in (False, True):
        _core.set_huge_pages(on)
        before = _anon_huge_kb()
        kept.append(_flat_index(data))
        growth[on] = _anon_huge_kb() - before
    # Off: the rows are marked MADV_NOHUGEPAGE. On: most of the 24 MB should be 2 MiB pages; at
    # least two of them even when the kernel cannot find contiguous memory for every fault.
    assert growth[True] >= growth[False] + 4096, growth
    assert growth[False] < 4096, growth
    # The rows end 1.4 MB into their twelfth 2 MiB page: that last, partly used page stays in
    # 4 KiB pages (MADV_NOHUGEPAGE), so at most the eleven whole ones become huge pages.
    whole_pages = data.nbytes // (2 << 20)
    assert data.nbytes % (2 << 20) != 0
    assert growth[True] <= whole_pages * 2048, growth


@pytest.mark.parametrize("quantization", [None, "sq8"])
def test_answers_are_bit_identical_with_huge_pages_on_and_off(restore_switch: None, quantization: str | None) -> None:
    # 11000 x 384: the float32 rows (16.9 MB) and the SQ8 codes (4.2 MB) both cross the 4 MiB
    # huge-page threshold, so the two builds really differ in their mappings.
    rng = np.random.default_rng(5)
    data = rng.standard_normal((11000, 384), dtype=np.float32)
    queries = rng.standard_normal((40, 384), dtype=np.float32)
    ids = np.arange(len(data), dtype=np.int64) * 3 + 7
    answers = []
    for on in (True, False):
        _core.set_huge_pages(on)
        index = kbcore.Index(384, "l2", M=8, ef_construction=32, seed=9, quantization=quantization)
        index.add(data, ids, threads=1)
        got_ids, got_dist = index.search(queries, k=10, ef=48)
        answers.append((np.asarray(got_ids), np.asarray(got_dist)))
    (ids_on, dist_on), (ids_off, dist_off) = answers
    assert np.array_equal(ids_on, ids_off)
    assert np.array_equal(dist_on.view(np.uint32), dist_off.view(np.uint32))
    assert (ids_on >= 7).all()  # real answers, not an empty result compared with itself
