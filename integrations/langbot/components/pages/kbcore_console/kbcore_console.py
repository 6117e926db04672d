"""The console page: the plugin's knowledge bases and what it did with them since it started.

Endpoints (``langbot.api(endpoint, body, method)`` in ``index.html``):

- ``GET /summary``: the data directory, each stored knowledge base (LangBot's id, documents,
  chunks, segments, index, embedder, bytes on disk, rows still being linked into the graph)
  with this process's retrieve and ingest counters (calls, errors, results or chunks, p50 / p95
  milliseconds over the last 1,000 calls, the latest error).
- ``GET /metrics``: the same figures in Prometheus' text format (``{"content_type", "body"}``).
- ``POST /telemetry/clear``: starts the counters again; answers the new summary.

Reading never creates the data directory, and a failure is an error the page shows, never an
exception out of the plugin.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from langbot_plugin.api.definition.components.page import Page, PageRequest, PageResponse

#: The description the engine gives the knowledge bases it creates, before LangBot's id.
DESCRIPTION_PREFIX = "LangBot knowledge base "


def _kb_id(info: dict[str, Any]) -> str:
    """LangBot's id of a stored knowledge base (from the description the engine wrote; a
    UUID is also the kbcore name)."""
    description = info.get("description") or ""
    if isinstance(description, str) and description.startswith(DESCRIPTION_PREFIX):
        return description[len(DESCRIPTION_PREFIX) :]
    return str(info.get("name", ""))


def _embedder_label(info: dict[str, Any]) -> str:
    emb = info.get("embedder") or {}
    kind = emb.get("kind", "none") if isinstance(emb, dict) else str(emb)
    if kind == "none":
        return "LangBot model"  # vectors come from the host's embedding model
    name = emb.get("name") or emb.get("model") if isinstance(emb, dict) else None
    return f"{kind} ({name})" if name else str(kind)


def _entry(engine: Any, name: str, counters: dict[str, Any]) -> dict[str, Any]:
    """One knowledge base's row; one that cannot be opened (a damaged file) is listed with
    its error and zero counts, so that it does not hide the others."""
    try:
        kb = engine.get_knowledge_base(name)
        info, stats = kb.info(), kb.stats()
    except Exception as exc:  # noqa: BLE001 - shown in its row
        return {
            "id": name,
            "name": name,
            "error": f"{type(exc).__name__}: {exc}",
            "documents": 0,
            "chunks": 0,
            "segments": 0,
            "pending_graph_rows": 0,
            "disk_bytes": None,
            "telemetry": counters.get(name),
        }
    kb_id = _kb_id(info)
    return {
        "id": kb_id,
        "name": name,
        "error": None,
        "documents": stats.documents,
        "chunks": stats.chunks,
        "segments": stats.segments,
        "pending_graph_rows": stats.pending_graph_rows,
        "index": info.get("index"),
        "index_type": info.get("index_type", "chunk"),
        "quantization": info.get("quantization"),
        "metric": info.get("metric"),
        "dim": info.get("dim"),
        "embedder": _embedder_label(info),
        "search_type": info.get("search_type"),
        "disk_bytes": info.get("disk_bytes"),
        "created_at": info.get("created_at"),
        "telemetry": counters.get(kb_id),
    }


def summary(component: Any) -> dict[str, Any]:
    """The page's figures (see the module docstring); ``component`` is the knowledge engine."""
    telemetry = component.telemetry.snapshot()
    counters = telemetry["knowledge_bases"]
    engine = component.stored_engine()
    kbs: list[dict[str, Any]] = []
    if engine is not None:
        kbs = [_entry(engine, name, counters) for name in engine.knowledge_bases()]
    stored = {kb["id"] for kb in kbs}
    return {
        "data_dir": component.data_dir(),
        "index_in_memory": bool(getattr(getattr(component, "plugin", None), "index_in_memory", False)),
        "kbcore_version": _version(),
        "since": telemetry["since"],
        "now": time.time(),
        "knowledge_bases": kbs,
        # counters of ids with no stored knowledge base (a retrieval of one never ingested)
        "unknown": {kb_id: c for kb_id, c in counters.items() if kb_id not in stored},
        "totals": {
            "knowledge_bases": len(kbs),
            "documents": sum(kb["documents"] for kb in kbs),
            "chunks": sum(kb["chunks"] for kb in kbs),
            "disk_bytes": sum(kb["disk_bytes"] or 0 for kb in kbs),
        },
    }


def _version() -> str:
    try:
        import kbcore

        return str(kbcore.__version__)
    except Exception:  # noqa: BLE001 - a figure of the page, never its failure
        return "unknown"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus(data: dict[str, Any]) -> str:
    """``summary``'s figures as Prometheus text exposition (version 0.0.4)."""
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, rows: list[tuple[dict[str, str], float]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in rows:
            text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            out.append(f"{name}{{{text}}} {value:g}")

    kbs = data["knowledge_bases"]
    family(
        "kbcore_documents",
        "gauge",
        "Documents stored.",
        [({"knowledge_base": kb["id"]}, kb["documents"]) for kb in kbs],
    )
    family("kbcore_chunks", "gauge", "Chunks stored.", [({"knowledge_base": kb["id"]}, kb["chunks"]) for kb in kbs])
    family(
        "kbcore_disk_bytes",
        "gauge",
        "Bytes the knowledge base takes on disk.",
        [({"knowledge_base": kb["id"]}, kb["disk_bytes"] or 0) for kb in kbs],
    )
    rows: dict[str, list[tuple[dict[str, str], float]]] = {}
    for kb_id, t in [(kb["id"], kb["telemetry"]) for kb in kbs] + list(data["unknown"].items()):
        if not t:
            continue
        for kind in ("retrieve", "ingest"):
            c = t[kind]
            lab = {"knowledge_base": kb_id}
            rows.setdefault(f"kbcore_{kind}_calls_total", []).append((lab, c["calls"]))
            rows.setdefault(f"kbcore_{kind}_errors_total", []).append((lab, c["errors"]))
            for q, key in (("0.5", "ms_p50"), ("0.95", "ms_p95")):
                if c[key] is not None:
                    rows.setdefault(f"kbcore_{kind}_milliseconds", []).append(({**lab, "quantile": q}, c[key]))
    helps = {
        "kbcore_retrieve_calls_total": ("counter", "Retrievals since the plugin started."),
        "kbcore_retrieve_errors_total": ("counter", "Retrievals that failed."),
        "kbcore_retrieve_milliseconds": ("summary", "Retrieval time over the last 1000 calls."),
        "kbcore_ingest_calls_total": ("counter", "Documents ingested since the plugin started."),
        "kbcore_ingest_errors_total": ("counter", "Ingests that failed."),
        "kbcore_ingest_milliseconds": ("summary", "Ingest time over the last 1000 calls."),
    }
    for name, (kind, help_text) in helps.items():
        if name in rows:
            family(name, kind, help_text, rows[name])
    return "\n".join(out) + "\n"


class KbcoreConsolePage(Page):
    """The plugin's page in LangBot's sidebar (``index.html``)."""

    def _component(self) -> Any:
        component = getattr(getattr(self, "plugin", None), "knowledge_engine", None)
        if component is None:
            raise RuntimeError("the knowledge engine has not started yet")
        return component

    async def handle_api(self, request: PageRequest) -> PageResponse:
        endpoint = (request.endpoint or "").rstrip("/") or "/"
        method = (request.method or "GET").upper()
        try:
            if endpoint in ("/", "/summary") and method == "GET":
                return PageResponse.ok(await asyncio.to_thread(summary, self._component()))
            if endpoint == "/metrics" and method == "GET":
                data = await asyncio.to_thread(summary, self._component())
                return PageResponse.ok({"content_type": "text/plain; version=0.0.4", "body": prometheus(data)})
            if endpoint == "/telemetry/clear" and method == "POST":
                component = self._component()
                component.telemetry.clear()
                return PageResponse.ok(await asyncio.to_thread(summary, component))
        except Exception as exc:  # noqa: BLE001 - the page shows the error; the plugin goes on
            return PageResponse.fail(f"kbcore console: {type(exc).__name__}: {exc}")
        return PageResponse.fail(f"unknown endpoint: {method} {endpoint}")
