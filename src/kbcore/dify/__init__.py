"""Dify's External Knowledge API: the ``metadata_condition`` translator and the HTTP server.

- :mod:`kbcore.dify.condition`: :func:`dify_condition_to_where`, Dify's ``metadata_condition``
  as a kbcore ``where`` with the semantics of Dify's own metadata filter (docs/dify.md).
- :mod:`kbcore.dify.request`: parsing and validation of one ``POST /retrieval`` body.
- :mod:`kbcore.dify.server`: the Starlette app (:func:`create_app`) and :func:`serve`
  (``pip install 'kbcore[server]'``; Starlette and uvicorn are imported only when used).
"""

from __future__ import annotations

from .condition import dify_condition_to_where

__all__ = ["create_app", "dify_condition_to_where", "parse_api_keys", "serve"]


def __getattr__(name: str):  # the server part is loaded on first use only
    if name in ("create_app", "parse_api_keys", "serve"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module 'kbcore.dify' has no attribute {name!r}")
