"""What the Ray-based test modules share: Ray's environment, the import, the ``needs_ray``
mark and a local Ray instance on loopback.

Imported by test_distributed.py, test_distributed_socket.py and test_engine_sharded.py before
anything imports Ray: the environment below is read when Ray is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

# Keep every Ray address on loopback (Ray otherwise picks the machine's interface address)
# and leave the cluster unauthenticated (it is reachable from this machine only).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
try:
    import ray
except ImportError:  # pragma: no cover - depends on the environment
    ray = None

NO_RAY = "ray is not installed (pip install 'kbcore[ray]'); sharded indexes run on Ray"

#: Every test that starts or joins a Ray instance (``-m "not ray"`` leaves them out).
ray_mark = pytest.mark.ray
skip_without_ray = pytest.mark.skipif(ray is None, reason=NO_RAY)

F = TypeVar("F", bound=Callable[..., Any])


def needs_ray(fn: F) -> F:
    """Marks a test as a Ray test, skipped with its reason when Ray is not installed."""
    return skip_without_ray(ray_mark(fn))


@contextmanager
def local_ray() -> Iterator[Any]:
    """A fresh local Ray instance with 2 CPUs on loopback (one already running is shut down
    first); shut down on exit. Yields ``ray.init``'s context."""
    if ray is None:
        pytest.skip(NO_RAY)
    if ray.is_initialized():
        ray.shutdown()
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    assert ctx.address_info["node_ip_address"].startswith("127."), ctx.address_info
    try:
        yield ctx
    finally:
        ray.shutdown()
