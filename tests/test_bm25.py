"""The native BM25 text leg (Index.add(texts=...), Index.search_text, kbcore.tokenize).

Scores are compared to a small BM25 written here (Lucene idf, k1 = 1.2, b = 0.75, each distinct
query term counted once) over the tokens of kbcore.tokenize, so the test checks the index's
arithmetic and bookkeeping, and the tokenizer cases below check the tokens themselves.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest

import kbcore
from kbcore import errors

K1, B = 1.2, 0.75
ATOL = 1e-5  # float32 accumulation in the index vs float64 here
RTOL = 1e-5


def reference_bm25(texts: dict[int, str], query: str, allowed=None) -> dict[int, float]:
    """id -> BM25 score for every row that matches at least one query term.

    Collection statistics (N, avgdl, df) come from all rows with text; ``allowed`` only
    restricts which rows may be returned, as a filter does.
    """
    docs = {i: kbcore.tokenize(t) for i, t in texts.items() if t is not None}
    n = len(docs)
    if n == 0:
        return {}
    avgdl = sum(len(toks) for toks in docs.values()) / n
    tf = {i: Counter(toks) for i, toks in docs.items()}
    df = Counter(term for c in tf.values() for term in c)
    out: dict[int, float] = {}
    for term in dict.fromkeys(kbcore.tokenize(query, for_query=True)):  # distinct, once each
        if df[term] == 0:
            continue
        idf = math.log(1.0 + (n - df[term] + 0.5) / (df[term] + 0.5))
        for i, c in tf.items():
            f = c.get(term, 0)
            if f == 0 or (allowed is not None and i not in allowed):
                continue
            norm = K1 * (1.0 - B + B * len(docs[i]) / avgdl)
            out[i] = out.get(i, 0.0) + idf * f * (K1 + 1.0) / (f + norm)
    return out


def assert_matches_reference(index, texts, query, k, where=None, allowed=None):
    ids, scores = index.search_text(query, k, where=where)
    assert ids.dtype == np.int64 and scores.dtype == np.float32
    assert ids.shape == scores.shape and ids.ndim == 1
    ref = reference_bm25(texts, query, allowed)
    m = min(k, len(ref))
    assert len(ids) == m, (query, ids, ref)
    assert len(set(ids.tolist())) == m
    assert np.all(np.diff(scores) <= 0), "scores must be descending"
    for i, s in zip(ids.tolist(), scores.tolist()):
        assert i in ref, f"{query!r}: id {i} matches no query term"
        assert s == pytest.approx(ref[i], rel=RTOL, abs=ATOL), (query, i)
    if m:
        kth = sorted(ref.values(), reverse=True)[m - 1]
        must = {i for i, s in ref.items() if s > kth + 2 * ATOL}
        assert must <= set(ids.tolist()), f"{query!r}: missing {must - set(ids.tolist())}"


def make_index(texts: dict[int, str | None], *, kind="flat", metadata=None, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.array(list(texts), dtype=np.int64)
    index = kbcore.Index(dim=dim, metric="cosine", kind=kind, M=8, ef_construction=32)
    vecs = rng.standard_normal((len(ids), dim)).astype(np.float32)
    index.add(vecs, ids, texts=list(texts.values()), metadata=metadata)
    return index


VOCAB = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "error",
    "code",
    "e1234",
    "part",
    "42",
    "x",
]


def toy_corpus(seed: int, n: int) -> dict[int, str]:
    """Seeded documents with skewed term frequencies, mixed case and punctuation."""
    rnd = random.Random(seed)
    weights = [1.0 / (r + 1) for r in range(len(VOCAB))]  # Zipf-like
    docs = {}
    for i in range(n):
        words = rnd.choices(VOCAB, weights, k=rnd.randint(1, 40))
        words = [w.upper() if rnd.random() < 0.2 else w for w in words]
        seps = [rnd.choice([" ", ", ", ". ", " - ", "\n", "; "]) for _ in words]
        docs[10 * i + 3] = "".join(w + s for w, s in zip(words, seps))
    return docs


def toy_queries(seed: int, n: int) -> list[str]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        words = rnd.choices(VOCAB + ["unknownterm"], k=rnd.randint(1, 5))
        if rnd.random() < 0.3:
            words.append(words[0].upper())  # a repeated term counts once
        out.append(" ".join(words))
    return out


# ----------------------------------------------------------------------------------------
# scores equal the reference


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_bm25_scores_equal_the_reference_on_a_toy_corpus(kind):
    texts = toy_corpus(1, 60)
    index = make_index(texts, kind=kind)
    for q in toy_queries(2, 40):
        for k in (1, 5, 100):
            assert_matches_reference(index, texts, q, k)


def test_bm25_hand_computed_scores_on_three_documents():
    texts = {1: "the cat sat", 2: "the dog", 3: "cat cat cat"}
    index = make_index(texts)
    ids, scores = index.search_text("cat", 10)
    # N = 3, df(cat) = 2, avgdl = 8/3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    s1 = idf * 1 * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 3 / (8 / 3)))
    s3 = idf * 3 * 2.2 / (3 + 1.2 * (0.25 + 0.75 * 3 / (8 / 3)))
    assert ids.tolist() == [3, 1]
    np.testing.assert_allclose(scores, [s3, s1], rtol=1e-6)


def test_bm25_counts_a_repeated_query_term_once():
    texts = toy_corpus(3, 20)
    index = make_index(texts)
    a = index.search_text("alpha beta", 10)
    b = index.search_text("alpha ALPHA beta alpha", 10)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_rows_without_text_are_not_in_the_text_leg():
    texts = {1: "apple pie", 2: None, 3: "apple tart", 4: None}
    index = make_index(texts)
    assert_matches_reference(index, texts, "apple", 10)
    assert set(index.search_text("apple", 10)[0].tolist()) == {1, 3}


def test_query_matching_nothing_returns_empty_arrays():
    index = make_index({1: "apple pie", 2: "banana"})
    for q in ("", "   ", "?!,.", "cherry", "日本"):
        ids, scores = index.search_text(q, 5)
        assert ids.shape == (0,) and ids.dtype == np.int64
        assert scores.shape == (0,) and scores.dtype == np.float32


def test_index_without_any_text_returns_empty():
    index = kbcore.Index(dim=2, metric="l2", kind="flat")
    assert len(index.search_text("anything", 3)[0]) == 0
    index.add(np.ones((2, 2), np.float32), [1, 2])
    assert len(index.search_text("anything", 3)[0]) == 0


# ----------------------------------------------------------------------------------------
# tokenization


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("Hello WORLD", ["hello", "world"]),
        ("ÉCOLE Ålborg ÆØÅ", ["école", "ålborg", "æøå"]),
        ("ΑΘΗΝΑ Ёлка ПРИВЕТ", ["αθηνα", "ёлка", "привет"]),
        ("İstanbul", ["istanbul"]),
    ],
)
def test_tokenize_folds_case(text, tokens):
    assert kbcore.tokenize(text) == tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("foo,bar;baz... (qux)!", ["foo", "bar", "baz", "qux"]),
        ("e-mail don't", ["e", "mail", "don", "t"]),
        ("ERR_CONN_42 v2.0", ["err", "conn", "42", "v2", "0"]),
        ("“quoted” — dash… «guillemets»", ["quoted", "dash", "guillemets"]),
        ("a\u00a0b\tc\nd", ["a", "b", "c", "d"]),
        ("  ,.;:!? ", []),
        ("", []),
    ],
)
def test_tokenize_splits_on_punctuation_and_space(text, tokens):
    assert kbcore.tokenize(text) == tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("ＫＢＣＯＲＥ", ["kbcore"]),
        ("ＡＢＣ１２３！ｘｙｚ", ["abc123", "xyz"]),
        ("Ｅｒｒｏｒ\u3000Ｃｏｄｅ", ["error", "code"]),  # ideographic space separates
    ],
)
def test_tokenize_folds_fullwidth_ascii(text, tokens):
    assert kbcore.tokenize(text) == tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("知识库", ["知识", "识库"]),  # Chinese: overlapping bigrams
        ("北京是中国的首都。", ["北京", "京是", "是中", "中国", "国的", "的首", "首都"]),
        ("東京は日本の首都です。", ["東京", "京は", "は日", "日本", "本の", "の首", "首都", "都で", "です"]),
        ("東京タワー", ["東京", "京タ", "タワ", "ワー"]),  # kanji + katakana in one run
        ("서울은 한국의 수도입니다.", ["서울", "울은", "한국", "국의", "수도", "도입", "입니", "니다"]),
        ("猫", ["猫"]),  # a run of one character is a unigram
        ("猫 と 犬", ["猫", "と", "犬"]),
    ],
)
def test_tokenize_cjk_runs_into_bigrams(text, tokens):
    assert kbcore.tokenize(text, for_query=True) == tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("kbcore是一个检索库", ["kbcore", "是一", "一个", "个检", "检索", "索库"]),
        ("Python3で検索", ["python3", "で検", "検索"]),
        ("GPU서버 설정", ["gpu", "서버", "설정"]),
        ("ＡＰＩキー", ["api", "キー"]),
    ],
)
def test_tokenize_mixed_script_splits_at_script_boundaries(text, tokens):
    assert kbcore.tokenize(text, for_query=True) == tokens


@pytest.mark.parametrize("text", ["知识库", "東京タワー", "서울은 한국의", "api キー"])
def test_document_tokens_add_every_cjk_character_to_the_query_bigrams(text):
    query_tokens = kbcore.tokenize(text, for_query=True)
    doc_tokens = kbcore.tokenize(text)
    singles = [t for t in doc_tokens if len(t) == 1 and t not in query_tokens]
    assert sorted(doc_tokens) == sorted(query_tokens + singles)
    assert "".join(singles) == "".join(ch for ch in text if ord(ch) > 0x3000)


def test_one_character_cjk_query_matches_inside_a_longer_run():
    index = make_index({1: "猫が好き", 2: "犬が好き"})
    ids, _ = index.search_text("猫", 5)
    assert ids.tolist() == [1]


CJK_DOCS = {
    1: "東京は日本の首都です。",
    2: "大阪の天気は晴れです。",
    3: "北京是中国的首都。",
    4: "서울은 한국의 수도입니다.",
    5: "Tokyo is the capital of Japan.",
    6: "全文検索エンジンを作る",
    7: "kbcore是一个知识库检索系统",
    8: "ＡＰＩキーの設定方法",
}


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("日本の首都", 1),
        ("天気", 2),
        ("検索エンジン", 6),  # Japanese 検索, not the Chinese 检索 of doc 7
        ("中国的首都", 3),
        ("한국의 수도", 4),
        ("capital of JAPAN", 5),
        ("检索系统", 7),
        ("KBCORE", 7),
        ("api キー", 8),
    ],
)
def test_cjk_query_finds_its_document(query, best):
    index = make_index(CJK_DOCS)
    ids, _ = index.search_text(query, 3)
    assert ids[0] == best
    assert_matches_reference(index, CJK_DOCS, query, 8)


def test_shared_cjk_term_matches_across_languages_only_where_the_characters_agree():
    index = make_index(CJK_DOCS)
    assert set(index.search_text("首都", 10)[0].tolist()) == {1, 3}  # same Han bigram in ja and zh
    assert set(index.search_text("検索", 10)[0].tolist()) == {6}


# ----------------------------------------------------------------------------------------
# deletes, upserts and slot reuse keep the text leg in step with the vectors


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_removed_ids_never_come_back_from_search_text(kind):
    texts = toy_corpus(5, 80)
    index = make_index(texts, kind=kind)
    rnd = random.Random(6)
    live = dict(texts)
    queries = toy_queries(7, 15)
    for _ in range(4):
        gone = rnd.sample(sorted(live), 12)
        index.remove(gone)
        for i in gone:
            del live[i]
        for q in queries:
            ids, _ = index.search_text(q, 100)
            assert not set(ids.tolist()) & set(gone)
            assert_matches_reference(index, live, q, 100)  # N, df, avgdl follow the deletes


def test_many_deletes_trigger_compaction_and_scores_stay_exact():
    # > 1024 stale postings and more stale than live: the postings are rebuilt.
    words = [f"w{j}" for j in range(60)]
    texts = {i: " ".join(words[(i + j) % 60] for j in range(25)) for i in range(200)}
    index = make_index(texts)
    gone = list(range(0, 200, 4)) + list(range(1, 200, 4)) + list(range(2, 200, 4))
    index.remove(gone)
    live = {i: t for i, t in texts.items() if i not in set(gone)}
    for q in ("w0 w1", "w17", "w59 w3 w30"):
        assert_matches_reference(index, live, q, 100)


def test_upsert_with_new_text_replaces_the_old_terms():
    texts = {1: "apple banana", 2: "cherry", 3: "banana bread"}
    index = make_index(texts)
    index.add(np.ones((1, 4), np.float32), [1], texts=["durian fruit"])
    texts[1] = "durian fruit"
    assert 1 not in index.search_text("apple", 10)[0].tolist()
    assert index.search_text("banana", 10)[0].tolist() == [3]
    assert index.search_text("durian", 10)[0].tolist() == [1]
    for q in ("apple banana durian", "fruit", "bread"):
        assert_matches_reference(index, texts, q, 10)


def test_upsert_without_text_drops_the_old_text():
    texts = {1: "apple banana", 2: "banana"}
    index = make_index(texts)
    index.add(np.ones((1, 4), np.float32), [1])  # a replaced id gets exactly the new (no) text
    assert index.search_text("apple banana", 10)[0].tolist() == [2]
    assert_matches_reference(index, {2: "banana"}, "banana", 10)


def test_reused_slot_does_not_inherit_the_old_terms():
    texts = {1: "apple apple", 2: "banana"}
    index = make_index(texts)
    index.remove([1])
    index.add(np.ones((1, 4), np.float32), [9], texts=["apple cherry"])  # reuses the freed slot
    live = {2: "banana", 9: "apple cherry"}
    ids, _ = index.search_text("apple", 10)
    assert ids.tolist() == [9]
    for q in ("apple", "cherry banana"):
        assert_matches_reference(index, live, q, 10)


def test_repeated_upserts_match_the_reference():
    rnd = random.Random(11)
    texts = toy_corpus(12, 40)
    index = make_index(texts)
    fresh = toy_corpus(13, 200)
    pool = list(fresh.values())
    for step in range(300):
        i = rnd.choice(sorted(texts))
        new = rnd.choice(pool)
        index.add(np.full((1, 4), 1.0 + step, np.float32), [i], texts=[new])
        texts[i] = new
    assert len(index) == 40
    for q in toy_queries(14, 20):
        assert_matches_reference(index, texts, q, 15)


def test_vectors_and_text_agree_on_the_live_ids():
    texts = toy_corpus(15, 50)
    index = make_index(texts, kind="hnsw")
    index.remove(list(texts)[::3])
    live_ids = set(index.ids().tolist())
    all_terms = " ".join(VOCAB)
    assert set(index.search_text(all_terms, 1000)[0].tolist()) == live_ids
    vec_ids, _ = index.search(np.ones(4, np.float32), k=1000)
    assert set(vec_ids[vec_ids >= 0].tolist()) == live_ids


# ----------------------------------------------------------------------------------------
# filters


def test_search_text_with_where_returns_only_passing_rows_with_global_statistics():
    texts = toy_corpus(21, 60)
    meta = [{"lang": "en" if n % 3 else "ja", "year": 2000 + n % 7} for n in range(len(texts))]
    index = make_index(texts, metadata=meta)
    ids_list = list(texts)
    cases = [
        ({"lang": "en"}, {i for i, m in zip(ids_list, meta) if m["lang"] == "en"}),
        ({"year": {"$gte": 2004}}, {i for i, m in zip(ids_list, meta) if m["year"] >= 2004}),
        (
            {"$and": [{"lang": "ja"}, {"year": {"$lt": 2003}}]},
            {i for i, m in zip(ids_list, meta) if m["lang"] == "ja" and m["year"] < 2003},
        ),
    ]
    for where, allowed in cases:
        for q in toy_queries(22, 15):
            ids, _ = index.search_text(q, 10, where=where)
            assert set(ids.tolist()) <= allowed
            assert_matches_reference(index, texts, q, 10, where=where, allowed=allowed)


def test_search_text_with_a_filter_that_passes_nothing_is_empty():
    index = make_index({1: "apple", 2: "apple pie"}, metadata=[{"lang": "en"}, {"lang": "en"}])
    ids, scores = index.search_text("apple", 5, where={"lang": "fr"})
    assert len(ids) == 0 and len(scores) == 0


def test_search_text_rejects_a_bad_filter():
    index = make_index({1: "apple"}, metadata=[{"lang": "en"}])
    with pytest.raises(ValueError):
        index.search_text("apple", 5, where={"lang": {"$bogus": 1}})


# ----------------------------------------------------------------------------------------
# persistence


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_save_load_round_trip_gives_identical_search_text(tmp_path, kind):
    texts = toy_corpus(31, 70)
    meta = [{"lang": "en" if n % 2 else "ja"} for n in range(len(texts))]
    texts[999] = "東京は日本の首都です。"
    meta.append({"lang": "ja"})
    index = make_index(texts, kind=kind, metadata=meta)
    # leave stale postings and a reused slot behind before saving
    index.remove(list(texts)[:20])
    index.add(np.ones((2, 4), np.float32), [5000, 5001], texts=["alpha omega", None])
    path = tmp_path / "text.kbi"
    index.save(path)
    loaded = kbcore.Index.load(path)
    queries = toy_queries(32, 25) + ["日本の首都", "alpha omega"]
    for q in queries:
        for where in (None, {"lang": "en"}):
            a = index.search_text(q, 20, where=where)
            b = loaded.search_text(q, 20, where=where)
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
    # the loaded index keeps working: new text is searchable and scores stay exact
    loaded.add(np.ones((1, 4), np.float32), [6000], texts=["zeta zeta unique"])
    live = {i: t for i, t in texts.items() if i not in set(list(texts)[:20])}
    live.update({5000: "alpha omega", 6000: "zeta zeta unique"})
    for q in ("zeta unique", "alpha", "日本"):
        assert_matches_reference(loaded, live, q, 30)


# ----------------------------------------------------------------------------------------
# bad inputs


@pytest.mark.parametrize("query", [None, b"bytes", 1, ["a"], np.str_("ok")])
def test_search_text_requires_a_str_query(query):
    index = make_index({1: "apple"})
    if isinstance(query, str):  # numpy str_ is a str subclass: accepted
        assert index.search_text(query, 1)[0].tolist() == []
        return
    with pytest.raises(errors.InvalidTypeError):
        index.search_text(query, 1)
    with pytest.raises(TypeError):
        index.search_text(query, 1)


@pytest.mark.parametrize("k", [0, -1])
def test_search_text_rejects_non_positive_k(k):
    index = make_index({1: "apple"})
    with pytest.raises(errors.InvalidArgumentError, match="k must be positive"):
        index.search_text("apple", k)


@pytest.mark.parametrize("k", [1.5, "3", None, True])
def test_search_text_rejects_a_non_integer_k(k):
    index = make_index({1: "apple"})
    with pytest.raises(errors.InvalidTypeError):
        index.search_text("apple", k)


def test_add_rejects_bad_texts_and_changes_nothing():
    index = make_index({1: "apple"})
    one = np.ones((1, 4), np.float32)
    with pytest.raises(errors.InvalidTypeError):
        index.add(one, [2], texts="banana")  # a bare str is not a list of texts
    with pytest.raises(errors.InvalidTypeError):
        index.add(one, [2], texts=[b"banana"])
    with pytest.raises(errors.InvalidArgumentError):
        index.add(one, [2], texts=["banana", "extra"])
    assert len(index) == 1
    assert len(index.search_text("banana", 5)[0]) == 0


# ----------------------------------------------------------------------------------------
# batch ingest: one add() of many rows equals the same rows added one at a time


def _mixed_corpus(seed: int, n: int) -> list[str | None]:
    """Rows sharing many terms in mixed scripts, with empty and missing texts."""
    rnd = random.Random(seed)
    words = VOCAB + ["東京", "大阪", "天気", "café", "ÉCOLE", "σοφία", "кремль", "한국어", "naïve"]
    rows: list[str | None] = []
    for i in range(n):
        if i % 23 == 7:
            rows.append(None)
        elif i % 31 == 5:
            rows.append(rnd.choice(["", " ... ", "!!"]))  # text without tokens
        else:
            rows.append(" ".join(rnd.choices(words, k=rnd.randint(1, 60))))
    return rows


def _text_results(index, queries):
    return [tuple(a.tobytes() for a in index.search_text(q, 50)) for q in queries]


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_one_batch_builds_the_same_index_as_row_by_row_adds(threads, tmp_path):
    rows = _mixed_corpus(5, 700)
    ids = np.arange(len(rows), dtype=np.int64) * 3 + 1
    vecs = np.random.default_rng(0).standard_normal((len(rows), 4)).astype(np.float32)
    batch = kbcore.Index(dim=4, metric="cosine", kind="flat")
    batch.add(vecs, ids, texts=rows, threads=threads)
    single = kbcore.Index(dim=4, metric="cosine", kind="flat")
    for i in range(len(rows)):
        single.add(vecs[i : i + 1], ids[i : i + 1], texts=rows[i : i + 1], threads=1)
    queries = toy_queries(9, 40) + ["東京 天気", "東", "café naïve", "σοφία кремль 한국어"]
    assert _text_results(batch, queries) == _text_results(single, queries)
    n_text = sum(r is not None for r in rows)
    assert batch._native.text_documents() == single._native.text_documents() == n_text
    # Same term numbering, postings and statistics: the saved files are byte for byte equal.
    batch.save(tmp_path / "batch.kbi")
    single.save(tmp_path / "single.kbi")
    assert (tmp_path / "batch.kbi").read_bytes() == (tmp_path / "single.kbi").read_bytes()


def test_rows_with_empty_text_count_in_the_collection_statistics():
    texts = {1: "apple pie", 2: "", 3: "apple tart", 4: " -- ", 5: None}
    index = make_index(texts)
    assert index._native.text_documents() == 4
    assert_matches_reference(index, texts, "apple", 10)
    assert_matches_reference(index, texts, "tart pie", 10)


def test_batches_into_a_populated_index_match_the_reference():
    rows = _mixed_corpus(11, 400)
    texts: dict[int, str | None] = {}
    index = kbcore.Index(dim=4, metric="cosine", kind="hnsw", M=8, ef_construction=32)
    rng = np.random.default_rng(2)
    for start in range(0, len(rows), 90):  # later batches meet known and new terms
        ids = np.arange(start, min(start + 90, len(rows)), dtype=np.int64)
        index.add(
            rng.standard_normal((len(ids), 4)).astype(np.float32), ids, texts=rows[start : start + 90], defer_graph=True
        )
        texts.update({int(i): rows[int(i)] for i in ids})
    for q in toy_queries(12, 25) + ["東京", "ÉCOLE café"]:
        assert_matches_reference(index, texts, q, 15)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_batch_ingest_writes_the_committed_bm25_fixture_byte_for_byte(threads, tmp_path):
    # bm25_rows_v1.kbi was written by the row-at-a-time implementation (see the script that
    # made it): the same texts must give the same term numbering, postings and lengths.
    import json
    import sys
    from pathlib import Path

    data = Path(__file__).parent / "data"
    sys.path.insert(0, str(data))
    try:
        import make_bm25_fixture as fixture
    finally:
        sys.path.remove(str(data))
    texts = json.loads((data / "bm25_rows.json").read_text(encoding="utf-8"))
    assert texts == fixture.rows()
    fixture.build(texts, threads=threads).save(tmp_path / "now.kbi")
    assert (tmp_path / "now.kbi").read_bytes() == (data / "bm25_rows_v1.kbi").read_bytes()
