"""Parent-child knowledge bases: children embedded and searched, parents returned, top-k
counted in parents (native grouping), ``part_ids`` = the matching children; checked against an
oracle that chunks the text the same way and groups an exhaustive child search by hand."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kbcore import Engine
from kbcore.chunking import chunk_text
from kbcore.errors import FormatError, InvalidArgumentError

PARENT, CHILD = 300, 60
TOPICS = ["rockets", "volcanoes", "glaciers", "orchids", "bridges", "compilers", "sonnets", "tides"]


def _text(seed: int) -> str:
    rng = np.random.default_rng(seed)
    paras = []
    for i in range(12):
        words = [TOPICS[int(t)] for t in rng.integers(0, len(TOPICS), 30)]
        paras.append(f"Section {seed}-{i}: " + " ".join(words) + ".")
    return "\n\n".join(paras)


@pytest.fixture
def pc(tmp_path):
    engine = Engine(tmp_path / "d")
    kb = engine.create_knowledge_base(
        "pc", index="flat", index_type="parent_child", parent_chunk_size=PARENT, child_chunk_size=CHILD
    )
    texts = {f"doc{s}": _text(s) for s in range(4)}
    for doc_id, text in texts.items():
        kb.ingest(text=text, document_id=doc_id)
    yield engine, kb, texts
    engine.close()


def _oracle(kb, texts, query, top_k):
    """(parent text, matching child indexes best first) of the best ``top_k`` parents, from an
    exhaustive child search grouped in Python."""
    children = []  # (document id, child index, parent index, parent span)
    for doc_id, text in texts.items():
        n = 0
        for p, parent in enumerate(chunk_text(text, chunk_size=PARENT, chunk_overlap=0)):
            for c in chunk_text(parent.text, chunk_size=CHILD, chunk_overlap=kb.pipelines["default"]["chunk_overlap"]):
                children.append((doc_id, n, p, parent.start + c.start, parent.start + c.end, c.text))
                n += 1
    vecs = kb.embedder.embed([c[5] for c in children])
    q = kb.embedder.embed([query])[0]
    order = np.argsort(-(vecs @ q), kind="stable")
    groups: dict[tuple[str, int], list[int]] = {}
    for i in order.tolist():
        groups.setdefault((children[i][0], children[i][2]), []).append(i)
    out = []
    for (doc_id, p), members in list(groups.items())[:top_k]:
        mine = [c for c in children if c[0] == doc_id and c[2] == p]
        start, end = min(c[3] for c in mine), max(c[4] for c in mine)
        out.append((doc_id, texts[doc_id][start:end], [children[i][1] for i in members]))
    return out


@pytest.mark.parametrize("query", ["rockets volcanoes", "orchids", "tides sonnets bridges"])
def test_parent_child_returns_parents_counted_in_parents(pc, query):
    engine, kb, texts = pc
    hits = kb.retrieve(query, 5)
    want = _oracle(kb, texts, query, 5)
    assert [(h.document_id, h.content) for h in hits] == [(w[0], w[1]) for w in want]
    for h, w in zip(hits, want):
        assert list(h.part_ids) == w[2]  # every child of the parent, best first (exhaustive)
        assert h.chunk_index == w[2][0] and len(h.content) <= PARENT
    assert len({(h.document_id, h.metadata["parent_index"]) for h in hits}) == 5


def test_parent_child_hybrid_and_full_text_group_by_parent(pc):
    engine, kb, texts = pc
    for search_type in ("hybrid", "full_text"):
        hits = kb.retrieve("glaciers compilers", 6, search_type=search_type)
        keys = [(h.document_id, h.metadata["parent_index"]) for h in hits]
        assert len(keys) == len(set(keys)) == 6
        for h in hits:
            assert h.content in texts[h.document_id] and len(h.content) > CHILD
            assert h.chunk_index in h.part_ids


def test_parent_child_dedup_is_one_parent_per_document(pc):
    engine, kb, texts = pc
    hits = kb.retrieve("rockets", 4, deduplicate=True)
    assert sorted(h.document_id for h in hits) == sorted(texts)
    assert all(h.content in texts[h.document_id] for h in hits)


def test_parent_child_survives_reopen_and_is_in_the_manifest(tmp_path):
    engine = Engine(tmp_path / "d")
    kb = engine.create_knowledge_base("pc", index_type="parent_child", parent_chunk_size=400, child_chunk_size=80)
    kb.ingest(text=_text(9), document_id="a")
    before = [(h.id, h.content) for h in kb.retrieve("tides", 3)]
    engine.close()
    engine = Engine(tmp_path / "d")
    kb = engine["pc"]
    assert kb.info()["index_type"] == "parent_child" and kb.info()["parent_chunk_size"] == 400
    assert [(h.id, h.content) for h in kb.retrieve("tides", 3)] == before
    engine.close()


def test_parent_child_default_children_are_512_or_a_quarter_of_a_small_parent(tmp_path):
    engine = Engine(tmp_path / "d")
    default = engine.create_knowledge_base("a", index="flat", index_type="parent_child")
    small = engine.create_knowledge_base("b", index="flat", index_type="parent_child", parent_chunk_size=400)
    langrag = engine.create_knowledge_base("c", index="flat", index_type="parent_child", child_chunk_size=256)
    got = [(kb.info()["parent_chunk_size"], kb.info()["chunk_size"]) for kb in (default, small, langrag)]
    assert got == [(2048, 512), (400, 100), (2048, 256)]
    text = " ".join(f"w{i}" for i in range(3000))  # 17,889 characters: parents of 2048 hold 4+ children
    default.ingest(text=text, document_id="d")
    parents = chunk_text(text, chunk_size=2048, chunk_overlap=0)
    children = [c for p in parents for c in chunk_text(p.text, chunk_size=512, chunk_overlap=50)]
    assert len(default) == len(children) > len(parents)
    hits = default.retrieve("w1500", 50)
    assert len(hits) == len(parents) and all(len(h.content) <= 2048 for h in hits)
    engine.close()


def test_parent_child_bad_settings_and_unsupported_calls(tmp_path):
    engine = Engine(tmp_path / "d")
    with pytest.raises(InvalidArgumentError, match="parent_chunk_size"):
        engine.create_knowledge_base("a", index_type="parent_child", parent_chunk_size=100, child_chunk_size=100)
    with pytest.raises(InvalidArgumentError, match="index_type"):
        engine.create_knowledge_base("b", index_type="parents")
    kb = engine.create_knowledge_base("c", index_type="parent_child", embedder=False, dim=4)
    with pytest.raises(InvalidArgumentError, match="parent_child"):
        kb.ingest_table({"document_id": ["x"], "text": ["t"]}, vectors=np.ones((1, 4), np.float32))
    kb2 = engine.create_knowledge_base("d", index_type="parent_child")
    kb2.ingest(text=_text(1), document_id="x")
    with pytest.raises(InvalidArgumentError, match="context_window"):
        kb2.retrieve("rockets", 2, context_window=1)
    engine.close()


@pytest.mark.parametrize(
    "change, field",
    [
        ({"parent_chunk_size": 10}, "parent_chunk_size"),  # not above the children's size
        ({"index_type": "tree"}, "index_type"),
        ({"index_type": "chunk"}, "parent_chunk_size"),  # a parent size without parent_child
        ({"context_window": -1}, "context_window"),
    ],
)
def test_a_manifest_with_a_bad_chunking_setting_does_not_load(tmp_path, change, field):
    from kbcore.engine import storage

    engine = Engine(tmp_path / "d")
    engine.create_knowledge_base("pc", index_type="parent_child", parent_chunk_size=400, child_chunk_size=80)
    engine.close()
    path = os.path.join(tmp_path / "d", "pc")
    m = storage.load_manifest(path)
    m["config"].update(change)
    storage.save_manifest(path, m)
    with pytest.raises(FormatError, match=field):
        Engine(tmp_path / "d")["pc"]


def test_old_manifests_load_as_plain_chunks(tmp_path):
    engine = Engine(tmp_path / "d")
    kb = engine.create_knowledge_base("plain")
    kb.ingest(text=_text(3), document_id="a")
    assert "index_type" not in kb.info() and "parent_index" not in kb.retrieve("orchids", 1)[0].metadata
    engine.close()


def test_parent_child_refuses_question_answer_pairs(tmp_path):
    engine = Engine(tmp_path / "d")
    kb = engine.create_knowledge_base("pc", index_type="parent_child")
    with pytest.raises(InvalidArgumentError, match="parent_child"):
        kb.ingest_qa(b"question,answer\nwhy?,because\n", filename="qa.csv")
    engine.close()


def test_parent_child_refuses_sync_rather_than_storing_children_without_parents(tmp_path):
    engine = Engine(tmp_path / "d")
    kb = engine.create_knowledge_base("pc", index_type="parent_child")
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text(_text(5))
    with pytest.raises(InvalidArgumentError, match="parent_child"):
        kb.sync(str(folder))
    assert len(kb) == 0
    engine.close()
