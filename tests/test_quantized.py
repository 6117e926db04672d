"""Quantized HNSW (quantization="sq8" and "rabitq" at 1, 4 and 8 bits): the graph is walked on
codes and the best candidates re-ranked exactly, so every answer is checked against the exact
oracle and the float32 index built with the same parameters (docs/quantization.md)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    METRICS,
    assert_distances_are_true,
    assert_search_matches_oracle,
    make_clustered,
    recall_at_k,
)

import kbcore
from kbcore.filters import compile_where

N, DIM = 3000, 48  # 48 is not a multiple of the 64-byte code stride: padding is exercised
PARAMS = dict(M=12, ef_construction=100, seed=3)
VERSION_OFFSET = 8
DATA_DIR = Path(__file__).parent / "data"
#: The quantized configurations every test here runs on (RaBitQ: the three code containers).
QUANTS = {
    "sq8": dict(quantization="sq8"),
    "rabitq1": dict(quantization="rabitq", bits=1),
    "rabitq2": dict(quantization="rabitq", bits=2),
    "rabitq4": dict(quantization="rabitq"),
    "rabitq8": dict(quantization="rabitq", bits=8),
}
#: The file format version each writes (6: the code type tagged by name, a block checksum; 2, 3 and 5 are read only).
FORMAT = {"sq8": 7, "rabitq": 7}
#: How far below float32 the recall@10 of 1- and 2-bit RaBitQ codes may fall at each ef on this
#: data (48 dimensions, where so few bits are coarse). Measured, worst metric: 1 bit 0.24 / 0.24 /
#: 0.09 / 0.01 at ef 10 / 16 / 32 / 64, 2 bits 0.06 / 0.06 / 0.003 / 0; at 256 dimensions 1 bit
#: loses 0.06 / 0.07 / 0.01 / 0.
SLACK_LOW_BITS = {1: {10: 0.3, 16: 0.3, 32: 0.12, 64: 0.03}, 2: {10: 0.08, 16: 0.08, 32: 0.02, 64: 0.01}}


@pytest.fixture(scope="module", params=list(QUANTS))
def quant(request) -> dict:
    return QUANTS[request.param]


def _pair(metric: str, data: np.ndarray, quant: dict, **kw):
    ids = np.arange(len(data), dtype=np.int64) + 1000
    f32 = kbcore.Index(DIM, metric, **PARAMS)
    sq8 = kbcore.Index(DIM, metric, **PARAMS, **quant, **kw)
    f32.add(data, ids, threads=1)
    sq8.add(data, ids, threads=1)
    return f32, sq8, ids


@pytest.fixture(scope="module", params=METRICS)
def built(request, quant):
    data, queries = make_clustered(71, N, DIM, n_queries=60)
    f32, sq8, ids = _pair(request.param, data, quant)
    return request.param, data, queries, ids, f32, sq8


def test_quantized_index_trains_at_the_threshold_and_reports_its_settings(built, quant):
    metric, data, queries, ids, f32, sq8 = built
    assert sq8.quantization == quant["quantization"] and sq8.quantizer_trained and sq8.rerank is None
    assert sq8.bits == (quant.get("bits", 4) if quant["quantization"] == "rabitq" else None)
    assert f32.quantization is None and not f32.quantizer_trained and f32.bits is None
    assert f"quantization={quant['quantization']!r}" in repr(sq8)


@pytest.mark.parametrize("ef", [10, 16, 32, 64])
def test_quantized_recall_matches_float32_at_the_same_ef(built, quant, ef):
    metric, data, queries, ids, f32, sq8 = built
    r32 = recall_at_k(f32.search(queries, 10, ef=ef)[0], data, ids, queries, 10, metric)
    got_ids, got_dist = sq8.search(queries, 10, ef=ef)
    r8 = recall_at_k(got_ids, data, ids, queries, 10, metric)
    # At ef == k the candidate list has no slack for the codes' ordering errors (measured:
    # up to 0.022 lower); from ef 16 on the two agree within 0.001 on this data. 1- and 2-bit
    # RaBitQ codes steer the walk less well: SLACK_LOW_BITS is what they are held to.
    slack = 0.03 if ef <= 10 else 0.01
    if quant.get("bits") in SLACK_LOW_BITS:
        slack = SLACK_LOW_BITS[quant["bits"]][ef]
    assert r8 >= r32 - slack, f"ef {ef}: {quant} recall {r8:.3f} vs float32 {r32:.3f}"
    # distances are exact (re-ranked from the float32 rows) and ascending
    assert_distances_are_true(got_ids, got_dist, data, ids, queries, metric)
    assert np.all(np.diff(got_dist, axis=1) >= 0)


def test_shallow_rerank_still_returns_exact_distances_at_lower_recall(built, quant):
    metric, data, queries, ids, f32, _ = built
    shallow = kbcore.Index(DIM, metric, **PARAMS, **quant, rerank=10)
    shallow.add(data, ids, threads=1)
    assert shallow.rerank == 10
    got_ids, got_dist = shallow.search(queries, 10, ef=64)
    assert_distances_are_true(got_ids, got_dist, data, ids, queries, metric)
    # (at 48 dimensions, cosine: 1 bit 0.48 and 2 bits 0.68 measured)
    floor = {1: 0.4, 2: 0.6}.get(quant.get("bits"), 0.8)
    assert recall_at_k(got_ids, data, ids, queries, 10, metric) >= floor


def test_before_training_a_quantized_index_answers_like_float32(quant):
    data, queries = make_clustered(72, 500, DIM, n_queries=20)
    f32, sq8, ids = _pair("l2", data, quant)
    assert not sq8.quantizer_trained
    a, b = f32.search(queries, 10), sq8.search(queries, 10)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    sq8.add(make_clustered(73, 600, DIM)[0], np.arange(600) + 10_000, threads=1)
    assert sq8.quantizer_trained


def test_quantization_none_writes_files_byte_identical_to_the_float32_index(tmp_path):
    data, _ = make_clustered(74, 1500, DIM)
    a = kbcore.Index(DIM, "cosine", **PARAMS)
    b = kbcore.Index(DIM, "cosine", **PARAMS, quantization=None)
    for ix in (a, b):
        ix.add(data, np.arange(len(data)), threads=1)
    a.save(tmp_path / "a.kbi")
    b.save(tmp_path / "b.kbi")
    raw = (tmp_path / "a.kbi").read_bytes()
    assert raw == (tmp_path / "b.kbi").read_bytes()
    assert struct.unpack_from("<I", raw, VERSION_OFFSET)[0] == 1


def test_upsert_and_remove_with_slot_reuse_keep_quantized_answers_exact_and_live(quant):
    data, queries = make_clustered(75, 2500, DIM, n_queries=40)
    metric = "cosine"
    f32, sq8, ids = _pair(metric, data, quant)
    rng = np.random.default_rng(5)
    gone = rng.choice(ids, 600, replace=False)
    for ix in (f32, sq8):
        ix.remove(gone, threads=1)
    fresh, _ = make_clustered(76, 600, DIM)
    new_ids = np.arange(600, dtype=np.int64) + 50_000  # reuse the freed slots
    upsert_ids = ids[~np.isin(ids, gone)][:200]
    upsert_vecs = make_clustered(77, 200, DIM)[0]
    for ix in (f32, sq8):
        ix.add(fresh, new_ids, threads=1)
        ix.add(upsert_vecs, upsert_ids, threads=1)
    live_mask = ~np.isin(ids, gone)
    all_ids = np.concatenate([ids[live_mask], new_ids])
    all_data = np.concatenate([data[live_mask], fresh])
    pos = {int(i): p for p, i in enumerate(all_ids)}
    for i, v in zip(upsert_ids, upsert_vecs):
        all_data[pos[int(i)]] = v
    got_ids, got_dist = sq8.search(queries, 10, ef=64)
    assert not np.isin(got_ids, gone).any()
    assert_distances_are_true(got_ids, got_dist, all_data, all_ids, queries, metric)
    r8 = recall_at_k(got_ids, all_data, all_ids, queries, 10, metric)
    r32 = recall_at_k(f32.search(queries, 10, ef=64)[0], all_data, all_ids, queries, 10, metric)
    assert r8 >= r32 - 0.02 and r8 >= 0.9, (r8, r32)


def test_deferred_graph_rows_are_found_before_and_after_building(quant):
    data, queries = make_clustered(78, 2000, DIM, n_queries=30)
    ids = np.arange(len(data), dtype=np.int64)
    ix = kbcore.Index(DIM, "l2", **PARAMS, **quant)
    ix.add(data[:1200], ids[:1200], threads=1)
    ix.add(data[1200:], ids[1200:], threads=1, defer_graph=True)
    assert ix.pending == 800
    got = ix.search(queries, 10, ef=64)
    assert recall_at_k(got[0], data, ids, queries, 10, "l2") >= 0.95
    assert_distances_are_true(*got, data, ids, queries, "l2")
    ix.build_graph()
    assert ix.pending == 0
    got = ix.search(queries, 10, ef=64)
    assert recall_at_k(got[0], data, ids, queries, 10, "l2") >= 0.95


@pytest.fixture(scope="module")
def filtered(quant):
    data, queries = make_clustered(79, N, DIM, n_queries=30)
    ids = np.arange(N, dtype=np.int64)
    meta = [{"bucket": int(i % 100)} for i in range(N)]
    ix = kbcore.Index(DIM, "l2", **PARAMS, **quant)
    ix.add(data, ids, metadata=meta, threads=1)
    return ix, data, queries, ids, np.array([m["bucket"] for m in meta])


@pytest.mark.parametrize("strategy", ["exact", "graph", "walk", "auto"])
@pytest.mark.parametrize("below", [2, 10, 50])
def test_filtered_quantized_search_returns_passing_rows_at_exact_distances(filtered, strategy, below):
    ix, data, queries, ids, bucket = filtered
    where = {"bucket": {"$lt": below}}
    mask = bucket < below
    got_ids, got_dist = ix._native.search(queries, 10, 64, 1, compile_where(where), strategy)
    assert np.isin(got_ids, ids[mask]).all()
    assert_distances_are_true(got_ids, got_dist, data[mask], ids[mask], queries, "l2")
    recall = recall_at_k(got_ids, data[mask], ids[mask], queries, 10, "l2")
    assert recall >= (0.99 if strategy == "exact" else 0.9), f"{strategy} {below}%: {recall:.3f}"


def test_exact_scan_with_a_deep_rerank_equals_the_oracle(filtered):
    ix, data, queries, ids, bucket = filtered
    mask = bucket < 3
    got = ix._native.search(queries, 10, int(mask.sum()), 1, compile_where({"bucket": {"$lt": 3}}), "exact")
    assert_search_matches_oracle(*got, data[mask], ids[mask], queries, 10, "l2")


def test_grouped_and_text_search_work_on_a_quantized_index(quant):
    data, queries = make_clustered(80, 1500, DIM, n_queries=10)
    ids = np.arange(len(data), dtype=np.int64)
    meta = [{"document_id": int(i // 5)} for i in range(len(data))]
    texts = [f"chunk {i} word{i % 7}" for i in range(len(data))]
    ix = kbcore.Index(DIM, "cosine", **PARAMS, **quant)
    ref = kbcore.Index(DIM, "cosine", **PARAMS)
    for x in (ix, ref):
        x.add(data, ids, metadata=meta, texts=texts, threads=1)
    got = ix.search_groups(queries, 5, group_by="document_id")
    want = ref.search_groups(queries, 5, group_by="document_id")
    assert [[g.key for g in row] for row in got] == [[g.key for g in row] for row in want]
    for a, b in zip(ix.search_text("word3", 5), ref.search_text("word3", 5)):
        np.testing.assert_array_equal(a, b)


def test_batch_search_on_threads_equals_one_thread(built):
    *_, queries, _, _, sq8 = built
    one = sq8.search(queries, 10, threads=1)
    two = sq8.search(queries, 10, threads=2)
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])


def test_every_simd_level_returns_the_scalar_answer(built):
    metric, data, queries, ids, _, sq8 = built
    original = kbcore.simd_level()
    try:
        kbcore.set_simd_level("scalar")
        want = sq8.search(queries, 10, ef=32)
        for level in kbcore.available_simd_levels():
            kbcore.set_simd_level(level)
            got = sq8.search(queries, 10, ef=32)
            # the code distances are exact integers at every level: the same nodes are met and
            # re-ranked; the float32 re-rank may differ in the last bits between levels
            np.testing.assert_array_equal(got[0], want[0], err_msg=level)
            np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-5, err_msg=level)
    finally:
        kbcore.set_simd_level(original)


def test_kbcore_simd_scalar_environment_runs_the_quantized_search(tmp_path, built):
    metric, data, queries, ids, _, sq8 = built
    path = tmp_path / "q.kbi"
    sq8.save(path)
    np.save(tmp_path / "q.npy", queries)
    code = (
        "import numpy as np, kbcore, sys; ix = kbcore.Index.load(sys.argv[1]);"
        "assert kbcore.simd_level() == 'scalar';"
        "np.save(sys.argv[3], ix.search(np.load(sys.argv[2]), 10, ef=32)[0])"
    )
    env = dict(os.environ, KBCORE_SIMD="scalar")
    subprocess.run(
        [sys.executable, "-c", code, str(path), str(tmp_path / "q.npy"), str(tmp_path / "out.npy")], env=env, check=True
    )
    original = kbcore.simd_level()
    try:
        kbcore.set_simd_level("scalar")
        np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), sq8.search(queries, 10, ef=32)[0])
    finally:
        kbcore.set_simd_level(original)


def test_persistence_round_trips_a_quantized_index_in_its_format_version(tmp_path, built, quant):
    metric, data, queries, ids, _, sq8 = built
    path = tmp_path / "q.kbi"
    sq8.save(path)
    raw = path.read_bytes()
    assert struct.unpack_from("<I", raw, VERSION_OFFSET)[0] == FORMAT[quant["quantization"]]
    back = kbcore.Index.load(path)
    assert back.quantization == quant["quantization"] and back.quantizer_trained and back.bits == sq8.bits
    for a, b in zip(back.search(queries, 10, ef=32), sq8.search(queries, 10, ef=32)):
        np.testing.assert_array_equal(a, b)
    back.save(tmp_path / "again.kbi")
    assert (tmp_path / "again.kbi").read_bytes() == raw


def test_a_corrupted_code_byte_fails_the_checksum(tmp_path, built):
    *_, sq8 = built
    path = tmp_path / "q.kbi"
    sq8.save(path)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0x5A  # inside the trailing code rows
    path.write_bytes(bytes(raw))
    with pytest.raises(OSError, match="(?i)checksum|corrupt"):
        kbcore.Index.load(path)


def test_committed_v2_fixture_loads_and_answers_at_exact_distances():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_sq8_fixture", DATA_DIR / "make_sq8_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    data, ids = gen.fixture_rows()
    index = kbcore.Index.load(DATA_DIR / gen.FILE_NAME)
    assert (index.quantization, index.quantizer_trained, index.metric, len(index)) == ("sq8", True, "cosine", len(ids))
    queries = np.random.default_rng(2).standard_normal((10, gen.DIM)).astype(np.float32)
    got = index.search(queries, 10, ef=64)
    assert_distances_are_true(*got, data, ids, queries, "cosine")
    assert recall_at_k(got[0], data, ids, queries, 10, "cosine") >= 0.95


def test_committed_v3_rabitq_fixture_loads_and_answers_at_exact_distances():
    # Format 3 (RaBitQ) as first released: a later layout or tagging of the code types must
    # still read this file, with its rotation, centroid and 3-bit codes, to the same answers.
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_rabitq_fixture", DATA_DIR / "make_rabitq_fixture.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    path = DATA_DIR / gen.FILE_NAME
    assert struct.unpack_from("<I", path.read_bytes(), VERSION_OFFSET)[0] == gen.FORMAT_VERSION
    data, ids = gen.fixture_rows()
    index = kbcore.Index.load(path)
    assert (index.quantization, index.bits, index.quantizer_trained, index.metric, len(index)) == (
        "rabitq",
        gen.BITS,
        True,
        "l2",
        len(ids),
    )
    removed = [i for i in gen.REMOVED if i not in set(ids.tolist())]
    assert removed and not any(i in index for i in removed)
    queries = np.random.default_rng(3).standard_normal((20, gen.DIM)).astype(np.float32)
    got = index.search(queries, 10, ef=64)
    assert_distances_are_true(*got, data, ids, queries, "l2")
    assert recall_at_k(got[0], data, ids, queries, 10, "l2") >= 0.95
    np.testing.assert_allclose(index.get_vectors(ids[-5:]), data[-5:])


def test_rabitq_retrain_keeps_answers_exact_and_recall_up(quant):
    # RaBitQ keeps a centroid and per-row norms: nothing clips when the data drifts, so its
    # retrain (a new centroid, every row encoded again) must keep the answers exact and the
    # recall at least where it was.
    if quant["quantization"] != "rabitq":
        pytest.skip("RaBitQ only: sq8's retrain is test_retrain_after_drift_restores_recall")
    data, queries = make_clustered(81, 2000, DIM, n_queries=40)
    ids = np.arange(len(data), dtype=np.int64)
    ix = kbcore.Index(DIM, "l2", **PARAMS, **quant)
    stored = np.concatenate([data[:1000] * 0.05 + 3.0, data[1000:]])
    ix.add(stored[:1000], ids[:1000], threads=1)  # trains on a shifted, narrow cluster
    ix.add(stored[1000:], ids[1000:], threads=1)
    before = recall_at_k(ix.search(queries, 10, ef=32)[0], stored, ids, queries, 10, "l2")
    ix.retrain_quantizer()
    got = ix.search(queries, 10, ef=32)
    after = recall_at_k(got[0], stored, ids, queries, 10, "l2")
    assert_distances_are_true(*got, stored, ids, queries, "l2")
    assert after >= before - 0.02, (before, after)
    # One or two bits per dimension cannot resolve 48-dimensional residuals that share the
    # offset of the shifted rows still pulling the centroid (measured before / after: 1 bit
    # 0.03 / 0.14, 2 bits 0.13 / 0.49).
    if quant.get("bits", 4) >= 4:
        assert after >= 0.9, (before, after)


def test_retrain_after_drift_restores_recall():
    data, queries = make_clustered(81, 2000, DIM, n_queries=40)
    ids = np.arange(len(data), dtype=np.int64)
    ix = kbcore.Index(DIM, "l2", **PARAMS, quantization="sq8", rerank=10)
    ix.add(data[:1000] * 0.05, ids[:1000], threads=1)  # trains on a narrow range
    ix.add(data[1000:], ids[1000:], threads=1)  # most values clip
    stored = np.concatenate([data[:1000] * 0.05, data[1000:]])
    before = recall_at_k(ix.search(queries, 10, ef=32)[0], stored, ids, queries, 10, "l2")
    ix.retrain_quantizer()
    after = recall_at_k(ix.search(queries, 10, ef=32)[0], stored, ids, queries, 10, "l2")
    assert after > before + 0.05 and after >= 0.9, (before, after)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(quantization="pq"), "quantization"),
        (dict(quantization="sq8", kind="flat"), "hnsw"),
        (dict(rerank=10), "rerank"),
        (dict(quantization="sq8", rerank=0), "rerank"),
        (dict(quantization="rabitq", kind="flat"), "hnsw"),
        (dict(quantization="rabitq", bits=0), "bits"),
        (dict(quantization="rabitq", bits=9), "bits"),
        (dict(quantization="rabitq", bits=2.5), "bits"),
        (dict(quantization="sq8", bits=4), "bits"),
        (dict(bits=4), "bits"),
    ],
)
def test_bad_quantization_arguments_raise_value_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        kbcore.Index(DIM, "l2", **kw)


def test_retrain_without_quantization_raises():
    ix = kbcore.Index(DIM, "l2")
    ix.add(np.ones((3, DIM), np.float32), [1, 2, 3])
    with pytest.raises(ValueError, match="quantization"):
        ix.retrain_quantizer()


def test_knowledge_base_created_quantized_keeps_it_across_reopening(tmp_path, quant):
    import pyarrow as pa

    from kbcore.engine import Engine

    data, queries = make_clustered(82, 1200, DIM, n_queries=5)
    table = pa.table(
        {"document_id": [f"d{i}" for i in range(len(data))], "text": [f"row {i}" for i in range(len(data))]}
    )
    kb = Engine(tmp_path).create_knowledge_base("kb", embedder=False, **quant)
    kb.ingest_table(table, vectors=data)
    index = kb._cell.state.index
    assert index.quantization == quant["quantization"] and index.quantizer_trained
    assert index.bits == quant.get("bits", 4 if quant["quantization"] == "rabitq" else None)
    hits = kb.retrieve(queries[0], top_k=5)
    want = kb._cell.state.index.search(queries[0], 5)[0].tolist()
    assert [h.id for h in hits] == want
    kb.close()
    again = Engine(tmp_path).get_knowledge_base("kb")
    assert (again._cell.state.index.quantization, again._cell.state.index.bits) == (index.quantization, index.bits)
    assert [h.id for h in again.retrieve(queries[0], top_k=5)] == want
    with pytest.raises(ValueError, match="quantization"):
        Engine(tmp_path).create_knowledge_base("bad", embedder=False, quantization="pq")


def test_auto_filtered_search_on_an_anti_correlated_filter_equals_the_exact_scan_on_codes(quant):
    # Queries near cluster 0, a filter passing only the two farthest clusters (10% of the rows):
    # auto measures the local selectivity after a descent on codes (no float32 row read) and
    # answers each query by the exact scan of the passing rows (codes, then an exact re-rank)
    # or the two-hop walk; either way the answer must be the forced exact scan's and the
    # oracle's. (On this data the walk finds the same rows, so this does not tell which ran.)
    rng = np.random.default_rng(43)
    n, dim, n_clusters = 4000, 32, 20
    centers = rng.standard_normal((n_clusters, dim)).astype(np.float32)
    labels = np.arange(n) % n_clusters
    data = (centers[labels] + 0.6 * rng.standard_normal((n, dim))).astype(np.float32)
    queries = (centers[0] + 0.6 * rng.standard_normal((30, dim))).astype(np.float32)
    far = [int(c) for c in np.argsort(((centers - centers[0]) ** 2).sum(axis=1))[-2:]]
    ids = np.arange(n, dtype=np.int64) + 7
    ix = kbcore.Index(dim, "l2", M=16, ef_construction=100, seed=5, **quant)
    ix.add(data, ids, metadata=[{"cluster": int(c)} for c in labels], threads=1)
    where = compile_where({"cluster": {"$in": far}})
    mask = np.isin(labels, far)
    auto = ix._native.search(queries, 10, 64, 1, where, "auto")
    exact = ix._native.search(queries, 10, 64, 1, where, "exact")
    np.testing.assert_array_equal(auto[0], exact[0])
    np.testing.assert_array_equal(auto[1], exact[1])
    assert np.isin(auto[0], ids[mask]).all()
    assert_distances_are_true(auto[0], auto[1], data[mask], ids[mask], queries, "l2")
    assert recall_at_k(auto[0], data[mask], ids[mask], queries, 10, "l2") >= 0.99
