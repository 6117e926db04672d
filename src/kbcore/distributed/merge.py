"""Exact merges of the shards' answers (pure functions of what the shards returned).

Every shard answers with its own top k (its best k rows, groups or BM25 scores, computed with
corpus-wide statistics where they matter), so the top k of their union is the top k of one
index over all rows. Ties are broken by id so that a page never depends on which shard
answered first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..index import Group

__all__ = ["merge_top_k", "merge_groups", "merge_text", "subset_rows"]


def merge_top_k(parts: Sequence[tuple[np.ndarray, np.ndarray]], k: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (ids, distances) per query row of the shards' [rows, k] answers, ascending,
    padded with -1 / +inf when fewer than k rows exist in all."""
    if parts:
        ids = np.concatenate([p[0] for p in parts], axis=1)
        dist = np.concatenate([p[1] for p in parts], axis=1)
    else:
        ids = np.full((rows, 0), -1, np.int64)
        dist = np.full((rows, 0), np.inf, np.float32)
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        dist = np.pad(dist, ((0, 0), (0, pad)), constant_values=np.inf)
    if ids.shape[0] == 1:  # one query (a RAG request): plain indexing, no take_along_axis
        order = np.lexsort((ids[0], dist[0]))[:k]
        return ids[0, order][None], dist[0, order][None]
    order = np.lexsort((ids, dist), axis=1)[:, :k]
    return np.take_along_axis(ids, order, 1), np.take_along_axis(dist, order, 1)


def merge_groups(
    parts: Sequence[Sequence[list[Group]]], k: int, group_size: int, rows: int, across_shards: bool
) -> list[list[Group]]:
    """The k best groups per query row. ``across_shards``: the grouping field is not the
    shard key, so one key may come from several shards and its groups are merged first."""
    pages: list[list[Group]] = []
    for q in range(rows):
        groups = [g for part in parts for g in part[q]]
        if across_shards:
            groups = _merge_same_key(groups, group_size)
        groups.sort(key=lambda g: (g.distance, g.ids[0]))
        pages.append(groups[:k])
    return pages


def merge_text(parts: Sequence[tuple[np.ndarray, np.ndarray]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (ids, BM25 scores) of the shards' answers, descending by score."""
    ids = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
    scores = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.float32)
    order = np.lexsort((ids, -scores))[:k]
    return ids[order], scores[order]


def subset_rows(metadata: Any, idx: np.ndarray) -> Any:
    """Rows ``idx`` of per-row metadata given as a list of dicts or an Arrow table (None stays None)."""
    if metadata is None:
        return None
    if type(metadata).__module__.split(".")[0] == "pyarrow":
        return metadata.take(idx)
    return [metadata[i] for i in idx.tolist()]


def _merge_same_key(groups: list[Group], group_size: int) -> list[Group]:
    """Merges groups of one key found on several shards (grouping by a non-shard key)."""
    by_key: dict[Any, list[Group]] = {}
    for g in groups:
        by_key.setdefault((type(g.key), g.key), []).append(g)
    out = []
    for same in by_key.values():
        if len(same) == 1:
            out.append(same[0])
            continue
        hits = sorted((d, i) for g in same for i, d in zip(g.ids, g.distances))[:group_size]
        same.sort(key=lambda g: g.distance)
        out.append(
            Group(
                same[0].key,
                tuple(i for _, i in hits),
                tuple(d for d, _ in hits),
                tuple(dict.fromkeys(i for g in same for i in g.part_ids)),
            )
        )
    return out
