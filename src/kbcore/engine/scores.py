"""Distance -> score in [0, 1]."""

from __future__ import annotations

import numpy as np


def score_from_distance(distance: np.ndarray | float, metric: str) -> np.ndarray | float:
    """Maps a distance (smaller is closer) to a score in [0, 1] (larger is better)."""
    if metric == "l2":
        return 1.0 / (1.0 + np.maximum(distance, 0.0))
    return np.clip(1.0 - np.asarray(distance, dtype=np.float64) / 2.0, 0.0, 1.0)


def _scores(dist: np.ndarray, metric: str) -> list[float]:
    """Scores of a distance array, as Python floats."""
    if metric == "l2":
        return (1.0 / (1.0 + np.maximum(dist.astype(np.float64), 0.0))).tolist()
    return np.clip(1.0 - dist.astype(np.float64) / 2.0, 0.0, 1.0).tolist()


def _score(d: float, metric: str) -> float:
    if metric == "l2":
        return 1.0 / (1.0 + max(d, 0.0))
    s = 1.0 - d / 2.0
    return 0.0 if s < 0.0 else 1.0 if s > 1.0 else s
