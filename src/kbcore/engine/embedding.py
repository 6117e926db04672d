"""Which embedder a knowledge base uses: the one its manifest's spec names, found among the
embedders the caller gave (or rebuilt from the spec), and the errors when there is none."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..embedders import SPEC_KINDS, Embedder, check_embeddings, embedder_from_spec, embedder_spec, rebuilds_cheaply
from ..errors import InvalidArgumentError


class KbEmbedder:
    """The embedder of one knowledge base (``current``; None: vectors only, or not rebuildable).

    ``explicit`` is the embedder passed when opening, ``default`` the Engine's.
    """

    def __init__(
        self, kb_name: str, spec: dict[str, Any] | None, explicit: Embedder | None, default: Embedder | None
    ) -> None:
        self._kb_name = kb_name
        self._spec = spec
        self._default = default
        self.current, self._problem = resolve(spec, (explicit, default))

    def attach(self, embedder: Embedder) -> None:
        """Makes ``embedder`` the first candidate and resolves again."""
        self.current, self._problem = resolve(self._spec, (embedder, self._default))

    def switch(self, spec: dict[str, Any], embedder: Embedder) -> None:
        """Makes ``embedder`` (recorded as ``spec``) the knowledge base's embedder (a re-embed)."""
        self._spec = spec
        self.current, self._problem = embedder, None

    def require(self, what: str) -> Embedder:
        """The embedder, else InvalidArgumentError saying why the knowledge base cannot ``what``."""
        if self.current is not None:
            return self.current
        spec = self._spec
        if spec is None or spec.get("kind") == "none":
            raise InvalidArgumentError(
                f"knowledge base {self._kb_name!r} has no embedder, so it cannot {what}: give "
                "query vectors, or create it with an embedder"
            )
        why = f" ({self._problem})" if self._problem else ""
        raise InvalidArgumentError(
            f"knowledge base {self._kb_name!r} was built with embedder {spec}, which cannot be "
            f"rebuilt here{why}, so it cannot {what}: pass embedder= to Engine or get_knowledge_base()"
        )

    def embed_query(self, text: str, what: str, dim: int | None) -> np.ndarray:
        """A query's vector: ``embed_queries`` when the embedder has one (an asymmetric model
        such as e5 embeds queries and passages differently), else ``embed``."""
        embedder = self.require(what)
        fn = getattr(embedder, "embed_queries", None)
        out = fn([text]) if callable(fn) else embedder.embed([text])
        return check_embeddings(out, 1, dim, repr(embedder))[0]


def _known_dim(embedder: Embedder) -> int | None:
    """An embedder's dimension without a probe request (None if an endpoint has not said yet)."""
    known = getattr(embedder, "known_dim", False)
    return known if known is not False else int(embedder.dim)


def resolve(spec: dict[str, Any] | None, candidates: tuple[Embedder | None, ...]) -> tuple[Embedder | None, str | None]:
    """The embedder of a manifest's spec and, when there is none, why: a candidate with the same
    spec, else one rebuilt from the spec when that is cheap (the registry's
    :func:`~kbcore.embedders.rebuilds_cheaply`: hashing, openai, minilm, e5; no key is read, no
    request sent), else a candidate of the same dimension, else a model loaded by name (e.g.
    sentence-transformers) if it loads (None when it does not: text queries then say so)."""
    if spec is None or spec.get("kind") == "none":
        return None, None
    for candidate in candidates:
        if candidate is not None and embedder_spec(candidate) == spec:
            return candidate, None
    problem = None
    if rebuilds_cheaply(spec.get("kind")):
        try:
            return embedder_from_spec(spec), None
        except (ImportError, OSError, ValueError) as exc:  # e.g. kbcore[minilm] not installed here
            problem = str(exc)
    for candidate in candidates:
        if candidate is not None and _known_dim(candidate) == int(spec.get("dim", -1)):
            return candidate, None
    if spec.get("kind") in SPEC_KINDS and not rebuilds_cheaply(spec.get("kind")):  # a model by name: last
        try:
            return embedder_from_spec(spec), None
        except Exception as exc:  # noqa: BLE001 - no model offline: text queries will say so
            problem = f"{type(exc).__name__}: {exc}"
    return None, problem
