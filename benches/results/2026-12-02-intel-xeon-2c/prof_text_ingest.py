"""The flat text ingest of bench_engine (SciFact documents, hashing embedder), timed alone.

Run from a repository root with that checkout's venv: best of 2 unprofiled runs, then a
cProfile of a third (tottime top 18).
"""

import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from benches.bench_engine import load  # noqa: E402

from kbcore import Engine  # noqa: E402
from kbcore.engine import Document  # noqa: E402


def main() -> None:
    data = load(Path(os.environ.get("KBCORE_DATA", "/work/shared/data")) / "scifact")
    docs = [
        Document(
            text=(d["title"] + " " + d["text"]).strip(),
            document_id=d["id"],
            metadata={"structured": bool(d["metadata"]["structured"])},
        )
        for d in data["docs"]
    ]
    best = float("inf")
    pr = cProfile.Profile()
    for rep in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            eng = Engine(tmp)
            kb = eng.create_knowledge_base("text", index="flat", chunk_size=500, chunk_overlap=50)
            t0 = time.perf_counter()
            if rep == 2:
                pr.enable()
            kb.ingest_many(docs, progress=False)
            if rep == 2:
                pr.disable()
            if rep < 2:
                best = min(best, time.perf_counter() - t0)
            eng.close()
    print("best of 2 unprofiled:", round(best, 3), "s")
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
