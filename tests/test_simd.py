"""SIMD dispatch: every level the CPU can run gives the scalar kernels' results (docs/index.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import METRICS, assert_search_matches_oracle, build, make_clustered, recall_at_k

import kbcore

KNOWN_LEVELS = ("scalar", "avx2", "avx512")


@pytest.fixture
def restore_simd_level(request):
    original = kbcore.simd_level()
    request.addfinalizer(lambda: kbcore.set_simd_level(original))
    return original


def levels():
    return list(kbcore.available_simd_levels())


def test_available_levels_start_with_scalar_and_include_the_active_level():
    avail = levels()
    assert avail[0] == "scalar"
    assert set(avail) <= set(KNOWN_LEVELS), avail
    assert len(set(avail)) == len(avail)
    assert kbcore.simd_level() in avail


def test_set_simd_level_switches_the_reported_level(restore_simd_level):
    for level in levels():
        kbcore.set_simd_level(level)
        assert kbcore.simd_level() == level


def test_set_simd_level_rejects_an_unknown_name(restore_simd_level):
    with pytest.raises(ValueError, match="(?i)simd|level|avx9000"):
        kbcore.set_simd_level("avx9000")
    assert kbcore.simd_level() == restore_simd_level


def test_set_simd_level_rejects_a_level_this_cpu_cannot_run(restore_simd_level):
    missing = [lv for lv in KNOWN_LEVELS if lv not in levels()]
    if not missing:
        pytest.skip("this CPU runs every known SIMD level, so none can be refused")
    with pytest.raises(ValueError):
        kbcore.set_simd_level(missing[-1])
    assert kbcore.simd_level() == restore_simd_level


# dims chosen around the 8- and 16-float register widths to exercise every tail path
@pytest.mark.parametrize("dim", [1, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100])
@pytest.mark.parametrize("metric", METRICS)
def test_flat_search_under_every_level_matches_scalar_level(restore_simd_level, metric, dim):
    data, queries = make_clustered(81 + dim, 1500, dim, n_queries=30)
    index = build(data, metric=metric, kind="flat")
    kbcore.set_simd_level("scalar")
    ref_ids, ref_dist = index.search(queries, k=10)
    assert_search_matches_oracle(ref_ids, ref_dist, data, np.arange(1500), queries, 10, metric)
    for level in levels():
        kbcore.set_simd_level(level)
        ids, dist = index.search(queries, k=10)
        np.testing.assert_allclose(dist, ref_dist, rtol=0, atol=1e-4, err_msg=f"level {level}")
        assert_search_matches_oracle(ids, dist, data, np.arange(1500), queries, 10, metric)
        one_ids, one_dist = index.search(queries[0], k=10)
        np.testing.assert_allclose(one_dist, ref_dist[0], rtol=0, atol=1e-4, err_msg=f"level {level}")


def misaligned(a: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 copy of `a` whose data pointer is 4 bytes past a 64-byte boundary."""
    buf = np.empty(a.size + 32, dtype=np.float32)
    skip = ((-buf.ctypes.data) % 64) // 4 + 1
    out = buf[skip : skip + a.size].reshape(a.shape)
    out[...] = a
    assert out.flags.c_contiguous and out.ctypes.data % 32 == 4
    return out


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_misaligned_inputs_give_same_results_as_aligned_under_every_level(restore_simd_level, kind):
    data, queries = make_clustered(91, 1000, 37, n_queries=20)
    for level in levels():
        kbcore.set_simd_level(level)
        index = build(data, metric="l2", kind=kind)
        shifted = build(misaligned(data), metric="l2", kind=kind)
        np.testing.assert_array_equal(shifted.get_vectors(np.arange(1000)), data)
        ref_ids, ref_dist = index.search(queries, k=10, threads=1)
        ids, dist = index.search(misaligned(queries), k=10, threads=1)
        np.testing.assert_array_equal(ids, ref_ids, err_msg=f"level {level}")
        np.testing.assert_allclose(dist, ref_dist, rtol=0, atol=1e-5, err_msg=f"level {level}")
        one_ids, one_dist = index.search(misaligned(queries[3]), k=10)
        np.testing.assert_array_equal(one_ids, ref_ids[3])
        if kind == "flat":
            assert_search_matches_oracle(ids, dist, data, np.arange(1000), queries, 10, "l2")
            s_ids, s_dist = shifted.search(queries, k=10)
            assert_search_matches_oracle(s_ids, s_dist, data, np.arange(1000), queries, 10, "l2")


@pytest.mark.parametrize("metric", METRICS)
def test_hnsw_built_and_searched_under_every_level_keeps_recall(restore_simd_level, metric):
    data, queries = make_clustered(90, 3000, 40, n_queries=100)
    live = np.arange(3000)
    for level in levels():
        kbcore.set_simd_level(level)
        index = build(data, metric=metric, kind="hnsw")
        ids, _ = index.search(queries, k=10)
        r = recall_at_k(ids, data, live, queries, 10, metric)
        assert r >= 0.95, f"level {level}: recall@10 {r:.4f}"


def _level_in_child(env_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, KBCORE_SIMD=env_value)
    return subprocess.run(
        [sys.executable, "-c", "import kbcore; print(kbcore.simd_level())"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_kbcore_simd_env_var_scalar_forces_scalar_at_import():
    proc = _level_in_child("scalar")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "scalar"


def test_kbcore_simd_env_var_forces_each_available_level_at_import():
    for level in levels():
        proc = _level_in_child(level)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == level
