"""KnowledgeBase.sync: content hashes per document and per chunk, unchanged documents skipped
without embedding, changed ones re-using the stored vectors of unchanged chunks (counted with
a counting embedder against an oracle built from the chunker), missing ones deleted, failures
reported, and a sync killed between commits completed by a re-run (docs/sync.md)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kbcore import Engine
from kbcore.chunking import chunk_text
from kbcore.embedders import HashingEmbedder
from kbcore.engine import Document, SyncReport
from kbcore.errors import InvalidArgumentError

CHUNK = 200
DIM = 32


class CountingEmbedder:
    """HashingEmbedder that counts the texts it is asked to embed."""

    def __init__(self, dim: int = DIM) -> None:
        self.inner = HashingEmbedder(dim=dim)
        self.dim = dim
        self.texts: list[str] = []

    def spec(self) -> dict:
        return self.inner.spec()

    def embed(self, texts):
        self.texts.extend(texts)
        return self.inner.embed(texts)


def _paragraph(rng: random.Random, i: int, j: int) -> str:
    words = [rng.choice(["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa"]) for _ in range(18)]
    return f"Doc {i} paragraph {j}: " + " ".join(words) + "."


def _write_folder(root, n: int, seed: int = 7) -> dict[str, str]:
    rng = random.Random(seed)
    texts = {}
    for i in range(n):
        rel = f"part{i % 3}/doc{i:03d}.txt" if i % 2 else f"doc{i:03d}.md"
        text = "\n\n".join(_paragraph(rng, i, j) for j in range(5))
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        texts[rel] = text
    return texts


def _kb(tmp_path, embedder):
    engine = Engine(str(tmp_path / "data"), embedder=embedder)
    return engine, engine.create_knowledge_base("kb", embedder=embedder, chunk_size=CHUNK, chunk_overlap=0)


def _check_vectors_match_texts(kb, embedder) -> None:
    """Every stored vector is the embedding of its chunk's stored text (reuse took the right row)."""
    vecs = kb.index.get_vectors(np.sort(kb.index.ids()))
    texts = [kb.retrieve(v, 1)[0].content for v in vecs]  # the nearest chunk is the row itself
    want = embedder.inner.embed(texts)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(vecs, want, atol=1e-5)


def test_sync_of_a_folder_adds_every_file_with_its_relative_path_as_id(tmp_path):
    src = tmp_path / "src"
    texts = _write_folder(src, 12)
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    report = kb.sync(str(src))
    assert isinstance(report, SyncReport)
    assert sorted(report.added) == sorted(texts)
    assert report.changed == report.unchanged == report.deleted == report.failed == ()
    want_chunks = sum(len(chunk_text(t, chunk_size=CHUNK, chunk_overlap=0)) for t in texts.values())
    assert report.chunks_embedded == len(emb.texts) == want_chunks == len(kb)
    assert sorted(d.document_id for d in kb.documents()) == sorted(texts)
    engine.close()


def test_sync_of_an_unchanged_folder_embeds_nothing_and_commits_nothing(tmp_path):
    src = tmp_path / "src"
    texts = _write_folder(src, 30)
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    kb.sync(str(src))
    emb.texts.clear()
    generation = kb.stats().generation
    report = kb.sync(str(src))
    assert emb.texts == []
    assert sorted(report.unchanged) == sorted(texts)
    assert report.added == report.changed == report.deleted == ()
    assert report.chunks_embedded == report.chunks_reused == 0
    assert kb.stats().generation == generation
    engine.close()


def test_an_edited_paragraph_embeds_only_the_chunks_whose_text_changed(tmp_path):
    src = tmp_path / "src"
    texts = _write_folder(src, 100)
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    kb.sync(str(src))
    rng = random.Random(3)
    edited = rng.sample(sorted(texts), 1)  # 1 % of the documents
    want_embedded: list[str] = []
    reused = 0
    for rel in edited:
        old = texts[rel]
        paragraphs = old.split("\n\n")
        paragraphs[2] = paragraphs[2].replace("paragraph 2:", "paragraph two, edited:")
        new = "\n\n".join(paragraphs)
        with open(src / rel, "w", encoding="utf-8") as f:
            f.write(new)
        old_chunks = {c.text for c in chunk_text(old, chunk_size=CHUNK, chunk_overlap=0)}
        new_chunks = [c.text for c in chunk_text(new, chunk_size=CHUNK, chunk_overlap=0)]
        want_embedded += [t for t in new_chunks if t not in old_chunks]
        reused += sum(t in old_chunks for t in new_chunks)
    emb.texts.clear()
    report = kb.sync(str(src))
    assert report.changed == tuple(edited)
    assert len(report.unchanged) == 99
    assert emb.texts == want_embedded and 0 < len(want_embedded) < reused
    assert report.chunks_embedded == len(want_embedded) and report.chunks_reused == reused
    _check_vectors_match_texts(kb, emb)
    engine.close()


def test_missing_files_are_deleted_unless_kept(tmp_path):
    src = tmp_path / "src"
    texts = _write_folder(src, 6)
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    kb.sync(str(src))
    gone = sorted(texts)[:2]
    for rel in gone:
        os.remove(src / rel)
    report = kb.sync(str(src), delete_missing=False)
    assert report.deleted == () and all(g in kb for g in gone)
    report = kb.sync(str(src))
    assert sorted(report.deleted) == gone
    assert not any(g in kb for g in gone) and len(kb.documents()) == 4
    engine.close()


def test_include_and_exclude_globs_select_files(tmp_path):
    src = tmp_path / "src"
    texts = _write_folder(src, 9)
    (src / "notes.bin").write_bytes(b"\x00\x01")  # unsupported: never taken without include
    (src / ".hidden.md").write_text("hidden", encoding="utf-8")
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    report = kb.sync(str(src), include="*.md")
    assert sorted(report.added) == sorted(k for k in texts if k.endswith(".md"))
    report = kb.sync(str(src), exclude=["part1/*", "*.md"])
    want = sorted(k for k in texts if k.endswith(".txt") and not k.startswith("part1/"))
    assert sorted(report.added) == want
    assert sorted(report.deleted) == sorted(k for k in texts if k.endswith(".md"))
    engine.close()


def test_a_file_that_fails_to_parse_is_reported_and_its_stored_version_kept(tmp_path):
    src = tmp_path / "src"
    _write_folder(src, 3)
    (src / "bad.md").write_text("first version", encoding="utf-8")
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    kb.sync(str(src))
    (src / "bad.md").write_bytes(b"\xff\xfe\x00bad \xc3\x28 utf-8")
    (src / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    report = kb.sync(str(src))
    failed = dict(report.failed)
    assert set(failed) == {"bad.md", "broken.pdf"} and all(failed.values())
    assert "bad.md" not in report.deleted and kb.document_text("bad.md") == "first version"
    assert "broken.pdf" not in kb
    engine.close()


def test_metadata_or_chunking_changes_reuse_every_vector(tmp_path):
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    docs = [("a", "Alpha beta gamma. " * 40, {"team": "x"}), ("b", "Delta omega. " * 40, {"team": "y"})]
    first = kb.sync(docs)
    assert sorted(first.added) == ["a", "b"]
    emb.texts.clear()
    report = kb.sync([("a", docs[0][1], {"team": "z"}), docs[1]])
    assert report.changed == ("a",) and report.unchanged == ("b",)
    assert emb.texts == [] and report.chunks_reused == kb.count({"document_id": "a"})
    assert kb.count({"team": "z"}) == kb.count({"document_id": "a"}) > 0
    engine.close()


def test_documents_and_dicts_need_a_stable_id(tmp_path):
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    with pytest.raises(InvalidArgumentError, match="needs an id"):
        kb.sync([Document(text="no id here")])
    with pytest.raises(InvalidArgumentError, match="twice"):
        kb.sync([("a", "x", None), ("a", "y", None)])
    with pytest.raises(InvalidArgumentError, match="folder source only"):
        kb.sync([("a", "x", None)], include="*.md")
    report = kb.sync([Document(text="hello world", document_id="h"), {"text": "bye", "document_id": "b"}])
    assert sorted(report.added) == ["b", "h"]
    engine.close()


def test_a_plain_ingest_is_adopted_by_sync_without_embedding(tmp_path):
    src = tmp_path / "src"
    texts = _write_folder(src, 4)
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    kb.ingest_many([Document(str(src / rel), document_id=rel) for rel in texts])
    emb.texts.clear()
    report = kb.sync(str(src))
    assert sorted(report.changed) == sorted(texts)  # no hash stored yet: re-chunked, vectors reused
    assert emb.texts == [] and report.chunks_reused == len(kb)
    assert sorted(kb.sync(str(src)).unchanged) == sorted(texts)
    engine.close()


_KILLED_SYNC = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from kbcore import Engine
    from kbcore.engine import commit, sync
    from test_sync import CountingEmbedder
    sync.BATCH_ROWS = 20
    commits = 0
    def hook(point):
        global commits
        if point == "manifest-committed":
            commits += 1
            if commits == {kill_at}:
                os.kill(os.getpid(), 9)
    commit.fault_hook = hook
    emb = CountingEmbedder()
    kb = Engine({data!r}, embedder=emb).get_knowledge_base("kb")
    kb.sync({src!r})
    """
)


@pytest.mark.parametrize("kill_at", [1, 3])
def test_a_sync_killed_between_commits_is_completed_by_a_rerun(tmp_path, kill_at):
    src = tmp_path / "src"
    texts = _write_folder(src, 20)
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    engine.close()
    tests = os.path.dirname(os.path.abspath(__file__))
    code = _KILLED_SYNC.format(tests=tests, kill_at=kill_at, data=str(tmp_path / "data"), src=str(src))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    engine = Engine(str(tmp_path / "data"), embedder=emb)
    kb = engine.get_knowledge_base("kb")
    done = {d.document_id for d in kb.documents()}
    assert done and done < set(texts)  # the committed batches, nothing half-stored
    report = kb.sync(str(src))
    assert set(report.unchanged) == done and set(report.added) == set(texts) - done
    assert sorted(d.document_id for d in kb.documents()) == sorted(texts)
    want = sum(len(chunk_text(texts[r], chunk_size=CHUNK, chunk_overlap=0)) for r in set(texts) - done)
    assert len(emb.texts) == want
    for rel, text in texts.items():
        assert kb.document_text(rel) == text
    engine.close()


def test_cli_sync_prints_the_report_and_reembed_switches_the_embedder(tmp_path, capsys):
    from kbcore.cli import main

    src = tmp_path / "src"
    texts = _write_folder(src, 5)
    data = str(tmp_path / "cli-data")
    assert main(["sync", str(src), "--kb", "docs", "--data", data]) == 0
    assert "5 added, 0 changed, 0 unchanged, 0 deleted, 0 failed" in capsys.readouterr().out
    os.remove(src / sorted(texts)[0])
    assert main(["sync", str(src), "--kb", "docs", "--data", data, "--keep-missing", "--exclude", "part*"]) == 0
    out = capsys.readouterr().out
    assert "0 deleted" in out and f"{sum(not k.startswith('part') for k in texts) - 1} unchanged" in out
    assert (
        main(["reembed", "--kb", "docs", "--data", data, "--embedder", "hashing", "--embedding-dimensions", "24"]) == 0
    )
    assert "-> 24 dimensions" in capsys.readouterr().out
    engine = Engine(data)
    kb = engine.get_knowledge_base("docs")
    assert kb.dim == 24 and kb.info()["embedder"]["dim"] == 24
    assert kb.retrieve("Doc 1 paragraph", 1)
    engine.close()


def test_a_missing_folder_or_a_file_is_not_a_source(tmp_path):
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    with pytest.raises(FileNotFoundError, match="No such folder"):
        kb.sync(str(tmp_path / "nowhere"))
    (tmp_path / "one.md").write_text("x", encoding="utf-8")
    with pytest.raises(TypeError, match="not a folder"):
        kb.sync(str(tmp_path / "one.md"))
    assert kb.documents() == []
    engine.close()


def test_a_zip_is_one_source_item_whose_dropped_members_are_deleted(tmp_path):
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    a, b = "Alpha beta gamma delta. " * 30, "Omega sigma kappa. " * 30

    def write(members: dict[str, str]) -> None:
        with zipfile.ZipFile(src / "arch.zip", "w") as z:
            for name, text in members.items():
                z.writestr(name, text)

    write({"a.txt": a, "sub/b.txt": b})
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    assert kb.sync(str(src)).added == ("arch.zip",)
    assert sorted(d.document_id for d in kb.documents()) == ["arch.zip/a.txt", "arch.zip/sub/b.txt"]
    assert kb.sync(str(src)).unchanged == ("arch.zip",)
    write({"a.txt": a})  # b dropped, a unchanged
    emb.texts.clear()
    report = kb.sync(str(src))
    assert report.changed == ("arch.zip",) and emb.texts == [] and report.chunks_reused > 0
    assert [d.document_id for d in kb.documents()] == ["arch.zip/a.txt"]
    engine.close()


def _set_pipeline_settings(kb, **settings) -> None:
    """Changes the default pipeline's chunking in the committed manifest (no public call does
    yet; an edited manifest or a later ``update_pipeline`` would)."""
    from kbcore.engine import commit

    def change(m: dict) -> None:
        m["pipelines"]["default"].update(settings)

    commit.update_manifest(kb._cell, change)


def test_a_change_of_separators_rechunks_and_reuses_the_vectors_of_unchanged_chunks(tmp_path):
    rng = random.Random(11)
    docs = {}
    for i in range(6):
        paras = [_paragraph(rng, i, j) for j in range(4)]
        paras[i % 4] = paras[i % 4].replace(": ", ": part one | part two ", 1)  # one paragraph gets a "|"
        docs[f"d{i}"] = "\n\n".join(paras)
    emb = CountingEmbedder()
    engine, kb = _kb(tmp_path, emb)
    kb.sync(list(docs.items()))
    emb.texts.clear()
    _set_pipeline_settings(kb, separators=["|"])
    report = kb.sync(list(docs.items()))
    assert sorted(report.changed) == sorted(docs) and report.unchanged == ()
    want = []
    for text in docs.values():
        old = {c.text for c in chunk_text(text, chunk_size=CHUNK, chunk_overlap=0)}
        want += [
            c.text for c in chunk_text(text, chunk_size=CHUNK, chunk_overlap=0, separators=["|"]) if c.text not in old
        ]
    assert want and sorted(emb.texts) == sorted(want)
    assert report.chunks_embedded == len(want) and report.chunks_reused == len(kb) - len(want) > 0
    _check_vectors_match_texts(kb, emb)
    emb.texts.clear()
    again = kb.sync(list(docs.items()))
    assert sorted(again.unchanged) == sorted(docs) and emb.texts == []
    engine.close()


def test_every_chunking_setting_is_part_of_the_content_hash():
    from kbcore.engine import sync

    doc = Document(text="Some text. " * 30, document_id="a")
    base = {"chunk_size": 200, "chunk_overlap": 0}
    variants = [
        ({**base, "chunk_unit": "tokens"}, None, None),
        ({**base, "separators": ["|"]}, None, None),
        ({**base, "separators": ["||"]}, None, None),
        ({**base, "steps": [{"name": "chunk", "kind": "chunk"}]}, None, None),
        (base, {"index_type": "parent_child", "parent_chunk_size": 1000}, None),
        (base, {"index_type": "parent_child", "parent_chunk_size": 2000}, None),
        ({**base, "chunk_unit": "tokens"}, None, {"kind": "minilm"}),
    ]
    hashes = {sync.hash_item(doc, base, None)[0]}
    assert sync.hash_item(doc, base, None, sync.chunking_key(base, {"dim": 8}))[0] in hashes  # defaults: as before
    for pcfg, config, tokenizer in variants:
        hashes.add(sync.hash_item(doc, pcfg, None, sync.chunking_key(pcfg, config, tokenizer))[0])
    assert len(hashes) == len(variants) + 1
