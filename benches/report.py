"""One benchmark report: kbcore next to hnswlib, faiss, usearch, numpy and bm25s (issue 7).

Run from the repository root::

    python -m benches.report [--data DIR] [--quick] [--only index,filter,...] [--large]
                             [--out benches/out] [--machine NAME] [--timeout S]
    python -m benches.report --from-json benches/out          # re-render, no benchmark runs

Every benchmark module runs in its own subprocess, one after the other, with ``--json`` into a
temporary folder. The report then writes, into ``--out``:

- ``<YYYY-MM-DD>-<machine>.json``: every number of every module, plus the machine (CPU model,
  cores, ``kbcore.simd_level()``, library versions, git commit) and the load average before and
  after the run and around each module;
- ``<YYYY-MM-DD>-<machine>.md``: the Markdown report, where each kbcore figure carries its
  ratio to the best anchor on that figure;
- ``<YYYY-MM-DD>-<machine>-*.png``: recall@10-vs-QPS curves per dataset and filtered QPS by
  selectivity per library.

``--quick`` runs each module's smoke configuration and appends ``-quick`` to the file names,
so a smoke run never overwrites a full one. A module that fails is reported as failed in its
section (with the end of its log) and the other modules still run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "benches" / "out"  # ignored by git; curated figures: benches/RESULTS.md
SCHEMA = 1
LOG_TAIL_LINES = 80
RECALL_TARGETS = ("0.95", "0.99")
HNSW_ANCHORS = ("hnswlib", "faiss", "usearch")
FILTER_ANCHORS = ("hnswlib", "faiss", "numpy")
COLOURS = {
    "kbcore": "tab:red",
    "hnswlib": "tab:blue",
    "faiss": "tab:green",
    "usearch": "tab:orange",
    "numpy": "tab:gray",
}


# ----------------------------------------------------------------------------------------------
# the modules


@dataclass(frozen=True)
class Module:
    """One benchmark module and the arguments the report gives it."""

    name: str  # the --only name
    module: str  # python -m target
    title: str
    quick_args: tuple[str, ...] = ()  # its smoke configuration (--quick where it has one)
    full_args: tuple[str, ...] = ()
    opt_in: bool = False  # runs only with --large or when named in --only
    full_minutes: str = ""  # expected duration of the full configuration on 2 quiet cores


MODULES: tuple[Module, ...] = (
    Module(
        "index",
        "benches.bench_index",
        "HNSW index: recall vs QPS, build, memory, save/load",
        quick_args=("--quick",),
        full_minutes="10-15",
    ),
    Module("filter", "benches.bench_filter", "Filtered search", quick_args=("--quick",), full_minutes="5-10"),
    Module("groups", "benches.bench_groups", "Grouped search", quick_args=("--quick",), full_minutes="2-5"),
    Module(
        "hybrid",
        "benches.bench_hybrid",
        "BM25 and hybrid search (index level)",
        quick_args=("--repeats", "1"),
        full_minutes="1",
    ),
    Module(
        "engine",
        "benches.bench_engine",
        "Knowledge engine (quality, overhead, ingest)",
        quick_args=("--index", "hnsw", "--rounds", "1"),
        full_minutes="1-2",
    ),
    Module(
        "engine_hybrid",
        "benches.bench_engine_hybrid",
        "Knowledge engine: hybrid retrieve",
        quick_args=("--rounds", "1"),
        full_minutes="1-2",
    ),
    Module(
        "index_1m",
        "benches.bench_index",
        "HNSW index at 1M x 384 (opt-in)",
        full_args=("--datasets", "synthetic", "--n", "1000000"),
        quick_args=("--datasets", "synthetic", "--n", "1000000"),
        opt_in=True,
        full_minutes="70-100",
    ),
)
MODULE_BY_NAME = {m.name: m for m in MODULES}


# ----------------------------------------------------------------------------------------------
# machine


def _cpuinfo() -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name") and "cpu_model" not in out:
                    out["cpu_model"] = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and "cpu_simd_flags" not in out:
                    flags = set(line.split(":", 1)[1].split())
                    out["cpu_simd_flags"] = sorted(f for f in flags if f.startswith(("avx", "sse4", "fma")))
    except OSError:
        pass
    if "cpu_model" not in out:
        out["cpu_model"] = platform.processor() or platform.machine()
    try:
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    out["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                    break
    except OSError:
        pass
    return out


def _git() -> dict[str, Any]:
    def run(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", "-C", str(REPO_ROOT), *args],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def machine_info() -> dict[str, Any]:
    """CPU, cores, SIMD level, library versions and git state of the process running the report."""
    from importlib import metadata

    info: dict[str, Any] = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }
    info.update(_cpuinfo())
    versions: dict[str, str | None] = {}
    for dist in (
        "kbcore",
        "numpy",
        "hnswlib",
        "faiss-cpu",
        "usearch",
        "bm25s",
        "pyarrow",
        "matplotlib",
        "pytest-benchmark",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    info["versions"] = versions
    try:
        import kbcore

        info["kbcore_simd_level"] = kbcore.simd_level()
        info["kbcore_available_simd_levels"] = list(kbcore.available_simd_levels())
        info["kbcore_path"] = os.path.dirname(kbcore.__file__)
    except Exception as exc:  # noqa: BLE001 - the report must still run and say why
        info["kbcore_simd_level"] = None
        info["kbcore_error"] = repr(exc)
    info["git"] = _git()
    return info


def machine_slug(info: dict[str, Any]) -> str:
    """A short file-name-safe name: the CPU model without marketing words, plus the core count."""
    model = str(info.get("cpu_model") or "unknown-cpu").lower()
    model = re.sub(r"\(r\)|\(tm\)|@.*$|\bcpu\b|\bprocessor\b|\b\d+-core\b", " ", model)
    words = re.findall(r"[a-z0-9]+", model)
    slug = "-".join(words)[:32].strip("-") or "unknown-cpu"
    return f"{slug}-{info.get('usable_cores') or info.get('cores')}c"


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ----------------------------------------------------------------------------------------------
# running the modules


def module_command(mod: Module, json_path: Path, *, quick: bool, data: str | None) -> list[str]:
    cmd = [sys.executable, "-m", mod.module, "--json", str(json_path)]
    if data:
        cmd += ["--data", data]
    cmd += list(mod.quick_args if quick else mod.full_args)
    return cmd


def run_module(mod: Module, cmd: list[str], timeout: float | None) -> dict[str, Any]:
    """Run one module, echo its output as it comes, and return its status, log tail and JSON."""
    json_path = Path(cmd[cmd.index("--json") + 1])
    entry: dict[str, Any] = {
        "title": mod.title,
        # The JSON goes to a temporary folder that is gone afterwards: name it generically.
        "command": [os.path.basename(cmd[0])]
        + [f"<tmp>/{json_path.name}" if a == str(json_path) else a for a in cmd[1:]],
        "loadavg_start": loadavg(),
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    lines: list[str] = []
    timed_out = threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        bufsize=1,
        start_new_session=True,
    )

    def kill() -> None:
        timed_out.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill) if timeout else None
    if timer is not None:
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            print(f"[{mod.name}] {line}", flush=True)
        rc = proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        entry.update(
            status="interrupted",
            returncode=None,
            log_tail=lines[-LOG_TAIL_LINES:],
            seconds=time.perf_counter() - t0,
            loadavg_end=loadavg(),
        )
        raise _Interrupted(entry) from None
    finally:
        if timer is not None:
            timer.cancel()
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    entry["loadavg_end"] = loadavg()
    entry["returncode"] = rc
    entry["log_tail"] = lines[-LOG_TAIL_LINES:]
    if timed_out.is_set():
        entry["status"] = "failed"
        entry["error"] = f"killed after the --timeout of {timeout:.0f} s"
    elif rc != 0:
        entry["status"] = "failed"
        entry["error"] = f"exit status {rc}"
    elif not json_path.exists():
        entry["status"] = "failed"
        entry["error"] = "exit status 0 but no JSON written"
    else:
        try:
            entry["result"] = json.loads(json_path.read_text(encoding="utf-8"))
            entry["status"] = "ok"
        except ValueError as exc:
            entry["status"] = "failed"
            entry["error"] = f"unreadable JSON: {exc}"
    return entry


class _Interrupted(Exception):  # noqa: N818 -- a control-flow signal carrying the entry, not an error
    def __init__(self, entry: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.entry = entry


def run_all(args: argparse.Namespace, selected: Sequence[Module]) -> dict[str, Any]:
    data = str(Path(args.data).resolve()) if args.data else None
    report: dict[str, Any] = {
        "kbcore_report": SCHEMA,
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "quick": args.quick,
        "data": data,
        "modules_selected": [m.name for m in selected],
        "loadavg_before": loadavg(),
        "machine": machine_info(),
        "modules": {},
    }
    print(
        f"report: modules {report['modules_selected']}, quick={args.quick}, load average {report['loadavg_before']}",
        flush=True,
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kbcore-report-") as tmp:
        for mod in selected:
            cmd = module_command(mod, Path(tmp) / f"{mod.name}.json", quick=args.quick, data=data)
            print(f"\n=== {mod.name}: {' '.join(cmd[1:])}", flush=True)
            try:
                entry = run_module(mod, cmd, args.timeout)
            except _Interrupted as stop:
                report["modules"][mod.name] = stop.entry
                report["interrupted"] = True
                print(f"=== {mod.name}: interrupted; writing the report of what ran", flush=True)
                break
            report["modules"][mod.name] = entry
            print(
                f"=== {mod.name}: {entry['status']} in {entry['seconds']:.0f} s"
                + (f" ({entry['error']})" if entry.get("error") else ""),
                flush=True,
            )
    report["loadavg_after"] = loadavg()
    report["total_s"] = round(time.perf_counter() - t0, 1)
    return report


# ----------------------------------------------------------------------------------------------
# formatting helpers


def num(x: Any, digits: int = 3) -> str:
    """A compact human number: thousands separators for large values, ``digits`` significant."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if not isinstance(x, float):
        return str(x)
    ax = abs(x)
    if ax >= 10**digits:
        return f"{x:,.0f}"
    if ax == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(ax)))
    return f"{x:,.{decimals}f}"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


@dataclass
class Ratio:
    """kbcore's value next to the best anchor's value of one figure."""

    value: float | None
    anchor: str | None = None
    anchor_value: float | None = None
    higher_better: bool = True

    @property
    def ratio(self) -> float | None:
        if self.value is None or self.anchor_value in (None, 0):
            return None
        return self.value / self.anchor_value

    @property
    def wins(self) -> bool | None:
        r = self.ratio
        if r is None:
            return None
        return r >= 1.0 if self.higher_better else r <= 1.0

    def ratio_text(self) -> str:
        r = self.ratio
        if self.value is None:
            return "n/a"
        if r is None:
            return "no anchor value" if self.anchor is None else "n/a"
        # Three decimals where two would print a tie ("1.00×") that is not one.
        text = f"{r:.3f}×" if r != 1.0 and round(r, 2) == 1.0 else f"{r:.2f}×"
        return f"**{text}** {self.anchor}" if self.wins else f"{text} {self.anchor}"

    def cell(self, fmt: Callable[[Any], str] = num) -> str:
        if self.value is None:
            return "n/a"
        return f"{fmt(self.value)} ({self.ratio_text()})"


def best_anchor(values: dict[str, float | None], higher_better: bool) -> tuple[str | None, float | None]:
    """The best anchor value of one figure (ignoring anchors without a value)."""
    have = {k: v for k, v in values.items() if v is not None and math.isfinite(v)}
    if not have:
        return None, None
    pick = max if higher_better else min
    lib = pick(have, key=have.__getitem__)
    return lib, have[lib]


def vs_best(kb: float | None, anchors: dict[str, float | None], higher_better: bool = True) -> Ratio:
    lib, val = best_anchor(anchors, higher_better)
    return Ratio(kb, lib, val, higher_better)


def table(head: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> list[str]:
    """Markdown table; ``align`` is one character per column: 'l' or 'r'."""
    align = align or "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def gate(ok: Any) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "**FAIL**")


def geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# ----------------------------------------------------------------------------------------------
# sections


@dataclass
class Render:
    """What the sections produce: Markdown lines, plot files and headline rows."""

    out_dir: Path
    stem: str
    lines: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    headline: list[tuple[str, str, str]] = field(default_factory=list)  # (figure, kbcore, ratio)

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def head(self, figure: str, r: Ratio, fmt: Callable[[Any], str] = num) -> None:
        self.headline.append((figure, fmt(r.value) if r.value is not None else "n/a", r.ratio_text()))


def module_status(rd: Render, report: dict, name: str) -> dict | None:
    """The module's result, or a note in the report saying why there is none."""
    entry = report["modules"].get(name)
    if entry is None:
        rd.add("_Not run in this report (see `--only`)._", "")
        return None
    if entry.get("status") != "ok":
        rd.add(
            f"**{name} failed** ({entry.get('error', entry.get('status'))}); "
            f"`{' '.join(entry.get('command', []))}` after {num(entry.get('seconds'))} s. "
            "End of its log:",
            "",
            "```",
        )
        rd.add(*entry.get("log_tail", [])[-30:])
        rd.add("```", "")
        return None
    return entry["result"]


def module_footer(rd: Render, report: dict, name: str) -> None:
    e = report["modules"][name]
    rd.add(
        f"_`{' '.join(e['command'])}`: {num(e['seconds'])} s, load average "
        f"{e.get('loadavg_start')} → {e.get('loadavg_end')}._",
        "",
    )


# -- index ---------------------------------------------------------------------------------------


def _at(lib: dict, target: str, mode: str) -> float | None:
    return lib.get("at_recall", {}).get(target, {}).get(mode)


def _ef_point(lib: dict, ef: int) -> dict | None:
    return next((p for p in lib.get("sweep", []) if p.get("ef") == ef), None)


def section_index(rd: Render, report: dict, name: str, headline: bool) -> None:
    res = module_status(rd, report, name)
    if res is None:
        return
    cfg = res.get("config", {})
    mt = cfg.get("mt_threads") or 0
    for ds_name, ds in res.get("datasets", {}).items():
        libs = ds.get("libs", {})
        anchors = [a for a in HNSW_ANCHORS if a in libs]
        kb = libs.get("kbcore")
        rd.add(
            f"### {ds_name} (n = {ds['n']:,}, {ds['nq']:,} queries, d = {ds['dim']}, "
            f"M = {cfg.get('M')}, ef_construction = {cfg.get('ef_construction')}, k = 10)",
            "",
        )

        # recall vs QPS
        modes = [("loop", "1 thread, loop"), ("batch", "1 thread, batch")]
        if mt > 1 and kb is not None and "batch_mt" in kb.get("at_recall", {}).get("0.95", {}):
            modes.append(("batch_mt", f"all cores ({mt} thr), batch"))
        head = ["library"]
        for _mode, label in modes:
            for t in RECALL_TARGETS:
                head.append(f"QPS@{t} {label}")
        head += ["recall@10 ef=64", "µs/query ef=64 (loop)"]
        rows = []
        for lib in ["kbcore"] + anchors:
            if lib not in libs:
                continue
            r = libs[lib]
            cells = [f"**{lib}**" if lib == "kbcore" else lib]
            p64 = _ef_point(r, 64)
            for mode, _ in modes:
                for t in RECALL_TARGETS:
                    v = _at(r, t, mode)
                    if lib == "kbcore":
                        cells.append(vs_best(v, {a: _at(libs[a], t, mode) for a in anchors}).cell())
                    else:
                        cells.append(num(v))
            rec = p64["recall_loop"] if p64 else None
            lat = p64["latency_us_loop"] if p64 else None
            if lib == "kbcore":
                cells.append(
                    vs_best(rec, {a: (_ef_point(libs[a], 64) or {}).get("recall_loop") for a in anchors}).cell(
                        lambda x: f"{x:.4f}"
                    )
                )
                cells.append(
                    vs_best(
                        lat,
                        {a: (_ef_point(libs[a], 64) or {}).get("latency_us_loop") for a in anchors},
                        higher_better=False,
                    ).cell()
                )
            else:
                cells += [f"{rec:.4f}" if rec is not None else "n/a", num(lat)]
            rows.append(cells)
        rd.add(
            "Recall@10 against QPS: QPS at equal recall, interpolated on the ef sweep "
            f"(efs {cfg.get('efs')}, median of {cfg.get('repeats')}). *loop* = one 1-D "
            "query per call (what a RAG request sees); *batch* = one call with all queries. "
            "n/a = the recall was never reached.",
            "",
        )
        rd.add(*table(head, rows), "")

        # build and memory
        head = [
            "library",
            "build s (2 threads)",
            "build CPU s",
            "B/vector (RSS growth)",
            "B/vector (own accounting)",
            "peak B/vector",
        ]
        rows = []
        for lib in ["kbcore"] + anchors:
            if lib not in libs:
                continue
            r = libs[lib]
            vals = [
                r.get("build_s"),
                r.get("build_cpu_s"),
                r.get("rss_bytes_per_vector"),
                r.get("own_bytes_per_vector"),
                (r.get("peak_rss_delta_bytes") or 0) / ds["n"] if "peak_rss_delta_bytes" in r else None,
            ]
            keys = ["build_s", "build_cpu_s", "rss_bytes_per_vector", "own_bytes_per_vector", None]
            if lib == "kbcore":
                cells = ["**kbcore**"]
                for v, key in zip(vals, keys):
                    if key in ("build_s", "build_cpu_s", "rss_bytes_per_vector"):
                        cells.append(vs_best(v, {a: libs[a].get(key) for a in anchors}, higher_better=False).cell())
                    elif key == "own_bytes_per_vector":
                        cells.append(num(v) + " (anchors: usearch only)" if v is not None else "n/a")
                    else:
                        cells.append(num(v))
            else:
                cells = [lib] + [num(v) for v in vals]
            rows.append(cells)
        rd.add(
            "Build time and memory per vector (RSS growth across the build, after "
            "`malloc_trim`; the vectors alone are "
            f"{ds['dim'] * 4:,} B).",
            "",
        )
        rd.add(*table(head, rows), "")
        busy = [f"{lib} {r['build_cpu_s'] / r['build_s']:.2f}" for lib, r in libs.items() if r.get("build_s")]
        rd.add(f"CPU/wall of the builds (2.0 = both cores busy): {', '.join(busy)}.", "")

        # save / load
        if any("save_load" in r for r in libs.values()):
            head = ["library", "save s (fsync included)", "load s (page cache)", "file B/vector"]
            rows = []
            for lib in ["kbcore"] + anchors:
                sl = libs.get(lib, {}).get("save_load")
                if not sl:
                    continue
                if lib == "kbcore":
                    other = {a: libs[a].get("save_load", {}) for a in anchors}
                    rows.append(
                        ["**kbcore**"]
                        + [
                            vs_best(sl[k], {a: o.get(k) for a, o in other.items()}, higher_better=False).cell()
                            for k in ("save_s", "load_s", "file_bytes_per_vector")
                        ]
                    )
                else:
                    rows.append([lib, num(sl["save_s"]), num(sl["load_s"]), num(sl["file_bytes_per_vector"])])
            rd.add(
                "Save and load of the built index (a temporary file; kbcore fsyncs inside "
                "`save`, the anchors get the same explicit fsync).",
                "",
            )
            rd.add(*table(head, rows), "")
        else:
            rd.add("_Save/load not measured in this run._", "")

        # exact flat
        flat = ds.get("flat", {})
        if "kbcore" in flat and "faiss" in flat:
            f_kb, f_fa = flat["kbcore"], flat["faiss"]
            rd.add("Exact search, 1 thread, one batch of all queries (faiss `IndexFlatIP` is the anchor):", "")
            rd.add(
                *table(
                    ["library", "QPS", "recall@10 (tie-aware)", "B/vector"],
                    [
                        [
                            "**kbcore flat**",
                            Ratio(f_kb["qps"], "faiss", f_fa["qps"]).cell(),
                            f"{f_kb['recall_ties']:.4f}",
                            Ratio(
                                f_kb.get("rss_bytes_per_vector"), "faiss", f_fa.get("rss_bytes_per_vector"), False
                            ).cell(),
                        ],
                        [
                            "faiss IndexFlatIP",
                            num(f_fa["qps"]),
                            f"{f_fa['recall_ties']:.4f}",
                            num(f_fa.get("rss_bytes_per_vector")),
                        ],
                    ],
                ),
                "",
            )
        if kb is not None and "default_ef" in kb:
            d = kb["default_ef"]
            rd.add(
                f"kbcore recall@10 at its default ef = {d.get('ef')}: {d.get('recall', 0):.4f} "
                f"(gate ≥ 0.95: {gate(d.get('ok'))}).",
                "",
            )

        # plot
        png = plot_recall_qps(rd, ds_name, ds, mt)
        if png:
            rd.add(f"![recall@10 vs QPS, {ds_name}]({png})", "")

        if headline and kb is not None:
            short = "SciFact" if ds_name == "scifact" else ds_name
            for mode, label in (("loop", "1 thread"), ("batch_mt", "all cores")):
                if mode == "batch_mt" and mode not in kb.get("at_recall", {}).get("0.95", {}):
                    continue
                r = vs_best(_at(kb, "0.95", mode), {a: _at(libs[a], "0.95", mode) for a in anchors})
                rd.head(f"{short}: QPS at recall@10 = 0.95, {label}", r)
            if ds_name != "scifact":
                rd.head(
                    f"{short}: build time (2 threads), s",
                    vs_best(kb.get("build_s"), {a: libs[a].get("build_s") for a in anchors}, False),
                )
                rd.head(
                    f"{short}: memory per vector, B",
                    vs_best(
                        kb.get("rss_bytes_per_vector"), {a: libs[a].get("rss_bytes_per_vector") for a in anchors}, False
                    ),
                )
                if "kbcore" in flat and "faiss" in flat:
                    rd.head(
                        f"{short}: exact flat QPS (1 thread)",
                        Ratio(flat["kbcore"]["qps"], "faiss", flat["faiss"]["qps"]),
                    )
                sl = kb.get("save_load")
                if sl:
                    rd.head(
                        f"{short}: load time, s",
                        vs_best(sl["load_s"], {a: libs[a].get("save_load", {}).get("load_s") for a in anchors}, False),
                    )
    module_footer(rd, report, name)


def plot_recall_qps(rd: Render, ds_name: str, ds: dict, mt: int) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    libs = ds.get("libs", {})
    modes = [("loop", "1 thread, one query per call"), ("batch", "1 thread, one batch call")]
    if any("qps_batch_mt" in (r.get("sweep") or [{}])[0] for r in libs.values()):
        modes.append(("batch_mt", f"all cores ({mt} threads), one batch call"))
    fig, axes = plt.subplots(1, len(modes), figsize=(5.2 * len(modes), 4.3), squeeze=False)
    for ax, (mode, label) in zip(axes[0], modes):
        for lib, r in libs.items():
            pts = [(p[f"recall_{mode}"], p[f"qps_{mode}"]) for p in r.get("sweep", []) if f"qps_{mode}" in p]
            if not pts:
                continue
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                marker="o",
                ms=3,
                lw=2.0 if lib == "kbcore" else 1.2,
                color=COLOURS.get(lib),
                label=lib,
            )
        if mode == "batch":
            for lib, marker in (("kbcore", "*"), ("faiss", "s")):
                f = ds.get("flat", {}).get(lib)
                if f:
                    ax.plot(
                        [f["recall"]],
                        [f["qps"]],
                        marker=marker,
                        ms=9,
                        ls="none",
                        color=COLOURS.get(lib),
                        label=f"{lib} exact flat",
                    )
        for t in RECALL_TARGETS:
            ax.axvline(float(t), color="grey", lw=0.6, ls=":")
        ax.set_yscale("log")
        ax.set_xlabel("recall@10")
        ax.set_ylabel("queries per second")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{ds_name}: n = {ds['n']:,}, d = {ds['dim']}, M = 16, ef_construction = 200")
    return _save_plot(rd, fig, f"{rd.stem}-recall-qps-{_safe(ds_name)}.png")


def _save_plot(rd: Render, fig: Any, fname: str) -> str:
    """Writes fig beside the report, closes it and lists it; returns the file name."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(rd.out_dir / fname, dpi=110)
    plt.close(fig)
    rd.plots.append(fname)
    return fname


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-")


# -- filter --------------------------------------------------------------------------------------


def _filter_point(r: dict | None) -> dict | None:
    """The point an anchor is judged by: its qualifying sweep point (recall >= 0.95), its single
    exact point (numpy), or None."""
    if r is None or "supported" in r:
        return None
    if "points" in r:
        return r.get("qualifying")
    return r


def _filter_anchor_cell(r: dict | None) -> str:
    if r is None:
        return "not run"
    if "supported" in r:
        return "no filtered search" if not r["supported"] else str(r.get("note"))
    if "points" in r:
        p = r.get("qualifying")
        if p is None:
            best = max(r["points"], key=lambda x: x["recall"]) if r["points"] else None
            if best is None:
                return "n/a"
            return f"never ≥ 0.95 (best {best['recall']:.3f} at ef {best['ef']}, {num(best['qps'])} QPS)"
        return f"{num(p['qps'])} (ef {p['ef']}, recall {p['recall']:.3f})"
    return f"{num(r['qps'])} (exact, recall {r['recall']:.3f})"


def section_filter(rd: Render, report: dict, headline: bool) -> None:
    res = module_status(rd, report, "filter")
    if res is None:
        return
    cfg = res.get("config", {})
    rd.add(
        "Single thread, a loop of single 1-D queries, k = 10. Every library sweeps ef upwards "
        f"until recall@10 ≥ {cfg.get('target_recall', 0.95)} and is compared at the lowest ef "
        "that reaches it (kbcore with its automatic strategy; numpy: exact mask + matmul). "
        "The best anchor is the fastest one that reached the target. kbcore at its default "
        "ef (64) is shown beside.",
        "",
    )
    all_ratios: list[float] = []
    for ds in res.get("datasets", []):
        rd.add(f"### {ds['name']} (n = {ds['n']:,}, {ds['queries']} queries, d = {ds['dim']})", "")
        head = [
            "filter",
            "passes",
            "kbcore QPS (× best anchor)",
            "kbcore recall@10",
            "kbcore strategy (ef)",
            "kbcore at default ef",
            "hnswlib",
            "faiss HNSW",
            "numpy",
            "usearch",
        ]
        rows = []
        for cname, c in ds.get("cases", {}).items():
            libs = c.get("libs", {})
            kb = libs.get("kbcore")
            best = c.get("best_anchor")
            if kb is not None:
                r = Ratio(kb["qps"], best["lib"] if best else None, best["qps"] if best else None)
                kb_cell = r.cell()
                if kb["recall"] < cfg.get("target_recall", 0.95):
                    kb_cell += " (recall below target)"
                elif r.ratio is not None:
                    all_ratios.append(r.ratio)
                kb_cells = [kb_cell, f"{kb['recall']:.3f}", f"{kb.get('strategy', '')} ({kb.get('ef', '')})"]
                d = libs.get("kbcore default ef")
                kb_cells.append(
                    "" if d is None else f"{num(d['qps'])} (recall {d['recall']:.3f}, {d.get('strategy', '')})"
                )
            else:
                kb_cells = ["not run", "", "", ""]
            rows.append(
                [
                    cname,
                    pct(c.get("fraction")),
                    *kb_cells,
                    *[_filter_anchor_cell(libs.get(a)) for a in ("hnswlib", "faiss", "numpy", "usearch")],
                ]
            )
        rd.add(*table(head, rows, "lrrrllllll"), "")
        cc = ds.get("compile_cost")
        if cc:
            rd.add(
                f"Filter compile + evaluate (`count(where)`) at {cc['case']}: "
                f"{num(cc['count (compile + evaluate) us'])} µs = "
                f"{pct(cc['fraction_of_search'])} of a filtered search "
                f"({num(cc['filtered search (auto) us'])} µs).",
                "",
            )
        png = plot_filter(rd, ds)
        if png:
            rd.add(f"![filtered QPS by selectivity, {ds['name']}]({png})", "")
        if headline and ds["name"].startswith("synthetic"):
            ratios = [
                c.get("kbcore_ratio")
                for c in ds.get("cases", {}).values()
                if c.get("kbcore_ratio") is not None and c["libs"]["kbcore"]["recall"] >= cfg.get("target_recall", 0.95)
            ]
            g = geomean(ratios)
            if g is not None:
                rd.headline.append(
                    (
                        f"{ds['name']}: filtered QPS, geometric mean over {len(ratios)} filters",
                        "—",
                        f"{g:.2f}× best anchor per filter (min {min(ratios):.2f}×)",
                    )
                )
    flags = res.get("flags") or []
    if flags:
        rd.add("Targets missed (from the module):", "")
        rd.add(*[f"- {f}" for f in flags], "")
    module_footer(rd, report, "filter")


def plot_filter(rd: Render, ds: dict) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [(n, c) for n, c in ds.get("cases", {}).items() if c.get("kind") == "selectivity"]
    if not cases:
        return None
    cases.sort(key=lambda nc: nc[1]["fraction"])
    fig, (ax_q, ax_r) = plt.subplots(1, 2, figsize=(11, 4.3))
    for lib in ("kbcore",) + FILTER_ANCHORS:
        xs, qs, rs, ok = [], [], [], []
        for _, c in cases:
            r = c["libs"].get(lib)
            if r is None or "supported" in r:
                continue
            p = r if lib == "kbcore" else _filter_point(r)
            if p is None and "points" in r and r["points"]:
                p = max(r["points"], key=lambda x: x["recall"])  # never reached the target
            if p is None:
                continue
            xs.append(c["fraction"])
            qs.append(p["qps"])
            rs.append(p["recall"])
            ok.append(p["recall"] >= 0.95)
        if not xs:
            continue
        colour = COLOURS.get(lib)
        ax_q.plot(xs, qs, color=colour, lw=2.0 if lib == "kbcore" else 1.2, label=lib)
        ax_r.plot(xs, rs, color=colour, lw=2.0 if lib == "kbcore" else 1.2, label=lib)
        for x, q, rr, good in zip(xs, qs, rs, ok):
            face = colour if good else "white"
            ax_q.plot([x], [q], marker="o", ms=5, color=colour, mfc=face)
            ax_r.plot([x], [rr], marker="o", ms=5, color=colour, mfc=face)
    for ax in (ax_q, ax_r):
        ax.set_xscale("log")
        ax.set_xlabel("fraction of rows passing the filter")
        ax.grid(True, which="both", lw=0.3)
        ax.legend(fontsize=8)
    ax_q.set_yscale("log")
    ax_q.set_ylabel("QPS, 1 thread (hollow: recall < 0.95)")
    ax_q.set_title("QPS (each library at its smallest ef with recall ≥ 0.95)", fontsize=10)
    ax_r.axhline(0.95, color="grey", lw=0.6, ls=":")
    ax_r.set_ylabel("recall@10")
    ax_r.set_title("recall@10 at that point", fontsize=10)
    fig.suptitle(f"Filtered search, {ds['name']} (n = {ds['n']:,}): bucket < t")
    return _save_plot(rd, fig, f"{rd.stem}-filtered-{_safe(ds['name'])}.png")


# -- groups --------------------------------------------------------------------------------------


def section_groups(rd: Render, report: dict, headline: bool) -> None:
    res = module_status(rd, report, "groups")
    if res is None:
        return
    rd.add(
        f"k = {res.get('k', 10)} distinct sources per query, ef = {res.get('ef', 64)}, "
        "1 thread, a loop of single queries. The anchor is what a hnswlib user writes today: "
        "`knn_query(k=50)` then the first 10 distinct sources in Python (over-fetch + dedup).",
        "",
    )
    for ds_name in ("scifact", "synthetic"):
        ds = res.get(ds_name)
        if ds is None:
            continue
        timing = ds.get("timing", {})
        of_name = next((k for k in timing if k.startswith("hnswlib")), None)
        of = timing.get(of_name) if of_name else None
        kbg = timing.get("kbcore search_groups", {})
        ung = timing.get("kbcore search (ungrouped)", {})
        anchor = "over-fetch" if of else None
        rows = [
            [
                "QPS (wall)",
                Ratio(kbg.get("qps"), anchor, of and of["qps"]).cell(),
                num(ung.get("qps")),
                num(of["qps"]) if of else "not run",
            ],
            [
                "QPS (from CPU time)",
                Ratio(kbg.get("cpu_qps"), anchor, of and of["cpu_qps"]).cell(),
                num(ung.get("cpu_qps")),
                num(of["cpu_qps"]) if of else "not run",
            ],
            [
                "grouped recall@10",
                Ratio(ds.get("kbcore_recall"), anchor, ds.get("overfetch_recall")).cell(lambda x: f"{x:.3f}"),
                "—",
                f"{ds['overfetch_recall']:.3f}" if "overfetch_recall" in ds else "not run",
            ],
            [
                "full pages (10 sources)",
                pct(ds.get("kbcore_full_pages")),
                "—",
                pct(ds.get("overfetch_full_pages")) if "overfetch_full_pages" in ds else "not run",
            ],
        ]
        if "kbcore_ndcg10" in ds:
            rows.append(
                [
                    "nDCG@10 (exact grouped " + f"{ds.get('exact_ndcg10', 0):.4f})",
                    Ratio(ds["kbcore_ndcg10"], anchor, ds.get("overfetch_ndcg10")).cell(lambda x: f"{x:.4f}"),
                    "—",
                    f"{ds['overfetch_ndcg10']:.4f}" if "overfetch_ndcg10" in ds else "n/a",
                ]
            )
        rd.add(f"### {ds_name} (n = {ds['n']:,}, {ds['sources']:,} sources, {ds['queries']} queries)", "")
        rd.add(
            *table(
                [
                    "figure",
                    "kbcore `search_groups` (× over-fetch)",
                    "kbcore `search` (ungrouped)",
                    of_name or "hnswlib over-fetch",
                ],
                rows,
            ),
            "",
        )
        if not of:
            rd.add("_No anchor on this dataset in this run (`--quick` skips hnswlib on synthetic data)._", "")
        eq = ds.get("equal_quality")
        eq_ratio = None
        if eq:
            t = eq.get("timing", {})
            kb_eq = next((v for k, v in t.items() if k.startswith("kbcore")), None)
            of_eq = next((v for k, v in t.items() if k.startswith("hnswlib")), None)
            if kb_eq and of_eq:
                eq_ratio = Ratio(kb_eq["qps"], "hnswlib over-fetch + dedup", of_eq["qps"])
                rd.add(
                    f"At equal quality (the lowest ef at which `search_groups` matches the "
                    f"over-fetch's grouped recall and nDCG@10: ef {eq['ef']}, recall "
                    f"{eq['recall']:.3f}, nDCG@10 {eq['ndcg10']:.4f}), timed side by side: "
                    f"{num(kb_eq['qps'])} QPS against {num(of_eq['qps'])} = "
                    f"{eq_ratio.cell()}. The QPS bar is read here; the rows above are both at "
                    f"ef {res.get('ef', 64)}.",
                    "",
                )
        passes = ds.get("passes", {})
        rd.add("Bars: " + ", ".join(f"{k} {gate(v)}" for k, v in passes.items()) + ".", "")
        if headline and ds_name == "scifact" and of:
            rd.head(
                "SciFact: grouped search QPS (`search_groups`), both at ef 64",
                Ratio(kbg.get("qps"), "hnswlib over-fetch + dedup", of["qps"]),
            )
            if eq_ratio is not None:
                rd.head(f"SciFact: grouped search QPS at equal quality (ef {eq['ef']})", eq_ratio)
    module_footer(rd, report, "groups")


# -- hybrid --------------------------------------------------------------------------------------


def section_hybrid(rd: Render, report: dict, headline: bool) -> None:
    res = module_status(rd, report, "hybrid")
    if res is None:
        return
    bm = res.get("bm25", {})
    sp = res.get("bm25_speed", {})
    rd.add(
        "SciFact documents (title + text), 300 test queries. The BM25 anchor is bm25s "
        "(Lucene variant, k1 = 1.2, b = 0.75).",
        "",
    )
    if bm and sp:
        best_tok = max(
            ("bm25s (kbcore tokens)", bm.get("bm25s_same_tokens_ndcg10")),
            ("bm25s (own tokenizer + stop words)", bm.get("bm25s_own_tokenizer_en_stopwords_ndcg10")),
            key=lambda kv: kv[1] or 0,
        )
        bm_best_build = max(
            sp.get("bm25s_build_own_tokenizer_docs_per_s") or 0, sp.get("bm25s_build_kbcore_tokens_docs_per_s") or 0
        )
        rows = [
            [
                "BM25 nDCG@10",
                Ratio(bm.get("kbcore_ndcg10"), best_tok[0], best_tok[1]).cell(lambda x: f"{x:.4f}"),
                (
                    f"same tokens {bm.get('bm25s_same_tokens_ndcg10', 0):.4f}, own tokenizer "
                    f"{bm.get('bm25s_own_tokenizer_en_stopwords_ndcg10', 0):.4f}"
                ),
            ],
            [
                "BM25 single-query QPS (1 thread)",
                Ratio(sp.get("kbcore_qps"), "bm25s", sp.get("bm25s_qps")).cell(),
                num(sp.get("bm25s_qps")),
            ],
            [
                "BM25 build, documents/s (tokenization included)",
                Ratio(sp.get("kbcore_build_docs_per_s"), "bm25s", bm_best_build or None).cell(),
                (
                    f"own tokenizer {num(sp.get('bm25s_build_own_tokenizer_docs_per_s'))}, "
                    f"kbcore tokens {num(sp.get('bm25s_build_kbcore_tokens_docs_per_s'))}"
                ),
            ],
        ]
        rd.add(*table(["figure", "kbcore (× best anchor)", "bm25s"], rows, "lrr"), "")
        rd.add(
            f"Score agreement with bm25s on the same tokens: identical top-10 sets "
            f"{bm.get('queries_with_identical_top10_sets')} queries, max relative score "
            f"difference {num(bm.get('max_rel_score_diff_vs_bm25s'))}.",
            "",
        )
        if headline:
            rd.head("BM25 single-query QPS", Ratio(sp.get("kbcore_qps"), "bm25s", sp.get("bm25s_qps")))
    hy = res.get("hybrid", {})
    if hy:
        rows = []
        for kind in ("flat", "hnsw"):
            h = hy.get(kind)
            if not h:
                continue
            lin = h.get("linear_ndcg10", {})
            best_leg = max(h["dense_ndcg10"], h["bm25_ndcg10"])
            rows.append(
                [
                    kind,
                    f"{h['dense_ndcg10']:.4f}",
                    f"{h['bm25_ndcg10']:.4f}",
                    f"{h['rrf_ndcg10']:.4f} ({h['rrf_ndcg10'] / best_leg:.2f}× best leg)",
                    f"{lin.get('0.7', float('nan')):.4f}",
                    gate(h.get("gate_rrf_ge_max")),
                ]
            )
        rd.add(
            "Hybrid nDCG@10 (no anchor library fuses the two legs; the ratio is to the better "
            f"single leg). Window {hy.get('window')} per leg, RRF k = {hy.get('rrf_k')}.",
            "",
        )
        rd.add(*table(["dense index", "dense", "BM25", "RRF", "linear w=0.7", "gate RRF ≥ max"], rows, "lrrrrl"), "")
    lat = res.get("latency", {})
    if lat:
        rows = [
            [
                kind,
                num(v["dense_us"]),
                num(v["hybrid_rrf_us"]),
                f"{v['ratio']:.2f}×",
                (f"{num(v['dense_window_us'])} + {num(v['text_window_us'])} + {num(v['fusion_us'])}"),
                gate(v.get("gate_ratio_le_1.5")),
            ]
            for kind, v in lat.items()
        ]
        rd.add("Hybrid latency, µs per query, 1 thread (no anchor: kbcore against its own dense search):", "")
        rd.add(
            *table(
                [
                    "dense index",
                    "dense k=10",
                    "hybrid RRF",
                    "hybrid / dense",
                    "parts: dense k=50 + text k=50 + fusion",
                    "gate ≤ 1.5×",
                ],
                rows,
                "lrrrll",
            ),
            "",
        )
    module_footer(rd, report, "hybrid")


# -- engine --------------------------------------------------------------------------------------


def section_engine(rd: Render, report: dict) -> None:
    res = module_status(rd, report, "engine")
    if res is not None:
        rd.add("Knowledge engine on SciFact (no anchor library has this layer; gates shown instead of ratios).", "")
        rows = []
        for r in res.get("runs", []):
            p, t = r["preembedded_ingest"], r["text_ingest"]
            od, op = r["overhead_dedup"], r["overhead_plain"]
            rows.append(
                [
                    r["index"],
                    f"{r['ndcg10_chunks_dedup']:.4f}",
                    f"{r['ndcg10_documents']:.4f}",
                    f"{num(od['engine_only_us'])} / {num(op['engine_only_us'])}",
                    f"{num(od['median_retrieve_us'])} / {num(od['median_native_us'])}",
                    f"{num(p['chunks_per_s'])} (gate ≥ 50,000: {gate(p['chunks_per_s'] >= 50_000)})",
                    f"{num(t['chunks_per_s'])} (gate ≥ 2,000: {gate(t['chunks_per_s'] >= 2_000)})",
                    gate(r.get("reopen_same_results")),
                ]
            )
        rd.add(
            *table(
                [
                    "index",
                    "nDCG@10 chunks+dedup (exact 0.6694)",
                    "nDCG@10 documents (exact 0.6451)",
                    "engine-only µs per retrieve, dedup / plain (gate ≤ 300)",
                    "retrieve / native µs (dedup)",
                    "pre-embedded ingest chunks/s",
                    "text ingest chunks/s (hashing embedder)",
                    "reopen same results",
                ],
                rows,
                "lrrrrrrl",
            ),
            "",
        )
        module_footer(rd, report, "engine")
    rd.add("#### Hybrid retrieve through the engine", "")
    res = module_status(rd, report, "engine_hybrid")
    if res is None:
        return
    r = res.get("run", {})
    rows = []
    for kb_name, label in (
        ("hashing_kb", "A: hashing embedder, query embedded per retrieve"),
        ("provided_kb", "B: provided embeddings, query_vector given"),
    ):
        kb = r.get(kb_name, {})
        for key, dd in (("latency", "plain"), ("latency_dedup", "dedup")):
            lat = kb.get(key)
            if not lat:
                continue
            ratio = lat["hybrid-rrf"] / lat["vector"]
            rows.append(
                [
                    f"{label}, {dd}",
                    num(lat["vector"]),
                    num(lat["hybrid-rrf"]),
                    num(lat["hybrid-linear"]),
                    num(lat["full_text"]),
                    f"{ratio:.2f}× ({gate(ratio <= 1.5)} ≤ 1.5)",
                ]
            )
    rd.add(f"Median `retrieve` latency, µs, top_k = 10, index {r.get('index')} (no anchor):", "")
    rd.add(
        *table(
            ["knowledge base", "vector", "hybrid RRF", "hybrid linear", "full text", "hybrid / vector"], rows, "lrrrrl"
        ),
        "",
    )
    rows = []
    for key, label in (("ndcg10_documents", "documents"), ("ndcg10_chunks_dedup", "chunks+dedup")):
        q = r.get(key)
        if q:
            rows.append(
                [label]
                + [f"{q[k]:.4f}" for k in ("vector", "full_text", "hybrid-rrf", "hybrid-linear")]
                + [gate(q["hybrid-rrf"] >= max(q["vector"], q["full_text"]))]
            )
    rd.add(*table(["level", "vector", "full text", "hybrid RRF", "hybrid linear", "RRF ≥ max"], rows, "lrrrrl"), "")
    module_footer(rd, report, "engine_hybrid")


# -- the whole report ------------------------------------------------------------------------------


def render(report: dict, out_dir: Path, stem: str) -> tuple[Path, list[str]]:
    """Write ``<stem>.md`` and its PNGs into ``out_dir``; return the .md path and the PNG names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rd = Render(out_dir, stem)
    m = report["machine"]
    v = m.get("versions", {})
    body = Render(out_dir, stem)

    def guarded(title: str, fn: Callable[[], None]) -> None:
        body.add(f"## {title}", "")
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others
            body.add(f"_This section could not be rendered: {exc!r}. The numbers are in the JSON._", "")

    sel = report.get("modules_selected", list(report["modules"]))
    guarded("Recall@10 against QPS, build time, memory, save/load", lambda: section_index(body, report, "index", True))
    if "index_1m" in sel:
        guarded("HNSW index at 1M vectors", lambda: section_index(body, report, "index_1m", True))
    guarded("Filtered search by selectivity", lambda: section_filter(body, report, True))
    guarded("Grouped search", lambda: section_groups(body, report, True))
    guarded("Hybrid search and BM25", lambda: section_hybrid(body, report, True))
    guarded("Knowledge engine", lambda: section_engine(body, report))

    title = "kbcore benchmark report" + (" (quick smoke run)" if report.get("quick") else "")
    rd.add(f"# {title}", "")
    git = m.get("git", {})
    rd.add(
        f"{report.get('created', '')[:10]} on {m.get('cpu_model')} — {m.get('usable_cores')} "
        f"usable cores of {m.get('cores')}, {m.get('memory_gib', '?')} GiB; "
        f"kbcore {v.get('kbcore')} (SIMD `{m.get('kbcore_simd_level')}` of "
        f"{m.get('kbcore_available_simd_levels')}), commit "
        f"`{(git.get('commit') or '?')[:10]}`{' + local changes' if git.get('dirty') else ''}; "
        f"hnswlib {v.get('hnswlib')}, faiss-cpu {v.get('faiss-cpu')}, usearch "
        f"{v.get('usearch')}, bm25s {v.get('bm25s')}, numpy {v.get('numpy')}, Python "
        f"{m.get('python')}.",
        "",
    )
    before, after = report.get("loadavg_before"), report.get("loadavg_after")
    rd.add(
        f"Load average (1/5/15 min) before the run {before}, after {after}; total "
        f"{num((report.get('total_s') or 0) / 60)} min.",
        "",
    )
    cores = m.get("usable_cores") or m.get("cores") or 1
    busiest = max(
        [before[0] if before else 0, after[0] if after else 0]
        + [
            max((e.get("loadavg_start") or [0])[0], (e.get("loadavg_end") or [0])[0])
            for e in report["modules"].values()
        ]
    )
    if busiest > 0.5 * cores:
        rd.add(
            f"> **The machine was busy** (load average up to {busiest:.1f} on {cores} cores): "
            "other processes shared the cores, so absolute timings are inflated and noisy. "
            "Compare ratios from the same run, and rerun on a quiet machine for published "
            "numbers.",
            "",
        )
    if report.get("quick"):
        rd.add(
            "> Quick smoke run: small synthetic sets, fewer queries and repeats. It proves the "
            "pipeline, not the numbers.",
            "",
        )
    failed = [n for n, e in report["modules"].items() if e.get("status") != "ok"]
    rd.add(
        "Modules: "
        + ", ".join(
            f"{n} {'ok' if e.get('status') == 'ok' else '**' + e.get('status', '?') + '**'} ({num(e.get('seconds'))} s)"
            for n, e in report["modules"].items()
        )
        + ".",
        "",
    )
    if failed:
        rd.add(f"**Failed:** {', '.join(failed)} — see their sections.", "")
    rd.add(
        "**How to read the ratios.** Next to each kbcore figure: kbcore ÷ the best anchor on "
        "that same figure (the fastest, most accurate or smallest of hnswlib, faiss, usearch, "
        "numpy or bm25s, whichever were measured). For QPS and recall higher is better, for "
        "times and bytes lower is better; **bold** marks the figures where kbcore is at least "
        "as good as the best anchor.",
        "",
    )
    rd.add("## Headline", "")
    if body.headline:
        rd.add(*table(["figure", "kbcore", "kbcore ÷ best anchor"], body.headline, "lrl"), "")
    else:
        rd.add("_No headline figures (the index module did not run or failed)._", "")
    rd.lines += body.lines
    rd.add(
        "---",
        "",
        f"Regenerate this file from its JSON: `python -m benches.report --from-json "
        f"{_display_path(out_dir / (stem + '.json'))}`.",
        "",
    )
    md = out_dir / f"{stem}.md"
    md.write_text("\n".join(rd.lines), encoding="utf-8")
    return md, body.plots


def _display_path(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


# ----------------------------------------------------------------------------------------------
# --from-json


def _is_report(obj: Any) -> bool:
    return isinstance(obj, dict) and "kbcore_report" in obj


def reports_from(path: Path) -> list[tuple[dict, Path, str]]:
    """(report, out dir, stem) for a combined report file, every combined report in a folder,
    or a folder of module JSONs (``index.json``, ``filter.json``, ...) assembled into one."""
    if path.is_file():
        return [(json.loads(path.read_text(encoding="utf-8")), path.parent, path.stem)]
    found = []
    for f in sorted(path.glob("*.json")):
        try:
            obj = json.loads(f.read_text(encoding="utf-8"))
        except ValueError:
            continue
        if _is_report(obj):
            found.append((obj, path, f.stem))
    if found:
        return found
    modules = {}
    for mod in MODULES:
        f = path / f"{mod.name}.json"
        if f.exists():
            modules[mod.name] = {
                "title": mod.title,
                "status": "ok",
                "command": [f.name],
                "seconds": None,
                "result": json.loads(f.read_text(encoding="utf-8")),
            }
    if not modules:
        raise SystemExit(f"--from-json: no report JSON and no module JSONs in {path}")
    info = machine_info()
    report = {
        "kbcore_report": SCHEMA,
        "created": _dt.date.today().isoformat(),
        "quick": None,
        "modules_selected": list(modules),
        "machine": info,
        "modules": modules,
        "note": f"assembled from the module JSONs in {path}; machine info is of the machine that assembled it",
    }
    stem = f"{_dt.date.today().isoformat()}-{machine_slug(info)}"
    return [(report, path, stem)]


# ----------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = ", ".join(m.name for m in MODULES)
    p = argparse.ArgumentParser(
        prog="python -m benches.report",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(
            f"  {m.name:<14} {m.module:<28} full run ~{m.full_minutes} min" + (" (opt-in: --large)" if m.opt_in else "")
            for m in MODULES
        ),
    )
    p.add_argument(
        "--data", default=None, help="data root holding scifact/ (default $KBCORE_DATA, else ../shared/data)"
    )
    p.add_argument("--quick", action="store_true", help="each module's smoke configuration; files get a -quick suffix")
    p.add_argument("--only", default=None, help=f"comma list of modules from: {names}")
    p.add_argument(
        "--large", action="store_true", help="also run index_1m (synthetic 1,000,000 x 384; about 1.5 h, ~12 GiB RAM)"
    )
    p.add_argument("--out", default=None, help="output folder (default benches/out; with --from-json: beside the JSON)")
    p.add_argument(
        "--machine", default=None, help="machine name in the file names (default: from the CPU model and cores)"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="kill a module after this many seconds (default: no limit)"
    )
    p.add_argument(
        "--from-json",
        default=None,
        metavar="PATH",
        help="re-render the Markdown and plots from a report JSON, a folder of them, "
        "or a folder of module JSONs; runs no benchmark",
    )
    return p.parse_args(argv)


def select_modules(args: argparse.Namespace) -> list[Module]:
    if args.only:
        wanted = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [w for w in wanted if w not in MODULE_BY_NAME]
        if unknown:
            raise SystemExit(f"--only: unknown modules {unknown}; choose from {[m.name for m in MODULES]}")
        if args.large and "index_1m" not in wanted:
            wanted.append("index_1m")
        return [m for m in MODULES if m.name in wanted]
    return [m for m in MODULES if not m.opt_in or args.large]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        for report, out_dir, stem in reports_from(Path(args.from_json)):
            target = Path(args.out) if args.out else out_dir
            md, plots = render(report, target, stem)
            if not (target / f"{stem}.json").exists():  # assembled from module JSONs, or moved
                (target / f"{stem}.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
            print(f"wrote {md}" + "".join(f"\nwrote {target / p}" for p in plots))
        return 0
    selected = select_modules(args)
    report = run_all(args, selected)
    day = report["created"][:10]
    stem = f"{day}-{args.machine or machine_slug(report['machine'])}" + ("-quick" if args.quick else "")
    out_dir = Path(args.out) if args.out else DEFAULT_OUT
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=1), encoding="utf-8")
    md, plots = render(report, out_dir, stem)
    print(f"\nwrote {json_path}\nwrote {md}" + "".join(f"\nwrote {out_dir / p}" for p in plots))
    failed = [n for n, e in report["modules"].items() if e.get("status") != "ok"]
    if failed:
        print(f"modules that failed: {', '.join(failed)}")
    return 1 if failed or report.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
