"""Fusion math for hybrid search (kbcore.fusion): RRF, linear min-max and z-score fusion.

Every expected value is computed by hand here or by a naive reference written in this file.
"""

from __future__ import annotations

import math
import random

import pytest

from kbcore import errors
from kbcore.fusion import linear, normalize_rrf, rrf, rrf_max_score, zscore


def naive_rrf(legs, k=60, weights=None):
    """Reference RRF: dict key -> fused score, first occurrence per leg, 1-based ranks."""
    weights = weights or [1.0] * len(legs)
    out: dict = {}
    for leg, w in zip(legs, weights):
        if w == 0:
            continue
        seen = []
        for key, _ in leg:
            if key not in seen:
                seen.append(key)
        for rank, key in enumerate(seen, start=1):
            out.setdefault(key, []).append(w / (k + rank))
    return {key: math.fsum(v) for key, v in out.items()}


def best_rank(legs, key):
    """Smallest 1-based rank of key among the distinct keys of each leg."""
    ranks = []
    for leg in legs:
        distinct = list(dict.fromkeys(kk for kk, _ in leg))
        if key in distinct:
            ranks.append(distinct.index(key) + 1)
    return min(ranks)


# ----------------------------------------------------------------------------------------
# RRF


def test_rrf_uses_one_based_ranks_and_sums_reciprocals():
    vec = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    txt = [("c", 12.0), ("a", 3.0)]
    got = dict(rrf([vec, txt], k=60))
    assert got["a"] == pytest.approx(1 / 61 + 1 / 62, abs=0, rel=1e-15)
    assert got["b"] == pytest.approx(1 / 62, abs=0, rel=1e-15)
    assert got["c"] == pytest.approx(1 / 63 + 1 / 61, abs=0, rel=1e-15)


def test_rrf_ignores_scores_and_uses_only_order():
    a = rrf([[(1, 100.0), (2, 99.0)], [(2, -5.0), (3, -6.0)]])
    b = rrf([[(1, 0.0), (2, 0.0)], [(2, 1e9), (3, 1e9)]])
    assert a == b


def test_rrf_output_is_sorted_by_score_descending():
    fused = rrf([[(i, 0.0) for i in range(20)], [(i, 0.0) for i in range(30, 5, -1)]])
    scores = [s for _, s in fused]
    assert scores == sorted(scores, reverse=True)


def test_rrf_ties_break_by_best_rank_then_key():
    # k = 0: x is 2nd in both legs (1/2 + 1/2 = 1), y and z are 1st in one leg each (1/1 = 1).
    fused = rrf([[("y", 0.0), ("x", 0.0)], [("z", 0.0), ("x", 0.0)]], k=0)
    assert [s for _, s in fused] == [1.0, 1.0, 1.0]
    assert [key for key, _ in fused] == ["y", "z", "x"]  # best rank 1 before 2; then y < z


def test_rrf_symmetric_rank_patterns_tie_exactly_and_order_by_key():
    fused = rrf([[("b", 0.0), ("a", 0.0)], [("a", 0.0), ("b", 0.0)]])
    assert fused[0][1] == fused[1][1]
    assert [key for key, _ in fused] == ["a", "b"]


def test_rrf_three_legs_is_independent_of_leg_order():
    legs = [[(1, 0), (2, 0), (3, 0)], [(2, 0), (3, 0), (1, 0)], [(3, 0), (1, 0), (2, 0)]]
    first = rrf(legs)
    # Each key has ranks {1, 2, 3} across the legs: an exact three-way tie, ordered by key.
    assert [key for key, _ in first] == [1, 2, 3]
    assert len({s for _, s in first}) == 1
    for perm in ([legs[1], legs[2], legs[0]], [legs[2], legs[0], legs[1]], legs[::-1]):
        assert rrf(perm) == first


def test_rrf_with_one_empty_leg_equals_the_other_leg_alone():
    leg = [(5, 0.3), (3, 0.2), (9, 0.1)]
    assert rrf([leg, []]) == rrf([leg]) == rrf([[], leg])
    assert [key for key, _ in rrf([leg, []])] == [5, 3, 9]


def test_rrf_of_no_legs_or_only_empty_legs_is_empty():
    assert rrf([]) == []
    assert rrf([[], []]) == []


def test_rrf_window_smaller_than_top_k_returns_the_union_without_padding():
    top_k = 10
    vec = [(1, 0.9), (2, 0.8), (3, 0.7)]
    txt = [(3, 7.0), (4, 6.0)]
    fused = rrf([vec, txt])[:top_k]
    assert sorted(key for key, _ in fused) == [1, 2, 3, 4]
    assert fused[0][0] == 3  # in both legs


def test_rrf_counts_only_the_first_occurrence_of_a_key_in_a_leg():
    got = dict(rrf([[(1, 0.0), (2, 0.0), (1, 0.0)]], k=60))
    assert got == {1: 1 / 61, 2: 1 / 62}
    got = dict(rrf([[(1, 0.0), (1, 0.0), (2, 0.0)]], k=60))
    assert got == {1: 1 / 61, 2: 1 / 62}  # ranks count distinct keys


def test_rrf_weights_scale_each_leg():
    vec = [("a", 0.0), ("b", 0.0)]
    txt = [("b", 0.0), ("a", 0.0)]
    got = dict(rrf([vec, txt], k=60, weights=[2.0, 1.0]))
    assert got["a"] == pytest.approx(2 / 61 + 1 / 62, rel=1e-15)
    assert got["b"] == pytest.approx(2 / 62 + 1 / 61, rel=1e-15)
    assert rrf([vec, txt], weights=[2.0, 1.0])[0][0] == "a"
    assert rrf([vec, txt], weights=[1.0, 2.0])[0][0] == "b"


def test_rrf_zero_weight_leg_is_ignored():
    vec = [("a", 0.0), ("b", 0.0)]
    txt = [("c", 0.0)]
    assert rrf([vec, txt], weights=[1.0, 0.0]) == rrf([vec])


def test_rrf_k_changes_the_scores_as_the_formula_says():
    got = dict(rrf([[("a", 0.0), ("b", 0.0)]], k=0))
    assert got == {"a": 1.0, "b": 0.5}
    got = dict(rrf([[("a", 0.0), ("b", 0.0)]], k=10))
    assert got == {"a": 1 / 11, "b": 1 / 12}


def test_rrf_matches_a_naive_reference_on_random_legs():
    rnd = random.Random(7)
    for _ in range(200):
        n_legs = rnd.randint(1, 4)
        legs = [[(rnd.randint(0, 30), rnd.random()) for _ in range(rnd.randint(0, 25))] for _ in range(n_legs)]
        k = rnd.choice([0, 1, 60, 100])
        weights = [rnd.choice([0.0, 0.5, 1.0, 3.0]) for _ in range(n_legs)] if rnd.random() < 0.5 else None
        if weights is not None and not any(weights):
            weights[0] = 1.0
        got = rrf(legs, k=k, weights=weights)
        ref = naive_rrf(legs, k, weights)
        assert {key for key, _ in got} == set(ref)
        for key, s in got:
            assert s == pytest.approx(ref[key], rel=1e-12)
        order = sorted(
            ref,
            key=lambda key: (
                -ref[key],
                best_rank([leg for leg, w in zip(legs, weights or [1] * n_legs) if w], key),
                key,
            ),
        )
        assert [key for key, _ in got] == order


@pytest.mark.parametrize("k", [-1, float("nan"), float("inf")])
def test_rrf_rejects_a_bad_k(k):
    with pytest.raises(errors.InvalidArgumentError):
        rrf([[(1, 0.0)]], k=k)
    with pytest.raises(ValueError):
        rrf([[(1, 0.0)]], k=k)


def test_rrf_rejects_bad_weights():
    legs = [[(1, 0.0)], [(2, 0.0)]]
    with pytest.raises(ValueError, match="2 legs but 1 weights"):
        rrf(legs, weights=[1.0])
    with pytest.raises(ValueError):
        rrf(legs, weights=[1.0, -0.5])
    with pytest.raises(ValueError):
        rrf(legs, weights=[0.0, 0.0])
    with pytest.raises(ValueError):
        rrf(legs, weights=[1.0, float("nan")])
    with pytest.raises(TypeError):
        rrf(legs, weights="ab")
    with pytest.raises(TypeError):
        rrf(legs, k="60")


# ----------------------------------------------------------------------------------------
# RRF normalisation to [0, 1]


def test_rrf_max_score_is_the_weight_sum_over_k_plus_one():
    assert rrf_max_score(2, k=60) == 2 / 61
    assert rrf_max_score(2, k=60, weights=[0.7, 0.3]) == pytest.approx(1 / 61, rel=1e-15)
    assert rrf_max_score(1, k=0) == 1.0


def test_normalize_rrf_maps_first_in_every_leg_to_one_and_keeps_order():
    vec = [("a", 0.0), ("b", 0.0), ("c", 0.0)]
    txt = [("a", 0.0), ("c", 0.0)]
    fused = rrf([vec, txt], k=60)
    norm = normalize_rrf(fused, 2, k=60)
    assert [key for key, _ in norm] == [key for key, _ in fused]
    assert norm[0] == ("a", 1.0)
    assert all(0.0 <= s <= 1.0 for _, s in norm)
    assert dict(norm)["b"] == pytest.approx((1 / 62) / (2 / 61), rel=1e-12)


def test_normalize_rrf_with_weights_stays_within_unit_interval():
    legs = [[(i, 0.0) for i in range(5)] for _ in range(3)]
    w = [0.1, 0.2, 0.7]  # sums to 1 only up to rounding
    norm = normalize_rrf(rrf(legs, k=60, weights=w), 3, k=60, weights=w)
    assert norm[0] == (0, 1.0)
    assert all(0.0 <= s <= 1.0 for _, s in norm)


def test_normalize_rrf_counts_an_empty_leg_in_the_maximum():
    fused = rrf([[("a", 1.0)], []])
    assert normalize_rrf(fused, 2) == [("a", 0.5)]
    assert normalize_rrf(fused, 1) == [("a", 1.0)]


# ----------------------------------------------------------------------------------------
# linear fusion


def test_linear_min_max_normalises_each_leg_and_weights_them():
    vec = [("a", 0.9), ("b", 0.5), ("c", 0.1)]  # -> 1.0, 0.5, 0.0
    txt = [("b", 10.0), ("d", 6.0), ("a", 2.0)]  # -> 1.0, 0.5, 0.0
    got = dict(linear(vec, txt, vector_weight=0.7))
    assert got["a"] == pytest.approx(0.7 * 1.0 + 0.3 * 0.0, abs=1e-15)
    assert got["b"] == pytest.approx(0.7 * 0.5 + 0.3 * 1.0, abs=1e-15)
    assert got["c"] == pytest.approx(0.0, abs=1e-15)
    assert got["d"] == pytest.approx(0.3 * 0.5, abs=1e-15)  # missing from the vector leg: 0
    assert [key for key, _ in linear(vec, txt, 0.7)] == ["a", "b", "d", "c"]


def test_linear_leg_with_constant_scores_normalises_to_one():
    vec = [("a", 0.42), ("b", 0.42)]
    txt = [("c", 3.0)]  # a single candidate is constant too
    got = dict(linear(vec, txt, vector_weight=0.6))
    assert got == {"a": pytest.approx(0.6), "b": pytest.approx(0.6), "c": pytest.approx(0.4)}


def test_linear_ties_break_by_best_rank_then_key():
    vec = [("b", 1.0), ("a", 1.0)]  # constant: both 1.0; b is rank 1
    got = linear(vec, [], vector_weight=0.5)
    assert [key for key, _ in got] == ["b", "a"]
    got = linear([("b", 1.0)], [("a", 1.0)], vector_weight=0.5)
    assert [key for key, _ in got] == ["a", "b"]  # both rank 1, both 0.5: by key


def test_linear_with_one_empty_leg_is_the_other_leg_scaled():
    vec = [(1, 0.9), (2, 0.6), (3, 0.3)]
    got = linear(vec, [], vector_weight=0.7)
    assert [key for key, _ in got] == [1, 2, 3]
    assert [s for _, s in got] == pytest.approx([0.7, 0.35, 0.0])
    got = linear([], vec, vector_weight=0.7)
    assert [s for _, s in got] == pytest.approx([0.3, 0.15, 0.0])
    assert linear([], []) == []


def test_linear_extreme_weights_select_one_leg():
    vec = [(1, 0.9), (2, 0.1)]
    txt = [(2, 5.0), (1, 1.0)]
    assert [key for key, _ in linear(vec, txt, vector_weight=1.0)] == [1, 2]
    assert [key for key, _ in linear(vec, txt, vector_weight=0.0)] == [2, 1]


def test_linear_scores_stay_in_unit_interval():
    rnd = random.Random(3)
    for _ in range(200):
        vec = [(rnd.randint(0, 20), rnd.uniform(-1, 1)) for _ in range(rnd.randint(0, 15))]
        txt = [(rnd.randint(0, 20), rnd.uniform(0, 30)) for _ in range(rnd.randint(0, 15))]
        w = rnd.random()
        got = linear(vec, txt, vector_weight=w)
        assert all(0.0 <= s <= 1.0 for _, s in got)
        scores = [s for _, s in got]
        assert scores == sorted(scores, reverse=True)


def test_linear_rejects_bad_inputs():
    with pytest.raises(ValueError):
        linear([(1, 0.5)], [], vector_weight=1.5)
    with pytest.raises(ValueError):
        linear([(1, 0.5)], [], vector_weight=float("nan"))
    with pytest.raises(TypeError):
        linear([(1, 0.5)], [], vector_weight="0.7")
    with pytest.raises(ValueError, match="finite"):
        linear([(1, float("inf"))], [])
    with pytest.raises(ValueError, match="finite"):
        linear([], [(1, float("nan"))])


def test_numpy_scalars_are_accepted_as_keys_weights_and_k():
    import numpy as np

    vec = [(np.int64(4), np.float32(0.9)), (np.int64(2), np.float32(0.1))]
    txt = [(np.int64(2), np.float32(3.0))]
    got = rrf([vec, txt], k=np.int64(60), weights=[np.float32(0.5), np.float64(1.0)])
    assert [int(key) for key, _ in got] == [2, 4]
    assert got[0][1] == pytest.approx(0.5 / 62 + 1.0 / 61)
    assert [int(key) for key, _ in linear(vec, txt, vector_weight=np.float32(0.7))] == [4, 2]


# ----------------------------------------------------------------------------------------
# z-score fusion


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def naive_zscore(legs, weights=None):
    """Reference z-score fusion: dict key -> fused mean z (before the normal CDF)."""
    weights = weights or [1.0] * len(legs)
    per_leg = []
    for leg, w in zip(legs, weights):
        first: dict = {}
        for key, s in leg:
            first.setdefault(key, s)
        if w == 0 or not first:
            continue
        vals = list(first.values())
        mean = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        z = {k: (v - mean) / sd if sd > 0 else 0.0 for k, v in first.items()}
        per_leg.append((z, min(z.values()), w))
    keys = {k for z, _, _ in per_leg for k in z}
    total = sum(w for _, _, w in per_leg)
    return {k: sum(w * z.get(k, floor) for z, floor, w in per_leg) / total for k in keys}


def test_zscore_standardises_each_leg_and_averages_through_the_normal_cdf():
    vec = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    txt = [("c", 12.0), ("a", 3.0)]
    sd_v = math.sqrt((0.3**2 + 0.2**2 + 0.5**2) / 3)  # mean 0.6
    z_v = {"a": 0.3 / sd_v, "b": 0.2 / sd_v, "c": -0.5 / sd_v}
    z_t = {"c": 1.0, "a": -1.0}  # mean 7.5, sd 4.5; "b" is missing: the leg's lowest z, -1
    want = {k: (z_v[k] + z_t.get(k, -1.0)) / 2 for k in "abc"}
    got = zscore([vec, txt])
    assert [k for k, _ in got] == ["a", "c", "b"]
    for key, score in got:
        assert score == pytest.approx(_phi(want[key]), abs=0, rel=1e-12)


def test_zscore_does_not_depend_on_a_legs_scale_or_offset():
    rng = random.Random(7)
    vec = [(i, rng.random()) for i in range(30)]
    txt = [(i, rng.random() * 20) for i in range(15, 45)]
    base = zscore([vec, txt])
    moved = zscore([[(k, 3.0 * s - 1.0) for k, s in vec], [(k, 0.01 * s + 100.0) for k, s in txt]])
    assert [k for k, _ in moved] == [k for k, _ in base]
    for (_, a), (_, b) in zip(base, moved):
        assert a == pytest.approx(b, rel=1e-9)


def test_zscore_of_huge_scores_is_that_of_the_scaled_scores():
    big = zscore([[(1, 1.7e308), (2, 1e308), (3, -1.7e308)], [(4, 1e301), (2, 1e300)]], floors=[None, (0.0, 2)])
    small = zscore([[(1, 1.7), (2, 1.0), (3, -1.7)], [(4, 1e-7), (2, 1e-8)]], floors=[None, (0.0, 2)])
    assert [k for k, _ in big] == [k for k, _ in small] and len(big) == 4
    for (_, a), (_, b) in zip(big, small):
        assert a == pytest.approx(b, rel=1e-9)


def test_zscore_a_confident_leg_outweighs_a_flat_one():
    # The text leg's top hit stands 3 sigma out; the vector leg's candidates all score alike.
    vec = [(i, 0.80 - 0.001 * i) for i in range(20)]
    txt = [(50, 30.0)] + [(i, 5.0 - 0.01 * i) for i in range(20, 39)]
    assert zscore([vec, txt])[0][0] == 50
    assert rrf([vec, txt])[0][0] == 0  # rank fusion cannot see the gap: both firsts tie


def test_zscore_is_monotone_in_each_leg_among_keys_equal_in_the_other():
    rng = random.Random(11)
    for _ in range(200):
        n = rng.randint(2, 12)
        vec = [(i, rng.random()) for i in range(n)]
        other = rng.random()
        txt = [(i, other) for i in range(n)] + [(100 + i, rng.random()) for i in range(rng.randint(0, 5))]
        order = [k for k, _ in zscore([vec, txt]) if k < 100]
        expect = [k for k, _ in sorted(vec, key=lambda kv: (-kv[1], kv[0]))]
        assert order == expect


def test_zscore_ties_break_by_best_rank_then_key():
    vec = [("x", 2.0), ("y", 1.0)]
    txt = [("y", 2.0), ("x", 1.0)]
    assert zscore([vec, txt]) == [("x", 0.5), ("y", 0.5)]  # x and y tie at z 0: best ranks 1 and 1
    got = zscore([[("b", 1.0), ("a", 1.0)]])  # a constant leg orders nothing: ranks decide
    assert got == [("b", 0.5), ("a", 0.5)]


def test_zscore_with_one_leg_keeps_that_legs_order_and_skips_empty_legs():
    leg = [(5, 0.9), (3, 0.7), (9, 0.65), (1, 0.1)]
    for legs in ([leg], [leg, []], [[], leg]):
        assert [k for k, _ in zscore(legs)] == [5, 3, 9, 1]
    assert zscore([]) == [] and zscore([[], []]) == []
    assert zscore([[(4, 0.3)], []]) == [(4, 0.5)]


def test_zscore_counts_only_the_first_occurrence_of_a_key_in_a_leg():
    assert zscore([[(1, 3.0), (2, 2.0), (1, -50.0), (3, 1.0)]]) == zscore([[(1, 3.0), (2, 2.0), (3, 1.0)]])


def test_zscore_weights_and_leg_order():
    rng = random.Random(3)
    for _ in range(50):
        legs = [[(rng.randrange(40), rng.gauss(0, 1)) for _ in range(rng.randint(0, 25))] for _ in range(3)]
        weights = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in legs]
        if not any(weights):
            weights[0] = 1.0
        got = zscore(legs, weights)
        ref = naive_zscore(legs, weights)
        assert {k for k, _ in got} == set(ref)
        for key, score in got:
            assert score == pytest.approx(_phi(ref[key]), rel=1e-9, abs=1e-12)
            assert 0.0 < score < 1.0 or math.isclose(score, 1.0)
        assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
        assert zscore(legs[::-1], weights[::-1]) == got


def test_zscore_rejects_bad_inputs():
    with pytest.raises(errors.InvalidArgumentError, match="finite"):
        zscore([[(1, float("nan"))]])
    with pytest.raises(errors.InvalidArgumentError, match="finite"):
        zscore([[(1, 1.0)], [(2, float("inf"))]])
    with pytest.raises(errors.InvalidArgumentError):
        zscore([[(1, 1.0)]], weights=[0.0])
    with pytest.raises(errors.InvalidArgumentError):
        zscore([[(1, 1.0)]], weights=[1.0, 1.0])
    with pytest.raises(errors.InvalidTypeError):
        zscore([[(1, 1.0)]], weights="1")


def test_zscore_floor_counts_the_keys_a_complete_leg_did_not_return():
    # A BM25 leg that matched one document of a window of five: four more score 0.
    vec = [(k, s) for k, s in zip("aebcd", (0.9, 0.6, 0.5, 0.45, 0.4))]
    txt = [("e", 7.0)]
    plain = dict(zscore([vec, txt]))  # a lone candidate: the text leg orders nothing
    assert max(plain, key=plain.get) == "a"
    got = zscore([vec, txt], floors=[None, (0.0, 4)])
    t = [7.0, 0, 0, 0, 0]
    mean, sd = sum(t) / 5, math.sqrt(sum((x - 1.4) ** 2 for x in t) / 5)
    v = [0.9, 0.5, 0.45, 0.4, 0.6]
    vm, vsd = sum(v) / 5, math.sqrt(sum((x - sum(v) / 5) ** 2 for x in v) / 5)
    want = {k: ((x - vm) / vsd + ((7.0 if k == "e" else 0.0) - mean) / sd) / 2 for k, x in zip("abcde", v)}
    assert [k for k, _ in got] == sorted(want, key=want.get, reverse=True)
    assert got[0][0] == "e"
    for key, score in got:
        assert score == pytest.approx(_phi(want[key]), rel=1e-12)


def test_zscore_rejects_bad_floors():
    leg = [[(1, 1.0), (2, 0.5)]]
    for floors, err in (
        ([(0.0, 0)], errors.InvalidArgumentError),
        ([(float("nan"), 2)], errors.InvalidArgumentError),
        ([(0.0, 1.5)], errors.InvalidArgumentError),
        ([0.0], errors.InvalidTypeError),
        ([None, None], errors.InvalidArgumentError),
        ("0", errors.InvalidTypeError),
    ):
        with pytest.raises(err):
            zscore(leg, floors=floors)
    assert zscore(leg, floors=[None]) == zscore(leg)
