"""A/B of the hybrid retrieve path in one process (issue 28, h41): the retrieval module of a
base commit against the working tree's, interleaved passes over SciFact's 300 queries.

    python -m benches.trials.hybrid_ab_trial [--base a1f9cd6] [--ef 32] [--passes 6] [--kb DIR]
        [--fusion rrf|zscore|linear] [--threads 0]

Builds (once, into --kb) the knowledge base of ``benches.bench_engine_peers`` (SciFact chunks,
pre-embedded, SQ8 HNSW), then alternates passes of ``kb.retrieve(text, 10, ef=, search_type=
"hybrid", fusion=, query_vector=v)`` through the base module and the current one. Per pass
it records each query's wall time, calling-thread CPU time and process CPU time (all threads);
prints the median over passes of each pass's p50, and new / old ratios. Also checks that both
paths return identical hits (ids, scores, order) for every query.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def load_base(commit: str):
    src = subprocess.run(
        ["git", "show", f"{commit}:src/kbcore/engine/retrieval.py"], capture_output=True, text=True, check=True
    ).stdout
    path = Path(tempfile.mkdtemp()) / "retrieval_base.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("kbcore.engine._retrieval_base", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="a1f9cd6")
    ap.add_argument("--ef", type=int, default=32)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--kb", default="/tmp/h41kb")
    ap.add_argument("--data", default=None)
    ap.add_argument("--fusion", default="rrf", choices=["rrf", "zscore", "linear"])
    ap.add_argument("--threads", type=int, default=0, help="kbcore.index.set_search_threads (0: the default)")
    args = ap.parse_args()

    from benches import bench_engine_peers as bp

    from kbcore.engine import Engine, knowledge_base
    from kbcore.index import set_search_threads

    set_search_threads(args.threads)
    data = bp.load(args.data, None, None)
    root = Path(args.kb)
    if not (root / "kb").exists() and not root.exists():
        peer = bp.Kbcore(str(root), data)
        for s, e in data.batches:
            peer.ingest_batch(s, e)
        peer.finish_ingest()
        peer.close()
    engine = Engine(str(root))
    kb = engine.get_knowledge_base("kb")
    kb.wait_until_indexed()
    new = knowledge_base.retrieval
    old = load_base(args.base)
    texts, qs, ef = data.query_texts, data.queries, args.ef

    def run(mod):
        knowledge_base.retrieval = mod
        wall, thr, proc, out = [], [], [], []
        for i in range(len(texts)):
            w0, t0, p0 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
            hits = kb.retrieve(texts[i], 10, ef=ef, search_type="hybrid", fusion=args.fusion, query_vector=qs[i])
            p1, t1, w1 = time.process_time_ns(), time.thread_time_ns(), time.perf_counter_ns()
            wall.append(w1 - w0)
            thr.append(t1 - t0)
            proc.append(p1 - p0)
            out.append([(h.id, h.score, h.distance) for h in hits])
        knowledge_base.retrieval = new
        return statistics.median(wall), statistics.median(thr), statistics.median(proc), out

    gc.disable()
    run(old), run(new)  # warm
    res = {"old": [], "new": []}
    answers = {}
    for p in range(args.passes):
        for name, mod in (("old", old), ("new", new)) if p % 2 == 0 else (("new", new), ("old", old)):
            w, t, pr, out = run(mod)
            res[name].append((w, t, pr))
            answers[name] = out
    gc.enable()
    same = answers["old"] == answers["new"]
    print(f"identical hits on all {len(texts)} queries: {same}")
    for j, label in enumerate(("wall", "thread cpu", "process cpu")):
        o = statistics.median(r[j] for r in res["old"]) / 1e3
        n = statistics.median(r[j] for r in res["new"]) / 1e3
        per_old = [round(r[j] / 1e3, 1) for r in res["old"]]
        per_new = [round(r[j] / 1e3, 1) for r in res["new"]]
        print(f"{label:12s} p50 us: old {o:7.1f}  new {n:7.1f}  new/old {n / o:.3f}  old {per_old} new {per_new}")
    engine.close()
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
