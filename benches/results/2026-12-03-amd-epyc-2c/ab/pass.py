"""One process: load the index, warm up, time 15 passes (median) of the 300 queries at 50 % (bucket<500), ef 16.

(ab.log was timed with 3 passes and the median of those, ab15.log with this file.)"""

import sys
import time

import numpy as np

import kbcore

idx = kbcore.Index.load("/work/ab/syn100k_sq8.kbi")
q = list(np.load("/work/ab/q.npy"))
where = {"bucket": {"$lt": 500}}
ids = [idx.search(r, k=10, ef=16, where=where, threads=1)[0] for r in q]  # warm-up
np.save(f"/work/ab/ids_{sys.argv[1]}.npy", np.array(ids))
ts = []
for _ in range(15):
    t = time.perf_counter()
    for r in q:
        idx.search(r, k=10, ef=16, where=where, threads=1)
    ts.append(time.perf_counter() - t)
print(f"{sys.argv[1]} {len(q) / sorted(ts)[7]:.0f}")
