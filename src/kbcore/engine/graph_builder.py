"""The registry of running graph builders, stopped at interpreter exit."""

from __future__ import annotations

import atexit
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .knowledge_base import KnowledgeBase

# Knowledge bases whose graph builder may be running; stopped at interpreter exit so that no
# native build is in flight while Python shuts down (the graph state is saved as pending).
_LIVE_BUILDERS: weakref.WeakSet[KnowledgeBase] = weakref.WeakSet()


@atexit.register
def _stop_all_graph_builders() -> None:
    for kb in list(_LIVE_BUILDERS):
        kb._stop_graph_builder()
