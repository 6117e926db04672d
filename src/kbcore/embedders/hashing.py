"""The built-in :class:`HashingEmbedder`: offline, no model, a lexical fallback."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["HashingEmbedder", "STOPWORDS"]

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

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> HashingEmbedder:
        """The embedder :meth:`spec` describes (no I/O)."""
        return cls(
            int(spec.get("dim", 384)),
            char_ngrams=tuple(spec.get("char_ngrams", (3, 5))),
            word_weight=float(spec.get("word_weight", 1.0)),
            char_weight=float(spec.get("char_weight", 1.0)),
            seed=int(spec.get("seed", 0)),
            **({"batch_size": int(spec["batch_size"])} if spec.get("batch_size") else {}),
        )

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
