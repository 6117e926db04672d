"""SciFact float32 index with a document_id column (4 chunks per id), built once and saved to /work/gab/."""

import sys

sys.path.insert(0, "/work/main")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from benches.datasets import load_scifact  # noqa: E402

import kbcore  # noqa: E402

ds = load_scifact("/work/shared/data")
idx = kbcore.Index(384, metric="cosine", kind="hnsw", M=16, ef_construction=200, ef=64)
table = pa.table({"document_id": pa.array(np.arange(ds.n) // 4, pa.int64())})
idx.add(ds.base, np.arange(ds.n, dtype=np.int64), metadata=table, threads=2)
idx.save("/work/gab/sf.kbi")
np.save("/work/gab/q.npy", ds.queries)
