"""Views of the Dify server (``kbcore serve --views FILE``): knowledge ids that scope a request.

A view is a knowledge id that Dify sends like a knowledge base's name, and that the server
answers from one or several knowledge bases under a fixed filter, search type, top-k cap and
score floor, for the keys of one team only. Dify cannot send a dynamic filter to an external
knowledge base (and drops the filter panel when several are selected), so a deployment that
serves several teams gives each team a view and a key instead::

    {"views": {
        "team-a-docs": {
            "knowledge_bases": ["handbook", "wiki"],   # required: one or more knowledge bases
            "filter": {"team": "a"},                  # a `where` filter, ANDed with Dify's condition
            "search_type": "hybrid",                  # vector | full_text | hybrid (else each KB's default)
            "reranker": null,                         # a reranker spec; false: none; null: each KB's default
            "top_k_max": 10,                          # caps Dify's top_k
            "score_floor": 0.3,                       # drops hits below it (Dify's threshold if higher)
            "api_keys_env": "TEAM_A_KEYS",            # the keys (comma-separated) allowed on this view
            "context_window": 1                       # neighbouring chunks per hit (else each KB's default)
        }}}

Every field but ``knowledge_bases`` is optional. A view without ``api_keys_env`` is usable
with the server's own keys; a view's keys are usable on that view only (not on other views or
on the knowledge bases by name). :func:`load_views` checks the whole file when the server
starts: an unknown field, a wrong type, a filter that does not compile, a knowledge base that
does not exist or an unset key variable raise ``InvalidArgumentError`` naming the view and the
problem, so a bad file stops the server instead of failing requests later.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError, InvalidTypeError, KbcoreError
from ..filters import compile_where
from ..rerankers import as_reranker

__all__ = ["VIEW_FIELDS", "View", "load_views"]

#: The fields a view may have.
VIEW_FIELDS = (
    "knowledge_bases",
    "filter",
    "search_type",
    "reranker",
    "top_k_max",
    "score_floor",
    "api_keys_env",
    "context_window",
)
_SEARCH_TYPES = ("vector", "full_text", "hybrid")


@dataclass(frozen=True)
class View:
    """One checked view. ``keys`` is None when the server's own keys are the view's."""

    knowledge_id: str
    knowledge_bases: tuple[str, ...]
    filter: dict[str, Any] | None = None
    search_type: str | None = None
    top_k_max: int | None = None
    score_floor: float = 0.0
    api_keys_env: str | None = None
    keys: tuple[str, ...] | None = None
    context_window: int | None = None
    #: None: each knowledge base's default reranker; False: none; else reranks the merged list
    reranker: Any = None


def _int(value: Any, lo: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= lo else None


def _view(kid: str, spec: Any, known: Any, env: Mapping[str, str]) -> View:
    def bad(problem: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"view {kid!r}: {problem}")

    if not isinstance(spec, dict):
        raise bad(f"must be an object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(VIEW_FIELDS))
    if unknown:
        raise bad(f"unknown field {unknown[0]!r}; the fields are {', '.join(VIEW_FIELDS)}")
    kbs = spec.get("knowledge_bases")
    if not isinstance(kbs, list) or not kbs or not all(isinstance(k, str) and k for k in kbs):
        raise bad(f"field 'knowledge_bases' must be a non-empty list of knowledge base names, got {kbs!r}")
    if len(set(kbs)) != len(kbs):
        raise bad("field 'knowledge_bases' names a knowledge base twice")
    for name in kbs:
        if known is not None and name not in known:
            raise bad(f"knowledge base {name!r} does not exist")
    where = spec.get("filter")
    if where is not None:
        if not isinstance(where, dict):
            raise bad(f"field 'filter' must be a where object, got {type(where).__name__}")
        try:
            compile_where(where)
        except (InvalidArgumentError, InvalidTypeError) as exc:
            raise bad(f"field 'filter' is not a valid filter: {exc}") from None
    st = spec.get("search_type")
    if st is not None and st not in _SEARCH_TYPES:
        raise bad(f"field 'search_type' must be one of {', '.join(_SEARCH_TYPES)}, got {st!r}")
    reranker = spec.get("reranker")
    if reranker is not None and reranker is not False:
        if not isinstance(reranker, (str, dict)):
            raise bad(
                f"field 'reranker' must be a reranker spec (an object or a kind name), false or null, got {reranker!r}"
            )
        try:
            reranker = as_reranker(reranker)
        except (InvalidArgumentError, InvalidTypeError, KbcoreError) as exc:
            raise bad(f"field 'reranker' cannot be built: {exc}") from None
    cap = spec.get("top_k_max")
    if cap is not None and _int(cap, 1) is None:
        raise bad(f"field 'top_k_max' must be an integer >= 1, got {cap!r}")
    floor = spec.get("score_floor", 0.0)
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (math.isfinite(floor) and 0 <= floor <= 1):
        raise bad(f"field 'score_floor' must be a number in [0, 1], got {floor!r}")
    window = spec.get("context_window")
    if window is not None and _int(window, 0) is None:
        raise bad(f"field 'context_window' must be an integer >= 0, got {window!r}")
    var = spec.get("api_keys_env")
    keys = None
    if var is not None:
        if not isinstance(var, str) or not var:
            raise bad(f"field 'api_keys_env' must name an environment variable, got {var!r}")
        raw = env.get(var, "")
        keys = tuple(dict.fromkeys(k.strip() for k in raw.split(",") if k.strip()))
        if not keys:
            raise bad(f"environment variable {var!r} (api_keys_env) is unset or holds no key")
        if any(any(c.isspace() for c in k) for k in keys):
            raise bad(f"a key in {var!r} contains whitespace (separate keys with commas)")
    return View(kid, tuple(kbs), where, st, cap, float(floor), var, keys, window, reranker)


def load_views(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    knowledge_bases: Any = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, View]:
    """The views of a views file (a path) or of its parsed content, checked in full.

    ``knowledge_bases``: the existing names (anything supporting ``in``, e.g. an
    :class:`~kbcore.Engine`); None skips that check. ``env``: where ``api_keys_env`` variables
    are read (default ``os.environ``). Raises ``InvalidArgumentError`` naming the view and the
    problem (``FileNotFoundError`` for a missing file)."""
    env = os.environ if env is None else env
    where = "the views"
    if isinstance(source, Mapping):
        data: Any = source
    else:
        where = f"views file {os.fspath(source)!r}"
        with open(source, encoding="utf-8") as f:
            text = f.read()
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidArgumentError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping) or set(data) != {"views"} or not isinstance(data["views"], Mapping):
        raise InvalidArgumentError(f'{where} must be a JSON object {{"views": {{"<knowledge_id>": {{...}}}}}}')
    out: dict[str, View] = {}
    for kid, spec in data["views"].items():
        if not kid.strip():
            raise InvalidArgumentError(f"{where}: a view's knowledge id is empty")
        try:
            out[kid] = _view(kid, spec, knowledge_bases, env)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{where}: {exc}") from None
    return out
