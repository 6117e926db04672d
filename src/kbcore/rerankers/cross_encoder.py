"""A local cross-encoder: sentence-transformers' ``CrossEncoder`` (``pip install 'kbcore[st]'``).

sentence-transformers (and torch) are imported when a :class:`CrossEncoderReranker` is built,
never when :mod:`kbcore.rerankers` is imported.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError
from .base import BaseReranker, positive_int

__all__ = ["CrossEncoderReranker", "DEFAULT_CROSS_ENCODER"]

#: A small English cross-encoder trained on MS MARCO (22M parameters).
DEFAULT_CROSS_ENCODER = "cross-encoder/ms-marco-MiniLM-L-6-v2"


class CrossEncoderReranker(BaseReranker):
    """Scores (query, text) pairs with a sentence-transformers ``CrossEncoder``.

    ``model``: a model name (loading by name may download it unless it is cached), a local
    path, or an already loaded ``CrossEncoder``. ``device``, ``max_length``: passed to
    ``CrossEncoder``. ``batch_size``: pairs per forward pass.

    The scores are the model's raw logits (the activation is forced to the identity, whatever
    the model's configuration says), so a hit's ``score`` is their sigmoid
    (``score_scale = "logit"``). A model with more than one output label is refused.
    ImportError naming ``pip install 'kbcore[st]'`` when sentence-transformers is missing.
    """

    score_scale = "logit"

    def __init__(
        self,
        model: Any = DEFAULT_CROSS_ENCODER,
        *,
        device: str | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
    ) -> None:
        self.batch_size = positive_int("batch_size", batch_size)
        self.max_length = None if max_length is None else positive_int("max_length", max_length)
        if isinstance(model, str):
            if not model.strip():
                raise InvalidArgumentError("model must be a model name or path, got an empty string")
            try:
                from sentence_transformers import CrossEncoder
            except ImportError:
                raise ImportError(
                    "CrossEncoderReranker needs sentence-transformers: pip install 'kbcore[st]'"
                ) from None
            self.model_name = model
            options: dict[str, Any] = {"device": device}
            if self.max_length is not None:
                options["max_length"] = self.max_length
            self._model = CrossEncoder(model, **options)
            self.rebuildable = True
        else:
            if not callable(getattr(model, "predict", None)):
                raise InvalidArgumentError(
                    f"model must be a model name, a path or a CrossEncoder, got {type(model).__name__}"
                )
            self._model = model
            given = getattr(model, "model_name_or_path", None) or getattr(
                getattr(model, "config", None), "_name_or_path", None
            )
            self.model_name = str(given or type(model).__name__)
            #: Whether :meth:`from_spec` can load the model again by its name.
            self.rebuildable = isinstance(given, str) and bool(given)
        labels = getattr(getattr(self._model, "config", None), "num_labels", 1)
        if labels != 1:
            raise InvalidArgumentError(
                f"cross-encoder {self.model_name!r} has {labels} output labels; a reranker needs one relevance logit"
            )
        self._identity = _identity_option(self._model)
        self.name = f"cross-encoder {self.model_name}"

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> CrossEncoderReranker:
        """Loads the model named by :meth:`spec`."""
        model = spec.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidArgumentError(f"a cross-encoder reranker spec needs 'model' (a name or path): {spec}")
        options = {k: spec[k] for k in ("batch_size", "max_length") if spec.get(k) is not None}
        return cls(model, **options)

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "cross-encoder", "model": self.model_name, "batch_size": self.batch_size}
        if self.max_length is not None:
            out["max_length"] = self.max_length
        if not self.rebuildable:
            return {"kind": "custom", "name": self.name}
        return out

    def __repr__(self) -> str:
        return f"CrossEncoderReranker({self.model_name!r})"

    def _score(self, query: str, texts: list[str]) -> np.ndarray:
        out = self._model.predict(
            [(query, t) for t in texts],
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
            **self._identity,
        )
        return np.asarray(out, dtype=np.float64).reshape(len(texts), -1)[:, 0] if len(texts) else out


def _identity(logits: Any) -> Any:
    """The activation that leaves the model's logits as they are."""
    return logits


def _identity_option(model: Any) -> dict[str, Any]:
    """The ``predict`` keyword that returns raw logits: ``activation_fn`` (sentence-transformers
    4+) or ``activation_fct`` (2-3), either a callable on the logits tensor; none when
    ``predict`` takes neither (then the model's own activation applies)."""
    try:
        params = inspect.signature(model.predict).parameters
    except (TypeError, ValueError):
        return {}
    for name in ("activation_fn", "activation_fct"):
        if name in params:
            return {name: _identity}
    return {}
