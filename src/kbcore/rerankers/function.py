"""A reranker from any function ``(query, texts) -> scores``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidTypeError
from .base import BaseReranker, check_score_scale, positive_int

__all__ = ["CallableReranker"]


class CallableReranker(BaseReranker):
    """Wraps ``fn(query, texts) -> scores`` (one float per text, higher is better).

    ``score_scale`` says how the scores become a hit's ``score`` in [0, 1]: ``"probability"``
    (clipped; the default) or ``"logit"`` (sigmoid). ``batch_size`` texts at most per call
    (default: all at once). Its spec is ``{"kind": "custom", "name": ...}``: a knowledge base
    records it, but cannot rebuild it when reopened (pass it again).
    """

    def __init__(
        self,
        fn: Callable[[str, list[str]], Any],
        *,
        name: str | None = None,
        score_scale: str = "probability",
        batch_size: int = 1 << 30,
    ) -> None:
        if not callable(fn):
            raise InvalidTypeError(f"expected a callable (query, texts) -> scores, got {type(fn).__name__}")
        self._fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self.score_scale = check_score_scale(score_scale)
        self.batch_size = positive_int("batch_size", batch_size)

    def _score(self, query: str, texts: list[str]) -> Any:
        return self._fn(query, texts)

    def spec(self) -> dict[str, Any]:
        return {"kind": "custom", "name": self.name}

    def __repr__(self) -> str:
        return f"CallableReranker({self.name!r})"

    def __call__(self, query: str, texts: Sequence[str]) -> Any:
        return self.rerank(query, texts)
