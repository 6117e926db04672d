"""The kbcore knowledge-engine plugin for LangBot (see README.md)."""

from __future__ import annotations

from langbot_plugin.api.definition.plugin import BasePlugin


class KbcoreKnowledgePlugin(BasePlugin):
    """The plugin object; all the work is in components/knowledge_engine/kbcore_engine.py."""

    async def initialize(self) -> None:
        pass
