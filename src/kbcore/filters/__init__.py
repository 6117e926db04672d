"""The ``where`` filter language: validation and compilation to the IR the native core evaluates.

See ``docs/filter-ir.md`` for the grammar, the semantics and the IR. In short,
:func:`compile_where` turns a Chroma-style ``where`` dict into an immutable tree of tuples::

    ("and", (node, ...)) | ("or", (node, ...)) | ("cmp", field, op, value)

The output is canonical: the keys of every dict are visited in sorted order (dicts are
unordered collections, so two equal dicts compile to the same IR), nested ``and`` in ``and`` and
``or`` in ``or`` are flattened, a single-child ``and`` / ``or`` is replaced by its child, and
duplicate ``$in`` / ``$nin`` items are dropped (first occurrence kept). Lists keep their order.

:func:`kbcore.dify.condition.dify_condition_to_where` translates the ``metadata_condition`` of
Dify's External Knowledge API into a ``where`` dict (``kbcore.filters.dify_condition_to_where``
still resolves, on first use, so that importing this package loads no Dify code);
:func:`iso8601_to_epoch` is the date-time parser used by ``$before`` / ``$after`` (the native
one, which also reads stored values).

The implementation lives in this package's modules: ``where`` (the compiler), ``cache`` (the
compiled-filter cache and :func:`native_filter`) and ``iso`` (ISO-8601, native).
"""

from __future__ import annotations

from typing import Any

from .cache import compile_where, native_filter
from .iso import iso8601_to_epoch
from .where import Node

__all__ = ["Node", "compile_where", "iso8601_to_epoch", "native_filter"]


def __getattr__(name: str) -> Any:
    """The old path of the Dify translator, resolved on first use (kbcore.dify.condition)."""
    if name == "dify_condition_to_where":
        from ..dify.condition import dify_condition_to_where

        return dify_condition_to_where
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
