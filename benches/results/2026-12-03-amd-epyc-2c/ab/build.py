"""Build the synthetic 100k sq8 index with bench_filter's attributes once (new kbcore), save it.

Run from /work/main (``python benches/results/.../ab/build.py``); writes to /work/ab/."""

import sys

sys.path.insert(0, "/work/main")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from benches.bench_filter import draw_attributes  # noqa: E402
from benches.datasets import make_synthetic  # noqa: E402

import kbcore  # noqa: E402

ds = make_synthetic(100_000, 300)
bucket, tag = draw_attributes(ds.n)
idx = kbcore.Index(ds.base.shape[1], metric="cosine", kind="hnsw", M=16, ef_construction=200, quantization="sq8")
table = pa.table({"bucket": pa.array(bucket, pa.int64())})
idx.add(ds.base, np.arange(ds.n, dtype=np.int64), metadata=table, threads=2)
idx.save("/work/ab/syn100k_sq8.kbi")
np.save("/work/ab/q.npy", ds.queries[:300])
print("built", len(idx), (bucket < 500).mean())
