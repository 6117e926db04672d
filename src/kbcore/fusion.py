"""Fusion for hybrid search: z-score fusion (the default), reciprocal rank fusion (RRF) and
linear score fusion.

Pure functions over ranked lists of ``(key, score)`` pairs, one list per retrieval *leg*
(for example the vector leg and the BM25 leg). Every leg is ranked best first and its scores
are "higher is better" (turn distances into similarities before calling :func:`linear`).
Keys are any hashable values that are mutually orderable (all ``int`` or all ``str``), because
the last tie-break sorts by key.

Fused results are ``list[tuple[key, float]]`` sorted by fused score descending; equal fused
scores are broken by the key's best 1-based rank in any leg, then by key ascending, so the
output is deterministic whatever the order of the legs or of the dict iteration. If a key
appears twice in one leg, only its first (best) occurrence counts, and ranks count distinct
keys (a repeat does not push the keys after it down).

Truncating to ``top_k`` is the caller's job (``fused[:top_k]``): a fused list may be shorter
than ``top_k`` when the legs' candidate windows are small or overlap, and that is not an error.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence
from typing import TypeVar

from .errors import InvalidArgumentError, InvalidTypeError

__all__ = ["linear", "normalize_rrf", "rrf", "rrf_max_score", "zscore"]

#: The retrieval routes a knowledge base can be set to (one leg, the other, or both fused),
#: and the fusions of the hybrid route: the one list (the engine, its manifest check and the
#: CLI read it).
SEARCH_TYPES: tuple[str, ...] = ("vector", "full_text", "hybrid")
FUSIONS: tuple[str, ...] = ("zscore", "rrf", "linear")
#: The fusion of a knowledge base created without one (``docs/hybrid.md`` has the measurements).
DEFAULT_FUSION = "zscore"

K = TypeVar("K", bound=Hashable)


def check_rrf_k(k: float, name: str = "rrf k") -> float:
    """``k`` as a float; raises unless it is a finite real number >= 0 (``name`` in messages)."""
    if isinstance(k, bool) or not isinstance(k, numbers.Real):
        raise InvalidTypeError(f"{name} must be a number, got {type(k).__name__}")
    if not math.isfinite(k) or k < 0:
        raise InvalidArgumentError(f"{name} must be a finite number >= 0, got {k!r}")
    return float(k)


def check_vector_weight(value: float) -> float:
    """``vector_weight`` as a float; raises unless it is a real number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidTypeError(f"vector_weight must be a number in [0, 1], got {type(value).__name__}")
    w = float(value)
    if not 0.0 <= w <= 1.0:  # also rejects NaN
        raise InvalidArgumentError(f"vector_weight must be in [0, 1], got {value!r}")
    return w


def _check_weights(weights: Sequence[float] | None, n_legs: int) -> list[float]:
    if weights is None:
        return [1.0] * n_legs
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise InvalidTypeError(f"weights must be a sequence of numbers, got {type(weights).__name__}")
    if len(weights) != n_legs:
        raise InvalidArgumentError(f"got {n_legs} legs but {len(weights)} weights")
    out: list[float] = []
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise InvalidTypeError(f"weights must be numbers, got {type(w).__name__}")
        if not math.isfinite(w) or w < 0:
            raise InvalidArgumentError(f"weights must be finite and >= 0, got {w!r}")
        out.append(float(w))
    if n_legs and not any(out):
        raise InvalidArgumentError("at least one weight must be positive")
    return out


def _distinct_keys(leg: Sequence[tuple[K, float]]) -> list[K]:
    """The leg's keys in order, first occurrence only."""
    keys = [kv[0] for kv in leg]
    if len(set(keys)) != len(keys):
        keys = list(dict.fromkeys(keys))
    return keys


def _sorted(acc: dict[K, list]) -> list[tuple[K, float]]:
    # acc values are [fused score, best rank]; order: score desc, best rank asc, key asc.
    # Plain tuples sort natively (no key function); keys are unique, so no two tuples are equal.
    order = sorted([(-v[0], v[1], key) for key, v in acc.items()])
    return [(key, -neg) for neg, _, key in order]


def rrf(
    legs: Sequence[Sequence[tuple[K, float]]],
    k: float = 60,
    weights: Sequence[float] | None = None,
) -> list[tuple[K, float]]:
    """Reciprocal rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009).

    With ``rank_i(d)`` the 1-based position of key ``d`` in leg ``i`` (best = 1) and ``w_i``
    the leg's weight (default 1)::

        rrf(d) = sum over legs i that contain d of  w_i / (k + rank_i(d))

    Only ranks matter; the legs' scores are ignored (so legs need not share a scale). A key
    missing from a leg contributes nothing for that leg; a leg of weight 0 is skipped. ``k``
    (>= 0, default 60) damps the advantage of the very top ranks. Empty legs are allowed; no
    legs give ``[]``.

    Returns every key of every leg as ``(key, rrf score)``, fused score descending; ties go to
    the better (smaller) best rank over the legs, then to the smaller key. Scores lie in
    ``(0, rrf_max_score(len(legs), k, weights)]``; see :func:`normalize_rrf` for [0, 1].
    """
    kk = check_rrf_k(k)
    ws = _check_weights(weights, len(legs))
    acc: dict[K, list] = {}
    terms: dict[K, list[float]] | None = {} if len(legs) > 2 else None
    for leg, w in zip(legs, ws):
        if w == 0.0:
            continue
        for rank, key in enumerate(_distinct_keys(leg), start=1):
            c = w / (kk + rank)
            entry = acc.get(key)
            if entry is None:
                acc[key] = [c, rank]
            else:
                # Two terms add exactly commutatively; for more legs a correctly rounded sum
                # (below) makes permuted rank patterns tie exactly.
                entry[0] += c
                entry[1] = min(entry[1], rank)
            if terms is not None:
                terms.setdefault(key, []).append(c)
    if terms is not None:
        for key, parts in terms.items():
            acc[key][0] = math.fsum(parts)
    return _sorted(acc)


def rrf_max_score(n_legs: int, k: float = 60, weights: Sequence[float] | None = None) -> float:
    """The largest RRF score attainable over ``n_legs`` legs: ``sum(w_i) / (k + 1)``.

    A key reaches it only by ranking first in every leg. With ``weights=None`` it is
    ``n_legs / (k + 1)``.
    """
    if isinstance(n_legs, bool) or not isinstance(n_legs, int) or n_legs < 0:
        raise InvalidArgumentError(f"n_legs must be a non-negative integer, got {n_legs!r}")
    kk = check_rrf_k(k)
    ws = _check_weights(weights, n_legs)
    return math.fsum(ws) / (kk + 1.0)


def normalize_rrf(
    fused: Sequence[tuple[K, float]],
    n_legs: int,
    k: float = 60,
    weights: Sequence[float] | None = None,
) -> list[tuple[K, float]]:
    """Maps RRF scores to [0, 1]: ``score / rrf_max_score(n_legs, k, weights)``, capped at 1.

    ``n_legs``, ``k`` and ``weights`` must be those given to :func:`rrf`. Legs that returned
    nothing still count in the maximum, so 1.0 means "first in every leg that was asked";
    pass only the legs that actually ran. Order is unchanged.
    """
    top = rrf_max_score(n_legs, k, weights)
    if top <= 0.0:
        return [(key, 0.0) for key, _ in fused]
    return [(key, min(1.0, s / top)) for key, s in fused]


def _min_max(leg: Sequence[tuple[K, float]], what: str) -> dict[K, tuple[float, int]]:
    """First occurrence of each key -> (min-max normalised score, 1-based rank)."""
    out: dict[K, tuple[float, int]] = {}
    scores: list[float] = []
    keys: list[K] = []
    ranks: list[int] = []
    rank = 0
    for key, score in leg:
        if key in out:
            continue
        rank += 1
        s = float(score)
        if not math.isfinite(s):
            raise InvalidArgumentError(f"{what} scores must be finite, got {score!r} for {key!r}")
        out[key] = (s, rank)
        keys.append(key)
        scores.append(s)
        ranks.append(rank)
    if not scores:
        return out
    lo, hi = min(scores), max(scores)
    span = hi - lo
    if span > 0.0:
        for key, s, r in zip(keys, scores, ranks):
            out[key] = ((s - lo) / span, r)
    else:
        for key, r in zip(keys, ranks):
            out[key] = (1.0, r)
    return out


def linear(
    vector_leg: Sequence[tuple[K, float]],
    text_leg: Sequence[tuple[K, float]],
    vector_weight: float = 0.7,
) -> list[tuple[K, float]]:
    """Weighted sum of min-max normalised scores (a convex combination).

    Each leg's scores (higher is better, finite) are normalised over that leg's own candidates::

        norm(s) = (s - min) / (max - min)      or 1.0 when max == min (one candidate, or ties)

    and with ``w = vector_weight`` in [0, 1]::

        fused(d) = w * norm_vector(d) + (1 - w) * norm_text(d)

    where a key missing from a leg contributes 0 for that leg. Fused scores are in [0, 1].
    Returns every key of both legs, fused score descending; ties go to the better best rank
    over the legs, then to the smaller key. Note that the worst candidate of a leg normalises
    to 0, like a missing one: min-max fusion is sensitive to the candidate window.
    """
    w = check_vector_weight(vector_weight)
    acc: dict[K, list] = {}
    for leg, lw, what in ((vector_leg, w, "vector leg"), (text_leg, 1.0 - w, "text leg")):
        for key, (s, rank) in _min_max(leg, what).items():
            c = lw * s
            entry = acc.get(key)
            if entry is None:
                acc[key] = [c, rank]
            else:
                entry[0] += c
                entry[1] = min(entry[1], rank)
    for entry in acc.values():  # guard against 0.7 * 1 + 0.3 * 1 rounding above 1
        entry[0] = min(entry[0], 1.0)
    return _sorted(acc)


def _z_scores(
    leg: Sequence[tuple[K, float]], floor: tuple[float, int] | None, what: str
) -> tuple[list[K], list[float], float]:
    """The leg's distinct keys in rank order, their z-scores over the leg, and the z-score of a
    key the leg did not return: that of the floor's score when the leg knows it (its keys
    counted in the mean and deviation), else the leg's lowest z-score."""
    first: dict[K, float] = {}  # insertion order = rank order
    for key, score in leg:
        if key not in first:
            first[key] = float(score)
    keys = list(first)
    if not keys:
        return keys, [], 0.0
    vals = list(first.values())
    if not all(map(math.isfinite, vals)):
        bad = next(k for k, v in first.items() if not math.isfinite(v))
        raise InvalidArgumentError(f"{what} scores must be finite, got {first[bad]!r} for {bad!r}")
    fv, fn = (0.0, 0) if floor is None else floor  # the floor's score, and how many keys have it
    hi = max(max(map(abs, vals)), abs(fv))
    if hi > 1e100:  # z-scores do not depend on the scale: keep the squares finite
        vals = [v / hi for v in vals]
        fv /= hi
    n = len(vals) + fn
    mean = (math.fsum(vals) + fv * fn) / n
    sq = math.fsum([(v - mean) * (v - mean) for v in vals]) + fn * (fv - mean) * (fv - mean)
    sd = math.sqrt(sq / n)
    if not sd > 0.0:  # one candidate, or every score equal: the leg orders nothing
        return keys, [0.0] * len(keys), 0.0
    inv = 1.0 / sd
    zs = [(v - mean) * inv for v in vals]
    return keys, zs, (min(zs) if floor is None else (fv - mean) * inv)


def _check_floors(floors: Sequence[tuple[float, int] | None] | None, n_legs: int) -> list[tuple[float, int] | None]:
    if floors is None:
        return [None] * n_legs
    if isinstance(floors, (str, bytes)) or not isinstance(floors, Sequence):
        raise InvalidTypeError(f"floors must be a sequence of (score, count) or None, got {type(floors).__name__}")
    if len(floors) != n_legs:
        raise InvalidArgumentError(f"got {n_legs} legs but {len(floors)} floors")
    out: list[tuple[float, int] | None] = []
    for f in floors:
        if f is None:
            out.append(None)
            continue
        if not isinstance(f, Sequence) or len(f) != 2:
            raise InvalidTypeError(f"a floor is a (score, count) pair or None, got {f!r}")
        score, count = f
        if isinstance(score, bool) or not isinstance(score, numbers.Real) or not math.isfinite(score):
            raise InvalidArgumentError(f"a floor's score must be a finite number, got {score!r}")
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
            raise InvalidArgumentError(f"a floor's count must be an integer >= 1, got {count!r}")
        out.append((float(score), int(count)))
    return out


def zscore(
    legs: Sequence[Sequence[tuple[K, float]]],
    weights: Sequence[float] | None = None,
    floors: Sequence[tuple[float, int] | None] | None = None,
) -> list[tuple[K, float]]:
    """Z-score fusion: each leg's scores standardised over its own candidates, then averaged.

    The zero-mean unit-variance normalisation of Montague & Aslam ("Relevance score
    normalization for metasearch", CIKM 2001) followed by a weighted mean (CombSUM). For
    each leg ``i`` with candidate scores ``s`` (higher is better, finite), over the leg's
    distinct keys::

        z_i(d) = (s_i(d) - mean_i) / std_i        (population std; 0 when std_i == 0)

    A key the leg did not return gets the leg's lowest z (it ranked below every candidate),
    unless ``floors[i]`` is a ``(score, count)`` pair: ``count`` (>= 1) further keys are known
    to have ``score`` (a BM25 leg that returned every match within a window of ``w``:
    ``(0.0, w - len(leg))``). They count in the mean and deviation, and a missing key gets
    their z; so a leg with a single match still lifts it. With ``w_i`` the leg's weight
    (default 1), over the legs that returned something::

        fused(d) = sum_i w_i * z_i(d) / sum_i w_i
        score(d) = Phi(fused(d)) = (1 + erf(fused(d) / sqrt(2))) / 2      in (0, 1)

    So each query weighs its legs by their own score distributions: a leg whose best hits
    stand far above its other candidates (a confident leg) moves the fused order more than
    a leg whose candidates all score alike, whatever the legs' scales. ``score`` 0.5 is an
    average candidate, 0.84 one standard deviation above. Each leg's normalisation is an
    increasing affine map of its scores, so among keys with equal standing in the other
    legs a better score in one leg always ranks higher; raising one candidate's score also
    moves its leg's mean and deviation, so its rank against keys of the other leg is not
    monotone in it (as for min-max fusion's bounds).

    An empty leg (or one of weight 0) is skipped: one leg alone keeps its own order. Returns
    every key of every leg, ordered by ``fused`` descending (ties: the better best rank over
    the legs, then the smaller key), with ``score``. No legs give ``[]``.
    """
    ws = _check_weights(weights, len(legs))
    fl = _check_floors(floors, len(legs))
    parts: list[tuple[list[K], list[float], float, float]] = []
    for i, (leg, w, floor) in enumerate(zip(legs, ws, fl)):
        if w == 0.0:
            continue
        keys, zs, missing = _z_scores(leg, floor, f"leg {i}")
        if keys:
            parts.append((keys, zs, missing, w))
    if not parts:
        return []
    total_w = math.fsum(w for *_, w in parts)
    # fused(d) = (sum_i w_i * missing_i + sum_{i returning d} w_i * (z_i(d) - missing_i)) / W:
    # the first sum is shared by every key. Two terms add exactly commutatively; for more legs
    # a correctly rounded sum makes the result independent of the legs' order.
    base = math.fsum(w * m for _, _, m, w in parts)
    acc: dict[K, list] = {}
    terms: dict[K, list[float]] | None = {} if len(parts) > 2 else None
    for keys, zs, missing, w in parts:
        for rank, (key, z) in enumerate(zip(keys, zs), start=1):
            c = w * (z - missing)
            entry = acc.get(key)
            if entry is None:
                acc[key] = [c, rank]
            else:
                entry[0] += c
                if rank < entry[1]:
                    entry[1] = rank
            if terms is not None:
                terms.setdefault(key, []).append(c)
    if terms is not None:
        for key, cs in terms.items():
            acc[key][0] = math.fsum(cs)
    for entry in acc.values():
        entry[0] = (base + entry[0]) / total_w
    inv_sqrt2 = 1.0 / math.sqrt(2.0)
    erfc = math.erfc
    return [(key, 0.5 * erfc(-f * inv_sqrt2)) for key, f in _sorted(acc)]
