"""Distance -> score: the one mapping of the index's distances (smaller is closer) to scores in
[0, 1] (larger is better).

- ``cosine``: ``1 - distance / 2`` (= ``(1 + cos) / 2``);
- ``ip``: ``1 - distance / 2`` clipped to [0, 1] (= ``(1 + dot) / 2``, exact for unit vectors);
- ``l2``: ``1 / (1 + distance)`` (distance is the squared Euclidean distance, clamped at 0).

Full-text and hybrid scores are not distances; see :mod:`kbcore.engine.retrieval`.
"""

from __future__ import annotations

import numpy as np


def score_from_distance(distance: np.ndarray | float, metric: str) -> np.ndarray | float:
    """The score of a distance: a float for a Python float (no numpy on the per-hit path), an
    array of float64 for an array. The two branches are the same formula (tested)."""
    if type(distance) is float:
        if metric == "l2":
            return 1.0 / (1.0 + (distance if distance > 0.0 else 0.0))
        s = 1.0 - distance / 2.0
        return 0.0 if s < 0.0 else 1.0 if s > 1.0 else s
    d = np.asarray(distance, dtype=np.float64)
    if metric == "l2":
        return 1.0 / (1.0 + np.maximum(d, 0.0))
    return np.clip(1.0 - d / 2.0, 0.0, 1.0)
