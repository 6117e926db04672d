"""The merge keys of ``Engine.retrieve`` over several knowledge bases, computed the fast way
(``multi._pick``: a stable sort of the concatenated scores; ``retrieval._scores``: the score
formula in one comprehension) against their definitions (the sort of ``(-score, list,
rank)`` key tuples; ``score_from_distance`` per distance), on seeded lists full of ties."""

from __future__ import annotations

import math
import random

import pytest

from kbcore.engine import multi, retrieval
from kbcore.engine.scores import score_from_distance


def _oracle(scores: list[list[float]], top_k: int, same: bool) -> list[tuple[int, int]]:
    """The documented merge order: by score, or by reciprocal rank then score; then the
    order of the knowledge bases, then rank."""
    keys = []
    for i, vs in enumerate(scores):
        for r, v in enumerate(vs):
            primary = v if same else 1.0 / (multi.RANK_K + r + 1)
            keys.append((-primary, -v, i, r))
    keys.sort()
    return [(i, r) for _, _, i, r in keys[:top_k]]


def _lists(rng: random.Random) -> list[list[float]]:
    """2-6 score lists, best first, some empty, drawn from a few values (ties within and
    across lists), at most 12 each."""
    values = [rng.choice([0.0, 0.25, 0.5, 0.5, 0.75, 1.0, rng.random()]) for _ in range(8)]
    out = []
    for _ in range(rng.randint(2, 6)):
        n = rng.choice([0, 0, 1, 3, 10, 12])
        out.append(sorted((rng.choice(values) for _ in range(n)), reverse=True))
    return out


@pytest.mark.parametrize("same", [True, False])
def test_pick_keeps_the_merge_order_of_whole_lists_with_ties_and_empty_lists(same):
    rng = random.Random(20261205)
    for _ in range(2000):
        scores = _lists(rng)
        top_k = rng.choice([1, 3, 10, 50])
        assert multi._pick(scores, top_k, same) == _oracle(scores, top_k, same)


def test_pick_of_no_candidates_is_empty():
    assert multi._pick([[], []], 5, True) == []
    assert multi._pick([[], []], 5, False) == []


@pytest.mark.parametrize("metric", ["cosine", "ip", "l2"])
def test_scores_equal_score_from_distance_bit_for_bit(metric):
    rng = random.Random(7)
    edges = [0.0, -0.0, -1e-7, 1e-7, 1.0, 2.0, 2.0000002, -3.0, 5.0, math.inf]
    dist = edges + [rng.uniform(-1.0, 3.0) for _ in range(500)]
    got = retrieval._scores(dist, metric)
    want = [score_from_distance(d, metric) for d in dist]
    assert [s.hex() for s in got] == [s.hex() for s in want]
