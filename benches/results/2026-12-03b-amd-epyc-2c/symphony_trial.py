"""Inputs of symphony_trial.cpp: SciFact chunk indexes (RaBitQ 1-bit and 4-bit, SQ8; M = 16,
ef_construction = 200, ids = row numbers), the queries as raw float32 and the exact top-100 as
raw int64. Usage: python symphony_trial.py OUTDIR [--data DIR]"""

import argparse
import sys
from pathlib import Path

import numpy as np

import kbcore

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benches.datasets import load_scifact, make_synthetic  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("--data", default=None)
p.add_argument("--synthetic", type=int, default=0, help="also a synthetic set of this many rows")
a = p.parse_args()
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
sets = [("scifact", load_scifact(a.data))]
if a.synthetic:
    sets.append((f"syn{a.synthetic}", make_synthetic(a.synthetic, 1000)))
for name, ds in sets:
    ds.queries.astype(np.float32).tofile(out / f"{name}_queries.f32")
    np.ascontiguousarray(ds.gt_ids, dtype=np.int64).tofile(out / f"{name}_gt.i64")
    for label, kw in [
        ("rabitq1", {"quantization": "rabitq", "bits": 1}),
        ("rabitq4", {"quantization": "rabitq", "bits": 4}),
        ("sq8", {"quantization": "sq8"}),
    ]:
        ix = kbcore.Index(ds.dim, metric="cosine", kind="hnsw", M=16, ef_construction=200, seed=1, **kw)
        ix.add(ds.base, np.arange(ds.n, dtype=np.int64), threads=2)
        ix.save(str(out / f"{name}_{label}.kbi"))
        print(name, label, "saved", flush=True)
