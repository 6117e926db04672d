"""Retrieval helpers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .types import _GROUP

if TYPE_CHECKING:
    from .knowledge_base import KnowledgeBase


def _search_groups(kb: KnowledgeBase, q: np.ndarray, k: int, where: Any, ef: int | None) -> list[tuple[int, float, Sequence[int]]]:
    """(best id, its distance, part ids) of the k nearest groups: native ``search_groups``."""
    groups = kb._index.search_groups(q, k, group_by=_GROUP, group_size=1, where=where, ef=ef,
                                     threads=1)
    return [(int(g.ids[0]), float(g.distances[0]), g.part_ids) for g in groups]
