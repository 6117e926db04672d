"""What a reranker is: the protocol, the score check, batching and the [0, 1] mapping.

A reranker scores how relevant each of a list of texts is to one query (a cross-encoder looks
at the query and the text together, which a vector search cannot). The engine's first stage
fetches ``rerank_depth`` candidates and the reranker orders them (docs/rerankers.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError, RerankerError

__all__ = [
    "Reranker",
    "BaseReranker",
    "SCORE_SCALES",
    "check_scores",
    "check_rerank_input",
    "to_unit_scores",
    "unit_score",
    "positive_int",
]

#: How a reranker's scores become a hit's ``score`` in [0, 1]: ``"probability"`` (already a
#: relevance in [0, 1], e.g. a ``/rerank`` API's ``relevance_score``: clipped to [0, 1]) or
#: ``"logit"`` (a raw cross-encoder output: the logistic sigmoid ``1 / (1 + exp(-x))``).
SCORE_SCALES = ("probability", "logit")
_F64 = np.dtype(np.float64)


@runtime_checkable
class Reranker(Protocol):
    """What kbcore needs from a reranker.

    ``rerank(query, texts)`` returns one finite float per text, higher = more relevant (the
    order of the texts is the first stage's; the scores need not be sorted). ``name`` names it
    in messages; ``spec()`` is a JSON-able dict from which :func:`kbcore.rerankers.reranker_from_spec`
    rebuilds it (never a secret). Optional attributes: ``score_scale`` (one of
    :data:`SCORE_SCALES`; ``"probability"`` when absent) and ``batch_size``.
    """

    name: str

    def rerank(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """Relevance of each text to ``query`` (float [len(texts)], higher is better)."""
        ...

    def spec(self) -> dict[str, Any]:
        """A JSON-able description with a ``kind`` (no secret)."""
        ...


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int >= 1, else InvalidArgumentError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_score_scale(value: Any) -> str:
    if value not in SCORE_SCALES:
        raise InvalidArgumentError(f"score_scale must be one of {', '.join(map(repr, SCORE_SCALES))}, got {value!r}")
    return str(value)


def check_rerank_input(query: Any, texts: Any) -> list[str]:
    """The texts as a list of str; InvalidTypeError for a query or a text that is not a str."""
    if not isinstance(query, str):
        raise InvalidTypeError(f"a rerank query is a str, got {type(query).__name__}")
    if isinstance(texts, str):
        raise InvalidTypeError("rerank expects a sequence of texts, got one str; wrap it in a list")
    out = list(texts)
    for t in out:
        if not isinstance(t, str):
            raise InvalidTypeError(f"texts to rerank must be str, got {type(t).__name__}")
    return out


def check_scores(out: Any, n: int, who: Any, endpoint: str | None = None) -> np.ndarray:
    """A reranker's answer as float64 [n], finite; RerankerError naming ``who`` (a name, or a
    reranker whose ``name`` and ``endpoint`` are used) otherwise: the caller's arguments were
    fine, the reranker failed."""
    # The common case, cheaply: a sum is finite only if every term is (NaN and inf propagate);
    # a sum that overflows takes the exact path below.
    if type(out) is np.ndarray and out.dtype is _F64 and out.shape == (n,) and math.isfinite(np.add.reduce(out)):
        return out
    if not isinstance(who, str):
        if endpoint is None:
            endpoint = getattr(who, "endpoint", None)
        who = f"reranker {getattr(who, 'name', None) or type(who).__name__}"
    try:
        arr = np.asarray(out)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is the reranker's fault
        raise RerankerError(
            f"{who} returned something that is not an array of scores: {exc}", endpoint=endpoint
        ) from None
    if arr.dtype == object or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        raise RerankerError(f"{who} must return numbers, got dtype {arr.dtype}", endpoint=endpoint)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1 or arr.shape[0] != n:
        raise RerankerError(f"{who} returned {list(arr.shape)} scores for {n} texts", endpoint=endpoint)
    arr = arr.astype(np.float64, copy=False)
    if not np.isfinite(arr).all():
        bad = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise RerankerError(f"{who} returned a NaN or infinite score (text {bad})", endpoint=endpoint)
    return arr


def to_unit_scores(scores: np.ndarray, scale: str) -> np.ndarray:
    """Scores in [0, 1] (float64) by :data:`SCORE_SCALES`' rule; order-preserving."""
    if scale == "logit":
        # 1 / (1 + exp(-x)) without overflow for large |x|.
        out = np.empty_like(scores)
        pos = scores >= 0
        out[pos] = 1.0 / (1.0 + np.exp(-scores[pos]))
        e = np.exp(scores[~pos])
        out[~pos] = e / (1.0 + e)
        return out
    return np.clip(scores, 0.0, 1.0)


def unit_score(score: float, scale: str) -> float:
    """One score in [0, 1] by :data:`SCORE_SCALES`' rule (:func:`to_unit_scores` for a float)."""
    if scale == "logit":
        if score >= 0.0:
            return 1.0 / (1.0 + math.exp(-score))
        e = math.exp(score)
        return e / (1.0 + e)
    return 0.0 if score < 0.0 else 1.0 if score > 1.0 else score


class BaseReranker:
    """Batching and checks for the rerankers of this package: subclasses implement
    ``_score(query, texts)`` for one batch of at most ``batch_size`` texts."""

    name: str = "reranker"
    score_scale: str = "probability"
    batch_size: int = 64
    #: The endpoint named in errors (HTTP rerankers).
    endpoint: str | None = None

    def _score(self, query: str, texts: list[str]) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def rerank(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """float64 [len(texts)] relevance scores, higher is better, in ``batch_size`` batches.

        InvalidTypeError for a query or texts that are not str; RerankerError (or
        RerankerUnavailableError) when the reranker fails or answers something invalid.
        """
        items = check_rerank_input(query, texts)
        if not items:
            return np.empty(0, dtype=np.float64)
        bs = self.batch_size
        parts = [
            check_scores(self._score(query, items[s : s + bs]), len(items[s : s + bs]), self.name, self.endpoint)
            for s in range(0, len(items), bs)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
