"""The manifest as data: the next generation, marking documents deleted, and the checkpoint and
compaction policy. Pure functions on manifest dicts; nothing here touches the disk
(:mod:`kbcore.engine.storage` reads and writes the file, :mod:`kbcore.engine.commit` decides when).

A manifest (``manifest.json``, see :mod:`kbcore.engine.storage`) holds ``generation``, ``config``
(metric, index kind and parameters, dim, chunking, search defaults), ``embedder`` (its spec),
``pipelines``, ``next_id``, ``next_group``, ``segments`` (name, rows, docs, deleted_docs,
files) and ``index`` (the checkpoint's file entry and rows, or None). A sharded knowledge
base (``config["shards"]``) has no index file; ``shard_checkpoint`` holds the rows covered by
the shards' last checkpoint (see :mod:`kbcore.engine.shards`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .types import DEFAULT_PIPELINE

if TYPE_CHECKING:
    from .segments import Segment

#: A checkpoint of the index is written when the rows not covered by the last one exceed
#: max(CKPT_MIN_ROWS, CKPT_FRACTION * rows in it): reopening replays at most that many.
CKPT_MIN_ROWS = 4096
CKPT_FRACTION = 0.5
#: Compaction runs when more than this many segments exist, or when deleted rows are more
#: than half of the stored rows (and more than COMPACT_MIN_ROWS rows are stored).
MAX_SEGMENTS = 32
COMPACT_MIN_ROWS = 256
#: Small segments are merged as they accumulate (size-tiered, as an LSM tree does): when the
#: newest MERGE_FACTOR or more segments the checkpoint covers (no vector file) are alike (the
#: largest less than MERGE_RATIO times the smallest), they are rewritten as one, and so on up
#: the tiers. A knowledge base ingested in small batches then keeps O(MERGE_FACTOR * log n)
#: covered segments instead of one per batch, each row rewritten about
#: log_MERGE_FACTOR(n / batch) times. MERGE_RATIO is above MERGE_FACTOR so that a merge of
#: MERGE_FACTOR batches is alike to a slightly smaller batch (else tiers split by a few rows
#: never merge again). A merge never makes a segment of more than MERGE_MAX_ROWS rows.
MERGE_FACTOR = 8
MERGE_RATIO = 10
MERGE_MAX_ROWS = 1 << 20


def chunking_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """A pipeline's chunking keys taken from ``cfg`` (a config or pipeline): size and overlap,
    and ``chunk_unit`` / ``separators`` only when set (absent means characters, none)."""
    out = {"chunk_size": cfg["chunk_size"], "chunk_overlap": cfg["chunk_overlap"]}
    for key in ("chunk_unit", "separators"):
        if key in cfg:
            out[key] = cfg[key]
    return out


def initial(name: str, config: dict[str, Any], embedder: dict[str, Any], description: str) -> dict[str, Any]:
    """The manifest of a new, empty knowledge base (generation 1)."""
    return {
        "name": name,
        "generation": 1,
        "created_at": time.time(),
        "description": description,
        "config": dict(config),
        "embedder": embedder,
        "pipelines": {DEFAULT_PIPELINE: chunking_settings(config)},
        "next_id": 0,
        "next_group": 0,
        "segments": [],
        "index": None,
    }


def next_generation(m: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``m`` with the generation incremented (what a mutation edits)."""
    out = json.loads(json.dumps(m))  # the manifest is plain JSON data; faster than deepcopy
    out["generation"] = m["generation"] + 1
    return out


def mark_deleted(m: dict[str, Any], refs: Iterable[tuple[Segment, int]]) -> None:
    """Marks the (segment, document row) refs deleted in ``m``; drops the segments left without
    a live document."""
    by_name = {s["name"]: s for s in m["segments"]}
    for seg, row in refs:
        entry = by_name[seg.name]
        if row not in entry["deleted_docs"]:
            entry["deleted_docs"].append(row)
            entry["deleted_docs"].sort()
    m["segments"] = [s for s in m["segments"] if len(s["deleted_docs"]) < s["docs"]]


def drop_vector_files(m: dict[str, Any]) -> None:
    """A checkpoint covers every row: no segment needs its vector file any more."""
    for seg in m["segments"]:
        seg["files"]["vectors"] = None


def tail_rows(m: dict[str, Any]) -> int:
    """Rows not covered by the index checkpoint (their segment still has a vector file)."""
    return sum(s["rows"] for s in m["segments"] if s["files"].get("vectors"))


def checkpoint_rows(m: dict[str, Any]) -> int:
    idx = m.get("index") or m.get("shard_checkpoint")
    return int(idx.get("rows", 0)) if idx else 0


def needs_checkpoint(m: dict[str, Any], new_rows: int) -> bool:
    """Whether a commit adding ``new_rows`` to ``m`` (the current manifest) checkpoints."""
    return tail_rows(m) + new_rows >= max(CKPT_MIN_ROWS, CKPT_FRACTION * checkpoint_rows(m))


def needs_compaction(m: dict[str, Any], live_rows: int, schema_runs: int | None = None) -> bool:
    """Whether to compact: more than half of the stored rows deleted, or more than
    MAX_SEGMENTS segments that compaction would bring down to at most half as many
    (``schema_runs``: how many segments it would leave, one per run of alike table schemas;
    None: one)."""
    stored = sum(s["rows"] for s in m["segments"])
    if stored > COMPACT_MIN_ROWS and stored - live_rows > stored // 2:
        return True
    return len(m["segments"]) > MAX_SEGMENTS and (schema_runs or 1) <= MAX_SEGMENTS // 2


def covered_prefix(m: dict[str, Any]) -> int:
    """How many of ``m``'s segments, from the oldest, have no vector file (the index checkpoint
    holds their rows). They come first: a segment is written with a vector file, and a
    checkpoint drops every segment's."""
    n = 0
    for seg in m["segments"]:
        if seg["files"].get("vectors"):
            break
        n += 1
    return n


def merge_start(rows: list[int]) -> int | None:
    """Where the trailing run of segments to merge into one starts (an index into ``rows``),
    or None: nothing to merge. ``rows`` are the live rows of segments the checkpoint covers,
    oldest first.

    The tiers are merged bottom-up as one merge: the newest alike segments (see
    :data:`MERGE_FACTOR`) become one, which may complete the tier above, and so on."""
    sim = [(r, i) for i, r in enumerate(rows)]
    start = None
    while sim:
        lo = hi = total = sim[-1][0]
        i = len(sim) - 1
        while i > 0:
            r = sim[i - 1][0]
            if max(hi, r) >= MERGE_RATIO * max(min(lo, r), 1) or total + r > MERGE_MAX_ROWS:
                break
            lo, hi, total, i = min(lo, r), max(hi, r), total + r, i - 1
        if len(sim) - i < MERGE_FACTOR:
            break
        start = sim[i][1]
        sim[i:] = [(total, start)]
    return start
