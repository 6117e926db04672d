"""The ``where`` filter language: validation and compilation to the IR the native core evaluates.

See ``docs/filter-ir.md`` for the grammar, the semantics and the IR. In short,
:func:`compile_where` turns a Chroma-style ``where`` dict into an immutable tree of tuples::

    ("and", (node, ...)) | ("or", (node, ...)) | ("cmp", field, op, value)

The output is canonical: the keys of every dict are visited in sorted order (dicts are
unordered collections, so two equal dicts compile to the same IR), nested ``and`` in ``and`` and
``or`` in ``or`` are flattened, a single-child ``and`` / ``or`` is replaced by its child, and
duplicate ``$in`` / ``$nin`` items are dropped (first occurrence kept). Lists keep their order.

:func:`dify_condition_to_where` (from :mod:`kbcore.dify.condition`) translates the
``metadata_condition`` of Dify's External Knowledge API into a ``where`` dict; :func:`iso8601_to_epoch` is the date-time parser used by
``$before`` / ``$after`` (the native one, which also reads stored values).

The implementation lives in :mod:`kbcore._filter`: ``where`` (the compiler), ``cache`` (the
compiled-filter cache and :func:`native_filter`) and ``iso`` (ISO-8601, native).
"""

from __future__ import annotations

from ._filter.cache import compile_where, native_filter
from ._filter.iso import iso8601_to_epoch
from ._filter.where import Node

__all__ = ["Node", "compile_where", "dify_condition_to_where", "iso8601_to_epoch", "native_filter"]


# Dify's metadata_condition translator lives in kbcore.dify.condition; re-exported here.
from .dify.condition import dify_condition_to_where
