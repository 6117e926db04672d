"""One frozen description of an index: :class:`IndexSpec`.

Every layer that configures an index (``Index(spec=...)``, the engine's
``create_knowledge_base(index=...)`` and its manifest, ``ShardedIndex``, the command line) builds
one ``IndexSpec`` and passes it whole; it is validated once, in ``__post_init__``, by the checks
of :mod:`.params` (where the names ``QUANTIZATIONS`` / ``RABITQ_BITS`` are defined, once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError
from .params import QUANTIZATIONS, RABITQ_BITS, bounded, check_bits, check_params, check_quantization, check_vectors

__all__ = ["IndexSpec", "as_index_spec", "QUANTIZATIONS", "RABITQ_BITS"]


@dataclass(frozen=True)
class IndexSpec:
    """What an index is: ``metric`` ("cosine", "ip", "l2"), ``kind`` ("hnsw", "flat"), HNSW's
    ``M`` and ``ef_construction``, the default search ``ef``, the ``quantization`` (None, "sq8",
    "rabitq") with RaBitQ's ``bits`` per dimension (None: 4), the exact re-rank depth of a
    quantized search (``rerank``; None: the native default) and where the float32 rows live
    (``vectors``: "memory", or "disk" for a quantized index).

    Frozen and validated on construction: InvalidArgumentError / InvalidTypeError name the bad
    field. ``to_dict`` / ``from_dict`` are its JSON form (the manifest's ``config`` keys are
    read by :meth:`from_config` and written by :meth:`to_config`)."""

    metric: str = "cosine"
    kind: str = "hnsw"
    M: int = 16
    ef_construction: int = 200
    ef: int = 64
    quantization: str | None = None
    bits: int | None = None
    rerank: int | None = None
    vectors: str = "memory"

    def __post_init__(self) -> None:
        for name in ("metric", "kind", "vectors"):
            if not isinstance(getattr(self, name), str):
                raise InvalidTypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        M, ef_construction, ef = check_params(self.metric, self.kind, self.M, self.ef_construction, self.ef)
        check_quantization(self.quantization, self.kind)
        bits = check_bits(self.bits, self.quantization)
        rerank = self.rerank
        if rerank is not None:
            if self.quantization is None:
                raise InvalidArgumentError("rerank applies to a quantized index (quantization='sq8' or 'rabitq')")
            rerank = bounded("rerank", rerank)
        check_vectors(self.vectors, self.quantization)
        for name, value in (("M", M), ("ef_construction", ef_construction), ("ef", ef), ("bits", bits)):
            object.__setattr__(self, name, value)  # numpy integers become ints
        object.__setattr__(self, "rerank", rerank)

    def replace(self, **changes: Any) -> IndexSpec:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-able."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IndexSpec:
        """The spec of :meth:`to_dict`'s dict; absent fields take their defaults. Raises
        InvalidArgumentError for an unknown field, InvalidTypeError when ``data`` is not a
        mapping."""
        if not isinstance(data, Mapping):
            raise InvalidTypeError(f"an index spec is a dict, got {type(data).__name__}")
        unknown = sorted(set(data) - _FIELDS)
        if unknown:
            raise InvalidArgumentError(f"unknown index spec field(s) {unknown}; known: {sorted(_FIELDS)}")
        return cls(**dict(data))

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> IndexSpec:
        """The spec a knowledge base's manifest ``config`` records (its kind is the key
        ``index``; ``quantization``, ``bits``, ``rerank`` and ``vectors`` may be absent, as in
        manifests written before they existed)."""
        return cls(
            metric=cfg["metric"],
            kind=cfg["index"],
            M=cfg["M"],
            ef_construction=cfg["ef_construction"],
            ef=cfg["ef"],
            quantization=cfg.get("quantization"),
            bits=cfg.get("bits"),
            rerank=cfg.get("rerank"),
            vectors="disk" if cfg.get("vectors") == "disk" else "memory",
        )

    def to_config(self) -> dict[str, Any]:
        """The manifest ``config`` keys of this spec; the optional ones only when they differ
        from their default, so older readers see the keys they know."""
        out: dict[str, Any] = {
            "metric": self.metric,
            "index": self.kind,
            "M": self.M,
            "ef_construction": self.ef_construction,
            "ef": self.ef,
        }
        for key in ("quantization", "bits", "rerank"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.vectors != "memory":
            out["vectors"] = self.vectors
        return out

    def index_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~kbcore.index.Index` that build this spec."""
        return {
            "metric": self.metric,
            "kind": self.kind,
            "M": self.M,
            "ef_construction": self.ef_construction,
            "ef": self.ef,
            "quantization": self.quantization,
            "bits": self.bits,
            "rerank": self.rerank,
            "vectors": self.vectors,
        }


_FIELDS = frozenset(f.name for f in dataclasses.fields(IndexSpec))


def as_index_spec(value: IndexSpec | Mapping[str, Any]) -> IndexSpec:
    """``value`` as an :class:`IndexSpec` (a spec as is, a dict through :meth:`IndexSpec.from_dict`)."""
    if isinstance(value, IndexSpec):
        return value
    if isinstance(value, Mapping):
        return IndexSpec.from_dict(value)
    raise InvalidTypeError(f"expected an IndexSpec or a dict, got {type(value).__name__}")
