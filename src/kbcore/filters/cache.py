"""The filter cache: compiled ``where`` filters (IR and native ``Filter``) keyed on a hashable
image of the where, shared by :func:`compile_where` and :func:`native_filter`. The key of
the common one-condition shapes is built in C (``_core.quick_key``), which also does the
lookup on the hot path (``_core.cached_filter``); both sides use that one key builder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _core
from ..errors import InvalidArgumentError
from .where import Node, _compile_node, _FilterError, _format_path

# Keyed on a hashable image of the where that keeps scalar types apart (1, 1.0 and
#    True are equal and hash alike in Python, but compile to different IR values). An entry
#    holds the IR and the native Filter built from it (converted and validated once), so that
#    a repeated where costs one dict lookup before the native evaluation.


class _Unhashable(Exception):  # noqa: N818 -- a control-flow signal (fall back to no caching), not an error
    pass


def _freeze(v: Any) -> Any:
    t = type(v)
    if t is str:
        return v
    if t is int or t is float or t is bool:
        return (t, v)
    if t is dict:
        return (dict, tuple([(k, _freeze(x)) for k, x in v.items()]))
    if t is list or t is tuple:
        return (list, tuple([_freeze(x) for x in v]))
    raise _Unhashable


# The key of the one-condition shapes {f: {op: v}} and {f: v} with a plain str / int / float /
# bool v, built in C without recursion: (f, op, type(v), v) or (f, type(v), v); None for any
# other where (then _freeze decides). It starts with a str, so it never equals a _freeze key
# (those start with "dict"). The C lookup of native_filter builds the same key.
_quick_key = _core.quick_key


_CACHE_SIZE = 1024
_cache: dict[Any, tuple[Node, Any]] = {}  # key -> (IR, native Filter)
_cached_filter = _core.cached_filter


def _compiled(where: Any) -> tuple[Node, Any]:
    """(IR, native Filter) of a non-None where, from the cache when possible; raises
    InvalidArgumentError naming the place of the error."""
    try:
        key = _quick_key(where)
        if key is None:
            key = _freeze(where)
        hit = _cache.get(key)
        if hit is not None:
            return hit
        node = _compile_node(where)  # raises before anything is cached
    except _Unhashable:  # numpy scalars, Mapping subclasses ...: compile without caching
        node = _compile_where_uncached(where)
        return node, _native(node, where)
    except _FilterError as err:
        raise _invalid(err) from None
    except RecursionError:
        raise InvalidArgumentError("where: the filter is nested too deeply") from None
    hit = (node, _native(node, where))
    if len(_cache) >= _CACHE_SIZE:
        try:  # evict the oldest entry (dicts keep insertion order)
            del _cache[next(iter(_cache))]
        except (KeyError, RuntimeError, StopIteration):  # another thread got there first
            pass
    _cache[key] = hit
    return hit


def _native(node: Node, where: Any) -> Any:
    """``_core.Filter(node)``; a string that is not valid Unicode (a lone surrogate, which
    the binding cannot convert to UTF-8) is an InvalidArgumentError naming its place. The
    check runs only when the native conversion fails, so a good filter costs nothing more."""
    try:
        return _core.Filter(node)
    except RuntimeError:
        segments = _surrogate_at(where)
        if segments is None:
            raise
        err = _FilterError("a string contains a lone surrogate, which is not valid Unicode")
        err.segments = segments
        text = str(_invalid(err)).encode("utf-8", "backslashreplace").decode("utf-8")
        raise InvalidArgumentError(text) from None


def _surrogate_at(v: Any) -> list[object] | None:
    """Path segments (innermost first) of the first str in ``v`` that is not UTF-8."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return []
        return None
    if isinstance(v, Mapping):
        items: Any = v.items()
    elif isinstance(v, (list, tuple)):
        items = enumerate(v)
    else:
        return None
    for k, x in items:
        for part in (k, x):
            found = _surrogate_at(part)
            if found is not None:
                return found + [k]
    return None


def _invalid(err: _FilterError) -> InvalidArgumentError:
    return InvalidArgumentError(f"{_format_path('where', err.segments)}: {err.message}")


def _compile_where_uncached(where: Any) -> Node:
    try:
        return _compile_node(where)
    except _FilterError as err:
        raise _invalid(err) from None
    except RecursionError:
        raise InvalidArgumentError("where: the filter is nested too deeply") from None


def compile_where(where: Mapping[str, Any] | None) -> Node | None:
    """Validates a ``where`` filter and compiles it to the IR; ``None`` means no filter.

    See ``docs/filter-ir.md``. Raises :class:`~kbcore.errors.InvalidArgumentError` (a
    ``ValueError``) whose message names the place inside the filter, e.g.
    ``where["$and"][1]["year"]: $gt expects a number, got str``.
    The result is canonical (see the module docstring); results for filters made of plain
    dicts, lists and scalars are cached (the IR is immutable, so sharing it is safe).
    """
    if where is None:
        return None
    return _compiled(where)[0]


def native_filter(where: Mapping[str, Any] | _core.Filter | None) -> Any:
    """The compiled ``where`` as the native ``Filter`` the index evaluates (``None`` for None).

    Validates exactly as :func:`compile_where` (same errors) and shares its cache; a cache hit
    of a one-condition where is one native call (``_core.cached_filter`` builds the
    ``_quick_key`` key and looks it up). A native ``Filter`` is returned as it is, so that
    :class:`~kbcore.Index` searches accept a filter compiled once for several calls.
    """
    if where is None:
        return None
    hit = _cached_filter(_cache, where)
    if hit is not None:
        return hit
    if type(where) is _core.Filter:  # compiled already (after the lookup: free for a dict)
        return where
    return _compiled(where)[1]
