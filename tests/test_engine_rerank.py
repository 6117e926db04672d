"""retrieve(rerank=, rerank_depth=): order and scores against an exact expectation, the first
stage it reranks (filters, dedup, hybrid), the default reranker in the manifest (round trip,
reopen, validation), the CLI flags, and the Dify server's fallback over real HTTP."""

from __future__ import annotations

import copy
import json
import math
import os

import pytest
from rerank_server import fake_rerank_server, relevance
from test_fuzz_kb_load import _read_json, build_base_kb, write_crafted

from kbcore import Engine
from kbcore.cli import main
from kbcore.engine import retrieval, storage
from kbcore.errors import FormatError, InvalidArgumentError, InvalidTypeError, RerankerError
from kbcore.rerankers import CallableReranker, HttpReranker

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
KEY = "sk-engine-SECRET-987"


def _text(i: int) -> str:
    return f"note {i}: " + " ".join(WORDS[(i * j) % len(WORDS)] for j in range(1, 6))


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path / "data")
    yield e
    e.close()


@pytest.fixture
def kb(engine):
    kb = engine.create_knowledge_base("kb", index="flat", chunk_size=200, chunk_overlap=0)
    for i in range(40):
        kb.ingest(text=_text(i), document_id=f"d{i}", metadata={"team": "a" if i % 2 else "b"})
    return kb


class Recorder:
    """A reranker scoring each text by a fixed table; records what it was asked."""

    def __init__(self, score_of, scale="probability"):
        self.score_of = score_of
        self.score_scale = scale
        self.name = "recorder"
        self.seen: list[list[str]] = []

    def rerank(self, query, texts):
        self.seen.append(list(texts))
        return [self.score_of(t) for t in texts]

    def spec(self):
        return {"kind": "custom", "name": self.name}


def _raw(text: str) -> float:
    """Deterministic scores spread over [-0.5, 1.5] (some clipped), with ties."""
    n = int(text.split(":")[0].split()[1])
    return ((n * 7) % 11) / 5.0 - 0.5


def _expected(first, raw_of, top_k, threshold=0.0, scale="probability"):
    """The reranked answer computed independently: stable sort by raw score, mapped, cut."""
    order = sorted(range(len(first)), key=lambda i: -raw_of(first[i].content))
    out = []
    for i in order:
        r = raw_of(first[i].content)
        s = min(1.0, max(0.0, r)) if scale == "probability" else 1.0 / (1.0 + math.exp(-r))
        if s >= threshold:
            out.append((first[i].id, s, first[i].distance))
    return out[:top_k]


def _triples(hits):
    return [(h.id, h.score, h.distance) for h in hits]


@pytest.mark.parametrize("scale", ["probability", "logit"])
def test_rerank_orders_by_the_reranker_and_maps_scores_exactly(kb, scale):
    rr = Recorder(_raw, scale)
    first = kb.retrieve("alpha delta golf", top_k=30, rerank=False)
    got = kb.retrieve("alpha delta golf", top_k=7, rerank=rr, rerank_depth=30)
    assert rr.seen == [[h.content for h in first]]
    assert _triples(got) == _expected(first, _raw, 7, scale=scale)
    assert [h.id for h in got] != [h.id for h in first[:7]]  # the order really changed


def test_the_threshold_applies_to_the_reranked_score(kb):
    first = kb.retrieve("alpha delta golf", top_k=50, rerank=False)
    got = kb.retrieve("alpha delta golf", top_k=10, rerank=Recorder(_raw), score_threshold=0.9)
    assert _triples(got) == _expected(first, _raw, 10, threshold=0.9)
    assert got and all(h.score >= 0.9 for h in got)
    by_id = {h.id: h.score for h in first}
    assert any(by_id[h.id] < 0.9 for h in got)  # kept although its first-stage score is lower


def test_rerank_depth_sets_the_first_stage_and_is_at_least_top_k(kb):
    rr = Recorder(_raw)
    kb.retrieve("alpha", top_k=3, rerank=rr)
    kb.retrieve("alpha", top_k=3, rerank=rr, rerank_depth=12)
    kb.retrieve("alpha", top_k=20, rerank=rr, rerank_depth=5)
    assert [len(s) for s in rr.seen] == [40, 12, 20]  # default 50 (40 chunks exist), 12, top_k


@pytest.mark.parametrize(
    "options",
    [
        {"search_type": "hybrid", "deduplicate": True, "filters": {"team": "a"}},
        {"search_type": "full_text", "filters": {"team": "b"}},
        {"search_type": "vector", "deduplicate": True},
    ],
)
def test_the_reranker_sees_the_first_stage_with_its_filters_and_dedup(kb, options):
    rr = Recorder(_raw)
    first = kb.retrieve("alpha delta", top_k=15, rerank=False, **options)
    got = kb.retrieve("alpha delta", top_k=5, rerank=rr, rerank_depth=15, **options)
    assert rr.seen == [[h.content for h in first]]
    assert _triples(got) == _expected(first, _raw, 5)
    if "filters" in options:
        assert {h.metadata["team"] for h in got} == {options["filters"]["team"]}


def _full(hits):
    return [
        (h.id, h.document_id, h.content, h.metadata, h.distance, h.score, h.pipeline_name, h.chunk_index, h.part_ids)
        for h in hits
    ]


@pytest.mark.parametrize(
    "options",
    [{}, {"deduplicate": True}, {"search_type": "hybrid", "score_threshold": 0.3}, {"filters": {"team": "a"}}],
)
def test_reranked_hits_are_the_first_stage_hits_with_every_field(kb, options):
    """Hits built after the rerank (only those kept) equal the first stage's own hits, field
    by field, reordered; only ``score`` is the reranker's."""
    threshold = options.get("score_threshold", 0.0)
    first = kb.retrieve("alpha delta golf", top_k=25, rerank=False, **{**options, "score_threshold": 0.0})
    got = kb.retrieve("alpha delta golf", top_k=6, rerank=Recorder(_raw), rerank_depth=25, **options)
    by_id = {h.id: h for h in first}
    want = _expected(first, _raw, 6, threshold=threshold)
    assert [(h.id, h.score) for h in got] == [(i, s) for i, s, _ in want] and got
    rows = _full(got)
    assert [r[:5] + r[6:] for r in rows] == [r[:5] + r[6:] for r in _full(by_id[h.id] for h in got)]


def test_rerank_of_one_contiguous_segment_reads_each_candidates_own_text(engine):
    """One ingest, one segment: the texts are sliced from its Arrow buffers."""
    one = engine.create_knowledge_base("one", index="flat", chunk_size=200, chunk_overlap=0)
    texts = [_text(i) + " é漢" * (i % 3) for i in range(30)]  # multi-byte characters shift the byte offsets
    one.ingest_many([{"document_id": f"d{i}", "text": t} for i, t in enumerate(texts)], progress=False)
    assert one.info()["segments"] == 1
    rr = Recorder(_raw)
    first = one.retrieve("alpha delta golf", top_k=20, rerank=False)
    got = one.retrieve("alpha delta golf", top_k=6, rerank=rr, rerank_depth=20)
    assert rr.seen == [[h.content for h in first]] and set(rr.seen[0]) <= set(texts)
    assert _triples(got) == _expected(first, _raw, 6)


def test_a_write_during_the_rerank_reranks_the_new_first_stage(kb):
    first = kb.retrieve("alpha delta", top_k=20, rerank=False)
    gone = first[0].document_id
    calls = []

    def deleting(query, texts):
        if not calls:
            kb.delete_document(gone)  # the knowledge base changes between the search and the hits
        calls.append(list(texts))
        return [_raw(t) for t in texts]

    got = kb.retrieve("alpha delta", top_k=5, rerank=deleting, rerank_depth=20)
    after = kb.retrieve("alpha delta", top_k=20, rerank=False)
    assert len(calls) == 2 and calls[1] == [h.content for h in after]
    assert gone not in {h.document_id for h in got}
    assert _triples(got) == _expected(after, _raw, 5)


def test_rerank_of_question_answer_and_parent_child_hits_reads_their_content(engine, monkeypatch):
    qa = engine.create_knowledge_base("qa", index="flat")
    rows = [{"question": f"what is {w}?", "answer": f"{w} is word {i}"} for i, w in enumerate(WORDS)]
    qa.ingest_qa("\n".join(json.dumps(r) for r in rows).encode(), format="jsonl", document_id="faq")
    pc = engine.create_knowledge_base("pc", index="flat", index_type="parent_child", parent_chunk_size=120)
    for i in range(6):
        pc.ingest(text=" ".join(_text(i * 6 + j) for j in range(6)), document_id=f"p{i}")
    for kb in (qa, pc):
        rr = Recorder(lambda t: float(len(t) % 7))
        first = kb.retrieve("alpha bravo", top_k=8, rerank=False)
        searches = []
        search = retrieval._retrieve
        monkeypatch.setattr(
            retrieval, "_retrieve", lambda *a, _s=search, _n=searches, **kw: _n.append(1) or _s(*a, **kw)
        )
        got = kb.retrieve("alpha bravo", top_k=4, rerank=rr, rerank_depth=8)
        monkeypatch.setattr(retrieval, "_retrieve", search)
        assert len(searches) == 1  # one first stage, its hits built whole
        assert rr.seen == [[h.content for h in first]]
        assert _full(got) == sorted(_full(got), key=lambda r: -r[5]) and len(got) == 4


def test_retrieve_key_and_text_pass_the_rerank_through(kb):
    rr = Recorder(_raw)
    hits = kb.retrieve("alpha delta", top_k=5, rerank=rr, deduplicate=True)
    keys = kb.retrieve_key("alpha delta", 5, rerank=rr)
    texts = kb.retrieve_text("alpha delta", 5, rerank=rr)
    assert [k.key for k in keys] == [h.document_id for h in hits] == [t.key for t in texts]
    assert [k.score for k in keys] == [h.score for h in hits]


def test_rerank_true_needs_a_default_and_a_text_query(kb):
    with pytest.raises(InvalidArgumentError, match="no default reranker"):
        kb.retrieve("alpha", rerank=True)
    vec = kb.embedder.embed(["alpha"])[0]
    with pytest.raises(InvalidArgumentError, match="query as text"):
        kb.retrieve(vec, rerank=Recorder(_raw))
    with pytest.raises(InvalidTypeError):
        kb.retrieve("alpha", rerank=3)


@pytest.mark.parametrize(
    "depth,err", [(0, InvalidArgumentError), (10**9, InvalidArgumentError), ("5", InvalidTypeError)]
)
def test_bad_rerank_depth_is_refused(kb, depth, err):
    with pytest.raises(err, match="rerank_depth"):
        kb.retrieve("alpha", rerank=Recorder(_raw), rerank_depth=depth)
    with pytest.raises(InvalidArgumentError, match="at most 1000"):
        kb.retrieve("alpha", top_k=2000, rerank=Recorder(_raw))


def test_a_failing_reranker_raises_with_the_first_stage_attached(kb):
    first = kb.retrieve("alpha", top_k=4, rerank=False, score_threshold=0.55)

    def broken(query, texts):
        raise ValueError("model exploded")

    with pytest.raises(RerankerError, match="model exploded") as e:
        kb.retrieve("alpha", top_k=4, rerank=broken, score_threshold=0.55)
    assert _triples(e.value.first_stage) == _triples(first)
    with pytest.raises(RerankerError, match="scores for 40 texts"):
        kb.retrieve("alpha", top_k=4, rerank=lambda q, t: [0.5])


# -- the default reranker ------------------------------------------------------------------


def test_default_reranker_round_trips_through_the_manifest_and_reopen(tmp_path, monkeypatch):
    monkeypatch.setenv("KBCORE_TEST_RERANK_KEY", KEY)
    with fake_rerank_server("cohere") as srv:
        rr = HttpReranker("rr-model", base_url=srv.url, api_key_env="KBCORE_TEST_RERANK_KEY", max_retries=0)
        data = tmp_path / "data"
        with Engine(data) as engine:
            kb = engine.create_knowledge_base("kb", index="flat", reranker=rr)
            for i in range(12):
                kb.ingest(text=_text(i), document_id=f"d{i}")
            first = kb.retrieve("alpha delta", top_k=12, rerank=False)
            assert srv.requests == []
            got = kb.retrieve("alpha delta", top_k=4)
            assert len(srv.requests) == 1
        with open(os.path.join(data, "kb", storage.MANIFEST), encoding="utf-8") as f:
            text = f.read()
        assert KEY not in text and '"api_key_env": "KBCORE_TEST_RERANK_KEY"' in text
        with Engine(data) as engine:
            kb = engine["kb"]
            assert kb.reranker_spec == rr.spec() and kb.info()["reranker"] == rr.spec()
            again = kb.retrieve("alpha delta", top_k=4)
            assert _triples(again) == _triples(got) == _expected(first, lambda t: relevance("alpha delta", t), 4)
            assert len(srv.requests) == 2
            vec = kb.embedder.embed(["alpha delta"])[0]
            assert _triples(kb.retrieve(vec, top_k=4)) == _triples(first[:4])  # a vector query: not reranked
            kb.set_reranker(None)
            assert kb.reranker_spec is None
            assert _triples(kb.retrieve("alpha delta", top_k=4)) == _triples(first[:4])
        with Engine(data) as engine:
            assert engine["kb"].reranker_spec is None
            assert len(srv.requests) == 2


def test_a_custom_default_works_until_reopen_then_asks_for_it(tmp_path):
    data = tmp_path / "data"
    rr = CallableReranker(lambda q, t: [_raw(x) for x in t], name="mine")
    with Engine(data) as engine:
        kb = engine.create_knowledge_base("kb", index="flat", reranker=rr)
        for i in range(8):
            kb.ingest(text=_text(i), document_id=f"d{i}")
        first = kb.retrieve("alpha", top_k=8, rerank=False)
        assert _triples(kb.retrieve("alpha", top_k=3)) == _expected(first, _raw, 3)
    with Engine(data) as engine:
        kb = engine["kb"]
        assert kb.reranker_spec == {"kind": "custom", "name": "mine"}
        with pytest.raises(RerankerError, match="'mine' is a custom one"):
            kb.retrieve("alpha", top_k=3)
        assert _triples(kb.retrieve("alpha", top_k=3, rerank=False)) == _triples(first[:3])
        kb.set_reranker(rr)
        assert _triples(kb.retrieve("alpha", top_k=3)) == _expected(first, _raw, 3)


def test_an_unknown_kind_at_creation_is_refused_before_anything_is_written(engine):
    with pytest.raises(InvalidArgumentError, match="unknown reranker kind 'colbert'"):
        engine.create_knowledge_base("kb", reranker={"kind": "colbert"})
    assert "kb" not in engine


# -- the manifest's check ------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_kb(tmp_path_factory) -> str:
    return build_base_kb(str(tmp_path_factory.mktemp("rrbase") / "data"))


BAD_RERANKERS = [
    ([1], "reranker"),
    ({"model": "x"}, "reranker.kind"),
    ({"kind": 3}, "reranker.kind"),
    ({"kind": "http", "api_format": "bing"}, "reranker.api_format"),
    ({"kind": "http", "api_format": "tei", "base_url": 5}, "reranker.base_url"),
    ({"kind": "cross-encoder"}, "reranker.model"),
    ({"kind": "http", "api_format": "cohere", "model": "m", "batch_size": 0}, "reranker.batch_size"),
    ({"kind": "http", "api_format": "cohere", "model": "m", "timeout": -1}, "reranker.timeout"),
]


@pytest.mark.parametrize("value,field", BAD_RERANKERS, ids=[f for _, f in BAD_RERANKERS])
def test_a_crafted_reranker_field_is_a_format_error_naming_it(base_kb, tmp_path, value, field):
    m = _read_json(os.path.join(base_kb, storage.MANIFEST))
    assert "reranker" not in m  # a manifest from before rerankers
    m = copy.deepcopy(m)
    m["reranker"] = value
    d = write_crafted(base_kb, str(tmp_path / "w"), m)
    with pytest.raises(FormatError) as e:
        Engine(os.path.dirname(d)).get_knowledge_base("kb")
    assert f"field {field!r}" in str(e.value)


def test_a_manifest_without_reranker_opens_without_one(base_kb):
    with Engine(os.path.dirname(base_kb)) as engine:
        kb = engine.get_knowledge_base("kb")
        assert kb.reranker_spec is None and kb.info()["reranker"] is None


# -- the command line ----------------------------------------------------------------------


def test_cli_reranker_flags(tmp_path, capsys, monkeypatch):
    data = str(tmp_path / "data")
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):
        (docs / f"n{i}.txt").write_text(_text(i), encoding="utf-8")
    with fake_rerank_server("tei") as srv:
        spec = json.dumps({"kind": "http", "api_format": "tei", "base_url": srv.url, "max_retries": 0})
        assert main(["ingest", str(docs), "--kb", "kb", "--data", data, "--embedder", "hashing"]) == 0
        capsys.readouterr()

        def query(*extra):
            assert main(["query", "alpha delta", "--kb", "kb", "--data", data, "--json", "--top-k", "3", *extra]) == 0
            return json.loads(capsys.readouterr().out)

        plain = query()
        assert srv.requests == []
        ranked = query("--reranker", spec, "--rerank-depth", "6")
        assert len(srv.requests) == 1 and len(srv.requests[0]["body"]["texts"]) == 6
        assert [r["score"] for r in ranked] == sorted(
            (relevance("alpha delta", t) for t in srv.requests[0]["body"]["texts"]), reverse=True
        )[:3]
        assert main(["ingest", str(docs / "n0.txt"), "--kb", "kb", "--data", data, "--reranker", spec]) == 0
        capsys.readouterr()
        assert _ids(query()) == _ids(ranked) and len(srv.requests) == 2  # the default now
        assert _ids(query("--no-rerank")) == _ids(plain) and len(srv.requests) == 2
        query("--rerank")
        assert len(srv.requests) == 3
        assert main(["query", "x", "--kb", "kb", "--data", data, "--reranker", "colbert"]) == 1
        assert "unknown reranker kind 'colbert'" in capsys.readouterr().err
        assert main(["query", "x", "--kb", "kb", "--data", data, "--reranker", spec, "--no-rerank"]) == 1
        assert "contradict" in capsys.readouterr().err


def _ids(rows):
    return [(r["document_id"], r["chunk_index"]) for r in rows]
