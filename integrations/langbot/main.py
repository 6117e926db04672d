"""The kbcore knowledge-engine plugin for LangBot (see README.md)."""

from __future__ import annotations

import asyncio
import logging

from langbot_plugin.api.definition.plugin import BasePlugin

from components import kbcore_home

logger = logging.getLogger(__name__)


class KbcoreKnowledgePlugin(BasePlugin):
    """The plugin object; the work is in components/knowledge_engine/kbcore_engine.py.

    ``initialize`` settles the data directory before any component runs: it picks it
    (:func:`kbcore_home.resolve_data_dir`), moves data an older version left in its package
    folder, and fails the plugin's start with a clear ``PermissionError`` when the directory
    cannot be written, rather than failing the first ingest.
    """

    data_dir: str | None = None

    async def initialize(self) -> None:
        try:
            config = self.get_config() or {}
        except Exception:  # noqa: BLE001 - no config outside an invocation: the defaults
            config = {}
        path = kbcore_home.resolve_data_dir(config)
        await asyncio.to_thread(kbcore_home.check_writable, path)
        moved = await asyncio.to_thread(kbcore_home.migrate_legacy_data, path)
        if moved:
            logger.info("kbcore: moved %d item(s) from an older version into %s", len(moved), path)
        await asyncio.to_thread(kbcore_home.remove_if_empty, path)  # created on first use
        self.data_dir = path
        logger.info("kbcore knowledge engine: data directory %s", path)
