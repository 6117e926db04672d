"""A fixed single-thread search loop whose instruction count compares two builds.

Wall-clock time means nothing on a shared machine; instructions retired by the search do.
``build DIR`` saves three seeded synthetic indexes (20k x 384, float32 / SQ8 / RaBitQ 4 bits);
``run DIR NAME`` loads one and runs 500 queries at ef 32 on one thread. Count the search only:

    python tools/search_instructions.py build build/instr
    valgrind --tool=callgrind --collect-atstart=no \
        --toggle-collect='kbcore::Index::search(*' --callgrind-out-file=/dev/null \
        python tools/search_instructions.py run build/instr sq8 2>&1 | grep 'Collected'
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import kbcore

N, DIM, NQ, EF, K = 20_000, 384, 500, 32, 10
KINDS: dict[str, dict[str, object]] = {
    "float32": {},
    "sq8": {"quantization": "sq8"},
    "rabitq": {"quantization": "rabitq", "bits": 4},
}


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2026)
    centres = rng.standard_normal((64, DIM)).astype(np.float32)
    rows = centres[rng.integers(0, 64, N)] + 0.6 * rng.standard_normal((N, DIM)).astype(np.float32)
    queries = centres[rng.integers(0, 64, NQ)] + 0.6 * rng.standard_normal((NQ, DIM)).astype(np.float32)
    return rows, queries


def main() -> int:
    """Entry point: build the indexes or run the search loop on one."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("build", "run"))
    parser.add_argument("dir")
    parser.add_argument("name", nargs="?", choices=tuple(KINDS))
    args = parser.parse_args()
    rows, queries = _data()
    if args.mode == "build":
        os.makedirs(args.dir, exist_ok=True)
        for name, kw in KINDS.items():
            index = kbcore.Index(DIM, "cosine", "hnsw", seed=1, **kw)  # type: ignore[arg-type]
            index.add(rows, np.arange(N, dtype=np.int64))
            index.save(os.path.join(args.dir, name))
        return 0
    index = kbcore.Index.load(os.path.join(args.dir, args.name))
    ids, _ = index.search(queries, K, ef=EF, threads=1)
    print(args.name, "checksum", int(ids.sum()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
