"""Fresh-process harness for the graph-index comparison (issue 28): a figure a rerun agrees with.

Each library runs alone in its own fresh process (``python -m benches.bench_quant --libs LIB``),
``--repeats`` times (>= 3), in interleaved order: every library's run 1, then every library's run
2 (the order rotated by one each repeat), and so on, so that a burst of outside load lands on one
process of each library instead of on all of one library's processes. Each process writes its
JSON to ``--out`` (``benches/out/``, git-ignored); this script reads them back and prints one
Markdown table.

Which process counts:

- a **competitor** (any library not starting with ``kbcore``) is judged on its **best** process,
  by QPS at each recall target separately: no competitor is judged on a slow process;
- a **kbcore** variant is judged on its **median** process (the lower middle for an even count);
- each ratio kbcore / anchor is the kept kbcore process over the kept anchor process; its spread is
  the min-max of the per-repeat ratios (kbcore run r over anchor run r, processes that ran next to
  each other in time).

Within a process, QPS at recall@10 0.95 and 0.99 is interpolated over the ef grid per pass, and the
process's figure is the median over its passes (``benches/bench_quant.py``). With ``--batch`` each
process also times one batch call over all queries on one thread for the libraries that have a
batch API, next to the one-query-per-call loop.

``os.getloadavg()`` is recorded before and after every process. The harness refuses to start when
the 1-minute load is above ``--max-load`` (default 0.5; ``--force`` runs anyway) and flags every
process that started above it (``!`` in the table, and in the JSON).

Run from the repository root::

    python -m benches.fresh --dataset scifact --libs kbcore-sq8,kbcore-rabitq,hnswlib,zvec-int8
    python -m benches.fresh --dataset synthetic --n 2000 --nq 50 --passes 1 --repeats 1 \\
        --libs kbcore,hnswlib --efs 10,32 --max-load 100      # smoke run (seconds)
    python -m benches.fresh --dataset synthetic --n 1000000 --index-cache /big/disk/idx \
        --libs kbcore-sq8,symqg,zvec-int8,hnswlib --wait-quiet 120   # 1M: one build per library

With ``--index-cache DIR`` each library's index is built once, in an untimed process, and saved
to ``DIR`` with the library's own persistence; every timed process then reopens it (kbcore
``Index.load``, hnswlib ``load_index``, SymphonyQG ``SymqgIndex.load``, a zvec collection
opened read-only). A timed process is still a fresh process; only the build is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benches" / "out"
TARGETS = ("0.95", "0.99")
MIN_REPEATS = 3


def is_kbcore(lib: str) -> bool:
    """kbcore's own variants are judged on their median process, the others on their best."""
    return lib.startswith("kbcore")


def schedule(libs: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, library) in run order: all libraries once per repeat, the order rotated by one
    each repeat so that no library always runs first (or right after the same neighbour)."""
    out: list[tuple[int, str]] = []
    for r in range(repeats):
        k = r % len(libs)
        out.extend((r, lib) for lib in list(libs[k:]) + list(libs[:k]))
    return out


def run_process(cmd: Sequence[str], log_path: Path, timeout: float | None) -> int:
    """Runs one benchmark process, its stdout and stderr into ``log_path``; returns its exit code
    (-9 when it ran past ``timeout`` seconds and was killed)."""
    with open(log_path, "w") as fh:
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO_ROOT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            fh.write(f"\nKILLED after {timeout} s (--timeout)\n")
            return -9
    return proc.returncode


def wait_for_quiet(max_load: float, wait_s: float, step_s: float = 15.0) -> float:
    """Sleeps in ``step_s`` steps while the 1-minute load is above ``max_load``, at most ``wait_s``
    seconds; returns the load when it stopped waiting."""
    deadline = time.monotonic() + wait_s
    load = os.getloadavg()[0]
    while load > max_load and time.monotonic() < deadline:
        time.sleep(min(step_s, max(0.0, deadline - time.monotonic())))
        load = os.getloadavg()[0]
    return load


def pick(values: Sequence[tuple[int, float]], how: str) -> tuple[int, float] | None:
    """(repeat, qps) kept among the processes that reached the target: the best or the median."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: v[1])
    if how == "best":
        return ordered[-1]
    return ordered[(len(ordered) - 1) // 2]


def collect(runs: Sequence[dict[str, Any]], dataset: str) -> dict[str, dict[str, Any]]:
    """Per library: each process's QPS at each target (loop and batch), the kept process, min-max."""
    per_lib: dict[str, dict[str, Any]] = {}
    for run in runs:
        lib = run["lib"]
        entry = per_lib.setdefault(lib, {"processes": [], "failed": 0, "skipped": None})
        if run["returncode"] != 0 or run.get("result") is None:
            entry["failed"] += 1
            continue
        ds = next(iter(run["result"]["datasets"].values()), None) if run["result"]["datasets"] else None
        if ds is None:
            entry["failed"] += 1
            continue
        if "skipped" in ds["build"].get(lib, {}):
            entry["skipped"] = ds["build"][lib]["skipped"]
            continue
        s = ds["summary"].get(lib, {})
        entry["processes"].append(
            {
                "repeat": run["repeat"],
                "loaded": run["loaded"],
                "qps": s.get("qps_median", {}),
                "batch_qps": s.get("batch_qps_median"),
                "build": ds["build"].get(lib, {}),
            }
        )
    for lib, entry in per_lib.items():
        how = "median" if is_kbcore(lib) else "best"
        entry["how"] = how
        entry["kept"] = {}
        for t in TARGETS:
            vals = [(p["repeat"], p["qps"][t]) for p in entry["processes"] if p["qps"].get(t) is not None]
            kept = pick(vals, how)
            entry["kept"][t] = (
                None
                if kept is None
                else {
                    "repeat": kept[0],
                    "qps": kept[1],
                    "min": min(v for _, v in vals),
                    "max": max(v for _, v in vals),
                    "reached": len(vals),
                }
            )
            if kept is not None:
                proc = next(p for p in entry["processes"] if p["repeat"] == kept[0])
                b = proc["batch_qps"]
                entry["kept"][t]["batch_qps"] = None if b is None else b.get(t)
                entry["kept"][t]["loaded"] = proc["loaded"]
    return per_lib


def ratios(per_lib: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every kbcore variant / every anchor at each target: kept / kept, and the per-repeat spread."""
    out = []
    kb = [lib for lib in per_lib if is_kbcore(lib)]
    anchors = [lib for lib in per_lib if not is_kbcore(lib)]
    for k in kb:
        for a in anchors:
            row: dict[str, Any] = {"kbcore": k, "anchor": a}
            for t in TARGETS:
                kk, ka = per_lib[k]["kept"].get(t), per_lib[a]["kept"].get(t)
                if kk is None or ka is None:
                    row[t] = None
                    continue
                by_rep = {p["repeat"]: p["qps"].get(t) for p in per_lib[a]["processes"]}
                pairs = [
                    p["qps"][t] / by_rep[p["repeat"]]
                    for p in per_lib[k]["processes"]
                    if p["qps"].get(t) is not None and by_rep.get(p["repeat"])
                ]
                row[t] = {
                    "ratio": kk["qps"] / ka["qps"],
                    "min": min(pairs) if pairs else None,
                    "max": max(pairs) if pairs else None,
                }
            out.append(row)
    return out


def _k(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def markdown(dataset: str, per_lib: dict[str, dict[str, Any]], rats: list[dict[str, Any]], max_load: float) -> str:
    """The library table (kept process, its batch QPS, min-max) and the ratio table."""
    lines = [
        f"### {dataset}: QPS at recall@10, one thread (competitors: best process; kbcore: median process)",
        "",
        "| library | kept | QPS @0.95 (run) | min–max | batch @0.95 | QPS @0.99 (run) | min–max | batch @0.99 "
        "| B/vector | build s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lib, e in per_lib.items():
        if e["skipped"] is not None:
            lines.append(f"| {lib} | skipped: {e['skipped']} |" + " |" * 8)
            continue
        cells = []
        for t in TARGETS:
            kt = e["kept"].get(t)
            if kt is None:
                cells += [f"never ≥ {t}", "", ""]
                continue
            flag = "!" if kt["loaded"] else ""
            cells += [
                f"{_k(kt['qps'])} (#{kt['repeat'] + 1}{flag})",
                f"{_k(kt['min'])}–{_k(kt['max'])} ({kt['reached']}/{len(e['processes'])})",
                _k(kt.get("batch_qps")),
            ]
        builds = [p["build"] for p in e["processes"] if "build_s" in p["build"]]
        bpv = statistics.median(b["rss_bytes_per_vector"] for b in builds) if builds else None
        bs = statistics.median(b["build_s"] for b in builds) if builds else None
        failed = f", {e['failed']} failed" if e["failed"] else ""
        lines.append(
            f"| {lib} | {e['how']}{failed} | "
            + " | ".join(cells)
            + f" | {'n/a' if bpv is None else f'{bpv:.0f}'} | {'n/a' if bs is None else f'{bs:.1f}'} |"
        )
    lines += [
        "",
        f"`!`: the process started with the 1-minute load above {max_load}. Batch: one call over all "
        "queries on one thread, in the kept process (n/a: no batch API, or run without --batch).",
        "",
        "| kbcore ÷ anchor | @0.95 (per-run min–max) | @0.99 (per-run min–max) |",
        "|---|---:|---:|",
    ]
    for r in rats:
        cells = []
        for t in TARGETS:
            v = r[t]
            if v is None:
                cells.append("n/a")
            elif v["min"] is None:
                cells.append(f"{v['ratio']:.2f}x")
            else:
                cells.append(f"{v['ratio']:.2f}x ({v['min']:.2f}–{v['max']:.2f})")
        lines.append(f"| {r['kbcore']} ÷ {r['anchor']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def prebuild(args: argparse.Namespace, libs: Sequence[str], out_dir: Path) -> None:
    """With ``--index-cache``: one untimed process per library builds its index and saves it
    there (``--recall-only``; skipped when an earlier run left it), so that every timed process
    reopens the same saved index instead of building its own: a 1M run then costs one build per
    library, not one per process. The timed processes stay fresh processes."""
    for lib in libs:
        cmd = [sys.executable, "-m", "benches.bench_quant", "--datasets", args.dataset, "--libs", lib]
        cmd += ["--recall-only", "--index-cache", str(args.index_cache)]
        for opt in ("n", "nq", "efs", "data"):
            if getattr(args, opt) is not None:
                cmd += [f"--{opt}", str(getattr(args, opt))]
        t0 = time.perf_counter()
        rc = run_process(cmd, out_dir / f"{lib}-build.log", args.timeout)
        print(f"build {lib}: exit {rc}, {time.perf_counter() - t0:.0f} s (untimed, saved to --index-cache)", flush=True)
        if rc != 0:
            raise SystemExit(f"the build process of {lib} failed (exit {rc}): see {out_dir / f'{lib}-build.log'}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="scifact", help="scifact, arguana or synthetic (one per invocation)")
    p.add_argument("--libs", required=True, help="comma-separated benches.bench_quant library names")
    p.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"fresh processes per library (>= {MIN_REPEATS})")
    p.add_argument("--passes", type=int, default=5, help="timed passes per ef inside each process")
    p.add_argument("--n", type=int, default=None, help="synthetic base size, or a prefix of a real set")
    p.add_argument("--nq", type=int, default=None, help="query count (synthetic), or a prefix of a real set's")
    p.add_argument("--efs", default=None, help="ef grid (default: bench_quant's)")
    p.add_argument("--data", default=None, help="data root (default $KBCORE_DATA)")
    p.add_argument("--no-batch", action="store_true", help="skip the one-thread batch pass")
    p.add_argument("--max-load", type=float, default=0.5, help="refuse to start above this 1-minute load")
    p.add_argument("--force", action="store_true", help="start even above --max-load (every such run is flagged)")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        help="before each process, wait up to this many seconds for the load to fall below --max-load",
    )
    p.add_argument("--out", default=str(DEFAULT_OUT), help="folder for the raw JSON (default benches/out/)")
    p.add_argument(
        "--index-cache",
        default=None,
        help="folder of saved indexes: each library is built once, untimed, then every timed process reopens it",
    )
    p.add_argument("--timeout", type=float, default=None, help="seconds before one process is killed")
    p.add_argument("--markdown", default=None, help="also write the table to this file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    libs = [x for x in args.libs.split(",") if x]
    if not libs:
        raise SystemExit("--libs names no library")
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    if args.repeats < MIN_REPEATS:
        print(f"WARNING: --repeats {args.repeats} < {MIN_REPEATS}: not a figure to quote", flush=True)
    load0 = os.getloadavg()
    if load0[0] > args.max_load:
        msg = f"1-minute load {load0[0]:.2f} > --max-load {args.max_load}: the machine is not quiet"
        if not args.force:
            print(f"REFUSED: {msg} (wait, or pass --force to run flagged)", file=sys.stderr, flush=True)
            return 2
        print(f"WARNING: {msg}; running because of --force, every such process is flagged", flush=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = Path(args.out) / f"fresh-{args.dataset}-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    plan = schedule(libs, args.repeats)
    if args.index_cache is not None:
        prebuild(args, libs, out_dir)
    for i, (rep, lib) in enumerate(plan):
        json_path = out_dir / f"{lib}-r{rep + 1}.json"
        cmd = [sys.executable, "-m", "benches.bench_quant", "--datasets", args.dataset, "--libs", lib]
        cmd += ["--passes", str(args.passes), "--json", str(json_path)]
        for opt in ("n", "nq", "efs", "data", "index_cache"):
            if getattr(args, opt) is not None:
                cmd += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
        if not args.no_batch:
            cmd.append("--batch")
        if args.wait_quiet > 0:
            wait_for_quiet(args.max_load, args.wait_quiet)
        before = os.getloadavg()
        loaded = before[0] > args.max_load
        t0 = time.perf_counter()
        rc = run_process(cmd, out_dir / f"{lib}-r{rep + 1}.log", args.timeout)
        wall = time.perf_counter() - t0
        after = os.getloadavg()
        result = json.loads(json_path.read_text()) if rc == 0 and json_path.exists() else None
        runs.append(
            {
                "repeat": rep,
                "lib": lib,
                "cmd": cmd,
                "returncode": rc,
                "wall_s": wall,
                "load_before": before,
                "load_after": after,
                "loaded": loaded,
                "result": result,
            }
        )
        print(
            f"[{i + 1}/{len(plan)}] {lib} run {rep + 1}: rc {rc}, {wall:.1f} s, load "
            f"{before[0]:.2f} -> {after[0]:.2f}{'  (LOADED)' if loaded else ''}",
            flush=True,
        )
    per_lib = collect(runs, args.dataset)
    rats = ratios(per_lib)
    md = markdown(args.dataset, per_lib, rats, args.max_load)
    summary = {
        "dataset": args.dataset,
        "libs": libs,
        "repeats": args.repeats,
        "passes": args.passes,
        "max_load": args.max_load,
        "load_start": load0,
        "load_end": os.getloadavg(),
        "runs": [{k: v for k, v in r.items() if k != "result"} for r in runs],
        "per_lib": per_lib,
        "ratios": rats,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n" + md, flush=True)
    print(f"\nraw JSON and logs: {out_dir}", flush=True)
    if args.markdown:
        Path(args.markdown).write_text(md + "\n")
    failed = [r for r in runs if r["returncode"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
