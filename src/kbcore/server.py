"""The Dify External Knowledge API server; it lives in :mod:`kbcore.dify.server`.

This module keeps the old import path working: ``from kbcore.server import create_app, serve,
parse_api_keys``. The ``kbcore serve`` command line is in :mod:`kbcore.cli`.
"""

from __future__ import annotations

from .dify.server import (
    API_KEYS_ENV,
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_KEEP_ALIVE_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_TOP_K,
    DEFAULT_REFRESH_INTERVAL,
    create_app,
    parse_api_keys,
    serve,
    uvicorn_config,
)

__all__ = [
    "API_KEYS_ENV",
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_KEEP_ALIVE_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_TOP_K",
    "DEFAULT_REFRESH_INTERVAL",
    "create_app",
    "parse_api_keys",
    "serve",
    "uvicorn_config",
]
