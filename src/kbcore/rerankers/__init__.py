"""Rerankers: score a query's candidates with a model that reads the query and each text.

A reranker is anything with ``rerank(query, texts) -> scores`` (:class:`Reranker`); any
function ``(query, texts) -> scores`` works too (:class:`CallableReranker`). These come with
kbcore, one module per kind, behind a small registry of kinds:

- ``"http"`` — :class:`HttpReranker` (:mod:`.http`): the ``/rerank`` APIs of Cohere (v1, v2),
  Jina, Voyage, vLLM, Xinference and Hugging Face text-embeddings-inference;
- ``"cross-encoder"`` — :class:`CrossEncoderReranker` (:mod:`.cross_encoder`): a local
  sentence-transformers ``CrossEncoder`` (``pip install 'kbcore[st]'``).

:func:`reranker_spec` describes a reranker as a JSON-able dict (never a secret) that a
knowledge base records in its manifest; :func:`reranker_from_spec` rebuilds it through the
registry (:func:`register_reranker` adds a kind). See docs/rerankers.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError
from .base import SCORE_SCALES, BaseReranker, Reranker, check_scores, to_unit_scores, unit_score
from .cross_encoder import DEFAULT_CROSS_ENCODER, CrossEncoderReranker
from .function import CallableReranker
from .http import API_FORMATS, HttpReranker

__all__ = [
    "Reranker",
    "BaseReranker",
    "HttpReranker",
    "CrossEncoderReranker",
    "CallableReranker",
    "API_FORMATS",
    "SCORE_SCALES",
    "RERANKER_KINDS",
    "as_reranker",
    "check_scores",
    "register_reranker",
    "reranker_from_spec",
    "reranker_spec",
    "score_scale",
    "to_unit_scores",
    "unit_score",
]

_REGISTRY: dict[str, Callable[[dict[str, Any]], Any]] = {}


def register_reranker(kind: str, from_spec: Callable[[dict[str, Any]], Any]) -> None:
    """Makes :func:`reranker_from_spec` build ``from_spec(spec)`` for specs of ``kind``."""
    if not isinstance(kind, str) or not kind or kind in ("custom", "none"):
        raise InvalidArgumentError(f"a reranker kind is a non-empty name other than 'custom' / 'none', got {kind!r}")
    if not callable(from_spec):
        raise InvalidTypeError(f"from_spec must be callable, got {type(from_spec).__name__}")
    _REGISTRY[kind] = from_spec


register_reranker("http", HttpReranker.from_spec)
register_reranker("cross-encoder", CrossEncoderReranker.from_spec)

#: The kinds kbcore rebuilds out of the box.
RERANKER_KINDS = tuple(_REGISTRY)


def reranker_from_spec(spec: dict[str, Any] | None) -> Any | None:
    """The reranker a spec describes (None for None or kind ``"none"``).

    No request is sent and no key read (``http``); ``cross-encoder`` loads its model.
    InvalidArgumentError for an unknown kind (naming it and the known ones), a ``custom`` one
    (which cannot be rebuilt: pass the reranker again) or a spec lacking a field;
    InvalidTypeError when ``spec`` is not a dict.
    """
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise InvalidTypeError(f"a reranker spec is a dict, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind == "none":
        return None
    if kind == "custom":
        raise InvalidArgumentError(
            f"the reranker {spec.get('name', '?')!r} is a custom one that cannot be rebuilt from its "
            "spec; pass it again (retrieve(rerank=...) or KnowledgeBase.set_reranker)"
        )
    factory = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if factory is None:
        raise InvalidArgumentError(
            f"unknown reranker kind {kind!r}; known kinds: {', '.join(sorted(_REGISTRY))} "
            "(or register one with kbcore.rerankers.register_reranker)"
        )
    try:
        return factory(spec)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, (InvalidArgumentError, InvalidTypeError)):
            raise
        raise InvalidArgumentError(f"invalid reranker spec {spec}: {exc}") from None


def as_reranker(obj: Any) -> Any:
    """A reranker from a reranker, a function ``(query, texts) -> scores``, a spec dict, a spec
    as JSON text, or a kind name (``"cross-encoder"``: the default model; ``"http"`` needs a
    spec with its model and URL). InvalidArgumentError / InvalidTypeError otherwise."""
    if isinstance(obj, str):
        text = obj.strip()
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except ValueError as exc:
                raise InvalidArgumentError(f"reranker spec is not valid JSON: {exc}") from None
            return reranker_from_spec(spec)
        if text == "cross-encoder":
            return CrossEncoderReranker(DEFAULT_CROSS_ENCODER)
        if text == "http":
            raise InvalidArgumentError(
                'the http reranker needs its model and URL: give a JSON spec, e.g. {"kind": "http", '
                '"api_format": "cohere", "model": "rerank-v3.5", "base_url": "https://api.cohere.com/v2"}'
            )
        return reranker_from_spec({"kind": text})
    if isinstance(obj, dict):
        return reranker_from_spec(obj)
    if callable(getattr(obj, "rerank", None)):
        return obj
    if callable(obj):
        return CallableReranker(obj)
    raise InvalidTypeError(
        f"expected a reranker (with .rerank(query, texts)), a function (query, texts) -> scores, "
        f"a spec or a kind name, got {type(obj).__name__}"
    )


def _json_safe(spec: Any) -> dict[str, Any] | None:
    if not isinstance(spec, dict):
        return None
    try:
        out = json.loads(json.dumps(spec, allow_nan=False))
    except (TypeError, ValueError):
        return None
    return out if isinstance(out.get("kind"), str) and out["kind"] else None


def reranker_spec(reranker: Any) -> dict[str, Any]:
    """The manifest record of a reranker: its ``spec()`` when that is a JSON-able dict with a
    ``kind``, else ``{"kind": "custom", "name": ...}`` (cannot be rebuilt)."""
    get = getattr(reranker, "spec", None)
    if callable(get):
        try:
            spec = _json_safe(get())
        except Exception:  # noqa: BLE001 - a user's spec() that fails is treated as absent
            spec = None
        if spec is not None:
            return spec
    name = getattr(reranker, "name", None)
    return {"kind": "custom", "name": name if isinstance(name, str) else type(reranker).__name__}


def score_scale(reranker: Any) -> str:
    """How ``reranker``'s scores map to [0, 1]: its ``score_scale`` (``"probability"`` if absent)."""
    scale = getattr(reranker, "score_scale", "probability")
    if scale not in SCORE_SCALES:
        raise InvalidArgumentError(
            f"reranker {getattr(reranker, 'name', reranker)!r} has score_scale {scale!r}; "
            f"expected one of {SCORE_SCALES}"
        )
    return scale
