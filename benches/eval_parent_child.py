"""nDCG@10 of parent-child knowledge bases against plain chunks, through the engine.

Run from the repository root with kbcore importable::

    python -m benches.eval_parent_child [--data DIR] [--sets scifact arguana] [--json OUT]

Each set's documents (title + text) are ingested as text with ``KnowledgeBase.ingest_many``
into knowledge bases that differ only in chunking, all with the built-in
``HashingEmbedder(384)`` (the shared MiniLM vectors embed the provided chunks, not the children
a parent-child knowledge base makes, so every row here is embedded by the engine itself) and
an exact ``flat`` index:

- ``chunk 500``: plain chunks (the engine's default, 500 / 50 characters);
- ``chunk 256``: plain chunks of the children's size (256 / 50);
- ``parent_child``: the engine's default sizes, parents of 2048 characters and children of
  512 (overlap 50);
- ``parent_child 2048/256``: LangRAG's sizes, children of 256 characters;

each queried with ``search_type`` ``vector`` and ``hybrid``. A result list is the document ids
of the hits in order with repeats dropped (a plain knowledge base with ``deduplicate=True``,
one chunk per document; a parent-child one counts top-k in parents and is also run with
``deduplicate=True``, one parent per document). ArguAna drops the query's own document (the
BEIR rule). Prints a Markdown table; relevance labels are only used to score.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benches.datasets import DEFAULT_DATA_ROOT
from benches.eval_hybrid import TOP_K, _jsonl, _qrels, ndcg_at_10

SETS = ("scifact", "arguana")
#: (label, create_knowledge_base keywords, deduplicate)
LAYOUTS: list[tuple[str, dict, bool]] = [
    ("chunk 500", {"chunk_size": 500, "chunk_overlap": 50}, True),
    ("chunk 256", {"chunk_size": 256, "chunk_overlap": 50}, True),
    # The engine's defaults (no sizes given): parents of 2048, children of 512.
    ("parent_child", {"index_type": "parent_child"}, False),
    ("parent_child dedup", None, True),  # the same knowledge base, one parent per document
    (
        "parent_child 2048/256",  # LangRAG's sizes
        {"index_type": "parent_child", "parent_chunk_size": 2048, "child_chunk_size": 256},
        False,
    ),
]
SEARCH_TYPES = ("vector", "hybrid")


def load(root: Path, name: str) -> dict | None:
    folder = root / name
    if not (folder / "documents.jsonl.gz").exists():
        return None
    docs = _jsonl(folder / "documents.jsonl.gz")
    return {
        "name": name,
        "docs": [{"document_id": d["id"], "text": (d.get("title", "") + "\n\n" + d["text"]).strip()} for d in docs],
        "queries": _jsonl(folder / "queries.jsonl"),
        "qrels": _qrels(folder / "qrels.tsv"),
        "exclude_self": name == "arguana",
    }


def ranked(kb, data: dict, search_type: str, deduplicate: bool) -> list[list[str]]:
    k = TOP_K + 1 if data["exclude_self"] else TOP_K
    out = []
    for q in data["queries"]:
        hits = kb.retrieve(q["text"], k, search_type=search_type, deduplicate=deduplicate)
        docs = list(dict.fromkeys(h.document_id for h in hits))
        if data["exclude_self"]:
            docs = [d for d in docs if d != q["id"]]
        out.append(docs[:TOP_K])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from kbcore.engine import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="data root (default $KBCORE_DATA, else ../shared/data)")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--json", default=None, help="write every number to this file")
    ap.add_argument("--layouts", nargs="+", default=None, help="run only these layouts (labels above; default: all)")
    args = ap.parse_args(argv)
    layouts = [lay for lay in LAYOUTS if args.layouts is None or lay[0] in args.layouts]
    if any(lay[1] is None for lay in layouts) and (args.layouts and "parent_child" not in args.layouts):
        raise SystemExit("'parent_child dedup' reuses the 'parent_child' knowledge base: list both")
    root = Path(args.data or os.environ.get("KBCORE_DATA", DEFAULT_DATA_ROOT))
    cols = [f"{label} {st}" for label, _, _ in layouts for st in SEARCH_TYPES]
    print("| set | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    report: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="kbcore-pc-") as tmp:
        engine = Engine(tmp)
        for name in args.sets:
            data = load(root, name)
            if data is None:
                print(f"| {name} | skipped: no data under {root / name} |")
                continue
            res: dict[str, float] = {}
            kb = None
            for i, (label, kw, dedup) in enumerate(layouts):
                if kw is not None:
                    t0 = time.perf_counter()
                    kb = engine.create_knowledge_base(f"{name}-{i}", index="flat", search_type="hybrid", **kw)
                    kb.ingest_many(data["docs"], progress=False)
                    res[f"{label} ingest s"] = time.perf_counter() - t0
                    res[f"{label} chunks"] = len(kb)
                for st in SEARCH_TYPES:
                    res[f"{label} {st}"] = ndcg_at_10(ranked(kb, data, st, dedup), data["queries"], data["qrels"])
            report[name] = res
            print(f"| {name} | " + " | ".join(f"{res[c]:.4f}" for c in cols) + " |", flush=True)
        engine.close()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
