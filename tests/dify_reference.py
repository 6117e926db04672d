"""A reference model of Dify's own metadata filter, to test kbcore's translation against.

Dify 1.12 filters its knowledge bases in SQL (``DatasetRetrieval.process_metadata_filter_func``
in api/core/rag/retrieval/dataset_retrieval.py) over each document's JSON metadata:
``doc_metadata[name].as_string()`` (the JSON value as text: "3" for 3, "2.5" for 2.5, NULL when
the key is missing) and ``.as_float()`` (the value cast to a float). A comparison with NULL is
not true, so a missing field never matches, ``is not`` / ``not in`` / ``not contains``
included. This module evaluates a ``metadata_condition`` the same way, in Python, on a row
(a dict of str / int / float values).

Where Dify's SQL would fail (casting non-numeric text to a float), :class:`Undefined` is
raised: the caller skips that case.
"""

from __future__ import annotations

import json
from typing import Any


class Undefined(Exception):  # noqa: N818 -- a control-flow signal inside the reference evaluator, not an error
    """Dify's SQL would raise on this row (a text value cast to a number)."""


def _as_string(row: dict, name: str) -> str | None:
    v = row.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        return v
    return json.dumps(v)


def _as_float(row: dict, name: str) -> float | None:
    v = row.get(name)
    if v is None:
        return None
    if isinstance(v, str):
        raise Undefined(f"as_float of the text {v!r}")
    return float(v)


def _items(value: Any) -> list[str]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v is not None]
    return [str(value)]


def _number_operand(value: Any) -> float:
    if isinstance(value, str):
        return float(value)  # SQL casts the bound text; callers give numeric text only
    return float(value)


def condition_holds(row: dict, name: str, op: str, value: Any) -> bool | None:
    """Whether one condition holds on ``row``; None when Dify skips it (a null value)."""
    if value is None and op not in ("empty", "not empty"):
        return None
    if op == "empty":
        return row.get(name) is None
    if op == "not empty":
        return row.get(name) is not None
    if op in ("contains", "not contains", "start with", "end with"):
        s = _as_string(row, name)
        if s is None:
            return False
        v = str(value)
        return {
            "contains": v in s,
            "not contains": v not in s,
            "start with": s.startswith(v),
            "end with": s.endswith(v),
        }[op]
    if op in ("is", "=", "is not", "≠"):
        positive = op in ("is", "=")
        if isinstance(value, str):
            s = _as_string(row, name)
            if s is None:
                return False
            return (s == value) if positive else (s != value)
        f = _as_float(row, name)
        if f is None:
            return False
        return (f == value) if positive else (f != value)
    if op in ("in", "not in"):
        texts = _items(value)
        if not texts:
            return op == "not in"
        s = _as_string(row, name)
        if s is None:
            return False
        return (s in texts) if op == "in" else (s not in texts)
    f = _as_float(row, name)
    if f is None:
        return False
    n = _number_operand(value)
    return {
        "<": f < n,
        "before": f < n,
        ">": f > n,
        "after": f > n,
        "≤": f <= n,
        "≥": f >= n,
    }[op]


def dify_matches(metadata_condition: dict | None, row: dict) -> bool:
    """Whether Dify's filter keeps ``row``. Raises Undefined where Dify's SQL would fail."""
    if not metadata_condition or not metadata_condition.get("conditions"):
        return True
    results = []
    for cond in metadata_condition["conditions"]:
        names = cond["name"] if isinstance(cond["name"], list) else [cond["name"]]
        per_name = [condition_holds(row, n, cond["comparison_operator"], cond.get("value")) for n in names]
        if per_name[0] is None:
            continue
        results.append(any(per_name))
    if not results:
        return True
    if (metadata_condition.get("logical_operator") or "and") == "and":
        return all(results)
    return any(results)
