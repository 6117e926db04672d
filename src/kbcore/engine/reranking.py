"""The rerank step of a retrieve, and which reranker a knowledge base uses by default.

``retrieve(query, top_k, rerank=..., rerank_depth=...)``: the first stage (vector, full text or
hybrid, with filters and dedup, see :mod:`.retrieval`) returns ``max(rerank_depth, top_k)``
hits without a score threshold; the reranker scores their texts against the query; the hits
are ordered by that score (ties keep the first stage's order), then ``score_threshold`` and
``top_k`` apply. A reranked hit's ``score`` is the reranker's relevance mapped to [0, 1]
(:func:`kbcore.rerankers.unit_score`: clipped for a ``/rerank`` API's relevance_score,
the sigmoid of a cross-encoder's logit); its ``distance`` stays the first stage's.

Nothing here takes a lock of the knowledge base: the reranker (often a network call) runs
after the first stage released its read lock.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError, KbcoreError, RerankerError
from ..rerankers import as_reranker, check_scores, reranker_from_spec, reranker_spec, score_scale, unit_score
from .types import Hit

# The first stage's hits are this call's own (no one else holds them): a reranked Hit gets its
# new score in place through the slot's descriptor (a frozen dataclass refuses setattr), far
# cheaper than a copy per hit.
_set_score = Hit.__dict__["score"].__set__

#: ``rerank_depth`` when not given: the first stage's candidates per reranked query. Chosen
#: from benches/bench_rerank.py (docs/rerankers.md): recall@50 is within a few points of
#: recall@100 on SciFact, ArguAna and the CJK sets, at half the reranker's cost.
DEFAULT_RERANK_DEPTH = 50
#: The largest ``rerank_depth`` accepted (every candidate's text goes to the reranker).
MAX_RERANK_DEPTH = 1000


def check_depth(value: Any, top_k: int) -> int:
    """The first stage's size for a reranked retrieve of ``top_k``: ``max(rerank_depth, top_k)``."""
    if value is None:
        value = DEFAULT_RERANK_DEPTH
    elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"rerank_depth must be an integer, got {type(value).__name__}")
    elif not 1 <= value <= MAX_RERANK_DEPTH:
        raise InvalidArgumentError(f"rerank_depth must be in [1, {MAX_RERANK_DEPTH}], got {value}")
    depth = max(int(value), top_k)
    if depth > MAX_RERANK_DEPTH:
        raise InvalidArgumentError(f"a reranked retrieve returns at most {MAX_RERANK_DEPTH} hits, got top_k={top_k}")
    return depth


class KbReranker:
    """The default reranker of one knowledge base: the manifest's spec, rebuilt on first use
    (a cross-encoder loads its model once), or the object attached for this session."""

    def __init__(self, kb_name: str, spec_of: Callable[[], dict[str, Any] | None]) -> None:
        self._kb_name = kb_name
        self._spec_of = spec_of
        self._lock = threading.Lock()
        self._built: tuple[str, Any] | None = None  # (spec as JSON, reranker)
        self._attached: Any = None

    def attach(self, reranker: Any) -> None:
        """Uses ``reranker`` whenever the manifest's spec is its spec (a custom one included)."""
        with self._lock:
            self._attached = reranker
            self._built = None

    def default(self) -> Any:
        """The default reranker. InvalidArgumentError when there is none; RerankerError when
        it cannot be built here (a custom one after a reopen, a cross-encoder without
        sentence-transformers or whose model does not load): the failure is remembered for
        that spec, so every retrieve fails alike and fast."""
        spec = self._spec_of()
        if spec is None:
            raise InvalidArgumentError(
                f"rerank=True, but knowledge base {self._kb_name!r} has no default reranker: pass "
                "rerank=<reranker>, or set one (create_knowledge_base(reranker=...) or set_reranker)"
            )
        key = json.dumps(spec, sort_keys=True)
        with self._lock:
            built = self._built
            if built is not None and built[0] == key:
                obj = built[1]
            elif self._attached is not None and json.dumps(reranker_spec(self._attached), sort_keys=True) == key:
                obj = self._attached
                self._built = (key, obj)
            else:
                try:
                    obj = reranker_from_spec(spec)
                except Exception as exc:  # noqa: BLE001 - any failure to build is the same answer
                    obj = RerankerError(
                        f"knowledge base {self._kb_name!r}'s default reranker ({spec.get('kind')!r}) cannot be "
                        f"built here: {type(exc).__name__}: {exc} (pass rerank=False, or another reranker)"
                    )
                self._built = (key, obj)
        if isinstance(obj, RerankerError):
            raise RerankerError(str(obj))
        return obj

    def choose(self, rerank: Any, query: Any) -> Any:
        """The reranker of one retrieve, or None: ``rerank`` None (the default reranker, for a
        text query), True (the default, required), False (none), or a reranker / function /
        spec. A query that is not text cannot be reranked: explicit asks raise."""
        if rerank is False:
            return None
        if rerank is None:
            if not isinstance(query, str) or self._spec_of() is None:
                return None
            return self.default()
        if not isinstance(query, str):
            raise InvalidArgumentError(
                "rerank needs the query as text (a reranker reads it), got a "
                f"{type(query).__name__}; pass the text as query and the vector as query_vector="
            )
        if rerank is True:
            return self.default()
        if isinstance(rerank, (int, float)) and not isinstance(rerank, bool):
            raise InvalidTypeError(f"rerank must be None, True, False or a reranker, got {rerank!r}")
        return as_reranker(rerank)


def apply(reranker: Any, query: str, hits: list[Hit], top_k: int, threshold: Any) -> list[Hit]:
    """``hits`` (the first stage, best first) reordered by ``reranker``, then ``threshold`` on
    the mapped score and ``top_k``.

    A failure of the reranker raises RerankerError (a function's own exception is wrapped in
    one); the error carries ``first_stage``: the hits the first stage alone would answer
    (``top_k`` of them, ``threshold`` applied to their own scores), for a caller that prefers
    an unreranked answer to none (the Dify server does)."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise InvalidTypeError(f"score_threshold must be a number, got {type(threshold).__name__}")
    if not hits:
        return []
    try:
        scale = score_scale(reranker)
        raw = reranker.rerank(query, [h.content for h in hits])
        scores = check_scores(raw, len(hits), reranker)
    except RerankerError as exc:
        exc.first_stage = _first_stage(hits, top_k, threshold)  # type: ignore[attr-defined]
        raise
    except KbcoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's reranker failed: say so, keep the cause
        err = RerankerError(f"reranker {_name(reranker)} failed: {type(exc).__name__}: {exc}")
        err.first_stage = _first_stage(hits, top_k, threshold)  # type: ignore[attr-defined]
        raise err from exc
    picks, units = _order(scores, scale, top_k, threshold)
    out = [hits[i] for i in picks]
    deque(map(_set_score, out, units), maxlen=0)
    return out


def apply_lazy(
    reranker: Any,
    query: str,
    texts: list[str],
    first_scores: Callable[[], list[float]],
    build: Callable[[list[int]], list[Hit] | None],
    first_stage: Callable[[], list[Hit]],
    top_k: int,
    threshold: Any,
) -> list[Hit] | None:
    """:func:`apply` over a first stage whose hits are not built yet: the reranker reads
    ``texts`` (the candidates' contents, best first), and ``build(positions)`` makes the hits
    of the candidates kept (None: the knowledge base changed since its search, and so does
    this function: search again). The same answer and errors as :func:`apply` on the built
    hits; on a failure, ``first_scores()`` (the candidates' first-stage scores) picks the
    first stage's hits to attach, built by ``build``, else taken from ``first_stage()``."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise InvalidTypeError(f"score_threshold must be a number, got {type(threshold).__name__}")
    if not texts:
        return []
    try:
        scale = score_scale(reranker)
        raw = reranker.rerank(query, texts)
        scores = check_scores(raw, len(texts), reranker)
    except KbcoreError as exc:
        if isinstance(exc, RerankerError):
            exc.first_stage = _lazy_first_stage(first_scores, build, first_stage, top_k, threshold)  # type: ignore[attr-defined]
        raise
    except Exception as exc:  # noqa: BLE001 - a user's reranker failed: say so, keep the cause
        err = RerankerError(f"reranker {_name(reranker)} failed: {type(exc).__name__}: {exc}")
        err.first_stage = _lazy_first_stage(first_scores, build, first_stage, top_k, threshold)  # type: ignore[attr-defined]
        raise err from exc
    picks, units = _order(scores, scale, top_k, threshold)
    out = build(picks)
    if out is None:
        return None
    deque(map(_set_score, out, units), maxlen=0)
    return out


def _order(scores: np.ndarray, scale: str, top_k: int, threshold: float) -> tuple[list[int], list[float]]:
    """(positions kept, their scores mapped to [0, 1]): by the reranker's scores (ties keep the
    first stage's order), ``threshold`` on the mapped score, at most ``top_k``."""
    order = (-scores).argsort(kind="stable")[:top_k]
    top = scores[order].tolist()
    if scale == "logit":
        units = [unit_score(r, scale) for r in top]
    else:  # unit_score's clip, inlined: this is the per-hit cost of a rerank
        units = [0.0 if r < 0.0 else 1.0 if r > 1.0 else r for r in top]
    if threshold > 0.0 and units and units[-1] < threshold:
        units = [u for u in units if u >= threshold]  # descending: a prefix
    return order[: len(units)].tolist(), units


def _lazy_first_stage(
    first_scores: Callable[[], list[float]],
    build: Callable[[list[int]], list[Hit] | None],
    first_stage: Callable[[], list[Hit]],
    top_k: int,
    threshold: float,
) -> list[Hit]:
    """What :func:`_first_stage` gives on the built hits, building only those."""
    picks = [i for i, s in enumerate(first_scores()) if s >= threshold][:top_k]
    hits = build(picks)
    return _first_stage(first_stage(), top_k, threshold) if hits is None else hits


def _name(reranker: Any) -> str:
    return getattr(reranker, "name", None) or type(reranker).__name__


def _first_stage(hits: list[Hit], top_k: int, threshold: float) -> list[Hit]:
    return [h for h in hits if h.score >= threshold][:top_k]
