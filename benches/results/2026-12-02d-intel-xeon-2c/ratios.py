"""Ratios of each kbcore quantized variant to each anchor from a bench_quant JSON (per-pass QPS)."""

import json
import statistics
import sys

with open(sys.argv[1]) as fh:
    r = json.load(fh)
mine = [x for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else ["kbcore-sq8", "kbcore-rabitq"]
print("load start", r["load_start"], "end", r.get("load_end"))
for dname, d in r["datasets"].items():
    s = d["summary"]
    print(f"\n== {dname}")
    for lib, b in d["build"].items():
        print(
            f"  {lib:20s} build {b.get('build_s', 0):7.1f} s  RSS {b.get('rss_bytes_per_vector', 0):7.0f} B  "
            + "  ".join(f"@{t} {s[lib]['qps_median'][t] or 0:8.0f}" for t in ("0.95", "0.99"))
        )
    anchors = [x for x in s if not x.startswith("kbcore")]
    for t in ("0.95", "0.99"):
        best = max((a for a in anchors if s[a]["qps_median"][t]), key=lambda a: s[a]["qps_median"][t], default=None)
        for m in mine:
            if m not in s or not s[m]["qps_median"][t]:
                continue
            cells = []
            for a in anchors + [x for x in s if x.startswith("kbcore") and x != m]:
                rs = [p / q for p, q in zip(s[m]["qps_per_pass"][t], s[a]["qps_per_pass"][t]) if p and q]
                if rs:
                    tag = "*" if a == best else ""
                    cells.append(f"{a}{tag} {statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})")
            print(f"  @{t} {m}: " + "; ".join(cells))
    sw = d["sweep"]
    print("  recall per ef:", sw[list(sw)[0]]["efs"])
    for lib in sw:
        print(f"   {lib:20s}", " ".join(f"{x:.3f}" for x in sw[lib]["recall"]))
