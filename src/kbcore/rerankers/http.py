"""A reranker for the de-facto ``POST /rerank`` HTTP APIs.

Formats (``api_format``), checked against each service's documentation:

==============  ==========================================  ===========================================
format          request                                     answer
==============  ==========================================  ===========================================
``cohere``      ``{model, query, documents, top_n}``        ``{"results": [{index, relevance_score}]}``
``cohere-v2``   the same, at Cohere's ``/v2/rerank``        the same
``jina``        the same, plus ``return_documents: false``  the same
``voyage``      ``{model, query, documents}``               ``{"data": [{index, relevance_score}]}``
``tei``         ``{query, texts, raw_scores: false,         ``[{index, score}]``
                truncate: true}``
==============  ==========================================  ===========================================

vLLM (``/v1/rerank``, ``/rerank``), Xinference (``/v1/rerank``) and LocalAI answer the Cohere
shape: use ``api_format="cohere"`` with their base URL. Hugging Face text-embeddings-inference
is ``tei`` (its ``/rerank`` applies the sigmoid unless ``raw_scores``).

The transport is :func:`kbcore._http.post_json` (timeouts, an overall deadline, retries with
backoff on 408/409/429/5xx, a response byte cap, no credentials across origins).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .._http import post_json, service_url
from ..errors import InvalidArgumentError, RerankerError, RerankerUnavailableError
from .base import BaseReranker, positive_int

__all__ = ["HttpReranker", "API_FORMATS", "DEFAULT_BASE_URLS", "DEFAULT_KEY_ENVS"]

#: The request / answer shapes :class:`HttpReranker` speaks.
API_FORMATS = ("cohere", "cohere-v2", "jina", "voyage", "tei")
#: The hosted services' API roots (``tei`` has none: it is self-hosted).
DEFAULT_BASE_URLS = {
    "cohere": "https://api.cohere.com/v1",
    "cohere-v2": "https://api.cohere.com/v2",
    "jina": "https://api.jina.ai/v1",
    "voyage": "https://api.voyageai.com/v1",
}
#: The environment variable read for the key when ``api_key_env`` is not given.
DEFAULT_KEY_ENVS = {
    "cohere": "COHERE_API_KEY",
    "cohere-v2": "COHERE_API_KEY",
    "jina": "JINA_API_KEY",
    "voyage": "VOYAGE_API_KEY",
    "tei": None,
}
# texts-embeddings-inference refuses batches above --max-client-batch-size (default 32).
_DEFAULT_BATCH = {"tei": 32}
_DEFAULT_BATCH_OTHER = 100
_UNSET: Any = object()


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _endpoint(base_url: str) -> str:
    return service_url(base_url, "rerank", "https://api.cohere.com/v2 or http://localhost:8080")


class HttpReranker(BaseReranker):
    """Scores texts with a ``POST {base_url}/rerank`` service.

    ``model``: the model name sent (optional for ``tei``, whose server runs one model).
    ``base_url``: the API root (``/rerank`` is appended unless the URL ends with it); default
    the hosted service of ``api_format`` (required for ``tei``). ``api_key_env``: the
    environment variable holding the key, read at each request and sent as ``Authorization:
    Bearer``; never stored, logged or put in a message (None or ``""``: no key, for a local
    server); default ``COHERE_API_KEY`` / ``JINA_API_KEY`` / ``VOYAGE_API_KEY`` / none for tei.

    At most ``batch_size`` texts per request (default 32 for tei, whose server refuses more
    by default, else 100). ``timeout``: seconds per socket operation; ``deadline``: seconds for
    one request including its retries; ``max_retries``: retries on connection errors, timeouts
    and HTTP 408/409/429/5xx, with exponential backoff (or the server's ``Retry-After``);
    ``max_response_bytes``: the largest answer read. ``sleep`` replaces the wait between
    retries (tests).

    Scores are the service's relevance in [0, 1] (``score_scale = "probability"``: a hit's
    ``score`` is the relevance clipped to [0, 1]). Errors: InvalidArgumentError for bad
    arguments (at construction); at rerank time RerankerUnavailableError when the service
    stayed unreachable or overloaded, RerankerError when it refused the request, answered
    something invalid (not JSON, a wrong count, an index missing or repeated, a score that is
    not a finite number), or the key variable is not set. Messages name the endpoint.
    """

    score_scale = "probability"

    def __init__(
        self,
        model: str | None = None,
        *,
        base_url: str | None = None,
        api_key_env: str | None = _UNSET,
        api_format: str = "cohere",
        batch_size: int | None = None,
        timeout: float = 10.0,
        deadline: float = 30.0,
        max_retries: int = 3,
        max_response_bytes: int = 8 * 1024 * 1024,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if api_format not in API_FORMATS:
            raise InvalidArgumentError(
                f"api_format must be one of {', '.join(map(repr, API_FORMATS))}, got {api_format!r}"
            )
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise InvalidArgumentError(f"model must be a non-empty string, got {model!r}")
        if model is None and api_format != "tei":
            raise InvalidArgumentError(f"HttpReranker(api_format={api_format!r}) needs model= (the model name)")
        if base_url is None:
            base_url = DEFAULT_BASE_URLS.get(api_format)
            if base_url is None:
                raise InvalidArgumentError(
                    f"HttpReranker(api_format={api_format!r}) needs base_url= (e.g. http://localhost:8080)"
                )
        if api_key_env is _UNSET:
            api_key_env = DEFAULT_KEY_ENVS[api_format]
        if api_key_env is not None and not isinstance(api_key_env, str):
            raise InvalidArgumentError(f"api_key_env must be a variable name or None, got {api_key_env!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be a non-negative integer, got {max_retries!r}")
        self.model = model
        self.base_url = base_url.strip() if isinstance(base_url, str) else base_url
        self._url = _endpoint(self.base_url)
        self.endpoint = self._url
        self.api_format = api_format
        self.api_key_env = api_key_env or None
        default_batch = _DEFAULT_BATCH.get(api_format, _DEFAULT_BATCH_OTHER)
        self.batch_size = positive_int("batch_size", default_batch if batch_size is None else batch_size)
        self.timeout = _number("timeout", timeout)
        self.deadline = _number("deadline", deadline)
        self.max_retries = max_retries
        self.max_response_bytes = positive_int("max_response_bytes", max_response_bytes)
        self._sleep = sleep
        self.name = f"{api_format} reranker {model or ''} at {self.endpoint}".replace("  ", " ")
        #: Requests sent (including retries), for monitoring and tests.
        self.requests_sent = 0

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> HttpReranker:
        """Rebuilds from :meth:`spec` (no request is sent, no key read)."""
        options = {
            k: spec[k]
            for k in ("batch_size", "timeout", "deadline", "max_retries", "max_response_bytes")
            if spec.get(k) is not None
        }
        return cls(
            spec.get("model"),
            base_url=spec.get("base_url"),
            api_key_env=spec.get("api_key_env"),
            api_format=spec.get("api_format", "cohere"),
            **options,
        )

    def spec(self) -> dict[str, Any]:
        """JSON-able description (no key: only the name of its environment variable)."""
        return {
            "kind": "http",
            "api_format": self.api_format,
            "model": self.model,
            "base_url": self.base_url,
            "api_key_env": self.api_key_env,
            "batch_size": self.batch_size,
            "timeout": self.timeout,
            "deadline": self.deadline,
            "max_retries": self.max_retries,
        }

    def __repr__(self) -> str:
        return f"HttpReranker({self.model!r}, endpoint={self.endpoint!r}, api_format={self.api_format!r})"

    # -- requests -----------------------------------------------------------------------

    def _api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise RerankerError(
                f"the API key for {self.endpoint} is read from the environment variable "
                f"{self.api_key_env}, which is not set (set it, or use api_key_env=None for a "
                "server without authentication)",
                endpoint=self.endpoint,
            )
        return key

    def _payload(self, query: str, texts: list[str]) -> dict[str, Any]:
        fmt = self.api_format
        if fmt == "tei":
            return {"query": query, "texts": texts, "raw_scores": False, "truncate": True}
        out: dict[str, Any] = {"model": self.model, "query": query, "documents": texts}
        if fmt == "voyage":
            return out
        out["top_n"] = len(texts)
        if fmt == "jina":
            out["return_documents"] = False
        return out

    def _count(self) -> None:
        self.requests_sent += 1

    def _score(self, query: str, texts: list[str]) -> np.ndarray:
        key = self._api_key()
        headers = {"User-Agent": "kbcore-reranker"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        n = len(texts)
        answer = post_json(
            self._url,
            self._payload(query, texts),
            headers=headers,
            timeout=self.timeout,
            deadline=self.deadline,
            max_retries=self.max_retries,
            max_response_bytes=self.max_response_bytes,
            error=RerankerError,
            unavailable=RerankerUnavailableError,
            scrub=(lambda s: s.replace(key, "***")) if key else None,
            what=f"rerank request to {self.endpoint} ({n} text{'s' if n != 1 else ''})",
            sleep=self._sleep,
            on_request=self._count,
        )
        return self._parse(answer, n)

    def _bad(self, what: str) -> RerankerError:
        return RerankerError(f"invalid response from {self.endpoint}: {what}", endpoint=self.endpoint)

    def _parse(self, answer: Any, n: int) -> np.ndarray:
        fmt = self.api_format
        if fmt == "tei":
            items, field = answer, "score"
            if not isinstance(items, list):
                raise self._bad(f"expected a JSON list of {{index, score}}, got {type(answer).__name__}")
        else:
            key = "data" if fmt == "voyage" else "results"
            items = answer.get(key) if isinstance(answer, dict) else None
            field = "relevance_score"
            if not isinstance(items, list):
                raise self._bad(f"no {key!r} list")
        if len(items) != n:
            raise self._bad(f"{len(items)} results for {n} texts")
        scores = np.full(n, np.nan)
        seen = np.zeros(n, dtype=bool)
        for pos, item in enumerate(items):
            if not isinstance(item, dict):
                raise self._bad(f"result {pos} is not an object")
            i = item.get("index")
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise self._bad(f"result {pos} has index {i!r}, expected 0..{n - 1}")
            if seen[i]:
                raise self._bad(f"index {i} appears twice")
            seen[i] = True
            s = item.get(field)
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
                raise self._bad(f"result {pos} has {field} {s!r}, expected a finite number")
            scores[i] = float(s)
        return scores
