"""One process: 9 timed passes (median) of search and of search_groups, k 10, ef 64, one thread."""

import sys
import time

import numpy as np

import kbcore

idx = kbcore.Index.load("/work/gab/sf.kbi")
q = list(np.load("/work/gab/q.npy"))


def qps(fn):
    for r in q:
        fn(r)
    ts = []
    for _ in range(9):
        s = time.perf_counter()
        for r in q:
            fn(r)
        ts.append(time.perf_counter() - s)
    return len(q) / sorted(ts)[4]


a = qps(lambda r: idx.search(r, 10, ef=64, threads=1))
b = qps(lambda r: idx.search_groups(r, 10, ef=64, threads=1))
print(sys.argv[1], f"search {a:.0f} groups {b:.0f}")
