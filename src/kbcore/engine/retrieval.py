"""Retrieval: read-only, driven by one :class:`SearchOptions`, through the public
:class:`~kbcore.Index` API only.

Routes: ``vector`` (``Index.search``, or ``Index.search_groups`` over the ``_group`` field
for ``deduplicate=True``: the native grouping), ``full_text`` (``Index.search_text``) and
``hybrid`` (both legs over a window of candidates, fused by :mod:`kbcore.fusion`). A fused
list is deduplicated in fused order by the chunks' ``_group`` values, natively
(:meth:`Index.collapse`, the rule of grouped search), widening the window while too few
documents come back.

Scores: vector hits map the distance (:mod:`kbcore.engine.scores`); full-text hits score
``bm25 / best bm25 of the query``; z-score fusion ``Phi(mean of the legs' z-scores)`` (the
normal CDF; each leg standardised over its own candidates, :func:`kbcore.fusion.zscore`,
equal weights); RRF hits their RRF value over its maximum
``2 / (rrf_k + 1)``; linear fusion ``vector_weight * minmax(vector score) + (1 - vector_weight)
* minmax(bm25)``. For full-text and hybrid hits ``distance`` is ``1 - score``.

Every search takes the knowledge base's ``RWLock.read()`` once and uses one
:class:`~kbcore.engine.state.KbState` snapshot throughout. Writes nothing.
"""

from __future__ import annotations

from bisect import bisect_right as _bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, cast

import numpy as np

from ..errors import InvalidArgumentError, InvalidTypeError
from ..filters import native_filter
from ..fusion import check_rrf_k, check_vector_weight, linear, normalize_rrf, rrf, zscore
from ..index import Group, Index, Search, collapse_by_key, fuse_rrf, search_many, wake_search_pool
from .scores import score_from_distance
from .state import KbState, StateCell
from .types import (
    FUSIONS,
    GROUP_FIELD,
    PARENT_FIELD,
    PARENT_INDEX,
    SEARCH_TYPES,
    Hit,
    SearchOptions,
    check_choice,
    new_hit,
)

#: (chunk id, distance or fused score, ids of the chunks of its document met) of one result.
Candidate = tuple[int, float, Sequence[int]]
#: Embeds one text query (raising a clear error when the knowledge base cannot).
EmbedQuery = Callable[[str, str], np.ndarray]


class Shortlist(NamedTuple):
    """A first stage's answer before its hits are built: the snapshot searched, the candidates
    in order (what :func:`make_hits` turns into hits) and how to read their values. Lets a
    caller that keeps only some candidates (the merge over several knowledge bases) build
    those alone (:func:`hits_of`)."""

    state: KbState | None  # None: an empty knowledge base (no candidates)
    cands: list[Candidate]
    metric: str
    fused: bool

    def scores(self) -> list[float]:
        """Each candidate's ``Hit.score`` (the same value its hit gets)."""
        if self.fused:
            return [c[1] for c in self.cands]
        metric = self.metric
        return [score_from_distance(c[1], metric) for c in self.cands]


_EMPTY = Shortlist(None, [], "", False)
_DEFAULT_OPTIONS = SearchOptions()
_OPTION_NAMES = SearchOptions._fields


def options(base: SearchOptions | None, overrides: Mapping[str, Any]) -> SearchOptions:
    """The options of one call: ``base`` (or the defaults) with keyword ``overrides``."""
    if not overrides:
        if base is None:
            return _DEFAULT_OPTIONS
        if type(base) is not SearchOptions:
            raise InvalidTypeError(f"options must be a SearchOptions, got {type(base).__name__}")
        return base
    try:
        if base is None:
            return SearchOptions(**overrides)
        if type(base) is SearchOptions:
            return base._replace(**overrides)
    except TypeError:
        unknown = next((k for k in overrides if k not in _OPTION_NAMES), None)
        if unknown is None:
            raise
        raise InvalidTypeError(
            f"unknown search option {unknown!r}; the options are {', '.join(_OPTION_NAMES)}"
        ) from None
    except ValueError:  # _replace names the unexpected field with a ValueError
        unknown = next(k for k in overrides if k not in _OPTION_NAMES)
        raise InvalidTypeError(
            f"unknown search option {unknown!r}; the options are {', '.join(_OPTION_NAMES)}"
        ) from None
    raise InvalidTypeError(f"options must be a SearchOptions, got {type(base).__name__}")


def check_k(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"{name} must be an integer, got {type(value).__name__}")
    if value < 1:
        raise InvalidArgumentError(f"{name} must be at least 1, got {value}")
    return int(value)


def retrieve(cell: StateCell, query: Any, top_k: Any, opts: SearchOptions, embed_query: EmbedQuery) -> list[Hit]:
    """The ``top_k`` best hits of ``query`` (see :meth:`KnowledgeBase.retrieve`), each with
    its ``context_window`` neighbours when asked."""
    n = opts.context_window
    config = cell.state.config
    if n is None:
        n = config.get("context_window", 0)
    elif n != 0:
        n = check_context_window(n)
        if config.get("index_type") == "parent_child":
            raise InvalidArgumentError(
                "context_window does not apply to a parent_child knowledge base: its hits are already the "
                "parents around the matching chunks (make parent_chunk_size larger for more context)"
            )
    hits = cast("list[Hit]", _retrieve(cell, query, top_k, opts, embed_query))
    return with_context(cell.state, hits, n) if n and hits else hits


def shortlist(
    cell: StateCell, query: Any, top_k: Any, opts: SearchOptions, embed_query: EmbedQuery
) -> Shortlist | None:
    """:func:`retrieve`'s candidates without their hits (:class:`Shortlist`), or None when the
    call asks for a context window (the neighbours shown depend on every hit of the list):
    then :func:`retrieve` it is."""
    n = opts.context_window
    if n is None:
        n = cell.state.config.get("context_window", 0)
    if n != 0:
        return None
    return cast("Shortlist", _retrieve(cell, query, top_k, opts, embed_query, lazy=True))


def hits_of(cell: StateCell, short: Shortlist, cands: list[Candidate]) -> list[Hit] | None:
    """The hits of some of ``short``'s candidates (as :func:`retrieve` would have built
    them), or None when the knowledge base changed since it was searched (its index may no
    longer hold them: search again)."""
    if not cands:
        return []
    with cell.rw.read():
        state = cell.state
        if state is not short.state:
            return None
        return make_hits(state, cands, short.metric, fused=short.fused)


def texts_of(short: Shortlist) -> list[str] | None:
    """The ``content`` each of ``short``'s candidates' hits would have (what a reranker
    reads), without building the hits; None for a parent-child or question-answer knowledge
    base (their content is not the chunk's own text: build the hits). The snapshot's segments
    are immutable: no lock needed."""
    state = short.state
    if state is None or not short.cands:
        return []
    if state.config.get("index_type") == "parent_child":
        return None
    segs = state.segments
    if len(segs) == 1 and segs[0].contiguous:
        only = segs[0]
        if only.content is not None:
            return None
        if only.text_views is not None:  # text_of's slice, inlined: this is the per-candidate cost
            offsets, data, base = only.text_views
            shift = base - only.min_id
            return [str(data[offsets[c[0] + shift] : offsets[c[0] + shift + 1]], "utf-8") for c in short.cands]
        first, text_of = only.min_id, only.text_of
        return [text_of(c[0] - first) for c in short.cands]
    out = []
    locate = state.locate
    for c in short.cands:
        seg, row = locate(c[0])
        if seg.content is not None:
            return None
        out.append(seg.text_of(row))
    return out


def check_context_window(value: Any) -> int:
    """``context_window`` as an int >= 0, else InvalidTypeError / InvalidArgumentError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidTypeError(f"context_window must be an integer, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgumentError(f"context_window must be at least 0, got {value}")
    return int(value)


def with_context(state: KbState, hits: list[Hit], n: int) -> list[Hit]:
    """``hits`` with each content extended by up to ``n`` chunks of the same document on
    each side (by ``chunk_index``), joined by newlines in chunk order. Every chunk appears at
    most once in the list: the hits' own chunks are reserved first, then each hit, best
    first, takes the neighbours not yet shown. Reads the immutable segments of ``state``; a
    hit whose chunk is no longer stored there (a concurrent re-ingest) keeps its content."""
    where: list[tuple[Any, int, int, int] | None] = []
    taken: set[tuple[str, int]] = set()
    for h in hits:
        try:
            seg, row = state.locate(h.id)
        except IndexError:
            where.append(None)
            continue
        if not 0 <= row < seg.rows or int(seg.ids[row]) != h.id:
            where.append(None)
            continue
        d = int(np.searchsorted(seg.doc_offsets, row, side="right")) - 1
        where.append((seg, row, int(seg.doc_offsets[d]), int(seg.doc_offsets[d + 1])))
        taken.add((seg.name, row))
    out = []
    for h, loc in zip(hits, where):
        if loc is None:
            out.append(h)
            continue
        seg, row, lo, hi = loc
        ci = seg.chunk_index[lo:hi]
        own = int(seg.chunk_index[row])
        near = np.flatnonzero(np.abs(ci - own) <= n) + lo
        rows = [row] + [int(r) for r in near if (seg.name, int(r)) not in taken]
        taken.update((seg.name, r) for r in rows)
        rows.sort(key=lambda r: int(seg.chunk_index[r]))
        meta = dict(h.metadata)
        meta["context_chunks"] = [int(seg.chunk_index[r]) for r in rows]
        content = "\n".join(seg.content_of(r) or seg.text_of(r) for r in rows)
        out.append(replace(h, content=content, metadata=meta))
    return out


def _retrieve(
    cell: StateCell, query: Any, top_k: Any, opts: SearchOptions, embed_query: EmbedQuery, *, lazy: bool = False
) -> list[Hit] | Shortlist:
    """The hits (or, ``lazy``, the :class:`Shortlist`) of one search."""
    top_k, threshold, mode, fusion, weight, where = _checked(cell, query, top_k, opts)
    if mode != "vector":
        return _retrieve_fused(cell, query, top_k, opts, where, mode, fusion, weight, embed_query, lazy)
    q = _query_vector(query if opts.query_vector is None else opts.query_vector, embed_query)
    with cell.rw.read():
        state = cell.state
        index = state.index
        if index is None or len(index) == 0:
            return _EMPTY if lazy else []
        group_by = _group_field(state, opts.deduplicate)
        # No more hits than rows: a huge top_k must not size the result arrays.
        k = min(top_k, len(index))
        cands = vector_candidates(index, q, k, where, group_by is not None, opts.ef, group_by or GROUP_FIELD)
        metric = state.config["metric"]
        if threshold > 0.0:
            cands = [c for c in cands if score_from_distance(c[1], metric) >= threshold]
        if lazy:
            return Shortlist(state, cands, metric, False)
        return make_hits(state, cands, metric, fused=False)


def _checked(cell: StateCell, query: Any, top_k: Any, opts: SearchOptions) -> tuple[int, Any, str, str, float, Any]:
    """The checks every search makes before it searches: (top_k, score threshold, search
    type, fusion, vector weight, the where clause with the pipelines)."""
    top_k = check_k(top_k, "top_k")
    threshold = opts.score_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise InvalidTypeError(f"score_threshold must be a number, got {type(threshold).__name__}")
    state = cell.state
    mode, fusion, weight = _search_mode(state, query, opts)
    if opts is not _DEFAULT_OPTIONS:  # checked whatever the search type (the defaults are valid)
        rrf_k = opts.rrf_k
        if type(rrf_k) is not int or rrf_k < 0:  # an int >= 0 is valid: no numbers.Real check
            check_rrf_k(rrf_k, "rrf_k")
        if opts.window is not None:
            check_k(opts.window, "window")
    if opts.query_vector is not None and not isinstance(query, str):
        raise InvalidArgumentError("query_vector= goes with a text query; the query is already a vector")
    return top_k, threshold, mode, fusion, weight, _where(state, opts.filters, opts.pipelines)


class VectorSearch(NamedTuple):
    """A vector first stage checked and ready to search (:func:`vector_search`), so that
    several knowledge bases' searches run as one native call (:func:`shortlists`)."""

    cell: StateCell
    q: np.ndarray
    top_k: int
    where: Any
    deduplicate: bool
    ef: int | None
    threshold: float


def vector_search(
    cell: StateCell, query: Any, top_k: Any, opts: SearchOptions, embed_query: EmbedQuery
) -> VectorSearch | None:
    """:func:`shortlist`'s checks and query vector, without searching; None when the call is
    not a vector search without context window (then :func:`shortlist` it is). Raises what
    :func:`shortlist` would raise before it searches."""
    n = opts.context_window
    if n is None:
        n = cell.state.config.get("context_window", 0)
    if n != 0:
        return None
    top_k, threshold, mode, _, _, where = _checked(cell, query, top_k, opts)
    if mode != "vector":
        return None
    q = _query_vector(query if opts.query_vector is None else opts.query_vector, embed_query)
    return VectorSearch(cell, q, top_k, where, bool(opts.deduplicate), opts.ef, threshold)


def expect_searches(n: int) -> None:
    """Announces ``n`` vector searches as one :func:`search_many` call soon (after the query's
    embedding): the native pool's workers wake now instead of at that call (a hint only)."""
    wake_search_pool(n)


def shortlists(searches: Sequence[VectorSearch]) -> list[Shortlist]:
    """The :class:`Shortlist` of each search, as :func:`shortlist` would give it, the searches
    of native indexes run as one :func:`~kbcore.index.search_many` call (concurrently, the
    GIL released) under every knowledge base's read lock (each taken once)."""
    return _under_read_locks(searches, _shortlists_locked)


#: Picks the candidates kept over several searches: given each search's scores (best first,
#: after its threshold), the (search, rank) pairs kept, in their final order.
Pick = Callable[[list[list[float]]], list[tuple[int, int]]]


def merged_hits(searches: Sequence[VectorSearch], pick: Pick) -> list[tuple[int, Hit]]:
    """Several vector searches merged into one list: every search run as in
    :func:`shortlists` (one native call), ``pick`` choosing the candidates kept from their
    scores, and hits built for those alone, as :func:`retrieve` builds them, without leaving
    the read locks (no knowledge base can change between the search and its hits). Returns
    (search's position, hit) pairs in ``pick``'s order. The scores ``pick`` reads are each
    candidate's ``Hit.score`` (:meth:`Shortlist.scores`); the candidates not kept get no
    candidate tuple, no :class:`Shortlist` and no hit."""
    return _under_read_locks(searches, lambda s: _merged_locked(s, pick))


def _under_read_locks(searches: Sequence[VectorSearch], run: Callable[[Sequence[VectorSearch]], Any]) -> Any:
    """``run(searches)`` under every searched knowledge base's read lock, each taken once."""
    holds = list({id(s.cell): s.cell.rw.read() for s in searches}.values())
    taken = 0
    try:
        for hold in holds:
            hold.__enter__()
            taken += 1
        return run(searches)
    finally:
        for hold in holds[:taken]:
            hold.__exit__(None, None, None)


def _searched_locked(searches: Sequence[VectorSearch]) -> list[tuple[KbState | None, Any, bool | None]]:
    """Each search run (the native ones as one :func:`search_many` call), as (snapshot or None
    for an empty knowledge base, the raw answer, how to read it): ``True`` a native search's
    groups, ``False`` its ``(ids, distances)``, ``None`` a candidate list already."""
    out: list[tuple[KbState | None, Any, bool | None]] = []
    batch: list[Search] = []
    at: list[int] = []
    for s in searches:
        state = s.cell.state
        index = state.index
        n = 0 if index is None else len(index)
        if index is None or n == 0:
            out.append((None, [], None))
            continue
        group_by = _group_field(state, s.deduplicate)
        k = min(s.top_k, n)  # no more hits than rows
        if isinstance(index, Index):
            batch.append(Search(index, s.q, k, s.where, s.ef, group_by))
            at.append(len(out))
            out.append((state, None, group_by is not None))  # the answer is filled in below
            continue
        cands = vector_candidates(index, s.q, k, s.where, group_by is not None, s.ef, group_by or GROUP_FIELD)
        out.append((state, cands, None))
    for i, result in zip(at, search_many(batch) if batch else ()):
        snapshot, _, grouped = out[i]
        out[i] = (snapshot, result, grouped)
    return out


def _shortlists_locked(searches: Sequence[VectorSearch]) -> list[Shortlist]:
    out: list[Shortlist] = []
    for s, (state, found, grouped) in zip(searches, _searched_locked(searches)):
        if state is None:
            out.append(_EMPTY)
            continue
        if grouped is not None:  # a native search's answer
            found = _group_candidates(found) if grouped else _knn_candidates(*found)
        out.append(_shortlist_of(state, found, s.threshold))
    return out


def _merged_locked(searches: Sequence[VectorSearch], pick: Pick) -> list[tuple[int, Hit]]:
    # Per search: (snapshot, metric, candidates or None while they are still the answer's
    # ids and distances, those ids, those distances), and the scores pick reads.
    found: list[tuple[KbState | None, str, list[Candidate] | None, list[int], list[float]]] = []
    scores: list[list[float]] = []
    for s, (state, raw, grouped) in zip(searches, _searched_locked(searches)):
        if state is None:
            found.append((None, "", [], [], []))
            scores.append([])
            continue
        metric = state.config["metric"]
        cands: list[Candidate] | None = None
        if grouped is False:
            ids, dist = raw[0].tolist(), raw[1].tolist()
            if ids[-1] < 0:  # padding (fewer passing rows than k) ends the list
                dist = [d for i, d in zip(ids, dist) if i >= 0]
                ids = [i for i in ids if i >= 0]
        else:
            cands = _group_candidates(raw) if grouped else raw
            ids, dist = [c[0] for c in cands], [c[1] for c in cands]
        score = _scores(dist, metric)
        threshold = s.threshold
        if threshold > 0.0 and score and min(score) < threshold:
            keep = [j for j, v in enumerate(score) if v >= threshold]
            ids, dist, score = [ids[j] for j in keep], [dist[j] for j in keep], [score[j] for j in keep]
            if cands is not None:
                cands = [cands[j] for j in keep]
        found.append((state, metric, cands, ids, dist))
        scores.append(score)
    kept = pick(scores)
    rows_of: dict[int, list[int]] = {}
    for i, r in kept:
        rows_of.setdefault(i, []).append(r)
    # Each search's hits come back in the order its rows were kept: the merged list takes
    # them back one by one (no (search, row) key per hit).
    built: dict[int, Iterator[Hit]] = {}
    for i, rows in rows_of.items():
        state, metric, cands, ids, dist = found[i]
        assert state is not None
        picked: list[tuple[int, float, Sequence[int]]]
        picked = [cands[r] for r in rows] if cands is not None else [(ids[r], dist[r], ()) for r in rows]
        built[i] = iter(make_hits(state, picked, metric, fused=False))
    return [(i, next(built[i])) for i, _ in kept]


def _scores(dist: list[float], metric: str) -> list[float]:
    """:func:`score_from_distance` of each distance (Python floats), in one comprehension
    rather than one call per candidate: the same float formula."""
    if metric == "l2":
        return [1.0 / (1.0 + (d if d > 0.0 else 0.0)) for d in dist]
    # One comprehension: in [0, 2] the formula needs no clamp (d / 2 is exact, 1 - it is in
    # [0, 1]); below 0 it clamps to 1, above 2 to 0; NaN stays NaN (tested).
    return [1.0 - d / 2.0 if 0.0 <= d <= 2.0 else 1.0 if d < 0.0 else 0.0 if d > 2.0 else d for d in dist]


def _shortlist_of(state: KbState, cands: list[Candidate], threshold: float) -> Shortlist:
    metric = state.config["metric"]
    if threshold > 0.0:
        cands = [c for c in cands if score_from_distance(c[1], metric) >= threshold]
    return Shortlist(state, cands, metric, False)


def vector_candidates(
    index: Index,
    q: np.ndarray,
    top_k: int,
    where: Any,
    deduplicate: bool,
    ef: int | None,
    group_by: str = GROUP_FIELD,
) -> list[Candidate]:
    """The nearest chunks (or, deduplicating, the best chunk of each nearest group of
    ``group_by``: a document, or a parent, natively) as candidates. One native call; the
    benchmark replaces it to time the rest."""
    if deduplicate:
        groups = cast(
            "list[Group]",
            index.search_groups(q, top_k, group_by=group_by, group_size=1, where=where, ef=ef, threads=1),
        )  # q is 1-D
        return _group_candidates(groups)
    return _knn_candidates(*index.search(q, top_k, where=where, ef=ef, threads=1))


def _group_candidates(groups: list[Group]) -> list[Candidate]:
    """The candidates of one query's groups: each group's best chunk."""
    return [(int(g.ids[0]), float(g.distances[0]), g.part_ids) for g in groups]


def _knn_candidates(ids: np.ndarray, dist: np.ndarray) -> list[Candidate]:
    """The candidates of one query's k nearest (padding dropped)."""
    return [(i, d, ()) for i, d in zip(ids.tolist(), dist.tolist()) if i >= 0]


def _group_field(state: KbState, deduplicate: bool) -> str | None:
    """The field a search groups by: the document (``deduplicate``), else a parent-child
    knowledge base's parent, else none."""
    if deduplicate:
        return GROUP_FIELD
    return PARENT_FIELD if state.config.get("index_type") == "parent_child" else None


def parent_text(state: KbState, chunk_id: int, parent: int) -> str:
    """The text of the parent ``parent`` of a stored child chunk: the document text between
    the first and the last character of that parent's children (read from the segment)."""
    seg, row = state.locate(chunk_id)
    d = int(np.searchsorted(seg.doc_offsets, row, side="right")) - 1
    lo, hi = int(seg.doc_offsets[d]), int(seg.doc_offsets[d + 1])
    column = seg.chunks.column(PARENT_INDEX).slice(lo, hi - lo)
    mine = np.asarray(column.to_numpy(), np.int64) == parent
    start, end = int(seg.start[lo:hi][mine].min()), int(seg.end[lo:hi][mine].max())
    text = seg.docs.column("text")[d].as_py()
    return seg.text_of(row) if text is None or start < 0 else text[start:end]


def make_hits(state: KbState, cands: list[Candidate], metric: str, *, fused: bool) -> list[Hit]:
    """Hits of candidates (values are distances, or fused scores when ``fused``). Caller
    holds the read lock: ``state.index`` holds every candidate. A parent-child knowledge
    base's hit holds its parent's text.

    This is the per-hit cost of every search, so the common case is inlined: a chunk is
    located by one bisect and its row by arithmetic (:meth:`Segment.row` in a segment with
    gaps: no numpy call), a text held as Arrow string views is sliced from them (what
    :meth:`Segment.text_of` does, without its call), and the score is
    :func:`score_from_distance`'s float formula."""
    if not cands:
        return []
    parents = state.config.get("index_type") == "parent_child"
    metas = state.index.get_metadata([c[0] for c in cands])  # type: ignore[union-attr]
    hits = []
    locate = state.locate
    segs = state.segments
    mins = state.seg_mins
    first = segs[0] if len(segs) == 1 else None
    # One segment (the usual case): whether its texts are views, and the views, are the same
    # for every candidate, so they are read once here rather than per hit.
    only_views = first.text_views if first is not None and first.content is None and not parents else None
    l2 = metric == "l2"
    group_field, parent_field = GROUP_FIELD, PARENT_FIELD
    for (cid, value, parts), meta in zip(cands, metas):
        seg = first if first is not None else segs[_bisect_right(mins, cid) - 1]
        row = cid - seg.min_id if seg.contiguous else seg.row(cid)
        del meta[group_field]
        meta.pop(parent_field, None)
        chunk_index = meta["chunk_index"]
        if not parts:
            parts = ()
        elif len(parts) == 1 and parts[0] == cid:  # met through its best chunk only
            parts = (chunk_index,)
        else:
            parts = tuple(int(s.chunk_index[r]) for s, r in map(locate, parts))
        if fused:
            score, dist = value, 1.0 - value
        elif l2:
            score, dist = 1.0 / (1.0 + (value if value > 0.0 else 0.0)), value
        else:
            score, dist = 1.0 - value / 2.0, value
            score = 0.0 if score < 0.0 else 1.0 if score > 1.0 else score
        views = only_views
        if first is None:  # several segments: the fast-path test for this hit's own one
            views = seg.text_views if seg.content is None and not parents else None
        if views is not None:
            offsets, data, base = views
            i = row + base
            content = str(data[offsets[i] : offsets[i + 1]], "utf-8")
        else:
            content = seg.text_of(row)
            if seg.content is not None:  # a QA pair: its question was searched, its answer is returned
                answer = seg.content_of(row)
                if answer is not None:
                    meta["question"] = content
                    content = answer
            if parents:
                content = parent_text(state, cid, meta[PARENT_INDEX])
        hits.append(
            new_hit(cid, meta["document_id"], content, meta, dist, score, meta["pipeline_name"], chunk_index, parts)
        )
    return hits


def _search_mode(state: KbState, query: Any, opts: SearchOptions) -> tuple[str, str, float]:
    """(search type, fusion, vector weight): the options, else the knowledge base's defaults.
    A vector query under a *default* text or hybrid search type searches vectors."""
    d_mode, d_fusion, d_weight = state.defaults
    explicit = opts.search_type is not None
    mode = check_choice("search_type", opts.search_type, SEARCH_TYPES) if explicit else d_mode
    fusion = d_fusion if opts.fusion is None else check_choice("fusion", opts.fusion, FUSIONS)
    weight = d_weight if opts.vector_weight is None else check_vector_weight(opts.vector_weight)
    if mode != "vector" and not isinstance(query, str):
        if isinstance(query, (bytes, bytearray)):
            raise InvalidTypeError("a query is a str or a vector, got bytes")
        if explicit:
            raise InvalidArgumentError(
                f"search_type={mode!r} needs the query as a string (BM25 searches text), got a "
                f"{type(query).__name__}; pass the text as query (for hybrid search of a "
                "knowledge base without embedder, also the vector as query_vector=)"
            )
        mode = "vector"
    return mode, fusion, weight


def _where(state: KbState, filters: Mapping[str, Any] | None, pipelines: Sequence[str] | str | None) -> Any:
    if pipelines is None:
        return filters
    if isinstance(pipelines, str):
        pipelines = [pipelines]
    for p in pipelines:
        state.pipeline(p)
    clause = {"pipeline_name": {"$in": list(pipelines)}}
    return {"$and": [filters, clause]} if filters else clause


def _query_vector(query: Any, embed_query: EmbedQuery) -> np.ndarray:
    if type(query) is np.ndarray and query.ndim == 1 and query.dtype.kind == "f":
        return query  # a 1-D float vector: what a RAG loop passes; the index checks the rest
    if isinstance(query, str):
        if not query.strip():
            raise InvalidArgumentError("the query is empty")
        return embed_query(query, "embed a text query")
    if isinstance(query, (bytes, bytearray)):
        raise InvalidTypeError("a query is a str or a vector, got bytes")
    q = np.asarray(query)
    if q.dtype.kind not in "fiu":  # float, signed or unsigned int (not bool, object, str)
        raise InvalidTypeError(f"a query is a str or a float vector, got {type(query).__name__} of dtype {q.dtype}")
    if q.ndim == 2 and q.shape[0] == 1:
        q = q[0]
    if q.ndim != 1:
        raise InvalidArgumentError(f"a query vector must be 1-D, got shape {list(q.shape)}")
    return q


def _retrieve_fused(
    cell: StateCell,
    query: str,
    top_k: int,
    opts: SearchOptions,
    where: Any,
    mode: str,
    fusion: str,
    weight: float,
    embed_query: EmbedQuery,
    lazy: bool = False,
) -> list[Hit] | Shortlist:
    """Full-text and hybrid retrieval: both legs over ``window`` candidates in one native call
    (:meth:`Index.search_hybrid_legs`, the vector leg on a pool worker; a sharded index: one
    call per leg), fusion (RRF in the same native call, :meth:`Index.search_hybrid_rrf`;
    z-score and linear in Python), dedup after fusion (widening the window while too few
    documents)."""
    if not query.strip():
        raise InvalidArgumentError("the query is empty")
    rrf_k = float(opts.rrf_k)
    window = max(4 * top_k, 50) if opts.window is None else int(opts.window)
    ef = None if opts.ef is None else check_k(opts.ef, "ef")
    q = None
    if mode == "hybrid":
        if opts.query_vector is None:
            q = embed_query(
                query, "embed the query for hybrid search (pass query_vector=, or use search_type='full_text')"
            )
        else:
            q = _query_vector(opts.query_vector, embed_query)
        q = np.ascontiguousarray(q, dtype=np.float32)  # once, not per widening step
    nf = native_filter(where)  # one compiled native filter for both legs
    with cell.rw.read():
        state = cell.state
        index = state.index
        if index is None or len(index) == 0:
            return _EMPTY if lazy else []
        if not isinstance(index, Index):
            nf = where  # a ShardedIndex sends the filter to its shards: the where, not a native object
        metric = state.config["metric"]
        n = len(index)
        top_k = min(top_k, n)  # no more hits than rows (window was sized from the request)
        group_by = _group_field(state, opts.deduplicate)
        if mode == "full_text" and group_by is None:
            window = min(window, top_k)  # one leg, no collapse: top_k candidates suffice
        while True:
            w = min(window, n)
            if q is not None and fusion == "rrf":
                # Both legs fused natively as the searches return them: one call that runs the
                # BM25 leg here and the vector leg on a pool worker (Index.search_hybrid_rrf),
                # or, for a sharded index, the legs one after the other and fuse_rrf.
                if isinstance(index, Index):
                    fids, fscores, n_vec, n_text = index.search_hybrid_rrf(q, query, w, where=nf, ef=ef, rrf_k=rrf_k)
                else:
                    ids, dist = index.search(q, w, where=nf, ef=ef, threads=1)
                    tids, tscores = index.search_text(query, w, where=nf)
                    fids, fscores = fuse_rrf(ids, dist, tids, tscores, rrf_k)
                    n_vec, n_text = int(np.count_nonzero(ids >= 0)), len(tids)
                if group_by is None:
                    top_ids, top_scores = fids[:top_k].tolist(), fscores[:top_k].tolist()
                    cands: list[Candidate] = [(i, s, ()) for i, s in zip(top_ids, top_scores)]
                    break
                cands = _dedup_fused(index, state, fids, fscores, top_k, group_by)
                full = n_text == w or n_vec == w
            else:
                vec_leg: list[tuple[int, float]] = []
                if q is not None:
                    if isinstance(index, Index):  # both legs in one call, concurrently
                        ids, dist, tids, tscores = index.search_hybrid_legs(q, query, w, where=nf, ef=ef)
                    else:
                        ids, dist = index.search(q, w, where=nf, ef=ef, threads=1)
                        tids, tscores = index.search_text(query, w, where=nf)
                    if ids[-1] < 0:
                        keep = ids >= 0
                        ids, dist = ids[keep], dist[keep]
                    ids, dist = _by_id_on_ties(ids, dist)
                    vec_leg = list(zip(ids.tolist(), score_from_distance(dist, metric).tolist()))
                else:
                    tids, tscores = index.search_text(query, w, where=nf)
                tids, tscores = _by_id_on_ties(tids, -tscores)
                text_leg = list(zip(tids.tolist(), (-tscores).tolist()))
                # A text leg shorter than the window returned every match: the vector leg's other
                # candidates (the chunks of the window BM25 did not match) score 0 there.
                fused = _fuse(mode, fusion, vec_leg, text_leg, weight, rrf_k, len(vec_leg) - len(tids))
                if group_by is None:
                    cands = [(i, s, ()) for i, s in fused[:top_k]]
                    break
                n_fused = len(fused)
                cands = _dedup_fused(
                    index,
                    state,
                    np.fromiter((f[0] for f in fused), np.int64, n_fused),
                    np.fromiter((f[1] for f in fused), np.float64, n_fused),
                    top_k,
                    group_by,
                )
                full = len(tids) == w or len(vec_leg) == w
            if len(cands) >= top_k or not full or w >= n:
                break
            window = w * 4
        if opts.score_threshold > 0.0:
            cands = [c for c in cands if c[1] >= opts.score_threshold]
        if lazy:
            return Shortlist(state, cands, metric, True)
        return make_hits(state, cands, metric, fused=True)


def _by_id_on_ties(ids: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A leg ordered by ``keys`` (ascending), equal keys by id: rank fusion and dedup then do
    not depend on how an index orders ties (one index and a sharded one differ there)."""
    if len(keys) > 1 and (np.diff(keys) == 0).any():
        order = np.lexsort((ids, keys))
        return ids[order], keys[order]
    return ids, keys


def _fuse(
    mode: str,
    fusion: str,
    vec_leg: list[tuple[int, float]],
    text_leg: list[tuple[int, float]],
    weight: float,
    rrf_k: float,
    text_unmatched: int,
) -> list[tuple[int, float]]:
    if mode == "full_text":
        top = text_leg[0][1] if text_leg else 0.0
        return [(i, min(1.0, s / top) if top > 0.0 else 0.0) for i, s in text_leg]
    if fusion == "zscore":
        return zscore([vec_leg, text_leg], floors=[None, (0.0, text_unmatched) if text_unmatched > 0 else None])
    if fusion == "rrf":
        return normalize_rrf(rrf([vec_leg, text_leg], k=rrf_k), 2, rrf_k)
    return linear(vec_leg, text_leg, weight)


def _dedup_fused(
    index: Any, state: KbState, ids: np.ndarray, fused: np.ndarray, top_k: int, group_by: str = GROUP_FIELD
) -> list[Candidate]:
    """The best chunk of each (pipeline, document) in fused order (``ids`` int64 with their
    float64 ``fused`` scores, best first), with the ids of every chunk of that document among
    the fused candidates (best first): natively, by the rule of grouped search
    (:meth:`Index.collapse` over the ``_group`` field; a sharded index by the segments' group
    column through :func:`~kbcore.index.collapse_by_key`)."""
    if not len(ids):
        return []
    scores = fused.astype(np.float32)
    if isinstance(index, Index):
        groups = index.collapse(ids, scores, group_by=group_by, limit=top_k)
    else:
        groups = collapse_by_key(ids, scores, state.groups_of(ids), limit=top_k)
    # The fused (float64) score of each best chunk, not the float32 copy the collapse carried.
    score_of = dict(zip(ids.tolist(), fused.tolist()))
    return [(g.ids[0], score_of[g.ids[0]], g.part_ids) for g in groups]


def nearest_ids(
    cell: StateCell, query: Any, top_k: Any, filters: Any, pipelines: Any, ef: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The ``(ids, distances)`` (int64, float32) of :func:`retrieve`'s vector hits for a
    vector ``query`` without dedup, score threshold or rerank: the same native call under the
    same read lock (a parent-child knowledge base: the best child of each parent, as
    :func:`retrieve`), with no candidate, metadata, text or hit built. Padding dropped; an empty
    knowledge base answers two empty arrays. Raises what :func:`retrieve` raises on the same
    arguments."""
    if type(top_k) is not int or top_k < 1:
        top_k = check_k(top_k, "top_k")
    if type(query) is not np.ndarray or query.ndim != 1 or query.dtype.kind != "f":
        if isinstance(query, str):
            raise InvalidTypeError(
                "search_ids takes a query vector, got a str; embed the text first (kb.embed_query(text)) "
                "or call retrieve"
            )
        query = _query_vector(query, _no_embedding)
    where = filters if pipelines is None else _where(cell.state, filters, pipelines)
    with cell.rw.read():
        state = cell.state
        index = state.index
        n = 0 if index is None else len(index)
        if n == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        k = top_k if top_k <= n else n  # no more hits than rows, as retrieve
        if state.config.get("index_type") != "parent_child":
            ids, dist = index.search(query, k, where=where, ef=ef, threads=1)  # type: ignore[union-attr]
        else:
            groups = cast(
                "list[Group]",
                index.search_groups(  # type: ignore[union-attr]
                    query, k, group_by=PARENT_FIELD, group_size=1, where=where, ef=ef, threads=1
                ),
            )  # query is 1-D
            ids = np.array([g.ids[0] for g in groups], np.int64)
            dist = np.array([g.distances[0] for g in groups], np.float32)
    if len(ids) and ids[-1] < 0:  # padding (fewer passing rows than k) ends the list
        keep = ids >= 0
        ids, dist = ids[keep], dist[keep]
    return ids, dist


def _no_embedding(text: str, what: str) -> np.ndarray:  # pragma: no cover - str is refused first
    raise InvalidTypeError(f"cannot {what}: a vector is expected")
