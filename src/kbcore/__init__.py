"""kbcore: a performance-first retrieval core for knowledge bases.

The native index (HNSW and exact) lives in :class:`kbcore.Index`.
"""

from __future__ import annotations

import os as _os
import warnings as _warnings

from . import errors
from ._core import available_simd_levels, set_simd_level, simd_level, tokenize
from .index import Group, Index, IndexSpec

__all__ = [
    "Index",
    "IndexSpec",
    "Group",
    "errors",
    "simd_level",
    "available_simd_levels",
    "set_simd_level",
    "tokenize",
    "__version__",
    "Engine",
    "KnowledgeBase",
    "Hit",
    "HashingEmbedder",
]

__version__ = "0.1.0"

_LAZY = {
    "Engine": "engine",
    "KnowledgeBase": "engine",
    "Hit": "engine",
    "HashingEmbedder": "embedders",
}


def __getattr__(name: str):  # the engine imports pyarrow: load it on first use only
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kbcore' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def _apply_simd_env() -> None:
    wanted = _os.environ.get("KBCORE_SIMD", "").strip().lower()
    if not wanted:
        return
    try:
        set_simd_level(wanted)
    except ValueError as exc:
        _warnings.warn(
            f"KBCORE_SIMD={wanted!r} ignored: {exc}; using {simd_level()!r}",
            RuntimeWarning,
            stacklevel=2,
        )


_apply_simd_env()
