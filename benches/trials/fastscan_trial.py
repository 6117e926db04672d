"""Inputs of fastscan_trial.cpp: SciFact chunk indexes (RaBitQ 1-bit and SQ8; M = 16,
ef_construction = 200, seed 1, ids = row numbers), the queries as raw float32 and the exact
top-10 as raw int64. Usage: python benches/trials/fastscan_trial.py OUTDIR [--data DIR]"""

import argparse
import sys
from pathlib import Path

import numpy as np

import kbcore

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benches.datasets import load_scifact  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--data", default=None)
a = p.parse_args()
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
ds = load_scifact(a.data)
ds.queries.astype(np.float32).tofile(out / "queries.f32")
np.ascontiguousarray(ds.gt_ids, dtype=np.int64).tofile(out / "gt.i64")
for label, kw in [("rabitq1", {"quantization": "rabitq", "bits": 1}), ("sq8", {"quantization": "sq8"})]:
    ix = kbcore.Index(ds.dim, metric="cosine", kind="hnsw", M=16, ef_construction=200, seed=1, **kw)
    ix.add(ds.base, np.arange(ds.n, dtype=np.int64), threads=2)
    ix.save(str(out / f"{label}.kbi"))
    print(label, "saved", flush=True)
