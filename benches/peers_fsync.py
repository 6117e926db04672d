"""What each system of ``bench_engine_peers`` does to make an ingest batch durable, observed with
strace: the sync system calls (fsync, fdatasync, msync, sync_file_range, syncfs) made on any
thread or child process between the start and the return of each 1k-row batch.

Run from the repository root (Linux, strace installed)::

    python -m benches.peers_fsync [--peers kbcore,zvec,lancedb,chroma,milvus-lite] [--n 2000]

It runs one child per system under ``strace -f`` and splits the trace at markers (``getppid``
calls the child makes before and after each batch). A batch with no sync call is durable against
a process crash at most, not against a power loss or an OS crash. Calls from a system's
background threads that happen to fall inside a batch are counted with it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

SYNC_CALLS = ("fsync", "fdatasync", "msync", "sync_file_range", "syncfs")
REPO_ROOT = Path(__file__).resolve().parents[1]


def child(name: str, n: int) -> None:
    """Ingests the first ``n`` SciFact chunks into ``name`` in 1k-row batches, with markers."""
    from benches import bench_engine_peers as peers

    data = peers.load(None, n, 5)
    root = tempfile.mkdtemp(prefix=f"peers-fsync-{name}-")
    try:
        peer = peers.PEERS[name](root, data)
        os.getppid()  # marker: batches begin
        for start, end in data.batches:
            peer.ingest_batch(start, end)
            os.getppid()  # marker: one batch returned
        peer.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def count(trace: str) -> list[Counter]:
    """Sync calls per segment between markers: [before, batch 1, ..., batch k, after]."""
    segments: list[Counter] = [Counter()]
    call = re.compile(r"\b(" + "|".join(SYNC_CALLS) + r")\(")
    for line in trace.splitlines():
        if "getppid(" in line:
            segments.append(Counter())
            continue
        m = call.search(line)
        if m:
            segments[-1][m.group(1)] += 1
    return segments


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="kbcore,zvec,lancedb,chroma,milvus-lite")
    ap.add_argument("--n", type=int, default=2000, help="chunks ingested (about n / 1000 batches)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.n)
        return 0
    if shutil.which("strace") is None:
        print("strace not found (apt-get install strace)", file=sys.stderr)
        return 2
    calls = ",".join((*SYNC_CALLS, "getppid"))
    for name in [p for p in args.peers.split(",") if p]:
        with tempfile.NamedTemporaryFile(suffix=".strace") as out:
            cmd = ["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", out.name, sys.executable, "-m"]
            cmd += ["benches.peers_fsync", "--child", name, "--n", str(args.n)]
            rc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False).returncode
            segments = count(Path(out.name).read_text())
        batches = segments[1:-1]
        per_batch = ", ".join(dict(c).__repr__() if c else "none" for c in batches)
        print(f"{name:12s} rc {rc}: sync calls per batch: {per_batch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
