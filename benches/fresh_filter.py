"""Fresh-process harness for the filtered-search comparison (issue 28), by the rule of
``benches/fresh.py``: a figure a rerun agrees with.

``bench_filter.py`` runs every library in one process and times them in interleaved rounds. This
script runs it ``--repeats`` times (>= 3), each a fresh process writing its JSON to ``--out``
(``benches/out/``, git-ignored), then keeps, per dataset and filter:

- each **competitor**'s **best** process (its median QPS over the interleaved rounds);
- each **kbcore** variant's **median** process (the lower middle for an even count);
- the ratio kbcore ÷ best anchor as kept ÷ kept, with the min–max of the per-process ratios
  (kbcore over the best anchor of the same process).

kbcore's recall@10 at its operating point is printed next to it (the figure counts only at
recall >= 0.95). ``os.getloadavg()`` is recorded before and after every process; the harness
refuses to start above ``--max-load`` unless ``--force``.

Run from the repository root::

    python -m benches.fresh_filter --datasets scifact \\
        --libs kbcore-sq8,hnswlib,faiss,qdrant-edge,qdrant-edge-acorn,numpy --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benches" / "out"
MIN_REPEATS = 3


def is_kbcore(lib: str) -> bool:
    """kbcore's variants are judged on their median process, the others on their best."""
    return lib.startswith("kbcore")


def lower_median(values: Sequence[float]) -> float:
    """The median, or the lower middle value for an even count (never flatters kbcore)."""
    s = sorted(values)
    return s[(len(s) - 1) // 2]


def summarise(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, filter) from the JSON of several bench_filter processes."""
    rows: list[dict[str, Any]] = []
    names = [ds["name"] for ds in runs[0]["datasets"]]
    for ds_name in names:
        per_run = [next(d for d in r["datasets"] if d["name"] == ds_name) for r in runs]
        for case_name, case0 in per_run[0]["cases"].items():
            inter = [d["cases"][case_name].get("interleaved") for d in per_run]
            if any(i is None for i in inter):
                continue
            libs = sorted({lib for i in inter for lib in i["qps_median"]})
            kept: dict[str, float] = {}
            for lib in libs:
                vals = [i["qps_median"][lib] for i in inter if lib in i["qps_median"]]
                kept[lib] = lower_median(vals) if is_kbcore(lib) else max(vals)
            anchors = {lib: q for lib, q in kept.items() if not is_kbcore(lib)}
            if not anchors:
                continue
            best = max(anchors, key=lambda a: anchors[a])
            for v in (lib for lib in libs if is_kbcore(lib)):
                per_process = [
                    i["qps_median"][v] / max(q for lib, q in i["qps_median"].items() if not is_kbcore(lib))
                    for i in inter
                    if v in i["qps_median"]
                ]
                # kbcore's operating point (the lowest ef of its sweep reaching the target).
                recall = [d["cases"][case_name]["libs"].get(v) or {} for d in per_run]
                rows.append(
                    {
                        "dataset": ds_name,
                        "filter": case_name,
                        "pass": case0["fraction"],
                        "kbcore": v,
                        "kbcore_qps": kept[v],
                        "recall": min((r.get("recall", float("nan")) for r in recall), default=float("nan")),
                        "best_anchor": best,
                        "anchor_qps": anchors[best],
                        "ratio": kept[v] / anchors[best],
                        "ratio_min": min(per_process),
                        "ratio_max": max(per_process),
                        "anchors": anchors,
                    }
                )
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The table RESULTS.md quotes."""
    out = [
        "| dataset | filter | pass | kbcore (median process) | recall@10 | QPS | best anchor (best process) "
        "| QPS | ratio (per-process min–max) |",
        "|---|---|---:|---|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['dataset']} | {r['filter']} | {r['pass']:.2%} | {r['kbcore']} | {r['recall']:.3f} "
            f"| {r['kbcore_qps']:,.0f} | {r['best_anchor']} | {r['anchor_qps']:,.0f} "
            f"| **{r['ratio']:.2f}×** ({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="scifact")
    ap.add_argument("--libs", default="kbcore-sq8,hnswlib,faiss,qdrant-edge,qdrant-edge-acorn,numpy")
    ap.add_argument("--repeats", type=int, default=MIN_REPEATS)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--max-load", type=float, default=0.5)
    ap.add_argument("--force", action="store_true", help="run even above --max-load")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    ap.add_argument("--reuse", action="store_true", help="only summarise the JSON already in --out")
    ap.add_argument("extra", nargs="*", help="passed on to bench_filter (after --)")
    args = ap.parse_args(argv)
    if args.repeats < MIN_REPEATS and not args.reuse:
        ap.error(f"--repeats must be at least {MIN_REPEATS}: a competitor is judged on its best of >= 3 processes")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / f"filter-{args.datasets.replace(',', '+')}-{r}.json" for r in range(args.repeats)]
    if not args.reuse:
        load = os.getloadavg()[0]
        if load > args.max_load and not args.force:
            print(f"1-minute load {load:.2f} > --max-load {args.max_load}: not a quiet machine", file=sys.stderr)
            return 2
        for path in files:
            before = os.getloadavg()
            cmd = [sys.executable, "-m", "benches.bench_filter", "--datasets", args.datasets]
            cmd += ["--libs", args.libs, "--json", str(path), *args.extra]
            subprocess.run(cmd, check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
            print(f"{path.name}: load {before[0]:.2f} -> {os.getloadavg()[0]:.2f}", file=sys.stderr)
    runs = [json.loads(p.read_text()) for p in files if p.exists()]
    if not runs:
        print(f"no results in {out}", file=sys.stderr)
        return 1
    table = markdown(summarise(runs))
    loads = ", ".join(f"{r['loadavg_start'][0]:.2f}->{r['loadavg_end'][0]:.2f}" for r in runs)
    text = f"{len(runs)} processes; load average per process {loads}\n\n{table}\n"
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
