"""Record, or compare against a record, the answers of every search path on a seeded grid.

A refactoring of the native search must not change one answer: this tool runs the grid
(metric x kind x quantization x scenario x ef, with forced filtered strategies and grouped
search) on the installed build and stores the ids and the distance bits of every answer
(``record``), or checks them bit for bit against a stored record (``compare``).

    python tools/search_snapshot.py record build/snapshot-before.npz
    python tools/search_snapshot.py compare build/snapshot-before.npz
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import numpy as np

import kbcore
from kbcore.filters.cache import native_filter

N = 1200  # rows: above the 1,000 the quantizers train on
DIM = 24
NQ = 12
K = 10
EFS = (8, 32, 100)
QUANTIZATIONS: tuple[tuple[str | None, int | None], ...] = (
    (None, None),
    ("sq8", None),
    ("rabitq", 1),
    ("rabitq", 4),
)
SCENARIOS = ("plain", "deferred", "removed")
# Filters of several selectivities, with the strategy forced or chosen.
WHERES = ({"c": {"$lt": 2}}, {"c": {"$lt": 30}}, {"c": {"$ne": 7}})
STRATEGIES = ("auto", "exact", "graph", "walk")


def _index(metric: str, kind: str, quant: str | None, bits: int | None, scenario: str) -> kbcore.Index:
    rng = np.random.default_rng(7)
    data = rng.standard_normal((N, DIM)).astype(np.float32)
    ids = np.arange(N, dtype=np.int64) * 3 + 1
    meta = [{"c": i % 97, "doc": i // 5} for i in range(N)]
    kw = {} if quant is None else {"quantization": quant}
    if bits is not None:
        kw["bits"] = bits
    index = kbcore.Index(DIM, metric, kind, M=8, ef_construction=64, seed=3, **kw)  # type: ignore[arg-type]
    if scenario == "deferred" and kind == "hnsw":
        cut = N - 150
        index.add(data[:cut], ids[:cut], metadata=meta[:cut], threads=1)
        index.add(data[cut:], ids[cut:], metadata=meta[cut:], defer_graph=True, threads=1)
    else:
        index.add(data, ids, metadata=meta, threads=1)
    if scenario == "removed":
        index.remove(ids[::4], threads=1)
    return index


def _runs() -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    queries = np.random.default_rng(11).standard_normal((NQ, DIM)).astype(np.float32)
    for metric in ("cosine", "ip", "l2"):
        for kind in ("hnsw", "flat"):
            for quant, bits in QUANTIZATIONS:
                if kind == "flat" and quant is not None:
                    continue
                for scenario in SCENARIOS:
                    if kind == "flat" and scenario == "deferred":
                        continue
                    index = _index(metric, kind, quant, bits, scenario)
                    native = index._native
                    tag = f"{metric}/{kind}/{quant}{bits or ''}/{scenario}"
                    for ef in EFS:
                        ids, dist = index.search(queries, K, ef=ef, threads=1)
                        yield f"{tag}/ef{ef}/plain", ids, dist
                        one = [index.search(queries[i], K, ef=ef) for i in range(2)]
                        yield f"{tag}/ef{ef}/one", np.stack([o[0] for o in one]), np.stack([o[1] for o in one])
                        for w, where in enumerate(WHERES):
                            for strategy in STRATEGIES if kind == "hnsw" else ("auto",):
                                ids, dist = native.search(queries, K, ef, 1, native_filter(where), strategy)
                                yield f"{tag}/ef{ef}/where{w}/{strategy}", ids, dist
                        for where in (None, WHERES[1]):
                            for strategy in ("auto", "exact", "graph") if kind == "hnsw" else ("auto",):
                                pages = native.search_groups(
                                    queries, 4, "doc", 2, ef, 1, native_filter(where), strategy
                                )
                                flat_ids, flat_dist = [], []
                                for page in pages:
                                    for _key, g_ids, g_dist, *_ in page:
                                        flat_ids.extend([-7, *[int(i) for i in g_ids]])
                                        flat_dist.extend([0.0, *[float(d) for d in g_dist]])
                                name = f"{tag}/ef{ef}/groups{where is not None:d}/{strategy}"
                                yield name, np.array(flat_ids, np.int64), np.array(flat_dist, np.float32)


def main() -> int:
    """Entry point: record or compare."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("record", "compare"))
    parser.add_argument("path")
    args = parser.parse_args()
    got = {}
    for name, ids, dist in _runs():
        got[name + "#ids"] = np.asarray(ids, np.int64)
        got[name + "#dist"] = np.asarray(dist, np.float32).view(np.uint32)
    if args.mode == "record":
        np.savez_compressed(args.path, **got)
        print(f"recorded {len(got) // 2} answers to {args.path}")
        return 0
    ref = np.load(args.path)
    bad = [k for k in ref.files if k not in got or not np.array_equal(ref[k], got[k])]
    bad += [k for k in got if k not in ref.files]
    print(f"compared {len(ref.files) // 2} answers: {len(bad)} differ")
    for k in bad[:20]:
        print("  differs:", k)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
