"""Retrieval over several knowledge bases at once (:meth:`Engine.retrieve`).

Each knowledge base is searched on its own terms (its filters, search type, dedup and
context window), with the query embedded once per distinct embedder spec. The vector searches
(no reranker, no context window) run as **one** native call,
:func:`kbcore.index.search_many`: each knowledge base's checks in Python, then every search
under every read lock, concurrently on the native search pool with the GIL released
(:func:`kbcore.index.set_search_threads` sizes it), the same answers as one call per knowledge
base. The other first stages (full text, hybrid) run one after the other, or in Python
threads when the knowledge bases hold at least ``PARALLEL_MIN_CHUNKS`` chunks together. The
hit lists are then merged:

- **by score** when every knowledge base has the same metric, the same embedder spec and the
  same search type and fusion: their scores are on one scale, so the merged list is the
  union ordered by ``score`` (ties: the order of ``names``, then each list's own order);
- **by reciprocal rank** otherwise: a hit ranked ``r`` (1-based) in its knowledge base's list
  gets ``1 / (60 + r)``, the lists are interleaved by that value (ties: the better ``score``,
  then the order of ``names``). Each hit keeps its own knowledge base's ``score``.

Reranking: ``rerank=<a reranker>`` reranks **once** over the merged list (each knowledge base's
first stage gives ``rerank_depth`` candidates, unreranked and without threshold; they are
merged as above, reranked, then ``score_threshold`` and ``top_k`` apply). ``rerank=None`` /
``True`` leave it to each knowledge base's default reranker, and the lists merge by score only
when those defaults are the same reranker; ``False``: no rerank.

Every hit's ``metadata`` says where it came from: ``knowledge_base`` (its name) and
``merged_by`` (``"score"`` or ``"rank"``). Deduplication is per knowledge base and document:
hits of the same document id in two knowledge bases are two hits.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError
from ..rerankers import as_reranker
from . import reranking
from .retrieval import check_k, expect_searches, merged_hits, shortlists
from .types import Hit, SearchOptions

#: Rank constant of the reciprocal-rank merge (Cormack et al. 2009).
RANK_K = 60
#: Most threads searching knowledge bases at once (one pool per process, made on first use).
MAX_THREADS = 8
#: Fewest chunks (over the knowledge bases searched) for which the searches run in threads:
#: below it a search is ~100 us, of which the Python half holds the GIL, and handing the calls
#: to threads costs more than it saves (``benches/bench_multi_kb.py`` measures both ways).
PARALLEL_MIN_CHUNKS = 100_000

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="kbcore-multi")
        return _pool


def check_names(names: Any) -> list[str]:
    """``names`` (a str or a sequence of distinct str) as a non-empty list."""
    if isinstance(names, str):
        return [names]
    if not isinstance(names, Sequence) or isinstance(names, (bytes, bytearray)):
        raise InvalidTypeError(f"names must be a str or a list of str, got {type(names).__name__}")
    out = list(names)
    if not out:
        raise InvalidArgumentError("names is empty: give at least one knowledge base")
    for n in out:
        if not isinstance(n, str):
            raise InvalidTypeError(f"a knowledge base name must be a str, got {type(n).__name__}")
    if len(set(out)) != len(out):
        dup = next(n for i, n in enumerate(out) if n in out[:i])
        raise InvalidArgumentError(f"knowledge base {dup!r} is named twice")
    return out


def _mode(defaults: tuple[str, str, float], opts: SearchOptions) -> tuple[str, str]:
    """(search type, fusion or "") of a knowledge base with these search defaults."""
    mode = opts.search_type if opts.search_type is not None else defaults[0]
    fusion = opts.fusion if opts.fusion is not None else defaults[1]
    return mode, (fusion if mode == "hybrid" else "")


def retrieve_many(kbs: Sequence[Any], query: Any, top_k: Any, opts: SearchOptions) -> list[Hit]:
    """The ``top_k`` best hits of ``query`` over ``kbs`` (open :class:`KnowledgeBase`
    objects, through their public API; see the module docstring)."""
    top_k = check_k(top_k, "top_k")
    rerank = opts.rerank
    if rerank is not None and rerank is not True and rerank is not False:
        # One reranker over the merged list: each knowledge base's first stage (no rerank, no
        # threshold) gives rerank_depth candidates, merged, then reranked once.
        if not isinstance(query, str):
            raise InvalidArgumentError("rerank needs the query as text (a reranker reads it)")
        reranker = as_reranker(rerank)
        depth = reranking.check_depth(opts.rerank_depth, top_k)
        first = retrieve_many(kbs, query, depth, opts._replace(rerank=False, score_threshold=0.0))
        return reranking.apply(reranker, query, first, top_k, opts.score_threshold)
    # (search defaults, embedder spec, metric, reranker spec, chunks) of each knowledge base.
    facts = [kb._merge_facts() for kb in kbs]
    modes = [_mode(f[0], opts) for f in facts]
    if len(kbs) > 1:
        # The vector searches run as one native call after the embedding: the pool's workers
        # wake meanwhile (their wake-up would otherwise delay that call by about one search).
        expect_searches(modes.count(("vector", "")))
    specs = _spec_ids([f[1] for f in facts])
    calls: list[tuple[Any, SearchOptions]] = []
    vectors: dict[int, np.ndarray] = {}
    vector_opts: SearchOptions | None = None  # one for every vector search (a NamedTuple: shared)
    text = isinstance(query, str) and opts.query_vector is None
    for kb, (mode, _), spec in zip(kbs, modes, specs):
        if not text or mode == "full_text" or not query.strip():
            calls.append((query, opts))  # the knowledge base raises or searches as given
            continue
        vec = vectors.get(spec)
        if vec is None:
            vec = vectors[spec] = kb.embed_query(query)
        if mode == "vector":
            if vector_opts is None:
                vector_opts = opts._replace(search_type="vector")
            calls.append((vec, vector_opts))
        else:
            calls.append((query, opts._replace(search_type=mode, query_vector=vec)))
    parallel = len(kbs) > 1 and sum([f[4] for f in facts]) >= PARALLEL_MIN_CHUNKS
    same = len(set(specs)) == 1 and len(set(modes)) == 1 and len({f[2] for f in facts}) == 1
    if same and rerank is not False:  # each reranked by its default: one scale if one reranker
        rerankers = [f[3] for f in facts]
        same = rerankers.count(rerankers[0]) == len(rerankers)
    merged_by = "score" if same else "rank"
    if len(kbs) > 1:
        out = _merge_shortlists(kbs, calls, top_k, same, parallel)
        if out is not None:
            return _tag(out, merged_by)
    if parallel:
        pool = _executor()
        futures = [pool.submit(kb.retrieve, q, top_k, o) for kb, (q, o) in zip(kbs, calls)]
        lists = [f.result() for f in futures]  # the first error raises, naming its knowledge base
    else:
        lists = [kb.retrieve(q, top_k, o) for kb, (q, o) in zip(kbs, calls)]
    tagged: list[tuple[float, float, int, int, Hit]] = []
    for i, hits in enumerate(lists):
        for r, h in enumerate(hits):
            primary = h.score if same else 1.0 / (RANK_K + r + 1)
            tagged.append((-primary, -h.score, i, r, h))
    tagged.sort(key=lambda t: t[:4])
    return _tag([(kbs[i], h) for _, _, i, _, h in tagged[:top_k]], merged_by)


def _merge_shortlists(
    kbs: Sequence[Any], calls: list[tuple[Any, SearchOptions]], top_k: int, same: bool, parallel: bool
) -> list[tuple[Any, Hit]] | None:
    """The merge over candidates: each knowledge base's first stage without its hits
    (``_shortlist``), merged by the same keys as the hits would be, then hits built only for
    the ``top_k`` kept. None when a knowledge base's call is not that simple (a reranker, a
    context window) or changed before its hits were built: the caller merges whole hit lists.
    When every call is a vector search, the searches, the merge and the hits run as one
    :func:`~kbcore.engine.retrieval.merged_hits` call (one native search call, the merge on
    the candidates' scores, the hits built under the read locks of the search: no knowledge
    base can change before its hits are built)."""
    searches = [kb._vector_search(q, top_k, o) for kb, (q, o) in zip(kbs, calls)]
    if None not in searches:
        try:
            pairs = merged_hits(searches, lambda scores: _pick(scores, top_k, same))
        except InvalidArgumentError:
            pass  # e.g. a re-embed changed a dimension since the query was embedded: below
        else:
            return [(kbs[i], h) for i, h in pairs]
    shorts = _shortlists(kbs, calls, top_k, parallel, searches)
    tagged: list[tuple[float, float, int, int]] = []
    for i, short in enumerate(shorts):
        if short is None:
            return None
        for r, score in enumerate(short.scores()):
            tagged.append((-score if same else -1.0 / (RANK_K + r + 1), -score, i, r))
    tagged.sort()
    kept = tagged[:top_k]
    picks: dict[int, list[int]] = {}
    for _, _, i, r in kept:
        picks.setdefault(i, []).append(r)
    built: dict[tuple[int, int], Hit] = {}
    for i, rows in picks.items():
        short = shorts[i]
        assert short is not None
        hits = kbs[i]._hits_of(short, [short.cands[r] for r in rows])
        if hits is None:
            return None
        built.update(zip(((i, r) for r in rows), hits))
    return [(kbs[i], built[i, r]) for _, _, i, r in kept]


def _pick(scores: list[list[float]], top_k: int, same: bool) -> list[tuple[int, int]]:
    """The (knowledge base, rank) pairs of the ``top_k`` best candidates, best first, from each
    knowledge base's scores (best first): the keys of the merge of whole hit lists (by score,
    or by reciprocal rank then score; then the order of the knowledge bases, then rank)."""
    if same:
        # By score, ties in list order: a stable sort of the concatenated scores, descending
        # (reverse keeps equal items in their order), is the sort by (-score, list, rank)
        # without a key tuple per candidate; a kept position maps back to its list by the
        # lists' start offsets (an empty list shares its start with the next one: bisect
        # finds the last list starting at or before the position, the one holding it).
        flat: list[float] = []
        start: list[int] = []
        for vs in scores:
            start.append(len(flat))
            flat += vs
        out = []
        for j in sorted(range(len(flat)), key=flat.__getitem__, reverse=True)[:top_k]:
            i = bisect_right(start, j) - 1
            out.append((i, j - start[i]))
        return out
    tagged = [(-1.0 / (RANK_K + r + 1), -v, i, r) for i, vs in enumerate(scores) for r, v in enumerate(vs)]
    tagged.sort()
    return [(int(t[-2]), int(t[-1])) for t in tagged[:top_k]]


def _shortlists(
    kbs: Sequence[Any],
    calls: list[tuple[Any, SearchOptions]],
    top_k: int,
    parallel: bool,
    searches: list[Any] | None = None,
) -> list[Any]:
    """Each knowledge base's first stage without its hits (a ``Shortlist``, or None: merge
    whole hit lists). The vector searches (``searches``: each knowledge base's
    ``_vector_search``, made here when not given) run as one native call, concurrently with
    the GIL released (:func:`kbcore.engine.retrieval.shortlists`); the others (full text,
    hybrid) one by one, or in threads when ``parallel``."""
    if searches is None:
        searches = [kb._vector_search(q, top_k, o) for kb, (q, o) in zip(kbs, calls)]
    batch = [s for s in searches if s is not None]
    if len(batch) > 1:
        try:
            found = iter(shortlists(batch))
        except InvalidArgumentError:
            # e.g. a re-embed switched a knowledge base to another dimension since its query
            # was embedded: its own call sorts that out, or raises the same error.
            searches = [None] * len(kbs)
        else:
            searches = [next(found) if s is not None else None for s in searches]
    else:
        searches = [None] * len(kbs)
    todo = [i for i, s in enumerate(searches) if s is None]
    if parallel and len(todo) > 1:
        pool = _executor()
        futures = {i: pool.submit(kbs[i]._shortlist, calls[i][0], top_k, calls[i][1]) for i in todo}
        return [futures[i].result() if i in futures else s for i, s in enumerate(searches)]
    return [kbs[i]._shortlist(calls[i][0], top_k, calls[i][1]) if s is None else s for i, s in enumerate(searches)]


def _tag(pairs: list[tuple[Any, Hit]], merged_by: str) -> list[Hit]:
    """The merged hits, each tagged with its knowledge base and how the lists were merged."""
    out = []
    for kb, h in pairs:
        meta = h.metadata  # the hit's own dict, made for this call: tag it in place
        meta["knowledge_base"] = kb.name
        meta["merged_by"] = merged_by
        out.append(h)
    return out


def _spec_ids(specs: list[Any]) -> list[int]:
    """For each embedder spec, the index of the first equal one (equal specs embed alike).
    Compares each spec with the distinct ones met so far only (in the usual case, one: the
    first), in a plain loop: no generator per knowledge base."""
    out: list[int] = []
    distinct: list[tuple[Any, int]] = []
    for i, spec in enumerate(specs):
        for seen, j in distinct:
            if seen == spec:
                out.append(j)
                break
        else:
            distinct.append((spec, i))
            out.append(i)
    return out
