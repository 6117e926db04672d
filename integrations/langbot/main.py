"""The kbcore knowledge-engine plugin for LangBot (see README.md)."""

from __future__ import annotations

import asyncio
import logging

from components import kbcore_home
from langbot_plugin.api.definition.plugin import BasePlugin

logger = logging.getLogger(__name__)


class KbcoreKnowledgePlugin(BasePlugin):
    """The plugin object; the work is in components/knowledge_engine/kbcore_engine.py.

    ``initialize`` settles the data directory before any component runs: it picks it
    (:func:`kbcore_home.resolve_data_dir`), moves data an older version left in its package
    folder, and fails the plugin's start with a clear ``PermissionError`` when the directory
    cannot be written, rather than failing the first ingest.
    """

    data_dir: str | None = None
    index_in_memory: bool = False

    def _start_config(self) -> dict:
        """The plugin settings while ``initialize`` runs.

        The SDK runtime (langbot-plugin 0.7.16, as LangBot 4.11.2 pins it) runs ``initialize``
        inside an invocation scope whose config is the one the worker was mounted with (empty),
        so ``get_config()`` misses the settings there; the runtime has already stored them with
        the ``config`` setter just before (``_legacy_config``), so that is read first.
        """
        stored = getattr(self, "_legacy_config", None)
        if stored:
            return dict(stored)
        try:
            return dict(self.get_config() or {})
        except Exception:  # noqa: BLE001 - no config outside an invocation: the defaults
            return {}

    async def initialize(self) -> None:
        config = self._start_config()
        self.index_in_memory = kbcore_home.index_in_memory(config)
        path = kbcore_home.resolve_data_dir(config)
        await asyncio.to_thread(kbcore_home.check_writable, path)
        moved = await asyncio.to_thread(kbcore_home.migrate_legacy_data, path)
        if moved:
            logger.info("kbcore: moved %d item(s) from an older version into %s", len(moved), path)
        await asyncio.to_thread(kbcore_home.remove_if_empty, path)  # created on first use
        self.data_dir = path
        logger.info("kbcore knowledge engine: data directory %s", path)
