"""Dataset loaders for the index benchmarks: SciFact chunk embeddings and seeded clustered vectors.

Every loader returns a :class:`Dataset` with unit-norm float32 base vectors, unit-norm float32
queries and the exact cosine top-k (row indices, best first) computed with numpy.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_ROOT = REPO_ROOT.parent / "shared" / "data"

SYNTHETIC_DIM = 384
SYNTHETIC_CLUSTERS = 1000
# Noise norm relative to the (unit) cluster centre: two points of one cluster have cosine ~ 1 / (1 + 1.0**2).
SYNTHETIC_NOISE = 1.0
SYNTHETIC_SEED = 20240601
_BLOCK_ROWS = 16384


@dataclass
class Dataset:
    """Base vectors, queries and exact ground truth for one benchmark run."""

    name: str
    base: np.ndarray  # float32 [n, dim], C-contiguous, unit-norm rows
    queries: np.ndarray  # float32 [nq, dim], C-contiguous, unit-norm rows
    gt_ids: np.ndarray  # int64 [nq, k], exact top-k row indices, best first
    gt_scores: np.ndarray  # float32 [nq, k], exact cosine of gt_ids (descending)
    info: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.base.shape[0])

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])

    @property
    def nq(self) -> int:
        return int(self.queries.shape[0])


def _normalise(x: np.ndarray) -> np.ndarray:
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


class TopK:
    """Running exact inner-product top-k of ``queries`` over base rows fed block by block.

    ``add(block, start)`` scores one block of rows whose first row is number ``start``; ties keep
    the lower row first, so feeding the blocks of ``base`` in order gives :func:`exact_top_k`.
    Peak extra memory is ``nq * len(block) * 4`` bytes.
    """

    def __init__(self, queries: np.ndarray, k: int = 10) -> None:
        self.queries = queries
        self.k = k
        self.ids = np.empty((queries.shape[0], 0), dtype=np.int64)
        self.scores = np.empty((queries.shape[0], 0), dtype=np.float32)

    def add(self, block: np.ndarray, start: int) -> None:
        scores = self.queries @ block.T
        kk = min(self.k, block.shape[0])
        part = np.argpartition(-scores, kk - 1, axis=1)[:, :kk]
        cand_ids = np.concatenate([self.ids, part + start], axis=1)
        cand_scores = np.concatenate([self.scores, np.take_along_axis(scores, part, axis=1)], axis=1)
        # Sort by (-score, id) so ties keep the lower row first.
        order = np.lexsort((cand_ids, -cand_scores), axis=1)[:, : self.k]
        self.ids = np.take_along_axis(cand_ids, order, axis=1)
        self.scores = np.take_along_axis(cand_scores, order, axis=1)


def exact_top_k(base: np.ndarray, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k of each query over ``base`` (ties: lower row first).

    Works over blocks of base rows so peak extra memory is ``nq * _BLOCK_ROWS * 4`` bytes.
    Returns ``(ids int64 [nq, k], scores float32 [nq, k])``, best first.
    """
    top = TopK(queries, k)
    for start in range(0, base.shape[0], _BLOCK_ROWS):
        top.add(base[start : start + _BLOCK_ROWS], start)
    return top.ids, top.scores


def scifact_dir(data: str | os.PathLike | None) -> Path:
    """Resolve the SciFact folder: ``--data`` (root or the folder itself), else ``$KBCORE_DATA``, else shared."""
    root = Path(data) if data else Path(os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    if (root / "chunk_embeddings.npy").exists():
        return root
    return root / "scifact"


def load_scifact(data: str | os.PathLike | None = None, k: int = 10) -> Dataset:
    """SciFact chunk embeddings [19369, 384] as base and the 300 claim embeddings as queries (cosine)."""
    folder = scifact_dir(data)
    base = np.ascontiguousarray(np.load(folder / "chunk_embeddings.npy"), dtype=np.float32)
    queries = np.ascontiguousarray(np.load(folder / "query_embeddings.npy"), dtype=np.float32)
    gt_ids, gt_scores = exact_top_k(base, queries, k)
    info: dict = {"path": str(folder), "metric": "cosine"}
    ref_path = folder / "exact_top100_chunks.npy"
    if ref_path.exists():
        ref = np.load(ref_path)[:, :k].astype(np.int64)
        overlap = np.mean([len(set(a) & set(b)) / k for a, b in zip(gt_ids, ref)])
        info["crosscheck_exact_top100"] = {
            "mean_top10_overlap": float(overlap),
            "queries_identical_order": int(np.sum(np.all(gt_ids == ref, axis=1))),
        }
    return Dataset("scifact", base, queries, gt_ids, gt_scores, info)


def _draw_clustered(centres: np.ndarray, m: int, rng: np.random.Generator, noise: float) -> np.ndarray:
    dim = centres.shape[1]
    labels = rng.integers(centres.shape[0], size=m)
    x = rng.standard_normal((m, dim), dtype=np.float32)
    x *= np.float32(noise / np.sqrt(dim))
    x += centres[labels]
    return _normalise(x)


def synthetic_centres(
    dim: int = SYNTHETIC_DIM, clusters: int = SYNTHETIC_CLUSTERS, seed: int = SYNTHETIC_SEED
) -> tuple[np.ndarray, np.random.SeedSequence, np.random.SeedSequence]:
    """The unit cluster centres of the seeded synthetic set, and the query and base seed streams."""
    centre_seed, query_seed, base_seed = np.random.SeedSequence(seed).spawn(3)
    centres = _normalise(np.random.default_rng(centre_seed).standard_normal((clusters, dim), dtype=np.float32))
    return centres, query_seed, base_seed


def synthetic_blocks(
    n: int,
    *,
    dim: int = SYNTHETIC_DIM,
    clusters: int = SYNTHETIC_CLUSTERS,
    noise: float = SYNTHETIC_NOISE,
    seed: int = SYNTHETIC_SEED,
) -> Iterator[tuple[int, np.ndarray]]:
    """The base rows of :func:`make_synthetic` as ``(first row, block)`` pairs of up to 16,384 rows,
    generated one block at a time (a 10M x 384 base never has to be in memory at once)."""
    centres, _, base_seed = synthetic_centres(dim, clusters, seed)
    n_blocks = (n + _BLOCK_ROWS - 1) // _BLOCK_ROWS
    for b, block_seed in enumerate(base_seed.spawn(n_blocks)):
        start = b * _BLOCK_ROWS
        stop = min(n, start + _BLOCK_ROWS)
        # Always draw a full block and slice, so a block's rows do not depend on n.
        block = _draw_clustered(centres, _BLOCK_ROWS, np.random.default_rng(block_seed), noise)
        yield start, block[: stop - start]


def synthetic_queries(
    nq: int,
    *,
    dim: int = SYNTHETIC_DIM,
    clusters: int = SYNTHETIC_CLUSTERS,
    noise: float = SYNTHETIC_NOISE,
    seed: int = SYNTHETIC_SEED,
) -> np.ndarray:
    """The queries of :func:`make_synthetic` (they do not depend on the base size)."""
    centres, query_seed, _ = synthetic_centres(dim, clusters, seed)
    return _draw_clustered(centres, nq, np.random.default_rng(query_seed), noise)


def make_synthetic(
    n: int = 100_000,
    nq: int = 1000,
    *,
    dim: int = SYNTHETIC_DIM,
    clusters: int = SYNTHETIC_CLUSTERS,
    noise: float = SYNTHETIC_NOISE,
    seed: int = SYNTHETIC_SEED,
    k: int = 10,
) -> Dataset:
    """Seeded clustered data: unit Gaussian centres, points = centre + noise, L2-normalised.

    Base rows are generated in fixed blocks, each with its own spawned seed, so the base for a
    smaller ``n`` is a prefix of a larger one. Queries come from a separate stream (fresh draws
    from the same clusters, never rows of the base).
    """
    base = np.empty((n, dim), dtype=np.float32)
    for start, block in synthetic_blocks(n, dim=dim, clusters=clusters, noise=noise, seed=seed):
        base[start : start + block.shape[0]] = block
    queries = synthetic_queries(nq, dim=dim, clusters=clusters, noise=noise, seed=seed)
    gt_ids, gt_scores = exact_top_k(base, queries, k)
    info = {
        "metric": "cosine",
        "clusters": clusters,
        "noise": noise,
        "seed": seed,
        "max_query_base_cosine": float(gt_scores[:, 0].max()),
    }
    return Dataset(f"synthetic-{n}", base, queries, gt_ids, gt_scores, info)
