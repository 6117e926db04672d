"""Grouped search (issue 4): ``Index.search_groups`` collapses hits by a metadata field.

Every test compares to an exact float64 numpy grouping oracle: each source's distance is the
distance of its best part, sources are ranked by it, and a source's parts are every row that
carries its key (and passes the filter). On the flat index the result must equal the oracle;
on HNSW it must be self-consistent, fill k groups whenever k exist, and reach the recall bar.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from conftest import DIST_ATOL, oracle_distances
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kbcore
from kbcore.errors import InvalidArgumentError, InvalidTypeError, NotFoundError
from kbcore.filters import compile_where
from kbcore.index import collapse_by_key

K = 10

# --------------------------------------------------------------------------------------------
# seeded corpora: sources are cluster centres, parts are centre + small noise


@dataclass
class Corpus:
    """Rows (parts) with their source key and a little extra metadata, as numpy arrays."""

    data: np.ndarray  # float32 [n, dim]
    ids: np.ndarray  # int64 [n]
    source: np.ndarray  # int64 [n]; -1 = the row has no group field
    year: np.ndarray  # int64 [n]
    lang: np.ndarray  # str [n]
    queries: np.ndarray  # float32 [q, dim]

    def metadata(self, str_keys: bool = False) -> list[dict]:
        rows = []
        for s, y, lang in zip(self.source.tolist(), self.year.tolist(), self.lang.tolist()):
            row: dict = {"year": y, "lang": lang}
            if s >= 0:
                row["document_id"] = f"doc-{s}" if str_keys else s
            rows.append(row)
        return rows

    def passing(self, where: dict | None) -> np.ndarray:
        """Boolean [n]: rows passing the (few) filters the tests use, evaluated in numpy."""
        if where is None:
            return np.ones(len(self.ids), dtype=bool)
        mask = np.ones(len(self.ids), dtype=bool)
        for field, cond in where.items():
            col = self.year if field == "year" else self.lang
            if not isinstance(cond, dict):
                cond = {"$eq": cond}
            for op, v in cond.items():
                mask &= {
                    "$eq": lambda col, v: col == v,
                    "$gte": lambda col, v: col >= v,
                    "$lt": lambda col, v: col < v,
                    "$in": np.isin,
                }[op](col, v)
        return mask


def make_corpus(
    seed: int,
    n_sources: int,
    dim: int,
    max_parts: int = 6,
    n_queries: int = 40,
    spread: float = 1.0,
    noise: float = 0.25,
    keyless: float = 0.05,
) -> Corpus:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_sources, dim)) * spread / np.sqrt(dim)
    parts = rng.integers(1, max_parts + 1, n_sources)
    source = np.repeat(np.arange(n_sources), parts)
    n = len(source)
    data = centres[source] + noise * rng.standard_normal((n, dim)) / np.sqrt(dim)
    source = source.copy()
    source[rng.random(n) < keyless] = -1  # rows without the group field
    ids = rng.permutation(np.arange(10 * n, 10 * n + 3 * n))[:n].astype(np.int64)  # not 0..n-1
    year = rng.integers(2000, 2025, n)
    lang = rng.choice(np.array(["en", "de", "fr"]), n, p=[0.6, 0.3, 0.1])
    qc = rng.integers(0, n_sources, n_queries)
    queries = centres[qc] + noise * rng.standard_normal((n_queries, dim)) / np.sqrt(dim)
    return Corpus(data.astype(np.float32), ids, source, year, lang, queries.astype(np.float32))


def build(corpus: Corpus, kind: str, metric: str = "cosine", str_keys: bool = False) -> kbcore.Index:
    index = kbcore.Index(corpus.data.shape[1], metric=metric, kind=kind, seed=7)
    index.add(corpus.data, corpus.ids, metadata=corpus.metadata(str_keys), threads=1)
    return index


# --------------------------------------------------------------------------------------------
# the oracle


@dataclass
class OracleGroup:
    key: object
    best: float
    part_ids: list[int]  # every passing part, ascending by distance
    part_dist: list[float]


def oracle_all_groups(
    corpus: Corpus, query: np.ndarray, metric: str, where: dict | None = None, str_keys: bool = False
) -> list[OracleGroup]:
    """Every source with at least one passing part, ranked by its best distance."""
    dist = oracle_distances(corpus.data, query, metric)[0]
    ok = corpus.passing(where) & (corpus.source >= 0)
    by_source: dict[int, list[int]] = {}
    for row in np.nonzero(ok)[0]:
        by_source.setdefault(int(corpus.source[row]), []).append(int(row))
    groups = []
    for s, rows in by_source.items():
        rows.sort(key=lambda r: dist[r])
        key = f"doc-{s}" if str_keys else s
        part_ids = [int(corpus.ids[r]) for r in rows]
        part_dist = [float(dist[r]) for r in rows]
        groups.append(OracleGroup(key, part_dist[0], part_ids, part_dist))
    groups.sort(key=lambda g: g.best)
    return groups


def assert_groups_equal_oracle(
    got, corpus, query, k, metric, group_size=1, where=None, str_keys=False, atol=DIST_ATOL
) -> None:
    """Exact grouping: keys in order, best ids and distances, part_ids = every passing part."""
    oracle = oracle_all_groups(corpus, query, metric, where, str_keys)
    by_key = {g.key: g for g in oracle}
    expect = oracle[:k]
    assert len(got) == len(expect), f"{len(got)} groups, oracle has {len(expect)}"
    keys = [g.key for g in got]
    assert len(set(keys)) == len(keys), f"duplicate keys {keys}"
    bests = [g.best for g in oracle]
    tied = any(abs(bests[j + 1] - bests[j]) <= 2 * atol for j in range(min(k, len(bests) - 1)))
    if not tied:
        assert keys == [g.key for g in expect]
    for j, g in enumerate(got):
        assert g.key in by_key, f"group {g.key!r} has no passing part"
        truth = by_key[g.key]
        # the group sits where its true best distance says (robust to exact ties)
        assert abs(truth.best - expect[j].best) <= atol, (j, g.key, truth.best, expect[j].best)
        m = min(group_size, len(truth.part_ids))
        assert len(g.ids) == len(g.distances) == m
        np.testing.assert_allclose(g.distances, truth.part_dist[:m], rtol=0, atol=atol)
        true_of = dict(zip(truth.part_ids, truth.part_dist))
        for pid, d in zip(g.ids, g.distances):
            assert pid in true_of, f"id {pid} is not a passing part of {g.key!r}"
            assert abs(true_of[pid] - d) <= atol
        assert g.distance == g.distances[0]
        # flat: part_ids is every passing part of the source, best first, and starts with ids
        assert sorted(g.part_ids) == sorted(truth.part_ids)
        assert tuple(g.part_ids[:m]) == tuple(g.ids)
        pd = [true_of[p] for p in g.part_ids]
        assert all(pd[i] <= pd[i + 1] + atol for i in range(len(pd) - 1)), "part_ids not best first"


def assert_groups_consistent(
    got, corpus, query, metric, group_size=1, where=None, str_keys=False, atol=DIST_ATOL
) -> None:
    """Approximate (HNSW) results: distinct keys, ordered, every id a true passing part."""
    dist = oracle_distances(corpus.data, query, metric)[0]
    row_of = {int(i): r for r, i in enumerate(corpus.ids)}
    ok = corpus.passing(where)
    keys = [g.key for g in got]
    assert len(set(keys)) == len(keys), f"duplicate keys {keys}"
    assert all(got[j].distance <= got[j + 1].distance for j in range(len(got) - 1)), "not ordered"
    for g in got:
        assert 1 <= len(g.ids) <= group_size and len(g.ids) == len(g.distances)
        assert list(g.distances) == sorted(g.distances)
        assert set(g.ids) <= set(g.part_ids)
        for pid in g.part_ids:
            r = row_of[pid]
            assert ok[r], f"part {pid} fails the filter"
            s = int(corpus.source[r])
            key = f"doc-{s}" if str_keys else s
            assert s >= 0 and key == g.key, f"part {pid} is not of {g.key!r}"
        for pid, d in zip(g.ids, g.distances):
            assert abs(dist[row_of[pid]] - d) <= atol


def key_recall(got_lists, corpus, queries, metric, k=K, where=None) -> float:
    """Tie-tolerant grouped recall@k: a returned key counts if its source's true best distance
    is within 1e-6 of the oracle's k-th best source distance."""
    ok = corpus.passing(where) & (corpus.source >= 0)
    src = corpus.source[ok]
    n_src = int(corpus.source.max()) + 1
    dist = oracle_distances(corpus.data[ok], queries, metric)
    hits = 0
    total = 0
    for got, d in zip(got_lists, dist):
        best = np.full(n_src, np.inf)
        np.minimum.at(best, src, d)
        present = np.sort(best[np.isfinite(best)])
        m = min(k, len(present))
        kth = present[m - 1]
        hits += sum(best[int(g.key)] <= kth + 1e-6 for g in got[:k])
        total += m
    return hits / total


# --------------------------------------------------------------------------------------------
# fixtures (module-scoped: HNSW builds are the slow part)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return make_corpus(11, n_sources=300, dim=24)


@pytest.fixture(scope="module")
def flat(corpus) -> kbcore.Index:
    return build(corpus, "flat")


@pytest.fixture(scope="module")
def hnsw(corpus) -> kbcore.Index:
    return build(corpus, "hnsw")


# --------------------------------------------------------------------------------------------
# exact grouping on the flat index


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
@pytest.mark.parametrize("group_size", [1, 3])
def test_flat_grouped_search_equals_bruteforce_grouping(metric, group_size):
    c = make_corpus(21, n_sources=120, dim=16, n_queries=15)
    index = build(c, "flat", metric)
    for q in c.queries:
        got = index.search_groups(q, K, group_size=group_size)
        assert_groups_equal_oracle(got, c, q, K, metric, group_size)


def test_flat_grouped_search_returns_all_groups_when_fewer_than_k_exist():
    c = make_corpus(22, n_sources=6, dim=8, n_queries=5)
    index = build(c, "flat")
    for q in c.queries:
        got = index.search_groups(q, K, group_size=2)
        assert len(got) == len({int(s) for s in c.source if s >= 0}) < K
        assert_groups_equal_oracle(got, c, q, K, "cosine", 2)


def test_rows_without_the_group_field_are_never_returned(corpus, flat, hnsw):
    keyless = {int(i) for i in corpus.ids[corpus.source < 0]}
    assert keyless
    for index in (flat, hnsw):
        for groups in index.search_groups(corpus.queries, K, group_size=4):
            for g in groups:
                assert not keyless & set(g.part_ids)


# --------------------------------------------------------------------------------------------
# distinct keys, ordering, group_size, k groups whenever k exist


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_groups_have_distinct_keys_and_ascending_best_distance(corpus, flat, hnsw, kind):
    index = flat if kind == "flat" else hnsw
    for q in corpus.queries:
        got = index.search_groups(q, K, group_size=3)
        assert len(got) == K
        assert_groups_consistent(got, corpus, q, "cosine", group_size=3)


def test_group_size_returns_several_parts_per_source(corpus, hnsw):
    for q in corpus.queries[:10]:
        got = hnsw.search_groups(q, 5, group_size=4)
        assert any(len(g.ids) > 1 for g in got)
        assert_groups_consistent(got, corpus, q, "cosine", group_size=4)


def flood_corpus(seed: int, n_floods: int, dim: int = 16, parts: int = 200) -> tuple[Corpus, np.ndarray]:
    """Clustered background sources plus, per query, one source with `parts` near-duplicate
    parts right at the query: an over-fetch of fewer than `parts` hits sees only that source."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim)) * 2.0
    n_bg = 3000
    cl = rng.integers(0, 40, n_bg)
    bg = centres[cl] + 0.3 * rng.standard_normal((n_bg, dim))
    queries = centres[rng.integers(0, 40, n_floods)] + 0.3 * rng.standard_normal((n_floods, dim))
    dups = np.concatenate([q + 0.01 * rng.standard_normal((parts, dim)) for q in queries])
    data = np.concatenate([bg, dups]).astype(np.float32)
    flood_source = np.repeat(np.arange(n_floods), parts)
    source = np.concatenate([np.arange(n_bg) // 3 + n_floods, flood_source])
    n = len(source)
    c = Corpus(
        data,
        np.arange(n, dtype=np.int64),
        source.astype(np.int64),
        np.full(n, 2020),
        np.full(n, "en"),
        queries.astype(np.float32),
    )
    return c, np.arange(n_floods)


@pytest.fixture(scope="module")
def flood():
    c, flood_keys = flood_corpus(5, n_floods=8)
    return c, flood_keys, build(c, "flat", "l2"), build(c, "hnsw", "l2")


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
@pytest.mark.parametrize("ef", [None, 16])
def test_k_groups_when_one_source_floods_the_nearest_neighbours(flood, kind, ef):
    c, flood_keys, flat_index, hnsw_index = flood
    index = flat_index if kind == "flat" else hnsw_index
    for q, fk in zip(c.queries, flood_keys):
        got = index.search_groups(q, K, ef=ef)
        assert len(got) == K, f"short page: {len(got)} groups"
        assert got[0].key == fk
        assert_groups_consistent(got, c, q, "l2")
        if kind == "flat":
            assert_groups_equal_oracle(got, c, q, K, "l2")
            assert len(got[0].part_ids) == 200


def test_hnsw_grouped_recall_survives_a_flooding_source(flood):
    """The 9 groups after the flooding one must still be the right ones: an ungrouped
    search for 260 hits finds them all, so the grouped search must too."""
    c, _, _, hnsw_index = flood
    key_of = dict(zip(c.ids.tolist(), c.source.tolist()))
    over = []
    for q in c.queries:
        ids, _ = hnsw_index.search(q, 260)
        keys = list(dict.fromkeys(key_of[int(i)] for i in ids))[:K]
        over.append([kbcore.Group(s, (), (0.0,), ()) for s in keys])
    assert key_recall(over, c, c.queries, "l2") >= 0.95  # the graph can reach them
    got = [hnsw_index.search_groups(q, K) for q in c.queries]
    recall = key_recall(got, c, c.queries, "l2")
    assert recall >= 0.95, f"grouped recall {recall:.3f} with a flooding source (ef=64)"


def test_hnsw_fills_k_groups_at_small_ef(corpus, hnsw):
    # ef is raised to k * group_size and then doubled until k groups are met
    for q in corpus.queries:
        assert len(hnsw.search_groups(q, 20, ef=1)) == 20
        assert len(hnsw.search_groups(q, 8, ef=2, group_size=3)) == 8


def test_hnsw_grouped_recall_on_clustered_data():
    # 5,400 parts of 1,500 sources in 48-d; ungrouped recall@10 at ef=64 is about 0.99 here
    c = make_corpus(61, n_sources=1500, dim=48, noise=0.8, n_queries=100)
    index = build(c, "hnsw")
    recall = key_recall(index.search_groups(c.queries, K), c, c.queries, "cosine")
    assert recall >= 0.95, f"grouped recall@10 {recall:.3f}"


# --------------------------------------------------------------------------------------------
# filters


WHERES = [
    {"lang": "de"},
    {"year": {"$gte": 2015}},
    {"lang": {"$in": ["de", "fr"]}, "year": {"$lt": 2010}},
    {"lang": "fr", "year": {"$gte": 2020}},  # very selective: exact path
]


@pytest.mark.parametrize("where", WHERES)
def test_flat_grouped_search_with_filter_equals_oracle(corpus, flat, where):
    for q in corpus.queries[:20]:
        got = flat.search_groups(q, K, where=where, group_size=2)
        assert_groups_equal_oracle(got, corpus, q, K, "cosine", 2, where)


@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("strategy", ["auto", "graph", "exact"])
def test_hnsw_grouped_search_with_filter_returns_only_passing_parts(corpus, hnsw, where, strategy):
    ir = compile_where(where)
    res = hnsw._native.search_groups(corpus.queries, K, "document_id", 2, 0, 1, ir, strategy)
    n_groups = len({int(s) for s in corpus.source[corpus.passing(where) & (corpus.source >= 0)]})
    for q, packed in zip(corpus.queries, res):
        got = [kbcore.Group._make(t) for t in packed]
        assert_groups_consistent(got, corpus, q, "cosine", 2, where)
        if strategy == "exact":
            assert_groups_equal_oracle(got, corpus, q, K, "cosine", 2, where)
        assert len(got) == min(K, n_groups), f"short page with strategy={strategy}"


def test_filtered_grouped_search_never_returns_a_short_page():
    """A filter that passes 30 % of rows, all far from the queries (clusters the queries do
    not come from): the cost model picks the filtered graph traversal, which cannot reach k
    passing sources for some queries. Ungrouped search falls back to an exact scan then; grouped
    search must not return fewer than k groups either."""
    rng = np.random.default_rng(3)
    n, nc, dim = 8000, 80, 16
    centres = rng.standard_normal((nc, dim)) * 2
    cl = rng.integers(0, nc, n)
    data = (centres[cl] + 0.3 * rng.standard_normal((n, dim))).astype(np.float32)
    queries = centres[rng.integers(24, nc, 200)] + 0.3 * rng.standard_normal((200, dim))
    queries = queries.astype(np.float32)
    index = kbcore.Index(dim, metric="l2", kind="hnsw")
    meta = [{"document_id": i // 4, "cl": int(c)} for i, c in enumerate(cl)]
    index.add(data, np.arange(n), metadata=meta, threads=1)
    index.search(queries, K)  # feeds the cost model its measured evaluations per ef
    where = {"cl": {"$lt": 24}}
    ids, _ = index.search(queries, K, where=where)
    assert (ids >= 0).all()
    got = index.search_groups(queries, K, where=where)
    short = [i for i, g in enumerate(got) if len(g) < K]
    assert not short, f"{len(short)} of {len(got)} grouped pages are short, e.g. query {short[0]}"


# --------------------------------------------------------------------------------------------
# key types


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_str_group_keys_group_like_int_keys(corpus, kind):
    index = build(corpus, kind, str_keys=True) if kind == "flat" else None
    if index is None:
        c = make_corpus(31, n_sources=150, dim=16, n_queries=10)
        index = build(c, "hnsw", str_keys=True)
        for q in c.queries:
            got = index.search_groups(q, K)
            assert len(got) == K and all(isinstance(g.key, str) for g in got)
            assert_groups_consistent(got, c, q, "cosine", str_keys=True)
        return
    for q in corpus.queries[:15]:
        got = index.search_groups(q, K, group_size=2)
        assert all(isinstance(g.key, str) for g in got)
        assert_groups_equal_oracle(got, corpus, q, K, "cosine", 2, str_keys=True)


def test_int_and_str_keys_are_distinct_groups():
    data = np.eye(4, dtype=np.float32) + 0.01
    index = kbcore.Index(4, metric="l2", kind="flat")
    index.add(
        data,
        [1, 2, 3, 4],
        metadata=[{"document_id": 7}, {"document_id": "7"}, {"document_id": 7}, {"document_id": "x"}],
    )
    got = index.search_groups(data[0], 10)
    assert {(type(g.key), g.key) for g in got} == {(int, 7), (str, "7"), (str, "x")}
    by_key = {g.key: g for g in got}
    assert sorted(by_key[7].part_ids) == [1, 3] and by_key["7"].part_ids == (2,)
    assert got[0].key == 7 and got[0].ids == (1,)


def test_group_by_another_field(corpus, flat):
    # any stored int or str field works as the group key, e.g. `lang` (3 groups) or `year`
    got = flat.search_groups(corpus.queries[0], K, group_by="lang")
    assert sorted(g.key for g in got) == ["de", "en", "fr"]
    assert sum(len(g.part_ids) for g in got) == len(corpus.ids)
    got = flat.search_groups(corpus.queries[0], 5, group_by="year")
    assert len(got) == 5 and all(isinstance(g.key, int) for g in got)


# --------------------------------------------------------------------------------------------
# mutation


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_removing_all_parts_of_a_source_removes_its_group(kind):
    c = make_corpus(41, n_sources=150, dim=16, n_queries=10, keyless=0.0)
    index = build(c, kind)
    q = c.queries[0]
    top = index.search_groups(q, K)[0].key
    gone = c.source == top
    index.remove(c.ids[gone])
    keep = ~gone
    c2 = Corpus(c.data[keep], c.ids[keep], c.source[keep], c.year[keep], c.lang[keep], c.queries)
    for qq in c.queries:
        got = index.search_groups(qq, K, group_size=2)
        assert top not in {g.key for g in got}
        assert len(got) == K
        if kind == "flat":
            assert_groups_equal_oracle(got, c2, qq, K, "cosine", 2)
        else:
            assert_groups_consistent(got, c2, qq, "cosine", 2)


def test_removing_every_keyed_row_makes_group_by_an_unknown_field():
    index = kbcore.Index(4, metric="l2", kind="flat")
    index.add(np.eye(4, dtype=np.float32), [1, 2, 3, 4], metadata=[{"document_id": 1}, {"document_id": 1}, {}, {}])
    assert len(index.search_groups(np.ones(4), 3)) == 1
    index.remove([1, 2])
    with pytest.raises(ValueError, match="document_id"):
        index.search_groups(np.ones(4), 3)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_upsert_moves_a_part_to_another_source(kind):
    c = make_corpus(51, n_sources=100, dim=16, n_queries=10, keyless=0.0)
    index = build(c, kind)
    q = c.queries[0]
    first = index.search_groups(q, K)
    src_key, dst_key = first[0].key, first[-1].key
    moved = int(first[0].ids[0])
    row = int(np.nonzero(c.ids == moved)[0][0])
    meta = [{"document_id": dst_key, "year": 2020, "lang": "en"}]
    index.add(c.data[row : row + 1], [moved], metadata=meta)
    source = c.source.copy()
    source[row] = dst_key
    c2 = Corpus(c.data, c.ids, source, c.year, c.lang, c.queries)
    got = index.search_groups(q, K, group_size=50)
    by_key = {g.key: g for g in got}
    assert moved in by_key[dst_key].part_ids
    assert src_key not in by_key or moved not in by_key[src_key].part_ids
    assert got[0].key == dst_key and got[0].ids[0] == moved
    if kind == "flat":
        for qq in c.queries:
            got = index.search_groups(qq, K, group_size=2)
            assert_groups_equal_oracle(got, c2, qq, K, "cosine", 2)
    else:
        assert_groups_consistent(got, c2, q, "cosine", 50)


# --------------------------------------------------------------------------------------------
# input validation


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        ({"k": 0}, ValueError),
        ({"k": -3}, ValueError),
        ({"k": 2.5}, TypeError),
        ({"group_size": 0}, ValueError),
        ({"group_size": -1}, ValueError),
        ({"group_size": True}, TypeError),
        ({"group_by": 5}, TypeError),
        ({"group_by": None}, TypeError),
        ({"group_by": b"document_id"}, TypeError),
        ({"group_by": "no_such_field"}, ValueError),
        ({"ef": 0}, ValueError),
        ({"threads": -1}, ValueError),
        ({"where": {"year": {"$gt": "x"}}}, ValueError),
    ],
)
def test_bad_arguments_raise(flat, corpus, kwargs, exc):
    with pytest.raises(exc):
        flat.search_groups(corpus.queries[0], **kwargs)


def test_bad_queries_raise(flat, corpus):
    with pytest.raises(ValueError):
        flat.search_groups(np.ones(corpus.data.shape[1] + 1), K)
    with pytest.raises(ValueError):
        flat.search_groups(np.full(corpus.data.shape[1], np.nan), K)
    with pytest.raises(TypeError):
        flat.search_groups(np.array(["a"] * corpus.data.shape[1]), K)
    with pytest.raises(InvalidArgumentError, match="no_such_field"):
        flat.search_groups(corpus.queries[0], K, group_by="no_such_field")


def test_empty_index_returns_no_groups():
    index = kbcore.Index(4, kind="flat")
    assert index.search_groups(np.ones(4), 3) == []
    assert index.search_groups(np.ones((2, 4)), 3) == [[], []]


# --------------------------------------------------------------------------------------------
# batch and threads


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
@pytest.mark.parametrize("where", [None, {"lang": "de"}])
def test_batch_equals_single_queries_and_threads_do_not_change_results(corpus, flat, hnsw, kind, where):
    index = flat if kind == "flat" else hnsw
    batch1 = index.search_groups(corpus.queries, K, group_size=2, where=where, threads=1)
    batch2 = index.search_groups(corpus.queries, K, group_size=2, where=where, threads=2)
    single = [index.search_groups(q, K, group_size=2, where=where) for q in corpus.queries]
    assert isinstance(batch1, list) and all(isinstance(b, list) for b in batch1)
    assert all(isinstance(g, kbcore.Group) for g in single[0])
    assert batch1 == single
    assert batch2 == batch1


# --------------------------------------------------------------------------------------------
# result objects and the collapse of one candidate list


def test_groups_are_group_named_tuples_of_python_scalars(corpus, hnsw):
    got = hnsw.search_groups(corpus.queries[0], K, group_size=2)
    plain = hnsw._native.search_groups(corpus.queries[:1], K, "document_id", 2, 0, 1, None)[0]
    for g, t in zip(got, plain, strict=True):
        assert type(g) is kbcore.Group and type(t) is tuple
        assert g == kbcore.Group._make(t) and tuple(g) == (g.key, g.ids, g.distances, g.part_ids)
        assert g._asdict()["part_ids"] == g.part_ids and g.distance == g.distances[0]
        assert all(type(f) is tuple for f in (g.ids, g.distances, g.part_ids))
        assert all(type(i) is int for i in g.ids + g.part_ids)
        assert all(type(d) is float for d in g.distances)
        assert g.part_ids[: len(g.ids)] == g.ids


def test_native_group_type_must_be_a_plain_tuple_subclass(corpus, hnsw):
    class WithDict(tuple):
        pass

    q = corpus.queries[:1]
    for bad in (dict, WithDict, 3):
        with pytest.raises(ValueError, match="group_type"):
            hnsw._native.search_groups(q, K, "document_id", 1, 0, 1, None, "auto", bad)


@pytest.mark.parametrize("group_size", [1, 3])
def test_hnsw_groups_collapse_the_ungrouped_candidate_list(corpus, hnsw, group_size):
    """Without expansion, grouped search walks the graph like an ungrouped search with the
    same ef, then collapses that list: the groups must be the first k keys of the list, each
    with its first group_size hits and every hit of its key, in list order. (The two walks are
    separate code, so a near-tie may be broken differently: 90 % of the pages must match
    exactly; a collapse bug breaks nearly all of them.)"""
    ef = 64
    key_of = {int(i): int(s) for i, s in zip(corpus.ids, corpus.source)}
    checked = matched = 0
    for q in corpus.queries:
        ids, dist = hnsw.search(q, ef, ef=ef)
        order: list[int] = []
        hits: dict[int, list[tuple[int, float]]] = {}
        for i, d in zip(ids.tolist(), dist.tolist()):
            s = key_of[i]
            if s < 0:
                continue
            if s not in hits:
                if len(order) == K:
                    continue
                order.append(s)
                hits[s] = []
            hits[s].append((i, d))
        if len(order) < K:
            continue  # the grouped search would widen its list here
        checked += 1
        got = hnsw.search_groups(q, K, group_size=group_size, ef=ef)
        want = [(s, tuple(i for i, _ in hits[s][:group_size]), tuple(i for i, _ in hits[s])) for s in order]
        if [(g.key, g.ids, g.part_ids) for g in got] == want:
            matched += 1
            for g in got:
                best = [d for _, d in hits[g.key][:group_size]]
                assert g.distances == pytest.approx(best, abs=1e-6)
    assert checked >= len(corpus.queries) // 2
    assert matched >= 0.9 * checked, f"{matched} of {checked} pages equal the collapsed list"


# --------------------------------------------------------------------------------------------
# collapsing a ranked list the caller has (Index.collapse, collapse_by_key): the rule of
# grouped search over a given order, against a plain Python oracle


def oracle_collapse(
    ranked: list[int], key_of: dict[int, object], group_size: int, limit: int
) -> list[tuple[object, tuple[int, ...], tuple[int, ...]]]:
    """(key, first group_size ids, every id) of the first ``limit`` keys met in ``ranked``;
    ids whose key is None are skipped; 1 and "1" are different keys."""
    order: list[tuple[type, object]] = []
    members: dict[tuple[type, object], list[int]] = {}
    for i in ranked:
        key = key_of[i]
        if key is None:
            continue
        tk = (type(key), key)
        if tk not in members:
            if len(order) >= limit:
                continue
            order.append(tk)
            members[tk] = []
        members[tk].append(i)
    return [(tk[1], tuple(members[tk][:group_size]), tuple(members[tk])) for tk in order]


# a group value: a small int, a str that may spell one of those ints, or none
_GROUP_VALUES = st.one_of(st.integers(-2, 3), st.sampled_from(["a", "b", "1"]), st.none())


@st.composite
def ranked_lists(draw: st.DrawFn) -> tuple[list[object], list[int], list[float], int, int]:
    """(group value per row, ranked row ids, their scores with ties, group_size, limit)."""
    values = draw(st.lists(_GROUP_VALUES, min_size=1, max_size=24))
    if all(v is None for v in values):
        values[0] = 0  # the field must exist in some stored row
    rows = draw(st.permutations(range(len(values))))
    ranked = rows[: draw(st.integers(0, len(values)))]
    scores = draw(st.lists(st.sampled_from([1.0, 0.5, 0.5, 0.25, 0.0]), min_size=len(ranked), max_size=len(ranked)))
    scores.sort(reverse=True)  # rank order; equal scores are ties the collapse keeps in list order
    return values, ranked, scores, draw(st.integers(1, 3)), draw(st.integers(0, len(values) + 1))


def _collapse_index(values: list[object]) -> kbcore.Index:
    rng = np.random.default_rng(len(values))
    index = kbcore.Index(2, metric="l2", kind="flat")
    ids = 100 + np.arange(len(values), dtype=np.int64) * 7  # ids are not slots
    meta = [{"year": 1} if v is None else {"year": 1, "source": v} for v in values]
    index.add(rng.standard_normal((len(values), 2)).astype(np.float32), ids, metadata=meta, threads=1)
    return index


@given(case=ranked_lists())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_collapse_keeps_the_first_groups_of_the_given_order_like_the_oracle(case):
    values, rows, scores, group_size, limit = case
    index = _collapse_index(values)
    ids = [100 + 7 * r for r in rows]
    key_of = {100 + 7 * r: v for r, v in enumerate(values)}
    got = index.collapse(ids, scores, group_by="source", group_size=group_size, limit=limit)
    assert [(g.key, g.ids, g.part_ids) for g in got] == oracle_collapse(ids, key_of, group_size, limit)
    score_of = dict(zip(ids, scores))
    for g in got:
        assert type(g.key) is type(key_of[g.ids[0]])
        assert g.distances == tuple(score_of[i] for i in g.ids)  # the given values ride along


@given(case=ranked_lists())
@settings(max_examples=150, deadline=None)
def test_collapse_by_key_keeps_the_first_groups_of_the_given_order_like_the_oracle(case):
    values, rows, scores, group_size, limit = case
    ints = {v: j for j, v in enumerate(dict.fromkeys(values))}  # every value (None too) as an int key
    ids = [5000 - r for r in rows]
    keys = [ints[values[r]] for r in rows]
    key_of = dict(zip(ids, keys))
    got = collapse_by_key(ids, scores, keys, group_size=group_size, limit=limit)
    assert [(g.key, g.ids, g.part_ids) for g in got] == oracle_collapse(ids, key_of, group_size, limit)


def test_collapse_of_the_exact_ranking_equals_exact_grouped_search(corpus, flat):
    """One rule: collapsing the flat index's full ranking gives grouped search's page."""
    for q in corpus.queries[:10]:
        ids, dist = flat.search(q, len(flat))
        for group_size in (1, 2):
            got = flat.collapse(ids, dist, group_size=group_size, limit=K)
            want = flat.search_groups(q, K, group_size=group_size)
            assert [(g.key, g.ids, g.part_ids) for g in got] == [(g.key, g.ids, g.part_ids) for g in want]


def test_collapse_names_an_id_that_is_not_in_the_index(flat, corpus):
    good = corpus.ids[:3].tolist()
    with pytest.raises(NotFoundError, match=r"id 12345678 \(position 2\) is not in the index"):
        flat.collapse([*good[:2], 12345678], [3.0, 2.0, 1.0], limit=2)
    with pytest.raises(KeyError):  # NotFoundError is a KeyError
        flat.collapse([-1], [0.0], limit=0)  # checked whatever the limit


def test_collapse_rejects_a_repeated_id_and_bad_arguments(flat, corpus):
    i, j = corpus.ids[:2].tolist()
    with pytest.raises(InvalidArgumentError, match=f"id {i} appears more than once"):
        flat.collapse([i, j, i], [3.0, 2.0, 1.0], limit=2)
    with pytest.raises(InvalidArgumentError, match="group_by field 'nope' is not present"):
        flat.collapse([i], [1.0], group_by="nope", limit=1)
    with pytest.raises(InvalidArgumentError, match="as long as ids"):
        flat.collapse([i, j], [1.0], limit=1)
    with pytest.raises(InvalidArgumentError, match="limit must be non-negative"):
        flat.collapse([i], [1.0], limit=-1)
    with pytest.raises(InvalidArgumentError, match="group_size must be positive"):
        flat.collapse([i], [1.0], group_size=0, limit=1)
    with pytest.raises(InvalidTypeError, match="scores must be numbers"):
        flat.collapse([i], ["x"], limit=1)
    with pytest.raises(InvalidArgumentError, match="keys must be as long as ids"):
        collapse_by_key([i, j], [1.0, 0.5], [1], limit=1)


def test_collapse_with_limit_zero_or_an_empty_list_returns_no_groups(flat, corpus):
    assert flat.collapse(corpus.ids[:5], np.ones(5), limit=0) == []
    assert flat.collapse([], [], limit=3) == []
    assert collapse_by_key([], [], [], limit=3) == []
