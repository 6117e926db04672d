"""Shared fixtures for the Index contract tests (docs/index.md).

Everything here is independent of kbcore: seeded synthetic data and an exact float64 numpy
oracle for each metric, so a test compares the index to ground truth, never to itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

METRICS = ("cosine", "ip", "l2")
KINDS = ("flat", "hnsw")

#: Absolute tolerance on a distance (float32 kernels vs the float64 oracle; data norms are ~1).
DIST_ATOL = 1e-4


# --------------------------------------------------------------------------------------------
# test tiers

#: The tier of every test in a module (markers registered in pyproject.toml). A bare
#: ``python -m pytest -q`` runs the fast tier, what is in no tier; ``-m ""`` runs every tier.
#: Assigned here, by module, so that a new test lands in its module's tier without a decorator.
#: The slow and single-test lists below come from ``--durations=0`` of the whole suite on 2
#: shared cores (2026-12-05): the fast tier keeps at least one case of every behaviour.
MODULE_TIERS: dict[str, str] = {
    "test_langbot_plugin": "langbot",
    # other processes, servers, real data sets, pytest inside pytest
    "test_engine_persistence": "integration",
    "test_engine_scifact": "integration",
    "test_multiprocess_kb": "integration",
    "test_phase_timeout": "integration",
    "test_server": "integration",
    "test_server_head_limit": "integration",
    "test_server_rerank": "integration",
    "test_server_views": "integration",
    "test_storage_faults": "integration",
    "test_hybrid_quality": "integration",
    "test_ingest_arrow_validation": "integration",
    # property-based fuzzing, resident-memory and thread-interleaving checks
    "test_filters_compile": "slow",
    "test_fuzz_dify": "slow",
    "test_fuzz_index_load": "slow",
    "test_fuzz_kb_load": "slow",
    "test_fuzz_where": "slow",
    "test_fuzz_http_parsing": "slow",
    "test_parsing_linear": "slow",
    "test_parsing_pdf_budget": "slow",
    "test_wal": "slow",
    "test_huge_pages": "slow",
    "test_index_threads": "slow",
    "test_quantized_disk": "slow",
}

#: Single tests in a fast module that take seconds, as ``module::test`` (a class test:
#: ``module::Class::test``) without the parameters: every parameter goes with it.
SLOW_TESTS: frozenset[str] = frozenset(
    {
        "test_engine_api::test_a_closed_knowledge_base_does_not_restart_its_graph_builder",
        "test_engine_lifecycle::test_delete_racing_ingest_is_clean",
        "test_formats::test_parsing_a_csv_peaks_under_four_times_its_size",
        "test_filtered_search::test_counts_follow_upserts_removes_and_save_load",
        "test_filtered_search::test_filtered_search_agrees_with_the_reference_evaluator",
        "test_grouping::test_collapse_by_key_keeps_the_first_groups_of_the_given_order_like_the_oracle",
        "test_grouping::test_filtered_grouped_search_never_returns_a_short_page",
        "test_distributed_socket::test_socket_scatter_times_out_and_fetches_the_address_again",
        "test_grouping::test_hnsw_grouped_recall_on_clustered_data",
        # the three that share the module's subprocess sweep of every truncation and bit flip
        "test_index_persistence::test_load_rejects_a_bit_flip_in_any_header_byte_with_format_error",
        "test_index_persistence::test_load_never_crashes_on_any_truncation_or_bit_flip",
        "test_index_persistence::test_load_rejects_every_truncation_and_payload_bit_flip_with_format_error",
        "test_metadata_columns::test_a_large_arrow_table_matches_its_rows",
        "test_metadata_columns::test_arrow_and_dict_readers_give_equal_columns",
        "test_metadata_columns::test_rows_round_trip_through_columns",
    }
)

#: Parametrised tests whose first collected case stays in the fast tier and whose other cases
#: (metrics, SIMD levels, sizes, planted violations) are slow.
FIRST_CASE_FAST: frozenset[str] = frozenset(
    {
        "test_filtered_search::test_walk_on_a_wide_leaf_filter_skips_removed_and_admits_only_passing_rows",
        "test_import_rules::test_a_planted_violation_is_caught",
        "test_index_mutation::test_hnsw_keeps_every_live_vector_reachable_after_removals",
        "test_index_mutation::test_hnsw_keeps_every_live_vector_reachable_after_upserts",
        "test_index_mutation::test_hnsw_recall_after_deleting_30_percent_and_adding_new_matches_fresh_index",
        "test_index_mutation::test_hnsw_stays_accurate_after_moving_many_vectors_repeatedly",
        "test_index_mutation::test_re_adding_an_id_replaces_its_vector_and_keeps_len",
        "test_index_mutation::test_removed_ids_are_never_returned_again",
        "test_index_search::test_flat_search_equals_numpy_oracle",
        "test_index_search::test_hnsw_distances_are_sorted_and_equal_true_distance_of_returned_ids",
        "test_index_search::test_hnsw_recall_at_10_is_at_least_095_at_default_ef",
        "test_index_search::test_hnsw_search_with_ef_smaller_than_k_still_returns_k_hits",
        "test_quantized::test_filtered_quantized_search_returns_passing_rows_at_exact_distances",
        "test_quantized::test_kbcore_simd_scalar_environment_runs_the_quantized_search",
        "test_quantized::test_quantized_index_trains_at_the_threshold_and_reports_its_settings",
        "test_quantized::test_quantized_recall_matches_float32_at_the_same_ef",
        "test_quantized::test_shallow_rerank_still_returns_exact_distances_at_lower_recall",
        "test_simd::test_flat_search_under_every_level_matches_scalar_level",
        "test_simd::test_hnsw_built_and_searched_under_every_level_keeps_recall",
        "test_simd::test_misaligned_inputs_give_same_results_as_aligned_under_every_level",
    }
)

#: Parameter ids (one ``-``-separated part of a case's id) whose cases are slow in a module: the
#: fast tier runs the quantized tests on SQ8 and 4-bit RaBitQ (the slow tier adds RaBitQ's 1-,
#: 2- and 8-bit containers), and the search tests on cosine (the slow tier adds ip and l2).
SLOW_PARAMS: dict[str, frozenset[str]] = {
    "test_quantized": frozenset({"rabitq1", "rabitq2", "rabitq8"}),
    "test_index_search": frozenset({"ip", "l2"}),
}

#: The fixtures that start or join a Ray instance (tests/ray_support.py).
RAY_FIXTURES = frozenset({"ray_local", "ray_address"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks each test with its tier before ``-m`` selects: by its module (MODULE_TIERS), by
    name (SLOW_TESTS, FIRST_CASE_FAST), by parameter (SLOW_PARAMS), and ``ray`` for a test that
    uses a Ray fixture even if its decorator was forgotten."""
    seen: set[str] = set()
    for item in items:
        base, _, params = item.nodeid.partition("[")
        path, _, name = base.partition("::")
        module = path.rsplit("/", 1)[-1].removesuffix(".py")
        key = f"{module}::{name}"
        tier = MODULE_TIERS.get(module)
        if tier is not None:
            item.add_marker(tier)
        slow = key in SLOW_TESTS or (key in FIRST_CASE_FAST and key in seen)
        slow = slow or not SLOW_PARAMS.get(module, frozenset()).isdisjoint(params.rstrip("]").split("-"))
        if slow:
            item.add_marker("slow")
        seen.add(key)
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("ray")


# --------------------------------------------------------------------------------------------
# seeded data


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh, seeded generator for each test."""
    return np.random.default_rng(20240601)


@dataclass
class ClusteredSource:
    """Gaussian clusters in a low-dimensional latent space, linearly embedded into `dim`.

    Vectors have norms around 1 (so float32 distance errors stay far below DIST_ATOL) and
    real neighbourhood structure, like embeddings; queries come from the same distribution
    but are not in the index.
    """

    rng: np.random.Generator
    dim: int
    n_clusters: int = 32
    latent: int = 16
    spread: float = 0.5
    noise: float = 0.05

    def __post_init__(self) -> None:
        latent = min(self.latent, self.dim)
        self._proj = self.rng.standard_normal((latent, self.dim)) / np.sqrt(self.dim)
        self._centers = self.rng.standard_normal((self.n_clusters, latent))

    def sample(self, n: int) -> np.ndarray:
        """`n` float32 vectors of shape [n, dim]."""
        latent = self._centers.shape[1]
        labels = self.rng.integers(0, self.n_clusters, n)
        z = self._centers[labels] + self.spread * self.rng.standard_normal((n, latent))
        x = z @ self._proj + self.noise * self.rng.standard_normal((n, self.dim)) / np.sqrt(self.dim)
        x /= np.sqrt(latent)
        return x.astype(np.float32)


def make_clustered(seed: int, n: int, dim: int, n_queries: int = 100, **kw):
    """(data [n, dim], queries [n_queries, dim]) float32, from one seeded clustered source."""
    src = ClusteredSource(np.random.default_rng(seed), dim, **kw)
    return src.sample(n), src.sample(n_queries)


@pytest.fixture
def clustered():
    """Factory fixture: clustered(seed, n, dim, n_queries=100) -> (data, queries)."""
    return make_clustered


# --------------------------------------------------------------------------------------------
# exact oracle


def oracle_distances(data: np.ndarray, queries: np.ndarray, metric: str) -> np.ndarray:
    """Exact float64 distance matrix [q, n]: cosine = 1 - cos, ip = 1 - dot, l2 = squared L2."""
    d = np.asarray(data, dtype=np.float64)
    q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    if d.shape[0] == 0:
        return np.zeros((q.shape[0], 0))
    if metric == "cosine":
        d = d / np.linalg.norm(d, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        return 1.0 - q @ d.T
    if metric == "ip":
        return 1.0 - q @ d.T
    if metric == "l2":
        out = (q * q).sum(1)[:, None] + (d * d).sum(1)[None, :] - 2.0 * (q @ d.T)
        return np.maximum(out, 0.0)
    raise AssertionError(f"unknown metric {metric!r}")


def oracle_topk(data, ids, queries, k: int, metric: str):
    """Exact top-k: (ids int64 [q, k] padded -1, dist float64 [q, k] padded +inf)."""
    ids = np.asarray(ids, dtype=np.int64)
    full = oracle_distances(data, queries, metric)
    q, n = full.shape
    out_ids = np.full((q, k), -1, dtype=np.int64)
    out_dist = np.full((q, k), np.inf)
    m = min(k, n)
    if m:
        order = np.argsort(full, axis=1, kind="stable")[:, :m]
        out_ids[:, :m] = ids[order]
        out_dist[:, :m] = np.take_along_axis(full, order, axis=1)
    return out_ids, out_dist


def assert_search_matches_oracle(got_ids, got_dist, data, ids, queries, k, metric, atol=DIST_ATOL):
    """The result is the exact top-k: distances equal the oracle's, every returned id is live,
    unique in its row and at its true distance, and ids equal the oracle's except where two
    oracle distances tie within `atol` (then either order / either member is accepted).
    """
    got_ids = np.atleast_2d(np.asarray(got_ids))
    got_dist = np.atleast_2d(np.asarray(got_dist))
    ids = np.asarray(ids, dtype=np.int64)
    exp_ids, exp_dist = oracle_topk(data, ids, queries, k, metric)
    assert got_ids.shape == exp_ids.shape, (got_ids.shape, exp_ids.shape)
    assert got_dist.shape == exp_dist.shape, (got_dist.shape, exp_dist.shape)

    # padding in the same places as the oracle
    np.testing.assert_array_equal(got_ids == -1, exp_ids == -1, err_msg="padding (-1) positions")
    np.testing.assert_array_equal(np.isinf(got_dist), np.isinf(exp_dist), err_msg="+inf positions")
    real = exp_ids != -1
    np.testing.assert_allclose(
        got_dist[real], exp_dist[real], rtol=0, atol=atol, err_msg="distances differ from the exact top-k"
    )

    # each returned id is live, unique per row, and really at the distance reported
    assert_distances_are_true(got_ids, got_dist, data, ids, queries, metric, atol)
    full = oracle_distances(data, queries, metric)

    # ids equal the oracle's wherever the oracle order is unambiguous
    all_d = np.sort(full, axis=1)
    for r in range(got_ids.shape[0]):
        for j in range(int(real[r].sum())):
            dj = exp_dist[r, j]
            neighbours = all_d[r, max(j - 1, 0) : j + 2]
            tied = np.sum(np.abs(neighbours - dj) <= 2 * atol) > 1
            if not tied:
                assert got_ids[r, j] == exp_ids[r, j], (
                    f"row {r} pos {j}: got id {got_ids[r, j]}, oracle {exp_ids[r, j]}"
                )


def assert_distances_are_true(got_ids, got_dist, data, ids, queries, metric, atol=DIST_ATOL):
    """Every non-padding returned id is in `ids`, unique in its row, and its reported distance
    equals its exact distance to the query (within `atol`); padding is (-1, +inf) together."""
    got_ids = np.atleast_2d(np.asarray(got_ids))
    got_dist = np.atleast_2d(np.asarray(got_dist))
    ids = np.asarray(ids, dtype=np.int64)
    pad = got_ids == -1
    np.testing.assert_array_equal(pad, np.isposinf(got_dist), err_msg="-1 ids must pair with +inf")
    full = oracle_distances(data, queries, metric)
    col = {int(i): c for c, i in enumerate(ids)}
    for r in range(got_ids.shape[0]):
        row = [int(i) for i in got_ids[r][~pad[r]]]
        assert len(set(row)) == len(row), f"row {r}: duplicate ids {row}"
        unknown = [i for i in row if i not in col]
        assert not unknown, f"row {r}: ids not in the live set: {unknown}"
        true_d = full[r, [col[i] for i in row]]
        np.testing.assert_allclose(
            got_dist[r][~pad[r]],
            true_d,
            rtol=0,
            atol=atol,
            err_msg=f"row {r}: reported distance != true distance of id",
        )


def recall_at_k(got_ids, data, ids, queries, k, metric, eps=1e-6) -> float:
    """Tie-tolerant recall@k: a returned live id counts if its true distance is within `eps`
    of the oracle's k-th distance."""
    got_ids = np.atleast_2d(np.asarray(got_ids))
    ids = np.asarray(ids, dtype=np.int64)
    full = oracle_distances(data, queries, metric)
    kth = np.sort(full, axis=1)[:, min(k, full.shape[1]) - 1]
    col = {int(i): c for c, i in enumerate(ids)}
    hits = 0
    for r in range(got_ids.shape[0]):
        row = {int(i) for i in got_ids[r, :k] if int(i) in col}
        hits += sum(full[r, col[i]] <= kth[r] + eps for i in row)
    return hits / (got_ids.shape[0] * k)


def assert_rows_sorted(dist) -> None:
    d = np.atleast_2d(np.asarray(dist, dtype=np.float64))
    diffs = np.diff(d, axis=1)
    # inf - inf is nan: padding after padding is fine
    ok = (diffs >= 0) | np.isnan(diffs)
    assert ok.all(), f"distances not ascending in rows {np.nonzero(~ok.all(axis=1))[0][:10]}"


def build(data, ids=None, *, metric="l2", kind="flat", **kw):
    """An Index over `data` (ids default to 0..n-1)."""
    import kbcore

    data = np.asarray(data)
    index = kbcore.Index(dim=data.shape[1], metric=metric, kind=kind, **kw)
    if ids is None:
        ids = np.arange(len(data), dtype=np.int64)
    index.add(data, ids)
    return index
