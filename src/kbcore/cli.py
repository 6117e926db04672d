"""The ``kbcore`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import __version__, simd_level

# -- knowledge bases -------------------------------------------------------------------------

_DEMO_QUERIES = (
    ("how do I rotate the API signing keys?", None),
    ("what happens if nobody acknowledges a page?", None),
    ("how do I roll back a bad deploy?", None),
    ("how many reviewers does a billing change need?", None),
    ("how many vacation days do I get?", None),
    ("rotate keys", {"team": "security"}),
)
_DEMO_TEAMS = {
    "security.md": "security",
    "oncall.md": "sre",
    "deploys.html": "sre",
    "code-review.txt": "engineering",
    "faq.jsonl": "people",
}


def _sample_files() -> list[str]:
    import os

    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "handbook")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if not f.startswith("."))


def _snippet(text: str, width: int = 96) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "\u2026"


def _print_hits(hits: list, *, width: int = 96) -> None:
    if not hits:
        print("  (no hits)")
    for h in hits:
        print(f"  {h.score:.3f}  {h.document_id} #{h.chunk_index}  {_snippet(h.content, width)}")


def cmd_demo(args: argparse.Namespace) -> int:
    """Builds a knowledge base from the shipped handbook and queries it, with MiniLM when
    ``kbcore[minilm]`` is installed, else the built-in hashing embedder (it says which)."""
    import os
    import tempfile

    from .embedders import default_embedder, describe_embedder
    from .engine import Document, Engine

    files = _sample_files()
    embedder = default_embedder()
    with tempfile.TemporaryDirectory(prefix="kbcore-demo-") as tmp:
        t0 = time.perf_counter()
        engine = Engine(tmp)
        kb = engine.create_knowledge_base("handbook", chunk_size=400, chunk_overlap=60, embedder=embedder)
        docs = [
            Document(
                f, document_id=os.path.basename(f), metadata={"team": _DEMO_TEAMS.get(os.path.basename(f), "general")}
            )
            for f in files
        ]
        results = kb.ingest_many(docs, progress=False)
        elapsed = time.perf_counter() - t0
        chunks = sum(r.chunks for r in results)
        print(f"kbcore {__version__} | SIMD {simd_level()} | knowledge base in {tmp}")
        print(
            f"ingested {len(results)} sample documents ({', '.join(r.format or '?' for r in results)}) "
            f"into {chunks} chunks in {elapsed * 1e3:.0f} ms"
        )
        print(f"embedder: {describe_embedder(embedder)}\n")
        for query, filters in _DEMO_QUERIES:
            label = f" where {json.dumps(filters)}" if filters else ""
            print(f"? {query}{label}")
            t1 = time.perf_counter()
            hits = kb.retrieve(query, top_k=args.top_k, filters=filters, deduplicate=True)
            ms = (time.perf_counter() - t1) * 1e3
            _print_hits(hits)
            print(f"  ({ms:.2f} ms)\n")
        engine.close()
    return 0


def _engine(args: argparse.Namespace):
    from .engine import Engine

    return Engine(args.data)


def _expand(paths: Sequence[str]) -> list[tuple[str, str]]:
    """(path, document id) of every supported file under the given files and directories.

    A file's document id is its path relative to the directory given, or its base name when
    the file itself is given, so ``ingest docs/`` and ``ingest docs/a.md`` name ``a.md`` alike
    and re-ingesting replaces it."""
    import os

    from .parsing import EXTENSIONS

    out: list[tuple[str, str]] = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in sorted(files):
                    if f.startswith(".") or os.path.splitext(f)[1].lower() not in EXTENSIONS:
                        continue
                    full = os.path.join(root, f)
                    out.append((full, os.path.relpath(full, p).replace(os.sep, "/")))
        else:
            out.append((p, os.path.basename(p)))
    return out


_EMBEDDER_IDENTITY = (
    "kind",
    "model",
    "base_url",
    "api_version",
    "dimensions",
    "model_dir",
    "max_seq_length",
    "char_ngrams",
    "word_weight",
    "char_weight",
    "seed",
    "normalize",
)


def _check_same_embedder(kb, embedder) -> None:
    """--embedder on an existing knowledge base must be the one it was built with."""
    from .embedders import embedder_spec
    from .errors import InvalidArgumentError

    have = kb.info()["embedder"] or {"kind": "none"}
    want = embedder_spec(embedder) if embedder is not False else {"kind": "none"}
    same = all(have.get(k) == want.get(k) for k in _EMBEDDER_IDENTITY)
    if same and "dim" in have and "dim" in want:
        same = have["dim"] == want["dim"]
    if not same:
        raise InvalidArgumentError(
            f"knowledge base {kb.name!r} was built with embedder {have}, but --embedder asks for "
            f"{want}; a knowledge base keeps one embedder (its vectors must be comparable): ingest "
            "into a new knowledge base, or leave --embedder out"
        )


def _separators(values: list[str] | None) -> list[str] | None:
    """``--separator`` values with ``\\n`` / ``\\t`` read as a newline / tab."""
    if values is None:
        return None
    return [v.replace("\\n", "\n").replace("\\t", "\t") for v in values]


def cmd_ingest(args: argparse.Namespace) -> int:
    from .embedders import describe_embedder
    from .engine import Document

    metadata = _json_arg(args.metadata, "--metadata") if args.metadata else None
    embedder = embedder_from_cli_args(args)
    reranker = _reranker_arg(args)
    engine = _engine(args)
    if args.kb in engine:
        kb = engine.get_knowledge_base(args.kb)
        if embedder is not None:
            _check_same_embedder(kb, embedder)
        if reranker is not None:
            kb.set_reranker(reranker)
            print(f"default reranker of {args.kb!r}: {kb.reranker_spec}")
    else:
        kb = engine.create_knowledge_base(
            args.kb,
            chunk_size=args.chunk_size,
            embedder=embedder,
            chunk_overlap=args.chunk_overlap,
            chunk_unit=args.chunk_unit,
            separators=_separators(args.separators),
            index=_index_spec(args),
            shards=args.shards,
            reranker=reranker,
            index_type=args.index_type,
            parent_chunk_size=args.parent_chunk_size,
            child_chunk_size=args.child_chunk_size,
            context_window=args.context_window,
        )
        if reranker is not None:
            print(f"default reranker: {kb.reranker_spec}")
        used = describe_embedder(kb.embedder) if kb.embedder is not None else "none (vectors only)"
        print(f"created knowledge base {args.kb!r} in {engine.path}; embedder: {used}")
    if args.pipeline not in kb.pipelines:
        kb.create_pipeline(args.pipeline)
    if args.qa:
        return _ingest_qa(args, engine, kb, metadata)
    files = _expand(args.paths)
    if not files:
        raise SystemExit("kbcore ingest: no supported files found")
    t0 = time.perf_counter()
    docs = [Document(path, document_id=doc_id) for path, doc_id in files]
    results = kb.ingest_many(docs, pipeline=args.pipeline, metadata=metadata)
    dt = time.perf_counter() - t0
    chunks = sum(r.chunks for r in results)
    replaced = sum(r.replaced for r in results)
    print(f"ingested {len(results)} documents ({replaced} replaced), {chunks} chunks into {args.kb!r} in {dt:.2f} s")
    engine.close()
    return 0


def _ingest_qa(args: argparse.Namespace, engine: Any, kb: Any, metadata: Any) -> int:
    """``kbcore ingest --qa FILE...``: each file's question-answer rows as one document (its
    path as given is the document id), each file atomically, in order."""
    t0 = time.perf_counter()
    chunks = 0
    for path in args.paths:
        res = kb.ingest_qa(
            path,
            question_column=args.question_column,
            answer_column=args.answer_column,
            metadata=metadata,
            pipeline=args.pipeline,
        )
        chunks += res.chunks
        print(f"{path}: {res.chunks} question-answer pairs{' (replaced)' if res.replaced else ''}")
    dt = time.perf_counter() - t0
    print(f"ingested {len(args.paths)} QA files, {chunks} pairs into {args.kb!r} in {dt:.2f} s")
    engine.close()
    return 0


def _json_arg(text: str, flag: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"kbcore: {flag} is not valid JSON: {exc}") from None


def _reranker_arg(args: argparse.Namespace) -> Any:
    """The reranker of ``--reranker`` (a JSON spec or a kind name), or None."""
    from .rerankers import as_reranker

    spec = getattr(args, "reranker", None)
    return as_reranker(spec) if spec else None


def cmd_query(args: argparse.Namespace) -> int:
    from .errors import InvalidArgumentError

    filters = _json_arg(args.filter, "--filter") if args.filter else None
    if args.reranker and args.rerank is False:
        raise InvalidArgumentError("--reranker and --no-rerank contradict each other; give one")
    reranker = _reranker_arg(args)
    engine = _engine(args)
    opts = {
        "filters": filters,
        "deduplicate": args.dedup,
        "score_threshold": args.min_score,
        "search_type": args.search_type,
        "fusion": args.fusion,
        "vector_weight": args.vector_weight,
        "context_window": args.context_window,
        "rerank": reranker if reranker is not None else args.rerank,
        "rerank_depth": args.rerank_depth,
    }
    if len(args.kb) == 1:
        hits = engine.get_knowledge_base(args.kb[0]).retrieve(args.text, top_k=args.top_k, **opts)
    else:  # several knowledge bases: merged (docs/engine.md)
        hits = engine.retrieve(args.kb, args.text, top_k=args.top_k, **opts)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": h.id,
                        "document_id": h.document_id,
                        "chunk_index": h.chunk_index,
                        "score": h.score,
                        "distance": h.distance,
                        "content": h.content,
                        "metadata": h.metadata,
                    }
                    for h in hits
                ],
                indent=1,
                ensure_ascii=False,
            )
        )
    else:
        _print_hits(hits, width=120)
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    engine = _engine(args)
    kb = engine.get_knowledge_base(args.kb)
    n = kb.delete_document(args.document)
    print(f"deleted document {args.document!r} ({n} chunks) from {args.kb!r}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    engine = _engine(args)
    names = engine.knowledge_bases()
    if not names:
        print(f"no knowledge bases in {engine.path}")
    for name in names:
        kb = engine.get_knowledge_base(name)
        print(f"{name:<24} {kb.stats().documents:>7} documents {len(kb):>9} chunks  {kb.metric} {kb.dim}-d")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    engine = _engine(args)
    info = engine.get_knowledge_base(args.kb).info()
    print(json.dumps(info, indent=1, ensure_ascii=False, default=str))
    return 0


def _add_ingest_parser(sub: argparse._SubParsersAction, data_help: str) -> None:
    from .chunking import CHUNK_UNITS
    from .index import KINDS, QUANTIZATIONS, VECTORS

    ing = sub.add_parser("ingest", help="ingest files or directories into a knowledge base (created if missing)")
    ing.add_argument("paths", nargs="+", metavar="PATH")
    ing.add_argument("--kb", required=True, help="knowledge base name")
    ing.add_argument("--data", default=None, help=data_help)
    ing.add_argument("--metadata", default=None, help="JSON object added to every document's metadata")
    ing.add_argument("--pipeline", default="default")
    ing.add_argument(
        "--qa",
        action="store_true",
        help="the PATHs are question-answer files (.csv .tsv .jsonl .xlsx): the question is searched, "
        "the answer returned (docs/qa.md)",
    )
    ing.add_argument("--question-column", default="question", help="with --qa: the question column")
    ing.add_argument("--answer-column", default="answer", help="with --qa: the answer column")
    ing.add_argument("--chunk-size", type=int, default=500, help="for a new knowledge base")
    ing.add_argument("--chunk-overlap", type=int, default=50, help="for a new knowledge base")
    ing.add_argument(
        "--chunk-unit",
        default="chars",
        choices=CHUNK_UNITS,
        help="for a new knowledge base: what --chunk-size / --chunk-overlap count (docs/formats.md)",
    )
    ing.add_argument(
        "--separator",
        action="append",
        default=None,
        dest="separators",
        metavar="SEP",
        help="for a new knowledge base: cut at SEP before paragraphs, sentences and words (repeat: tried in "
        "order; \\n and \\t stand for a newline and a tab)",
    )
    ing.add_argument("--index", default="hnsw", choices=KINDS, help="for a new knowledge base")
    ing.add_argument(
        "--index-type",
        default="chunk",
        choices=("chunk", "parent_child"),
        help="for a new knowledge base: parent_child embeds small child chunks and returns their parents",
    )
    ing.add_argument("--parent-chunk-size", type=int, default=2048, help="for a new parent_child knowledge base")
    ing.add_argument(
        "--child-chunk-size",
        type=int,
        default=None,
        help="for a new parent_child knowledge base (default 512, or a quarter of the parent size if smaller)",
    )
    ing.add_argument(
        "--context-window",
        type=int,
        default=0,
        metavar="N",
        help="for a new knowledge base: the default number of neighbouring chunks added to each hit",
    )
    ing.add_argument(
        "--quantization",
        default="auto",
        choices=("auto", "none", *QUANTIZATIONS),
        help="for a new knowledge base: walk the graph on compressed codes (sq8: 8-bit; rabitq: --bits; "
        "hnsw only), re-ranked from the float32 rows; none: float32 rows only; auto (default): sq8 "
        "for an hnsw index, none for flat",
    )
    ing.add_argument(
        "--bits",
        type=int,
        default=None,
        help="for a new knowledge base with --quantization rabitq: bits per dimension, 1 to 8 (default 4)",
    )
    ing.add_argument(
        "--index-rerank",
        type=int,
        default=None,
        metavar="N",
        help="for a new knowledge base with --quantization: how many candidates a search re-ranks "
        "exactly on the float32 rows (default: the index's)",
    )
    ing.add_argument(
        "--vectors",
        default="memory",
        choices=VECTORS,
        help="for a new knowledge base with --quantization: keep the float32 rows in RAM (memory) or "
        "in the mapped index file, out of anonymous memory (disk); stored, every reopen keeps it",
    )
    add_embedder_arguments(ing)
    add_reranker_argument(ing, default_of="the knowledge base (in its manifest; kbcore query and serve use it)")
    ing.add_argument(
        "--shards",
        type=int,
        default=None,
        metavar="N",
        help="for a new knowledge base: shard its index over N Ray actors (needs kbcore[ray])",
    )
    ing.set_defaults(func=cmd_ingest)


def _add_query_parser(sub: argparse._SubParsersAction, data_help: str) -> None:
    from .engine import FUSIONS, SEARCH_TYPES

    q = sub.add_parser("query", help="retrieve the chunks that best match a text")
    q.add_argument("text")
    q.add_argument(
        "--kb", required=True, action="append", help="knowledge base name (repeat it to query several, merged)"
    )
    q.add_argument("--data", default=None, help=data_help)
    q.add_argument("--filter", default=None, help='JSON where filter, e.g. \'{"team": "infra"}\'')
    q.add_argument("--top-k", type=int, default=5)
    q.add_argument("--min-score", type=float, default=0.0, help="score threshold in [0, 1]")
    q.add_argument("--dedup", action="store_true", help="one hit per document")
    q.add_argument(
        "--search-type",
        default=None,
        choices=SEARCH_TYPES,
        help="vector (embeddings), full_text (BM25) or hybrid (both, fused); default: the knowledge base's",
    )
    q.add_argument(
        "--fusion",
        default=None,
        choices=FUSIONS,
        help="hybrid fusion: zscore (each leg's scores standardised per query, averaged), rrf "
        "(reciprocal rank fusion) or linear (weighted min-max scores); default: the knowledge base's",
    )
    q.add_argument(
        "--vector-weight",
        type=float,
        default=None,
        help="weight of the vector leg in linear fusion, in [0, 1]; default: the knowledge base's",
    )
    q.add_argument(
        "--context-window",
        type=int,
        default=None,
        metavar="N",
        help="add the N chunks before and after each hit (same document); default: the knowledge base's",
    )
    add_reranker_argument(q)
    q.add_argument(
        "--rerank",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--rerank: rerank with the knowledge base's default reranker (an error without one); "
        "--no-rerank: do not rerank; default: rerank when the knowledge base has a default reranker",
    )
    q.add_argument(
        "--rerank-depth",
        type=int,
        default=None,
        metavar="N",
        help="candidates the first stage passes to the reranker (default 50, at least --top-k)",
    )
    q.add_argument("--json", action="store_true", help="print hits as JSON")
    q.set_defaults(func=cmd_query)


def cmd_sync(args: argparse.Namespace) -> int:
    engine = _engine(args)
    kb = engine.get_knowledge_base(args.kb) if args.kb in engine else engine.create_knowledge_base(args.kb)
    if args.pipeline not in kb.pipelines:
        kb.create_pipeline(args.pipeline)
    t0 = time.perf_counter()
    report = kb.sync(
        args.dir,
        include=args.include or None,
        exclude=args.exclude or None,
        delete_missing=not args.keep_missing,
        pipeline=args.pipeline,
    )
    dt = time.perf_counter() - t0
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(report), indent=1, ensure_ascii=False))
    else:
        print(
            f"synced {args.dir!r} into {args.kb!r} in {dt:.2f} s: {len(report.added)} added, "
            f"{len(report.changed)} changed, {len(report.unchanged)} unchanged, {len(report.deleted)} deleted, "
            f"{len(report.failed)} failed; {report.chunks_embedded} chunks embedded, {report.chunks_reused} reused"
        )
        for doc_id, reason in report.failed:
            print(f"  failed {doc_id}: {reason}")
    engine.close()
    return 1 if report.failed else 0


def cmd_reembed(args: argparse.Namespace) -> int:
    from .embedders import describe_embedder

    embedder = embedder_from_cli_args(args)
    if not embedder:
        raise SystemExit("kbcore reembed: --embedder is required (and may not be none)")
    engine = _engine(args)
    kb = engine.get_knowledge_base(args.kb)
    report = kb.reembed(embedder, batch_size=args.batch_size)
    print(
        f"re-embedded {report.chunks} chunks of {args.kb!r} with {describe_embedder(embedder)} "
        f"({report.old_dim} -> {report.new_dim} dimensions) in {report.total_seconds:.2f} s "
        f"({report.embed_seconds:.2f} s in the embedder); generation {report.generation}"
    )
    engine.close()
    return 0


def _add_sync_parsers(sub: argparse._SubParsersAction, data_help: str) -> None:
    """sync and reembed."""
    s = sub.add_parser(
        "sync",
        help="make a knowledge base mirror a folder: add new files, replace changed ones (re-using "
        "unchanged chunks' vectors), delete removed ones",
    )
    s.add_argument("dir", metavar="DIR")
    s.add_argument("--kb", required=True, help="knowledge base name (created if missing)")
    s.add_argument("--data", default=None, help=data_help)
    s.add_argument("--pipeline", default="default")
    s.add_argument("--include", action="append", default=[], metavar="GLOB", help="only files matching (repeatable)")
    s.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="skip files matching (repeatable)")
    s.add_argument("--keep-missing", action="store_true", help="keep documents whose file is gone")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(func=cmd_sync)

    r = sub.add_parser(
        "reembed", help="embed every stored chunk again with another embedder (queries keep working meanwhile)"
    )
    r.add_argument("--kb", required=True)
    r.add_argument("--data", default=None, help=data_help)
    r.add_argument("--batch-size", type=int, default=256, help="texts per embedder call (default 256)")
    add_embedder_arguments(r)
    r.set_defaults(func=cmd_reembed)


def _add_admin_parsers(sub: argparse._SubParsersAction, data_help: str) -> None:
    """delete, list and info."""
    d = sub.add_parser("delete", help="delete a document from a knowledge base")
    d.add_argument("--kb", required=True)
    d.add_argument("--document", required=True, help="document id")
    d.add_argument("--data", default=None, help=data_help)
    d.set_defaults(func=cmd_delete)

    ls = sub.add_parser("list", help="list the knowledge bases")
    ls.add_argument("--data", default=None, help=data_help)
    ls.set_defaults(func=cmd_list)

    info = sub.add_parser("info", help="show a knowledge base's configuration and counts")
    info.add_argument("--kb", required=True)
    info.add_argument("--data", default=None, help=data_help)
    info.set_defaults(func=cmd_info)


def build_parser() -> argparse.ArgumentParser:
    """The ``kbcore`` argument parser: every subcommand, its options and its handler."""
    from .engine import default_data_dir

    parser = argparse.ArgumentParser(prog="kbcore", description="kbcore retrieval core and knowledge engine")
    parser.add_argument("--version", action="version", version=f"kbcore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="build a knowledge base from the shipped sample handbook and query it")
    demo.add_argument("--top-k", type=int, default=3)
    demo.set_defaults(func=cmd_demo)

    data_help = f"data directory (default $KBCORE_HOME or ./kb-data; now {default_data_dir()})"
    _add_ingest_parser(sub, data_help)
    _add_query_parser(sub, data_help)
    _add_admin_parsers(sub, data_help)
    _add_sync_parsers(sub, data_help)
    _add_serve_parser(sub, data_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import KbcoreError

    args = build_parser().parse_args(argv)
    try:
        status = int(args.func(args))
        sys.stdout.flush()  # a closed pipe surfaces here, inside the handler below
        return status
    except (KbcoreError, FileNotFoundError, ImportError) as exc:
        print(f"kbcore {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader closed the pipe (``kbcore demo | head``): stop quietly, as a shell tool
        # killed by SIGPIPE would. stdout goes to /dev/null so the interpreter's final flush
        # does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + 13  # 141, the status a shell reports for SIGPIPE


# -- the reranker option (ingest, query) ---------------------------------------------------


def add_reranker_argument(parser: argparse.ArgumentParser, *, default_of: str | None = None) -> None:
    """Adds ``--reranker SPEC`` (a JSON spec or a kind name; docs/rerankers.md)."""
    what = f"the default reranker of {default_of}" if default_of else "rerank with this reranker"
    parser.add_argument(
        "--reranker",
        default=None,
        metavar="SPEC",
        help=f'{what}: a JSON spec, e.g. \'{{"kind": "http", "api_format": "cohere", '
        f'"model": "rerank-v3.5", "base_url": "https://api.cohere.com/v2", '
        f'"api_key_env": "COHERE_API_KEY"}}\', or cross-encoder (a local model, kbcore[st])',
    )


# -- the embedder options (ingest, serve) ---------------------------------------------------


def add_embedder_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``--embedder`` and the ``--embedding-*`` options to an argparse parser (see
    :func:`embedder_from_cli_args`)."""
    from .embedders import EMBEDDER_KINDS
    from .embedders.openai import AZURE_API_VERSION

    g = parser.add_argument_group("embedder")
    g.add_argument(
        "--embedder",
        choices=EMBEDDER_KINDS,
        default=None,
        help="how texts become vectors: hashing (built-in, lexical), minilm (kbcore[minilm], "
        "semantic, offline), openai (any OpenAI-compatible /v1/embeddings: OpenAI, Ollama, "
        "vLLM, LocalAI, LM Studio), azure (an Azure OpenAI deployment), "
        "sentence-transformers (kbcore[st]), none (vectors only); default: the one the "
        "knowledge base recorded, else the engine's default",
    )
    g.add_argument(
        "--embedding-model",
        default=None,
        metavar="NAME",
        help="model name (openai, sentence-transformers) or deployment name (azure)",
    )
    g.add_argument(
        "--embedding-base-url",
        default=None,
        metavar="URL",
        help="openai: API root, default https://api.openai.com/v1 (Ollama: "
        "http://localhost:11434/v1); azure: the resource URL https://NAME.openai.azure.com",
    )
    g.add_argument(
        "--embedding-api-key-env",
        default=None,
        metavar="VAR",
        help="environment variable holding the API key (default OPENAI_API_KEY, azure: "
        "AZURE_OPENAI_API_KEY; '' for a server without authentication); the key itself "
        "is never stored",
    )
    g.add_argument(
        "--embedding-dimensions",
        type=int,
        default=None,
        metavar="N",
        help="openai/azure: ask for N-dimensional vectors (text-embedding-3-*); hashing: its dim",
    )
    g.add_argument(
        "--embedding-api-version",
        default=None,
        metavar="V",
        help=f"azure api-version (default {AZURE_API_VERSION}); openai: added as ?api-version=",
    )
    g.add_argument(
        "--embedding-batch-size", type=int, default=None, metavar="N", help="texts per request / per model batch"
    )
    g.add_argument(
        "--embedding-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="openai/azure: socket timeout per request (default 60)",
    )


_CLI_FIELDS = {
    "embedding_model": "--embedding-model",
    "embedding_base_url": "--embedding-base-url",
    "embedding_api_key_env": "--embedding-api-key-env",
    "embedding_dimensions": "--embedding-dimensions",
    "embedding_api_version": "--embedding-api-version",
    "embedding_batch_size": "--embedding-batch-size",
    "embedding_timeout": "--embedding-timeout",
}
_CLI_ALLOWED = {
    "hashing": {"embedding_dimensions", "embedding_batch_size"},
    "minilm": {"embedding_batch_size"},
    "e5": {"embedding_batch_size"},
    "openai": set(_CLI_FIELDS),
    "azure": set(_CLI_FIELDS),
    "sentence-transformers": {"embedding_model", "embedding_batch_size"},
    "none": set(),
}


def _index_spec(args: argparse.Namespace) -> Any:
    """The one :class:`~kbcore.index.IndexSpec` of ``kbcore ingest``'s index flags (validated
    there: InvalidArgumentError names the bad value)."""
    from .engine.directory import AUTO_QUANTIZATION, DEFAULT_HNSW_QUANTIZATION
    from .index import IndexSpec

    quantization = args.quantization
    if quantization == AUTO_QUANTIZATION:  # the engine's default (docs/engine.md, "Index layout")
        quantization = DEFAULT_HNSW_QUANTIZATION if args.index == "hnsw" else None
    elif quantization == "none":
        quantization = None
    return IndexSpec(
        kind=args.index,
        quantization=quantization,
        bits=args.bits,
        rerank=args.index_rerank,
        vectors=args.vectors,
    )


def embedder_from_cli_args(args: argparse.Namespace) -> Any:
    """The embedder that :func:`add_embedder_arguments`' options ask for.

    Returns None when ``--embedder`` is absent (use the knowledge base's recorded embedder, or
    the engine's default), False for ``--embedder none`` (vectors only: what
    ``Engine.create_knowledge_base(embedder=False)`` takes), else an embedder. Sends no request
    and reads no key. Raises InvalidArgumentError naming the option for a missing
    ``--embedding-model`` / ``--embedding-base-url``, or for an ``--embedding-*`` option that the
    chosen embedder does not use (or that is given without ``--embedder``).
    """
    from .embedders import EMBEDDER_KINDS, OpenAIEmbedder, embedder_from_spec
    from .embedders.openai import AZURE_API_VERSION, DEFAULT_BASE_URL
    from .errors import InvalidArgumentError

    kind = getattr(args, "embedder", None)
    given = {f for f in _CLI_FIELDS if getattr(args, f, None) is not None}
    if kind is None:
        if given:
            raise InvalidArgumentError(
                f"{', '.join(sorted(_CLI_FIELDS[f] for f in given))} need --embedder "
                "(openai, azure, hashing, minilm, e5 or sentence-transformers)"
            )
        return None
    if kind not in EMBEDDER_KINDS:
        raise InvalidArgumentError(f"unknown --embedder {kind!r}; expected one of {', '.join(EMBEDDER_KINDS)}")
    extra = given - _CLI_ALLOWED[kind]
    if extra:
        raise InvalidArgumentError(
            f"{', '.join(sorted(_CLI_FIELDS[f] for f in extra))} cannot be used with --embedder {kind}"
        )
    model = getattr(args, "embedding_model", None)
    batch = getattr(args, "embedding_batch_size", None)
    if kind == "none":
        return False
    if kind in ("hashing", "minilm", "e5", "sentence-transformers"):  # one spec, built by the registry
        spec: dict[str, Any] = {"kind": kind, "batch_size": batch}
        if kind == "hashing":
            spec["dim"] = getattr(args, "embedding_dimensions", None) or 384
        if kind == "sentence-transformers":
            if not model:
                raise InvalidArgumentError("--embedder sentence-transformers needs --embedding-model NAME")
            spec["model"] = model
        return embedder_from_spec(spec)
    options: dict[str, Any] = {"dimensions": getattr(args, "embedding_dimensions", None)}
    if batch:
        options["batch_size"] = batch
    if getattr(args, "embedding_timeout", None) is not None:
        options["timeout"] = args.embedding_timeout
    key_env = getattr(args, "embedding_api_key_env", None)
    base_url = getattr(args, "embedding_base_url", None)
    if not model:
        what = "deployment name" if kind == "azure" else "model name"
        raise InvalidArgumentError(f"--embedder {kind} needs --embedding-model (the {what})")
    if kind == "azure":
        if not base_url:
            raise InvalidArgumentError(
                "--embedder azure needs --embedding-base-url https://NAME.openai.azure.com (the resource URL)"
            )
        return OpenAIEmbedder.azure(
            base_url,
            model,
            api_version=getattr(args, "embedding_api_version", None) or AZURE_API_VERSION,
            api_key_env=(key_env if key_env is not None else "AZURE_OPENAI_API_KEY") or None,
            **options,
        )
    return OpenAIEmbedder(
        model,
        base_url=base_url or DEFAULT_BASE_URL,
        api_key_env=(key_env if key_env is not None else "OPENAI_API_KEY") or None,
        api_version=getattr(args, "embedding_api_version", None),
        **options,
    )


# -- serve: Dify's External Knowledge API (kbcore[server]; kbcore.dify.server) ---------------


def _add_serve_parser(sub: argparse._SubParsersAction, data_help: str) -> None:
    from .dify import server as srv  # imports no web framework

    p = sub.add_parser(
        "serve",
        help="serve knowledge bases over Dify's External Knowledge API (POST /retrieval)",
        description="Serves the knowledge bases of a data directory over Dify's External "
        f"Knowledge API. Keys come from --api-key and from ${srv.API_KEYS_ENV} (comma "
        "separated); prefer the variable, command lines are visible to other users.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"an accepted bearer key (repeatable; also ${srv.API_KEYS_ENV})",
    )
    p.add_argument("--data", default=None, metavar="DIR", help=data_help)
    limits = [
        ("--max-top-k", int, srv.DEFAULT_MAX_TOP_K, "largest top_k served; larger is clamped"),
        ("--max-body-bytes", int, srv.DEFAULT_MAX_BODY_BYTES, "request body limit in bytes"),
        (
            "--refresh-interval",
            float,
            srv.DEFAULT_REFRESH_INTERVAL,
            "seconds between checks for changes by other processes (0: never)",
        ),
        ("--body-timeout", float, srv.DEFAULT_BODY_TIMEOUT, "seconds a client has to send its request body (then 408)"),
        (
            "--header-timeout",
            float,
            srv.DEFAULT_HEADER_TIMEOUT,
            "seconds a new connection has to send its request headers (then closed)",
        ),
        (
            "--keep-alive-timeout",
            int,
            srv.DEFAULT_KEEP_ALIVE_TIMEOUT,
            "seconds an idle keep-alive connection stays open",
        ),
        ("--max-connections", int, srv.DEFAULT_MAX_CONNECTIONS, "connections served at once (503 beyond)"),
        (
            "--max-head-bytes",
            int,
            srv.DEFAULT_MAX_HEAD_BYTES,
            "largest request head (request line and headers) in bytes (431 and closed beyond)",
        ),
    ]
    for flag, kind, default, text in limits:
        p.add_argument(flag, type=kind, default=default, help=f"{text} (default {default})")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--views",
        default=None,
        metavar="FILE",
        help="JSON file of views: knowledge ids scoping one or several knowledge bases with a fixed "
        "filter, search type, top-k cap, score floor and their own keys (docs/dify.md)",
    )
    p.add_argument(
        "--no-mmap",
        dest="mmap",
        action="store_false",
        help="copy each knowledge base's index into memory when it opens instead of reading it in "
        "place from its file: a slower open and more memory, faster searches of a large one",
    )
    add_embedder_arguments(p)
    p.set_defaults(func=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .dify import server as srv
    from .engine import default_data_dir
    from .errors import InvalidArgumentError

    try:
        keys = srv.parse_api_keys(args.api_key)
        embedder = embedder_from_cli_args(args) or None  # for knowledge bases built with a custom one
        srv.serve(
            args.data or default_data_dir(),
            keys,
            host=args.host,
            port=args.port,
            max_body_bytes=args.max_body_bytes,
            max_top_k=args.max_top_k,
            refresh_interval=args.refresh_interval,
            body_timeout=args.body_timeout,
            header_timeout=args.header_timeout,
            keep_alive_timeout=args.keep_alive_timeout,
            max_connections=args.max_connections,
            max_head_bytes=args.max_head_bytes,
            log_level=args.log_level,
            embedder=embedder,
            views=args.views,
            mmap=args.mmap,
        )
    except (ImportError, InvalidArgumentError, FileNotFoundError) as exc:
        print(f"kbcore serve: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
