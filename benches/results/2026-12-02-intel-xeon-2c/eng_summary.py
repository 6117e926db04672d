"""Old vs new bench_engine rounds: median of rounds per figure, and the min-max of new/old.

Usage: python eng_summary.py DIR (DIR holds eng_old_N.json and eng_new_N.json).
"""

import glob
import json
import statistics
import sys

FIGS = [
    ("overhead_plain", "engine_only_us"),
    ("overhead_plain", "median_overhead_us"),
    ("overhead_plain", "median_native_us"),
    ("overhead_dedup", "engine_only_us"),
    ("overhead_dedup", "median_overhead_us"),
    ("preembedded_ingest", "chunks_per_s"),
    ("preembedded_ingest", "engine_chunks_per_s"),
    ("text_ingest", "chunks_per_s"),
]


def load(d: str, tag: str) -> list:
    out = []
    for f in sorted(glob.glob(f"{d}/eng_{tag}_*.json")):
        with open(f) as fh:
            out.append(json.load(fh))
    return out


def main() -> None:
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    old, new = load(d, "old"), load(d, "new")
    print(f"rounds: old {len(old)}, new {len(new)}")
    for r in old + new:
        print("  load", [round(x, 2) for x in r["loadavg_start"]], "->", [round(x, 2) for x in r["loadavg_end"]])
    for kind in ("hnsw", "flat"):
        print(f"== {kind}")
        for a, b in FIGS:
            o = [next(x for x in r["runs"] if x["index"] == kind)[a][b] for r in old]
            n = [next(x for x in r["runs"] if x["index"] == kind)[a][b] for r in new]
            ratios = [y / x for x, y in zip(o, n)]
            print(
                f"  {a}.{b:<22s} old {statistics.median(o):10.1f}  new {statistics.median(n):10.1f}  "
                f"new/old median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
            )


if __name__ == "__main__":
    main()
