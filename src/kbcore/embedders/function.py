"""Any function ``texts -> array`` as an embedder (:class:`CallableEmbedder`; never rebuilt from a spec)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidTypeError
from .base import check_embeddings

__all__ = ["CallableEmbedder"]


class CallableEmbedder:
    """Wraps a function ``texts -> array [len(texts), dim]``; ``dim`` is probed if not given."""

    def __init__(
        self, fn: Callable[[list[str]], Any], *, dim: int | None = None, name: str | None = None, batch_size: int = 256
    ) -> None:
        if not callable(fn):
            raise InvalidTypeError(f"expected a callable, got {type(fn).__name__}")
        self._fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self.batch_size = int(batch_size)
        if dim is None:
            dim = check_embeddings(fn(["dimension probe"]), 1, None, self.name).shape[1]
        self.dim = int(dim)

    def spec(self) -> dict[str, Any]:
        return {"kind": "custom", "name": self.name, "dim": self.dim}

    def __repr__(self) -> str:
        return f"CallableEmbedder({self.name!r}, dim={self.dim})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        return check_embeddings(self._fn(texts), len(texts), self.dim, self.name)
