"""What every embedder shares: the :class:`Embedder` protocol, the check of an embedder's
output (:func:`check_embeddings`) and of a spec's required fields (:func:`spec_field`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["Embedder", "check_embeddings", "spec_field"]


@runtime_checkable
class Embedder(Protocol):
    """What kbcore needs from an embedder."""

    #: The dimension of the vectors.
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim] vectors of ``texts`` (one batch)."""
        ...


def check_embeddings(out: Any, n: int, dim: int | None, who: str) -> np.ndarray:
    """Validates an embedder's output: a finite float array of shape [n, dim]."""
    try:
        arr = np.asarray(out)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is the embedder's fault
        raise InvalidTypeError(f"{who} returned something that is not an array: {exc}") from None
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_:
        raise InvalidTypeError(f"{who} must return a float array, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[0] != n or (dim is not None and arr.shape[1] != dim):
        want = f"[{n}, {dim}]" if dim is not None else f"[{n}, dim]"
        raise InvalidArgumentError(f"{who} returned shape {list(arr.shape)}, expected {want}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise InvalidArgumentError(f"{who} returned NaN or infinite values")
    return arr


def spec_field(spec: dict[str, Any], key: str, kind: str) -> Any:
    """``spec[key]``; InvalidArgumentError naming the kind when it is absent or empty."""
    if key not in spec or spec[key] in (None, ""):
        raise InvalidArgumentError(f"embedder spec of kind {kind!r} lacks {key!r}: {spec}")
    return spec[key]
