"""One ``POST /retrieval`` body of Dify's External Knowledge API, parsed and validated.

Pure Python, no web framework: :func:`parse_request` runs on a worker thread of the server
(its cost is linear in the body, which the server bounds), and raises :class:`ApiError` with
the HTTP status and the stable error code of every problem it finds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError
from ..filters import compile_where
from .condition import dify_condition_to_where

__all__ = ["ApiError", "Request", "parse_request"]

# error codes (see kbcore.dify.server and docs/dify.md)
E_AUTH_HEADER = 1001
E_AUTH_KEY = 1002
E_NO_KNOWLEDGE = 2001
E_EMPTY_BODY = 3000
E_BAD_REQUEST = 3001
E_BAD_CONDITION = 3002
E_TOO_LARGE = 3003
E_TIMEOUT = 3004
E_UNAVAILABLE = 5030
E_EMBEDDER_FAILED = 5020
E_EMBEDDER_UNAVAILABLE = 5031
E_INTERNAL = 5000

#: Deepest nesting of arrays and objects a body may have (Dify's is 4 deep).
MAX_JSON_DEPTH = 32
#: ``top_k`` when Dify sends none (its own default for external knowledge).
DEFAULT_TOP_K = 5


class ApiError(Exception):
    """An error reply: HTTP status, error code and message."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.knowledge_id: str | None = None  # set once the request names one


@dataclass(frozen=True)
class Request:
    """A validated retrieval request. ``requested_top_k`` is what the client asked for
    (``top_k`` is it clamped to the server's limit)."""

    knowledge_id: str
    query: str
    top_k: int
    score_threshold: float
    where: dict | None
    requested_top_k: int


def _type_name(v: Any) -> str:
    return {type(None): "null", bool: "boolean", str: "string", list: "array", dict: "object"}.get(
        type(v), "number" if isinstance(v, (int, float)) else type(v).__name__
    )


def _bad(message: str) -> ApiError:
    return ApiError(400, E_BAD_REQUEST, message)


def _check_depth(data: Any) -> None:
    """ApiError if arrays / objects nest deeper than MAX_JSON_DEPTH (iterative walk)."""
    stack = [(data, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _bad(f"the request body nests arrays and objects deeper than {MAX_JSON_DEPTH}")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v if isinstance(x, (dict, list)))


def _load(body: bytes) -> dict:
    if not body.strip():
        raise ApiError(
            400,
            E_EMPTY_BODY,
            "empty request body; the API key is valid. POST a JSON object with knowledge_id, "
            "query and retrieval_setting {top_k, score_threshold}",
        )
    try:
        data = json.loads(body)
    except RecursionError:
        raise _bad(f"the request body nests arrays and objects deeper than {MAX_JSON_DEPTH}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise _bad(f"the request body must be a JSON object, got {_type_name(data)}")
    _check_depth(data)
    return data


def _text(value: Any, name: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(f"{name} contains a lone surrogate, which is not valid Unicode") from None
    return value


def _top_k(setting: dict, max_top_k: int) -> tuple[int, int]:
    top_k = setting.get("top_k")
    if top_k is None:
        top_k = DEFAULT_TOP_K
    if isinstance(top_k, float) and math.isfinite(top_k) and top_k.is_integer():
        top_k = int(top_k)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise _bad(f"retrieval_setting.top_k must be an integer, got {_type_name(top_k)}")
    if top_k < 1:
        shown = top_k if top_k > -(10**18) else "a negative number"
        raise _bad(f"retrieval_setting.top_k must be at least 1, got {shown}")
    return min(top_k, max_top_k), top_k


def _threshold(setting: dict) -> float:
    threshold = setting.get("score_threshold")
    if threshold is None:
        return 0.0
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise _bad(f"retrieval_setting.score_threshold must be a number, got {_type_name(threshold)}")
    if isinstance(threshold, int) and not 0 <= threshold <= 1:  # 10**400 has no float
        raise _bad("retrieval_setting.score_threshold must be within [0, 1]")
    threshold = float(threshold)
    if not math.isfinite(threshold) or not 0.0 <= threshold <= 1.0:
        raise _bad(f"retrieval_setting.score_threshold must be within [0, 1], got {threshold}")
    return threshold


def parse_request(body: bytes, max_top_k: int) -> Request:
    """The validated request of a ``POST /retrieval`` body. ``top_k`` above ``max_top_k`` is
    clamped (``Request.requested_top_k`` keeps the asked value). Raises :class:`ApiError`:
    3000 for an empty body (Dify's registration probe), 3001 for a malformed one, 3002 for a
    ``metadata_condition`` that cannot apply."""
    data = _load(body)
    kid = data.get("knowledge_id")
    if not isinstance(kid, str) or not kid.strip():
        got = "nothing" if kid is None else repr(kid) if isinstance(kid, str) else _type_name(kid)
        raise _bad(f"knowledge_id must be a non-empty string, got {got}")
    _text(kid, "knowledge_id")
    query = data.get("query")
    if not isinstance(query, str):
        got = "nothing" if query is None else _type_name(query)
        raise _bad(f"query must be a string, got {got}")
    _text(query, "query")
    setting = data.get("retrieval_setting")
    if setting is None:
        setting = {}
    if not isinstance(setting, dict):
        raise _bad(f"retrieval_setting must be an object, got {_type_name(setting)}")
    top_k, requested = _top_k(setting, max_top_k)
    threshold = _threshold(setting)
    try:
        where = dify_condition_to_where(data.get("metadata_condition"))
        if where is not None:
            compile_where(where)  # every filter error is reported here, as a condition error
    except (InvalidArgumentError, InvalidTypeError) as exc:
        raise ApiError(400, E_BAD_CONDITION, str(exc)) from None
    except RecursionError:
        raise ApiError(400, E_BAD_CONDITION, "metadata_condition is nested too deeply") from None
    return Request(kid, query, top_k, threshold, where, requested)
