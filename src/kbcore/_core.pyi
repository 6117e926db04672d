"""Type stub of the native extension (pybind11). Use the kbcore package, not this module."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

def simd_level() -> str: ...
def available_simd_levels() -> list[str]: ...
def set_simd_level(level: str) -> None: ...
def huge_pages() -> bool: ...
def set_huge_pages(on: bool) -> None: ...
def huge_pages_supported() -> bool: ...
def _set_upper_beam(divisor: int, min_slots: int, wide_divisor: int = 0, wide_min_slots: int = 0) -> None: ...
def _upper_beam() -> tuple[int, int, int, int]: ...
def tokenize(text: str, for_query: bool = ...) -> list[str]: ...
def checksum64(data: bytes) -> int: ...
def block_checksum(data: bytes) -> int: ...
def code_types() -> dict[str, dict[str, tuple[int, int, int]]]: ...

MAX_M: int
MAX_DIM: int
MAX_EF: int

def quick_key(where: Any) -> tuple[Any, ...] | None: ...
def cached_filter(cache: dict[Any, tuple[Any, Filter]], where: Any) -> Filter | None: ...
def parse_iso8601(text: str) -> float | None:
    """Epoch seconds (UTC) of an ISO-8601 date or date-time (cpp/string_dict.cpp), else None."""

class Filter:
    """A compiled filter IR (docs/filter-ir.md) converted and validated once."""

    def __init__(self, ir: tuple[Any, ...]) -> None: ...

_FilterArg = tuple[Any, ...] | Filter
_G = TypeVar("_G")

def collapse_keys(
    ids: npt.NDArray[np.int64],
    values: npt.NDArray[np.float32],
    keys: npt.NDArray[np.int64],
    group_size: int,
    limit: int,
    group_type: type[_G] | None = ...,
) -> list[_G]:
    """Collapses a ranked list (best first) by given int64 group keys: the first `limit` groups,
    each (key, ids, values, part_ids) with its first group_size hits and every part."""

def rrf_fuse(
    ids_a: npt.NDArray[np.int64],
    dist_a: npt.NDArray[np.float32],
    ids_b: npt.NDArray[np.int64],
    score_b: npt.NDArray[np.float32],
    k: float,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Reciprocal rank fusion of a distance leg (ascending) and a score leg (descending): (ids,
    scores), every id once, best first, scores normalised to [0, 1] (``kbcore.index.fuse_rrf``)."""

def search_many(
    requests: list[tuple[Index, np.ndarray, int, int, Filter | None, str | None, int]],
    threads: int = ...,
    group_type: type | None = ...,
) -> list[Any]:
    """One query per index, (index, query, k, ef, filter, group_by, group_size) each, searched
    concurrently on the search pool with the GIL released; (ids, distances) or groups each."""

def set_search_threads(threads: int) -> None: ...
def fast_search(
    index: Index,
) -> Callable[[Any, Any, Any, Any], tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None]: ...
def search_threads() -> int: ...
def wake_search_pool(tasks: int) -> None:
    """Wakes the search pool's workers a search_many call of ``tasks`` searches will use."""

class Index:
    def __init__(
        self,
        dim: int,
        metric: str,
        kind: str,
        M: int,
        ef_construction: int,
        ef: int,
        seed: int,
        quantization: str = ...,
        rerank: int = ...,
        vectors: str = ...,
        bits: int = ...,
        code_params: dict[str, int] = ...,
    ) -> None: ...
    def retrain_quantizer(self, threads: int) -> None: ...
    def reorder(self, method: str, threads: int) -> None: ...
    def add(
        self,
        vectors: npt.NDArray[np.float32],
        ids: npt.NDArray[np.int64],
        threads: int,
        columns: list[tuple[Any, ...]] = ...,
        texts: Sequence[str | None]
        | tuple[npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.uint8] | None]
        | None = ...,
        defer_graph: bool = ...,
    ) -> None: ...
    def build_graph(self, max_rows: int, threads: int) -> int: ...
    def pending_rows(self) -> int: ...
    def remove(self, ids: npt.NDArray[np.int64], threads: int) -> None: ...
    def search(
        self,
        queries: npt.NDArray[np.float32],
        k: int,
        ef: int,
        threads: int,
        filter: _FilterArg | None = ...,
        strategy: str = ...,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def search_one(
        self,
        query: npt.NDArray[np.float32],
        k: int,
        ef: int,
        filter: _FilterArg | None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def search_hybrid_legs(
        self,
        query: npt.NDArray[np.float32],
        text: str,
        k: int,
        ef: int,
        filter: _FilterArg | None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def search_hybrid_rrf(
        self,
        query: npt.NDArray[np.float32],
        text: str,
        k: int,
        ef: int,
        filter: _FilterArg | None,
        rrf_k: float,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], int, int]: ...
    def search_groups(
        self,
        queries: npt.NDArray[np.float32],
        k: int,
        group_by: str,
        group_size: int,
        ef: int,
        threads: int,
        filter: _FilterArg | None = ...,
        strategy: str = ...,
        group_type: type[_G] | None = ...,
    ) -> list[list[_G]]:
        """Per query, a list of (key, ids, distances, part_ids) built as ``group_type``
        instances (a NamedTuple class) when given, else plain tuples."""
    def collapse(
        self,
        ids: npt.NDArray[np.int64],
        values: npt.NDArray[np.float32],
        group_by: str,
        group_size: int,
        limit: int,
        group_type: type[_G] | None = ...,
    ) -> list[_G]:
        """The first ``limit`` groups of a ranked list by field ``group_by``, as ``group_type``
        instances (key, ids, values, part_ids) when given, else plain tuples."""
    def search_text(
        self,
        query: str,
        k: int,
        filter: _FilterArg | None = ...,
        stats: tuple[int, int, dict[str, int]] | None = ...,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def text_stats(self, query: str) -> tuple[int, int, dict[str, int]]:
        """(rows with text, their total tokens, {distinct query term: rows containing it})."""
    def text_documents(self) -> int: ...
    def count(self, filter: _FilterArg) -> int: ...
    def strategy(self, passing: int, ef: int) -> str: ...
    def unfiltered_strategy(self, ef: int) -> str: ...
    def get_metadata(self, ids: npt.NDArray[np.int64]) -> list[dict[str, Any]]: ...
    def get_vectors(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]: ...
    def ids(self) -> npt.NDArray[np.int64]: ...
    def contains(self, id: int) -> bool: ...
    def size(self) -> int: ...
    def memory_bytes(self) -> int: ...
    @property
    def _codes_in_place(self) -> bool: ...
    @property
    def _links_in_place(self) -> bool: ...
    def save(self, path: str) -> None: ...
    @staticmethod
    def load(path: str, vectors: str | None = ..., mmap: bool = ...) -> Index: ...
    @property
    def evals_per_ef(self) -> float: ...
    def search_stats(
        self, queries: npt.NDArray[np.float32], k: int, ef: int
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.uint64]]: ...
    @property
    def quantization(self) -> str: ...
    @property
    def rerank(self) -> int: ...
    @rerank.setter
    def rerank(self, value: int) -> None: ...
    @property
    def bits(self) -> int: ...
    @property
    def code_params(self) -> dict[str, int]: ...
    @property
    def quantizer_trained(self) -> bool: ...
    @property
    def vectors(self) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def metric(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def M(self) -> int: ...
    @property
    def ef_construction(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def ef(self) -> int: ...
    @ef.setter
    def ef(self, value: int) -> None: ...
