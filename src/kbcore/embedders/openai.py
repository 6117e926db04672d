"""An embedder for any OpenAI-compatible ``/v1/embeddings`` endpoint.

OpenAI itself, Azure OpenAI (deployment URLs with an ``api-key`` header and ``api-version``),
and the local servers that speak the same protocol: Ollama, vLLM, LocalAI, LM Studio, llama.cpp's
server, text-embeddings-inference... Only the standard library is used (``urllib``), imported
on first request, so importing :mod:`kbcore.embedders` stays cheap.

The API key is never an argument: it is read from the environment variable named by
``api_key_env`` at each request, so a knowledge base can record the embedder (see
:func:`kbcore.embedders.embedder_to_spec`) without recording a secret, and a rotated key is
picked up without a restart.
"""

from __future__ import annotations

import base64
import math
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from .._http import DEFAULT_DEADLINE, DEFAULT_MAX_RESPONSE_BYTES, RETRY_STATUSES, post_json, service_url
from ..errors import EmbedderError, EmbedderUnavailableError, InvalidArgumentError, InvalidTypeError

__all__ = ["OpenAIEmbedder", "DEFAULT_BASE_URL", "AZURE_API_VERSION", "RETRY_STATUSES"]

#: OpenAI's own API.
DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: The Azure OpenAI data-plane ``api-version`` used by :meth:`OpenAIEmbedder.azure` by default
#: (a GA version; pass another one if your resource needs it).
AZURE_API_VERSION = "2024-10-21"
_AUTH_HEADERS = ("bearer", "api-key")


def _positive_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _non_negative(name: str, value: Any, *, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        rule = "a positive" if positive else "a non-negative"
        raise InvalidArgumentError(f"{name} must be {rule} finite number, got {value!r}")
    return float(value)


def _endpoint_url(base_url: str, api_version: str | None) -> str:
    parts = urlsplit(service_url(base_url, "embeddings", "https://api.openai.com/v1 or http://localhost:11434/v1"))
    query = parse_qsl(parts.query, keep_blank_values=True)
    if api_version is not None:
        query = [(k, v) for k, v in query if k != "api-version"] + [("api-version", api_version)]
    return urlunsplit(parts._replace(query=urlencode(query)))


class OpenAIEmbedder:
    """Embeds texts with an OpenAI-compatible ``POST {base_url}/embeddings`` endpoint.

    ``model``: the model name sent in the request (for Azure deployment URLs the deployment
    decides; the name is still sent, as the OpenAI SDK does). ``base_url``: the API root, e.g.
    ``https://api.openai.com/v1`` (default), ``http://localhost:11434/v1`` (Ollama),
    ``http://localhost:8000/v1`` (vLLM), ``http://localhost:8080/v1`` (LocalAI),
    ``http://localhost:1234/v1`` (LM Studio); ``/embeddings`` is appended unless the URL already
    ends with it. ``api_key_env``: the environment variable holding the key, read at each
    request (``None`` or ``""``: send no key, for local servers without auth).
    ``auth_header``: ``"bearer"`` (``Authorization: Bearer KEY``, OpenAI and most servers) or
    ``"api-key"`` (``api-key: KEY``, Azure). ``api_version``: added as ``?api-version=`` (Azure
    deployment URLs need it); see :meth:`azure`.

    ``dimensions``: sent to the service as the request's ``dimensions`` (models that can shorten
    their vectors, e.g. ``text-embedding-3-*``) and then required of the response. ``dim``: the
    expected dimension without sending anything. With neither, ``dim`` is learned from the first
    response; reading :attr:`dim` before any call sends one probe request.

    Requests carry at most ``batch_size`` inputs. Each request has a socket ``timeout`` (seconds,
    for connecting and for each read) and an overall ``deadline`` (seconds, default 300, for the
    whole request with its retries and waits: a server dripping its answer a byte at a time
    cannot stretch it). An answer larger than ``max_response_bytes`` (default 64 MiB) is
    refused. Redirects are followed only within the endpoint's origin and only when they keep
    the POST (307 / 308): the key is never sent to another origin. Connection errors, timeouts
    and HTTP 408/409/429/5xx are retried up to ``max_retries`` times with exponential backoff (``backoff * 2**attempt``
    seconds, at most ``max_backoff``, minus up to 25 % random jitter); a ``Retry-After`` (or
    ``retry-after-ms``) header is honoured instead when present, unless it asks for more than
    ``max_retry_after`` seconds, which fails at once. ``normalize`` L2-normalises each vector.
    ``sleep`` replaces :func:`time.sleep` between retries (tests).

    Errors: :class:`~kbcore.errors.InvalidArgumentError` for bad arguments (here, at
    construction); at embedding time :class:`~kbcore.errors.EmbedderUnavailableError` (a
    ``ConnectionError``) when the service stayed unreachable or overloaded after the retries,
    :class:`~kbcore.errors.EmbedderError` (a ``RuntimeError``) when it refused the request
    (400, 401, 403, 404...), answered something that is not valid embeddings, or the key
    variable is not set. Messages name the endpoint and never contain the key.

    Thread-safe: concurrent :meth:`embed` calls each make their own requests.
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str | None = "OPENAI_API_KEY",
        dimensions: int | None = None,
        dim: int | None = None,
        auth_header: str = "bearer",
        api_version: str | None = None,
        batch_size: int = 128,
        timeout: float = 60.0,
        deadline: float = DEFAULT_DEADLINE,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        max_retry_after: float = 60.0,
        normalize: bool = False,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model.strip():
            raise InvalidArgumentError(f"model must be a non-empty string, got {model!r}")
        if api_key_env is not None and not isinstance(api_key_env, str):
            raise InvalidArgumentError(f"api_key_env must be a variable name or None, got {api_key_env!r}")
        if auth_header not in _AUTH_HEADERS:
            raise InvalidArgumentError(f"auth_header must be 'bearer' or 'api-key', got {auth_header!r}")
        if api_version is not None and (not isinstance(api_version, str) or not api_version.strip()):
            raise InvalidArgumentError(f"api_version must be a non-empty string or None, got {api_version!r}")
        self.model = model
        self.base_url = base_url.strip() if isinstance(base_url, str) else base_url
        self.api_version = api_version
        self.endpoint = _endpoint_url(self.base_url, api_version)
        self.api_key_env = api_key_env or None
        self.auth_header = auth_header
        self.dimensions = _positive_int("dimensions", dimensions, allow_none=True)
        expected = _positive_int("dim", dim, allow_none=True)
        if expected is not None and self.dimensions is not None and expected != self.dimensions:
            raise InvalidArgumentError(f"dim={expected} contradicts dimensions={self.dimensions}")
        self._dim: int | None = self.dimensions if self.dimensions is not None else expected
        self.batch_size: int = _positive_int("batch_size", batch_size)  # type: ignore[assignment]  # not None: allow_none is off
        self.timeout = _non_negative("timeout", timeout, positive=True)
        self.deadline = _non_negative("deadline", deadline, positive=True)
        self.max_response_bytes: int = _positive_int("max_response_bytes", max_response_bytes)  # type: ignore[assignment]  # not None: allow_none is off
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be a non-negative integer, got {max_retries!r}")
        self.max_retries = max_retries
        self.backoff = _non_negative("backoff", backoff)
        self.max_backoff = _non_negative("max_backoff", max_backoff)
        self.max_retry_after = _non_negative("max_retry_after", max_retry_after)
        self.normalize = bool(normalize)
        self._sleep = sleep if sleep is not None else time.sleep
        self._rng = random.Random()
        self._lock = threading.Lock()
        #: Requests sent (successful or not), for monitoring and tests.
        self.requests_sent = 0

    @classmethod
    def azure(
        cls,
        endpoint: str,
        deployment: str,
        *,
        api_version: str = AZURE_API_VERSION,
        api_key_env: str | None = "AZURE_OPENAI_API_KEY",
        model: str | None = None,
        **kwargs: Any,
    ) -> OpenAIEmbedder:
        """An Azure OpenAI deployment: ``{endpoint}/openai/deployments/{deployment}/embeddings
        ?api-version=...`` with the key in an ``api-key`` header.

        ``endpoint`` is the resource URL (``https://NAME.openai.azure.com``). Azure's newer
        ``/openai/v1`` route needs no helper: ``OpenAIEmbedder(DEPLOYMENT,
        base_url="https://NAME.openai.azure.com/openai/v1", auth_header="api-key",
        api_key_env="AZURE_OPENAI_API_KEY")``. Other keyword arguments are as for the class.
        """
        if not isinstance(deployment, str) or not deployment.strip() or "/" in deployment:
            raise InvalidArgumentError(f"deployment must be a deployment name, got {deployment!r}")
        if not isinstance(endpoint, str):
            raise InvalidArgumentError(f"endpoint must be the resource URL, got {endpoint!r}")
        base = endpoint.strip().rstrip("/")
        if not base.endswith("/openai"):
            base += "/openai"
        return cls(
            model or deployment,
            base_url=f"{base}/deployments/{deployment}",
            api_key_env=api_key_env,
            auth_header="api-key",
            api_version=api_version,
            **kwargs,
        )

    # -- description ----------------------------------------------------------------------

    @property
    def known_dim(self) -> int | None:
        """The dimension if known (from ``dimensions``, ``dim`` or a response), else None."""
        return self._dim

    @property
    def dim(self) -> int:
        """The dimension of the vectors; the first read with none known sends a probe request."""
        if self._dim is None:
            self._embed_batch(["dimension probe"])
        assert self._dim is not None
        return self._dim

    def spec(self) -> dict[str, Any]:
        """JSON-able description (no key: only the name of its environment variable)."""
        out: dict[str, Any] = {
            "kind": "openai",
            "model": self.model,
            "base_url": self.base_url,
            "api_key_env": self.api_key_env,
            "auth_header": self.auth_header,
            "api_version": self.api_version,
            "dimensions": self.dimensions,
            "batch_size": self.batch_size,
            "timeout": self.timeout,
            "deadline": self.deadline,
            "max_response_bytes": self.max_response_bytes,
            "max_retries": self.max_retries,
            "normalize": self.normalize,
        }
        if self._dim is not None:
            out["dim"] = self._dim
        return out

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> OpenAIEmbedder:
        """The client :meth:`spec` describes; no request is sent and no key read."""
        options = {
            k: spec[k]
            for k in ("batch_size", "timeout", "deadline", "max_response_bytes", "max_retries")
            if spec.get(k) is not None
        }
        model = spec.get("model")
        if model in (None, ""):
            raise InvalidArgumentError(f"embedder spec of kind 'openai' lacks 'model': {spec}")
        return cls(
            model,
            base_url=spec.get("base_url") or DEFAULT_BASE_URL,
            api_key_env=spec.get("api_key_env", "OPENAI_API_KEY"),
            dimensions=spec.get("dimensions"),
            dim=spec.get("dim") if spec.get("dimensions") is None else None,
            auth_header=spec.get("auth_header") or "bearer",
            api_version=spec.get("api_version"),
            normalize=bool(spec.get("normalize", False)),
            **options,
        )

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.model!r}, endpoint={self.endpoint!r}, dim={self._dim})"

    # -- embedding ------------------------------------------------------------------------

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim] vectors, in ``batch_size`` requests.

        Raises InvalidTypeError for a str or non-str items, EmbedderError /
        EmbedderUnavailableError as described on the class.
        """
        if isinstance(texts, str):
            raise InvalidTypeError("embed expects a sequence of strings, got one str; wrap it in a list")
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidTypeError(f"texts must be str, got {type(t).__name__}")
        if not texts:
            return np.empty((0, self._dim if self._dim is not None else self.dim), dtype=np.float32)
        parts = [self._embed_batch(texts[s : s + self.batch_size]) for s in range(0, len(texts), self.batch_size)]
        return parts[0] if len(parts) == 1 else np.vstack(parts)

    def _api_key(self) -> str | None:
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise EmbedderError(
                f"the API key for {self.endpoint} is read from the environment variable "
                f"{self.api_key_env}, which is not set (set it, or use api_key_env=None / "
                "--embedding-api-key-env '' for a server without authentication)",
                endpoint=self.endpoint,
            )
        return key

    def _scrub(self, text: str, key: str | None) -> str:
        if key:
            text = text.replace(key, "***")
        return text

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        key = self._api_key()
        payload: dict[str, Any] = {"model": self.model, "input": texts}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        headers = {"User-Agent": "kbcore-embedder"}
        if key is not None:
            if self.auth_header == "api-key":
                headers["api-key"] = key
            else:
                headers["Authorization"] = f"Bearer {key}"
        n = len(texts)
        data = post_json(
            self.endpoint,
            payload,
            headers=headers,
            timeout=self.timeout,
            deadline=self.deadline,
            max_retries=self.max_retries,
            max_response_bytes=self.max_response_bytes,
            error=EmbedderError,
            unavailable=EmbedderUnavailableError,
            scrub=lambda text: self._scrub(text, key),
            what=f"embedding request to {self.endpoint} ({n} input{'s' if n != 1 else ''})",
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            max_retry_after=self.max_retry_after,
            sleep=self._sleep,
            rng=self._rng,
            on_request=self._count_request,
        )
        vectors = self._parse(data, n)
        if self.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors

    def _bad(self, what: str) -> EmbedderError:
        return EmbedderError(f"invalid response from {self.endpoint}: {what}", endpoint=self.endpoint)

    def _count_request(self) -> None:
        with self._lock:
            self.requests_sent += 1

    def _parse(self, obj: object, n: int) -> np.ndarray:
        data = obj.get("data") if isinstance(obj, dict) else None
        if not isinstance(data, list):
            raise self._bad("no 'data' list")
        if len(data) != n:
            raise self._bad(f"{len(data)} embeddings for {n} inputs")
        rows: list[Any] = [None] * n
        with_index = [isinstance(item, dict) and "index" in item for item in data]
        if any(with_index) and not all(with_index):
            raise self._bad("some items have an 'index' and some do not")
        for pos, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                raise self._bad(f"item {pos} has no 'embedding'")
            i = item["index"] if with_index[pos] else pos
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise self._bad(f"item {pos} has index {i!r}, expected 0..{n - 1}")
            if rows[i] is not None:
                raise self._bad(f"index {i} appears twice")
            emb = item["embedding"]
            if isinstance(emb, str):  # encoding_format=base64: little-endian float32
                try:
                    emb = np.frombuffer(base64.b64decode(emb, validate=True), dtype="<f4")
                except (ValueError, TypeError):
                    raise self._bad(f"item {pos} has a string embedding that is not base64 float32") from None
            elif isinstance(emb, list):
                try:
                    emb = np.asarray(emb)
                except (ValueError, RecursionError):  # ragged or deep nesting
                    emb = None
                if emb is None or emb.ndim != 1 or emb.dtype.kind not in "fiu":
                    raise self._bad(f"embedding {i} is not a flat list of numbers")
            else:
                raise self._bad(f"embedding {i} is a {type(emb).__name__}, expected a list of numbers")
            rows[i] = emb
        widths = {len(r) for r in rows}
        if len(widths) != 1:
            raise self._bad(f"embeddings of different lengths {sorted(widths)} in one response")
        width = widths.pop()
        if width == 0:
            raise self._bad("empty embeddings")
        with self._lock:
            if self._dim is None:
                self._dim = width
            elif width != self._dim:
                why = f"dimensions={self.dimensions}" if self.dimensions is not None else "the first response"
                raise self._bad(f"{width}-dimensional embeddings, expected {self._dim} (from {why})")
        out = np.vstack(rows).astype(np.float64, copy=False)
        if not np.isfinite(out).all():
            bad = int(np.flatnonzero(~np.isfinite(out).all(axis=1))[0])
            raise self._bad(f"embedding {bad} contains NaN or infinite values")
        if (np.abs(out) > np.finfo(np.float32).max).any():
            raise self._bad("values beyond the float32 range")
        return out.astype(np.float32)
