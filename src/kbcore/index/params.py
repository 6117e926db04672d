"""The index's parameters: the one list of metric, kind, quantization and vectors names, the
native limits (read from the core), and the checks every layer shares (``check_params``,
``check_quantization``, ``check_bits``, ``check_vectors``; the integer checks ``positive``,
``bounded``, ``limit``, ``threads``). No index is built here."""

from __future__ import annotations

from typing import Literal

import numpy as np

from .. import _core
from ..errors import InvalidArgumentError, InvalidTypeError

__all__ = [
    "METRICS",
    "KINDS",
    "CODE_TYPES",
    "QUANTIZATIONS",
    "VECTORS",
    "M_RANGE",
    "DIM_RANGE",
    "EF_RANGE",
    "RABITQ_BITS",
    "RABITQ_DEFAULT_BITS",
    "check_params",
    "check_quantization",
    "check_bits",
    "check_vectors",
    "positive",
    "bounded",
    "limit",
    "threads",
]

Metric = Literal["cosine", "ip", "l2"]
Kind = Literal["hnsw", "flat"]
Quantization = Literal["sq8", "rabitq"]
Vectors = Literal["memory", "disk"]

#: The metric and index kind names (the one list; the engine and its integrations use it).
METRICS: tuple[str, ...] = ("cosine", "ip", "l2")
KINDS: tuple[str, ...] = ("hnsw", "flat")
#: The range of the HNSW parameter M (the top is the native kMaxM, read from the core).
M_RANGE = (2, _core.MAX_M)
#: The range of an index's dimension (the top is the native kMaxDim).
DIM_RANGE = (1, _core.MAX_DIM)
#: The range of ef, ef_construction, rerank and a search's k (the top is the native kMaxEf,
#: 2^30): what the constructor, the file format and the loader all accept. Work buffers are
#: bounded by the rows that exist whatever the value (docs/index.md, "Limits").
EF_RANGE = (1, _core.MAX_EF)
#: The code types an HNSW index can walk its graph on, and their parameters' (min, max, default),
#: as the native registry lists them (cpp/code_types.h).
CODE_TYPES: dict[str, dict[str, tuple[int, int, int]]] = _core.code_types()
QUANTIZATIONS: tuple[str, ...] = tuple(CODE_TYPES)
VECTORS: tuple[str, ...] = ("memory", "disk")  # where the float32 rows live
#: Bits per dimension of RaBitQ codes: the range, and the default.
RABITQ_BITS: tuple[int, int] = CODE_TYPES["rabitq"]["bits"][:2]
RABITQ_DEFAULT_BITS = CODE_TYPES["rabitq"]["bits"][2]


def positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value <= 0:
        raise InvalidArgumentError(f"{name} must be positive, got {value}")
    return int(value)


def bounded(name: str, value: int) -> int:
    """A positive integer of at most ``EF_RANGE[1]`` (k, ef, ef_construction, rerank)."""
    value = positive(name, value)
    if value > EF_RANGE[1]:
        raise InvalidArgumentError(f"{name} must be in [{EF_RANGE[0]}, {EF_RANGE[1]}] (2^30), got {value}")
    return value


def limit(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"limit must be an integer, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgumentError(f"limit must be non-negative, got {value}")
    return int(value)


_THREADS_CAP = 1 << 20  # far above any machine, well inside the native size_t


def threads(value: int) -> int:
    """A thread count as the native calls take it: 0 = all cores; a count above any machine's
    is capped (the native pool caps it again at the cores and the work), so it converts."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidArgumentError(f"threads must be a non-negative integer (0 = all cores), got {value!r}")
    return min(int(value), _THREADS_CAP)


def check_params(metric: str, kind: str, M: int, ef_construction: int, ef: int) -> tuple[int, int, int]:
    """Validates an index configuration without building an index; returns (M,
    ef_construction, ef) as ints. Raises InvalidArgumentError / InvalidTypeError naming the
    bad parameter: M outside ``M_RANGE``, ef or ef_construction outside ``EF_RANGE`` (the
    limits the native constructor, the file format and the loader share)."""
    if metric not in METRICS:
        raise InvalidArgumentError(f"unknown metric {metric!r}; expected one of {METRICS}")
    if kind not in KINDS:
        raise InvalidArgumentError(f"unknown kind {kind!r}; expected one of {KINDS}")
    M = positive("M", M)
    if not M_RANGE[0] <= M <= M_RANGE[1]:
        raise InvalidArgumentError(f"M must be in [{M_RANGE[0]}, {M_RANGE[1]}], got {M}")
    return M, bounded("ef_construction", ef_construction), bounded("ef", ef)


def check_quantization(quantization: str | None, kind: str) -> None:
    """Validates a quantization choice for an index kind (None, or one of the known codes for
    ``kind="hnsw"``) without building an index; raises InvalidArgumentError naming it."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise InvalidArgumentError(f"unknown quantization {quantization!r}; expected None or one of {QUANTIZATIONS}")
    if quantization is not None and kind != "hnsw":
        raise InvalidArgumentError("quantization applies to kind='hnsw' only")


def check_bits(bits: int | None, quantization: str | None) -> int | None:
    """Validates RaBitQ's bits per dimension (None: the default of 4); raises
    InvalidArgumentError for bits without ``quantization="rabitq"`` or out of [1, 8]."""
    if bits is None:
        return None
    if quantization != "rabitq":
        raise InvalidArgumentError("bits applies to quantization='rabitq' only")
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)):
        raise InvalidArgumentError(f"bits must be an integer, got {bits!r}")
    if not RABITQ_BITS[0] <= bits <= RABITQ_BITS[1]:
        raise InvalidArgumentError(f"bits must be in [{RABITQ_BITS[0]}, {RABITQ_BITS[1]}], got {bits}")
    return int(bits)


def check_vectors(vectors: str, quantization: str | None) -> None:
    """Validates ``vectors`` ("memory" or "disk"; "disk" needs a quantization)."""
    if vectors not in ("memory", "disk"):
        raise InvalidArgumentError(f"unknown vectors {vectors!r}; expected 'memory' or 'disk'")
    if vectors == "disk" and quantization is None:
        raise InvalidArgumentError(
            "vectors='disk' needs quantization='sq8' or 'rabitq' (a float32 graph reads every row)"
        )
