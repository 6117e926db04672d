"""Where the plugin's code and data live inside a LangBot plugin runtime (stdlib only).

Two things the runtime does not do for this plugin are done here:

* **kbcore itself.** The runtime pip-installs ``requirements.txt`` from a package index into a
  sealed, read-only tree; kbcore is on no index a LangBot host reaches, and the runtime gives pip
  no way to see the package's own files (pip options are refused in ``requirements.txt``, the
  requirements are copied to a scratch folder before pip runs, and the sandboxed installer does
  not mount the package). So the ``.lbpkg`` carries kbcore's manylinux wheel(s) in ``wheels/``
  and lists only kbcore's own dependencies (numpy, pyarrow, tqdm) in ``requirements.txt``;
  :func:`ensure_kbcore` unpacks the wheel that fits this interpreter into a per-installation
  library folder and puts it on ``sys.path``. Without a ``wheels/`` folder (a source checkout)
  the kbcore already installed is used.
* **A data directory that outlives the package folder.** The runtime starts the plugin in the
  unpacked package folder, named by the package's digest and read-only: a new version gets a new
  folder. It does give every installation a private folder that keeps its id across upgrades
  (``<runtime data>/installations/<installation uuid>/``, whose ``rpc-transfer`` child is
  ``$LANGBOT_PLUGIN_FILE_STORAGE_DIR`` and whose ``data`` child the sandboxed mode mounts at
  ``/data``). :func:`resolve_data_dir` picks ``<that>/data/kbcore``; :func:`migrate_legacy_data`
  moves what versions up to 0.1.0 left in ``./data/kbcore`` of an old package folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Environment variable naming the data directory (wins over everything else).
DATA_DIR_ENV = "KBCORE_LANGBOT_DATA"
#: Set by the LangBot plugin runtime (OSS profile): ``<installation folder>/rpc-transfer``.
FILE_STORAGE_ENV = "LANGBOT_PLUGIN_FILE_STORAGE_DIR"
#: The installation folder the runtime mounts at ``/data`` in its sandboxed (nsjail) profile.
SANDBOX_DATA = "/data"
#: Our folder inside the installation's ``data`` folder.
DATA_SUBDIR = "kbcore"
#: Where versions up to 0.1.0 kept their data, relative to the package folder.
LEGACY_SUBDIR = os.path.join("data", "kbcore")
#: The plugin's identity in manifest.yaml (used to recognise our old package folders).
PLUGIN_AUTHOR = "kbcore"
PLUGIN_NAME = "KbcoreKnowledge"

PLUGIN_ROOT = Path(__file__).resolve().parent.parent
_ENGINE_LOCK = ".engine.lock"
_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


class DataDirError(PermissionError):
    """The data directory cannot be created or written (raised at plugin start)."""


# -- the kbcore library ----------------------------------------------------------------------


def bundled_wheels(root: Path = PLUGIN_ROOT) -> list[Path]:
    """The kbcore wheels the package carries (``wheels/kbcore-*.whl``), sorted."""
    return sorted((root / "wheels").glob("kbcore-*.whl"))


def interpreter_tag() -> str:
    """This interpreter's CPython tag (``cp312``) and machine, as named in error messages."""
    return f"cp{sys.version_info.major}{sys.version_info.minor} on {sys.platform} {platform.machine()}"


_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def _fallback_rank(name: str) -> int | None:
    """Without ``packaging``: 0 if the wheel ``name`` is for this CPython, on Linux and this
    machine (a manylinux wheel of another architecture must not load), else None."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = platform.machine().lower()
    machine = _MACHINE_ALIASES.get(machine, machine)
    parts = name[: -len(".whl")].split("-")
    if len(parts) < 5 or not sys.platform.startswith("linux"):
        return None
    pythons, platforms = parts[-3].split("."), parts[-1].split(".")
    if tag not in pythons or not any(pl.endswith("_" + machine) for pl in platforms):
        return None
    return 0


def wheel_rank(path: Path) -> int | None:
    """How well the wheel at ``path`` fits this interpreter: the position of its best tag in
    ``packaging.tags.sys_tags()`` (0 best), or None when it does not fit."""
    try:  # the runtime's own environment has packaging (the SDK depends on it)
        from packaging.tags import sys_tags
        from packaging.utils import InvalidWheelFilename, parse_wheel_filename
    except ImportError:  # pragma: no cover - exercised with packaging hidden
        return _fallback_rank(path.name)

    try:
        _, _, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename:
        return None
    for rank, supported in enumerate(sys_tags()):
        if supported in tags:
            return rank
    return None


def pick_wheel(wheels: list[Path]) -> Path:
    """The wheel among ``wheels`` that fits this interpreter best. Raises ``ImportError``
    naming the interpreter (CPython tag, platform, machine) and the wheels present when none
    fits."""
    ranked = [(rank, w) for w in wheels if (rank := wheel_rank(w)) is not None]
    if not ranked:
        raise ImportError(
            f"the kbcore plugin package carries no kbcore wheel for this Python ({interpreter_tag()}, "
            f"Python {sys.version.split()[0]}); it carries: "
            + (", ".join(w.name for w in wheels) or "none")
            + ". Install a package built for this interpreter (integrations/langbot/build_lbpkg.py "
            "--python <this python>, or from the wheels workflow's CPython 3.10-3.13 wheels)"
        )
    return min(ranked, key=lambda rw: (rw[0], rw[1].name))[1]


def _installation_dir() -> Path | None:
    """The runtime's per-installation folder (parent of ``$LANGBOT_PLUGIN_FILE_STORAGE_DIR``)."""
    transfer = os.environ.get(FILE_STORAGE_ENV, "").strip()
    if not transfer:
        return None
    return Path(transfer).resolve().parent


def library_dir() -> Path:
    """Where bundled wheels are unpacked: ``<installation>/home/kbcore-lib`` under the OSS
    runtime, ``$HOME/.cache/kbcore-langbot/lib`` elsewhere (``/home`` in the sandbox), else a
    folder in the temporary directory."""
    inst = _installation_dir()
    candidates = []
    if inst is not None:
        candidates.append(inst / "home" / "kbcore-lib")
    home = os.environ.get("HOME")
    if home:
        candidates.append(Path(home) / ".cache" / "kbcore-langbot" / "lib")
    candidates.append(Path(tempfile.gettempdir()) / f"kbcore-langbot-lib-{os.getuid()}")
    for c in candidates:
        parent = c.parent
        if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
            return c
        try:
            c.mkdir(parents=True, exist_ok=True)
            return c
        except OSError:
            continue
    return candidates[-1]


def _unpack(wheel: Path, target_root: Path) -> Path:
    """Unpacks ``wheel`` into ``target_root/<sha256[:16]>`` (atomically; reused when present)
    and removes folders of other wheels there."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    target = target_root / digest
    if not (target / ".complete").is_file():
        target_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target_root))
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    dest = (tmp / info.filename).resolve()
                    if tmp.resolve() not in dest.parents and dest != tmp.resolve():
                        raise ValueError(f"{wheel.name}: unsafe path {info.filename!r}")
                zf.extractall(tmp)
            (tmp / ".complete").write_text(wheel.name + "\n", encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    for other in target_root.iterdir():
        if other.name != digest and other.is_dir():
            shutil.rmtree(other, ignore_errors=True)
    return target


def ensure_kbcore(root: Path = PLUGIN_ROOT) -> str | None:
    """Makes ``import kbcore`` load the wheel the package carries, if it carries one.

    Returns the folder put on ``sys.path`` (None when the package has no ``wheels/`` folder and
    the installed kbcore is used). The package carries one wheel per CPython version (3.10 to
    3.13) and machine; :func:`pick_wheel` chooses. Raises ``ImportError`` naming the
    interpreter and the wheels present when none fits it.
    """
    wheels = bundled_wheels(root)
    if not wheels:
        return None
    if "kbcore" in sys.modules:
        return os.path.dirname(os.path.dirname(sys.modules["kbcore"].__file__ or "")) or None
    path = str(_unpack(pick_wheel(wheels), library_dir()))
    if path not in sys.path:
        sys.path.insert(0, path)
    return path


# -- the data directory ----------------------------------------------------------------------


def resolve_data_dir(config: Mapping[str, Any] | None = None) -> str:
    """The data directory: ``$KBCORE_LANGBOT_DATA``; else the plugin setting ``data_dir``; else
    ``<installation folder>/data/kbcore`` (OSS runtime, found through
    ``$LANGBOT_PLUGIN_FILE_STORAGE_DIR``); else ``/data/kbcore`` when ``/data`` is a directory
    (the sandboxed runtime mounts the same installation folder there); else
    ``$XDG_DATA_HOME/kbcore-langbot`` (``~/.local/share/kbcore-langbot``), e.g. under
    ``lbp run``. Never the package folder."""
    env = os.environ.get(DATA_DIR_ENV, "").strip()
    if env:
        return os.path.abspath(env)
    configured = str((config or {}).get("data_dir") or "").strip()
    if configured:
        return os.path.abspath(configured)
    inst = _installation_dir()
    if inst is not None:
        return str(inst / "data" / DATA_SUBDIR)
    if os.path.isdir(SANDBOX_DATA):
        return os.path.join(SANDBOX_DATA, DATA_SUBDIR)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.abspath(os.path.join(base, "kbcore-langbot"))


def index_in_memory(config: Mapping[str, Any] | None = None) -> bool:
    """The plugin setting ``index_in_memory``: True copies each knowledge base's index into
    memory when it opens (``Engine(mmap=False)``: a slower open and more memory, faster searches
    of a large one); False or unset (the default) reads it in place from its file. A bool, or
    its text ("true" / "false", as a form may send it); ``ValueError`` naming the setting else."""
    value = (config or {}).get("index_in_memory")
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise ValueError(f"plugin setting 'index_in_memory' must be true or false, got {value!r}")


def check_writable(path: str) -> None:
    """Creates ``path`` if needed and proves it writable; raises :class:`DataDirError` (a
    ``PermissionError``) naming the path, the reason and the two settings that move it."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise DataDirError(
            f"kbcore knowledge engine: the data directory {path!r} is not writable "
            f"({exc.strerror or exc}); set the plugin setting 'Data directory' or "
            f"${DATA_DIR_ENV} to a writable directory"
        ) from exc


def _is_our_package(code: Path) -> bool:
    try:
        text = (code / "manifest.yaml").read_text(encoding="utf-8")
    except OSError:
        return False
    return (
        re.search(rf"^\s*author:\s*['\"]?{PLUGIN_AUTHOR}['\"]?\s*$", text, re.M) is not None
        and re.search(rf"^\s*name:\s*['\"]?{PLUGIN_NAME}['\"]?\s*$", text, re.M) is not None
    )


def legacy_data_dirs(cwd: str | None = None) -> list[Path]:
    """Data folders left by versions up to 0.1.0: ``./data/kbcore`` of the working directory
    and, when that is a runtime package folder (``.../artifacts/sha256/<digest>/code``), of
    every other package folder of this plugin beside it."""
    here = Path(cwd or os.getcwd()).resolve()
    found: list[Path] = []
    candidates = [here]
    if here.name == "code" and _DIGEST_RE.match(here.parent.name):
        for sibling in sorted(here.parent.parent.iterdir()):
            code = sibling / "code"
            if sibling != here.parent and _DIGEST_RE.match(sibling.name) and code.is_dir():
                candidates.append(code)
    for code in candidates:
        d = code / LEGACY_SUBDIR
        if d.is_dir() and (code == here or _is_our_package(code)):
            found.append(d)
    return found


def _with_writable_parent(path: Path, action) -> None:
    """Runs ``action()``, temporarily adding the owner's write bit to ``path``'s parent (the
    runtime seals package folders 0555) when that is what stood in the way."""
    parent = path.parent
    try:
        action()
        return
    except PermissionError:
        pass
    mode = stat.S_IMODE(parent.stat().st_mode)
    parent.chmod(mode | stat.S_IWUSR)
    try:
        action()
    finally:
        parent.chmod(mode)


def _entries(d: Path) -> Iterator[Path]:
    for p in sorted(d.iterdir()):
        if p.name == _ENGINE_LOCK or p.name.startswith((".tmp-", ".trash-", ".write-probe-")):
            continue
        yield p


def migrate_legacy_data(target: str, cwd: str | None = None) -> list[str]:
    """Moves the knowledge bases of :func:`legacy_data_dirs` into ``target`` and removes the
    emptied folders. A knowledge base already in ``target`` is kept there and the old copy is
    left in place (with a warning). Returns the names moved."""
    moved: list[str] = []
    dest_root = Path(target).resolve()
    for old in legacy_data_dirs(cwd):
        if old.resolve() == dest_root:
            continue
        dest_root.mkdir(parents=True, exist_ok=True)
        kept = False
        for entry in _entries(old):
            dest = dest_root / entry.name
            if dest.exists():
                logger.warning(
                    "kbcore: %s exists in both %s and %s; keeping the one in %s",
                    entry.name,
                    old,
                    dest_root,
                    dest_root,
                )
                kept = True
                continue
            try:
                os.rename(entry, dest)
            except OSError:  # another file system
                tmp = dest_root / f".tmp-migrate-{entry.name}-{uuid.uuid4().hex[:8]}"
                shutil.copytree(entry, tmp) if entry.is_dir() else shutil.copy2(entry, tmp)
                os.rename(tmp, dest)
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            moved.append(entry.name)
            logger.info("kbcore: moved %s from %s to %s", entry.name, old, dest_root)
        if kept:
            continue
        for p in old.iterdir():  # the lock file and any leftovers of interrupted writes
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        try:
            _with_writable_parent(old, old.rmdir)
            data = old.parent
            if not any(data.iterdir()):
                _with_writable_parent(data, data.rmdir)
        except OSError as exc:
            logger.warning("kbcore: could not remove the old data folder %s: %s", old, exc)
    return moved


def remove_if_empty(path: str) -> bool:
    """Removes the data directory when it holds no knowledge base (only the engine's lock file,
    or nothing). Returns True when it is gone."""
    p = Path(path)
    if not p.is_dir():
        return True
    if any(True for _ in _entries(p)):
        return False
    for q in p.iterdir():
        shutil.rmtree(q, ignore_errors=True) if q.is_dir() else q.unlink(missing_ok=True)
    try:
        p.rmdir()
    except OSError:
        return False
    return True
