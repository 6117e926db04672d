"""A sentence-transformers model as an embedder (``pip install 'kbcore[st]'``, imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import check_embeddings, spec_field

__all__ = ["SentenceTransformerEmbedder"]


class SentenceTransformerEmbedder:
    """A sentence-transformers model (``pip install 'kbcore[st]'``).

    ``model`` is a model name or a local path (loading by name may need network access unless
    the model is cached), or an already loaded ``SentenceTransformer``. Vectors are
    L2-normalised when ``normalize`` (use metric ``cosine`` or ``ip``).
    """

    def __init__(
        self,
        model: Any = "sentence-transformers/all-MiniLM-L6-v2",
        *,
        device: str | None = None,
        batch_size: int = 64,
        normalize: bool = True,
    ) -> None:
        if isinstance(model, str):
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise ImportError(
                    "SentenceTransformerEmbedder needs sentence-transformers: pip install 'kbcore[st]'"
                ) from None
            self.model_name = model
            self._model = SentenceTransformer(model, device=device)
            self.rebuildable = True
        else:
            self._model = model
            given = getattr(model, "model_name_or_path", None)
            self.model_name = str(given or type(model).__name__)
            #: Whether :func:`embedder_from_spec` can load the model again by its name.
            self.rebuildable = isinstance(given, str) and bool(given)
        get_dim = getattr(self._model, "get_sentence_embedding_dimension", None)
        dim = get_dim() if get_dim is not None else None
        if dim is None:
            dim = int(np.asarray(self._model.encode(["dimension probe"])).shape[-1])
        self.dim = int(dim)
        self.batch_size = int(batch_size)
        self.normalize = bool(normalize)
        self.name = f"sentence-transformers:{self.model_name}"

    def spec(self) -> dict[str, Any]:
        return {"kind": "sentence-transformers", "model": self.model_name, "dim": self.dim, "normalize": self.normalize}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> SentenceTransformerEmbedder:
        """The model :meth:`spec` names, loaded again."""
        return cls(
            spec_field(spec, "model", "sentence-transformers"),
            normalize=bool(spec.get("normalize", True)),
            batch_size=int(spec.get("batch_size") or 64),
        )

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.model_name!r}, dim={self.dim})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )
        return check_embeddings(out, len(texts), self.dim, repr(self))
