"""kbcore.rerankers: the registry, the protocol's checks, the HTTP reranker against a fake
``/rerank`` service on 127.0.0.1 (every api_format, hostile answers, retries, the key), and the
cross-encoder wrapper with a stand-in model."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest
from rerank_server import fake_rerank_server, no_sleep, relevance

from kbcore.errors import InvalidArgumentError, InvalidTypeError, RerankerError, RerankerUnavailableError
from kbcore.rerankers import (
    API_FORMATS,
    CallableReranker,
    CrossEncoderReranker,
    HttpReranker,
    as_reranker,
    register_reranker,
    reranker_from_spec,
    reranker_spec,
    to_unit_scores,
)

QUERY = "rotate the signing keys"
TEXTS = [
    "how to bake bread",
    "rotate the signing keys every month",
    "the keys of a piano",
    "signing keys: rotate them",
    "rotate",
]
KEY = "sk-test-SECRET-0123456789"


def _reranker(srv, fmt: str, **kw) -> HttpReranker:
    kw.setdefault("sleep", no_sleep)
    kw.setdefault("api_key_env", "KBCORE_TEST_RERANK_KEY")
    return HttpReranker("rr-model", base_url=srv.url, api_format=fmt, **kw)


# -- the registry --------------------------------------------------------------------------


def test_unknown_kind_is_an_invalid_argument_naming_it():
    with pytest.raises(InvalidArgumentError, match="unknown reranker kind 'colbert'.*cross-encoder, http"):
        reranker_from_spec({"kind": "colbert"})
    with pytest.raises(InvalidArgumentError, match="unknown reranker kind 'colbert'"):
        as_reranker("colbert")


def test_a_custom_spec_cannot_be_rebuilt_and_says_so():
    spec = reranker_spec(CallableReranker(lambda q, t: [0.0] * len(t), name="mine"))
    assert spec == {"kind": "custom", "name": "mine"}
    with pytest.raises(InvalidArgumentError, match="'mine' is a custom one"):
        reranker_from_spec(spec)


def test_spec_type_and_none():
    assert reranker_from_spec(None) is None
    assert reranker_from_spec({"kind": "none"}) is None
    with pytest.raises(InvalidTypeError):
        reranker_from_spec(["http"])  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        as_reranker(42)
    with pytest.raises(InvalidArgumentError, match="needs its model and URL"):
        as_reranker("http")
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        as_reranker("{kind: http}")


def test_http_spec_round_trips_through_the_registry_and_json_text():
    rr = HttpReranker("rerank-v3.5", api_format="cohere-v2", api_key_env="CO_KEY", batch_size=7)
    spec = rr.spec()
    assert spec["kind"] == "http" and spec["api_key_env"] == "CO_KEY"
    again = reranker_from_spec(spec)
    assert isinstance(again, HttpReranker) and again.spec() == spec
    assert again.endpoint == "https://api.cohere.com/v2/rerank"
    import json

    assert as_reranker(json.dumps(spec)).spec() == spec


def test_a_registered_kind_is_rebuilt():
    register_reranker("kbcore-test-length", lambda spec: CallableReranker(lambda q, t: [len(x) for x in t]))
    rr = reranker_from_spec({"kind": "kbcore-test-length"})
    assert rr.rerank("q", ["a", "abc"]).tolist() == [1.0, 3.0]
    with pytest.raises(InvalidArgumentError):
        register_reranker("custom", lambda spec: None)


def test_a_function_is_a_reranker_and_its_output_is_checked():
    rr = as_reranker(lambda q, texts: [float(len(t)) for t in texts])
    assert isinstance(rr, CallableReranker)
    assert rr.rerank("q", ["ab", "a"]).tolist() == [2.0, 1.0]
    for bad, what in [
        (lambda q, t: [1.0], "scores for 2 texts"),
        (lambda q, t: [1.0, math.nan], "NaN"),
        (lambda q, t: ["a", "b"], "numbers"),
        (lambda q, t: [[1.0, 2.0], [3.0, 4.0]], "for 2 texts"),
    ]:
        with pytest.raises(RerankerError, match=what):
            as_reranker(bad).rerank("q", ["ab", "a"])
    with pytest.raises(InvalidTypeError, match="one str"):
        rr.rerank("q", "ab")
    with pytest.raises(InvalidTypeError):
        rr.rerank(b"q", ["ab"])  # type: ignore[arg-type]


def test_batches_are_at_most_batch_size_and_concatenated_in_order():
    calls: list[int] = []

    def fn(q, texts):
        calls.append(len(texts))
        return [float(t) for t in texts]

    rr = CallableReranker(fn, batch_size=2)
    assert rr.rerank("q", ["5", "4", "3", "2", "1"]).tolist() == [5.0, 4.0, 3.0, 2.0, 1.0]
    assert calls == [2, 2, 1]


def test_score_mapping_is_clip_or_sigmoid_exactly():
    s = np.array([-1000.0, -2.0, 0.0, 0.25, 3.0, 1000.0])
    assert to_unit_scores(s, "probability").tolist() == [0.0, 0.0, 0.0, 0.25, 1.0, 1.0]
    got = to_unit_scores(s, "logit")
    want = [1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0 for x in s]
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-300)
    assert np.all(np.diff(got) >= 0)


# -- the HTTP reranker against a fake service ---------------------------------------------


@pytest.mark.parametrize("fmt", API_FORMATS)
def test_every_api_format_sends_its_shape_and_maps_indexes_back(monkeypatch, fmt):
    monkeypatch.setenv("KBCORE_TEST_RERANK_KEY", KEY)
    with fake_rerank_server(fmt) as srv:
        rr = _reranker(srv, fmt)
        got = rr.rerank(QUERY, TEXTS)
        assert got.tolist() == [relevance(QUERY, t) for t in TEXTS]  # input order, not the service's
        (req,) = srv.requests
        assert req["path"] == "/v1/rerank"
        assert req["headers"]["Authorization"] == f"Bearer {KEY}"
        body = req["body"]
        if fmt == "tei":
            assert body == {"query": QUERY, "texts": TEXTS, "raw_scores": False, "truncate": True}
        else:
            assert body["model"] == "rr-model" and body["query"] == QUERY and body["documents"] == TEXTS
            assert ("top_n" in body) == (fmt != "voyage")
            assert body.get("top_n", len(TEXTS)) == len(TEXTS)
            assert ("return_documents" in body) == (fmt == "jina")


def test_batch_size_splits_requests(monkeypatch):
    monkeypatch.setenv("KBCORE_TEST_RERANK_KEY", KEY)
    with fake_rerank_server("tei") as srv:
        rr = _reranker(srv, "tei", batch_size=2)
        assert rr.rerank(QUERY, TEXTS).tolist() == [relevance(QUERY, t) for t in TEXTS]
        assert [len(r["body"]["texts"]) for r in srv.requests] == [2, 2, 1]
        assert rr.requests_sent == 3


BAD_ANSWERS = [
    (b"<html>oops</html>", "not JSON"),
    ({"results": "no"}, "no 'results' list"),
    ({"data": []}, "no 'results' list"),
    ({"results": [{"index": 0, "relevance_score": 0.5}]}, "1 results for 5 texts"),
    ({"results": [{"index": i % 4, "relevance_score": 0.5} for i in range(5)]}, "index 0 appears twice"),
    ({"results": [{"index": i, "relevance_score": 0.5} for i in range(4)] + [{"index": 9}]}, "index 9"),
    ({"results": [{"index": i, "relevance_score": 0.5} for i in range(4)] + [{"index": True}]}, "index True"),
    (
        b'{"results": [' + b",".join(b'{"index": %d, "relevance_score": NaN}' % i for i in range(5)) + b"]}",
        "relevance_score nan",
    ),
    ({"results": [{"index": i, "relevance_score": "high"} for i in range(5)]}, "'high'"),
    ({"results": [[i, 0.5] for i in range(5)]}, "not an object"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
]


@pytest.mark.parametrize("payload,what", BAD_ANSWERS, ids=[w for _, w in BAD_ANSWERS])
def test_invalid_answers_raise_reranker_error_naming_the_endpoint(monkeypatch, payload, what):
    monkeypatch.setenv("KBCORE_TEST_RERANK_KEY", KEY)
    with fake_rerank_server("cohere") as srv:
        srv.plan = [(200, payload)]
        rr = _reranker(srv, "cohere")
        with pytest.raises(RerankerError) as e:
            rr.rerank(QUERY, TEXTS)
        assert not isinstance(e.value, RerankerUnavailableError)
        assert what in str(e.value) and rr.endpoint in str(e.value)
        assert e.value.endpoint == rr.endpoint


def test_tei_answer_that_is_not_a_list_is_refused(monkeypatch):
    with fake_rerank_server("tei") as srv:
        srv.plan = [(200, {"results": []})]
        with pytest.raises(RerankerError, match="expected a JSON list"):
            _reranker(srv, "tei", api_key_env=None).rerank(QUERY, TEXTS)


def test_429_then_200_is_retried(monkeypatch):
    monkeypatch.setenv("KBCORE_TEST_RERANK_KEY", KEY)
    with fake_rerank_server("cohere") as srv:
        srv.plan = [(429, {"message": "slow down"})]
        rr = _reranker(srv, "cohere")
        assert rr.rerank(QUERY, TEXTS).tolist() == [relevance(QUERY, t) for t in TEXTS]
        assert len(srv.requests) == 2 and rr.requests_sent == 2


def test_500s_until_the_retries_run_out_are_unavailable(monkeypatch):
    monkeypatch.setenv("KBCORE_TEST_RERANK_KEY", KEY)
    with fake_rerank_server("jina") as srv:
        srv.plan = [(500, {"error": "boom"})] * 10
        rr = _reranker(srv, "jina", max_retries=2)
        with pytest.raises(RerankerUnavailableError) as e:
            rr.rerank(QUERY, TEXTS)
        assert isinstance(e.value, ConnectionError) and e.value.status == 500
        assert "3 attempts" in str(e.value) and rr.endpoint in str(e.value)
        assert len(srv.requests) == 3


def test_a_refusal_is_not_retried_and_the_key_never_appears(monkeypatch):
    monkeypatch.setenv("KBCORE_TEST_RERANK_KEY", KEY)
    with fake_rerank_server("cohere") as srv:
        srv.plan = [(401, {"message": f"invalid api token {KEY}"})]
        rr = _reranker(srv, "cohere")
        with pytest.raises(RerankerError) as e:
            rr.rerank(QUERY, TEXTS)
        assert e.value.status == 401 and len(srv.requests) == 1
        assert KEY not in str(e.value) and KEY not in repr(e.value) and "***" in str(e.value)
        assert KEY not in repr(rr.spec()) and KEY not in repr(rr) and KEY not in rr.name


def test_a_missing_key_variable_is_named_and_nothing_is_sent(monkeypatch):
    monkeypatch.delenv("KBCORE_TEST_RERANK_KEY", raising=False)
    with fake_rerank_server("voyage") as srv:
        with pytest.raises(RerankerError, match="KBCORE_TEST_RERANK_KEY, which is not set"):
            _reranker(srv, "voyage").rerank(QUERY, TEXTS)
        assert srv.requests == []


def test_no_key_sends_no_authorization():
    with fake_rerank_server("tei") as srv:
        _reranker(srv, "tei", api_key_env=None).rerank(QUERY, TEXTS)
        assert "Authorization" not in srv.requests[0]["headers"]


def test_an_empty_list_sends_nothing():
    with fake_rerank_server("tei") as srv:
        assert _reranker(srv, "tei", api_key_env=None).rerank(QUERY, []).shape == (0,)
        assert srv.requests == []


@pytest.mark.parametrize(
    "kwargs,what",
    [
        ({"api_format": "bing"}, "api_format"),
        ({"api_format": "tei", "base_url": None}, "needs base_url"),
        ({"base_url": "ftp://x"}, "http:// or https://"),
        ({"base_url": "http://u:p@host"}, "credentials"),
        ({"batch_size": 0}, "batch_size"),
        ({"timeout": -1}, "timeout"),
        ({"max_retries": -1}, "max_retries"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, what):
    kwargs = {"base_url": "http://127.0.0.1:9", **kwargs}
    with pytest.raises(InvalidArgumentError, match=what):
        HttpReranker("m", **kwargs)
    with pytest.raises(InvalidArgumentError, match="needs model"):
        HttpReranker(api_format="cohere")


# -- the cross-encoder, with a stand-in for sentence-transformers --------------------------


class _FakeCrossEncoder:
    """Predicts a logit per (query, text) pair, through its activation (the sigmoid unless
    ``activation_fn`` is given, as sentence-transformers does); records its calls."""

    def __init__(self, name, device=None, max_length=None):
        self.model_name_or_path = name
        self.config = types.SimpleNamespace(num_labels=1)
        self.calls: list[dict] = []

    def predict(self, pairs, batch_size=32, show_progress_bar=None, convert_to_numpy=True, activation_fn=None):
        self.calls.append({"n": len(pairs), "batch_size": batch_size})
        logits = np.array([4.0 * relevance(q, t) - 2.0 for q, t in pairs], dtype=np.float32)
        # like sentence-transformers for one label: the sigmoid unless told another activation
        return activation_fn(logits) if activation_fn is not None else 1.0 / (1.0 + np.exp(-logits))


def test_cross_encoder_scores_are_logits_mapped_by_the_sigmoid(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", types.SimpleNamespace(CrossEncoder=_FakeCrossEncoder))
    rr = CrossEncoderReranker("some/model", batch_size=2)
    got = rr.rerank(QUERY, TEXTS)
    np.testing.assert_allclose(got, [4.0 * relevance(QUERY, t) - 2.0 for t in TEXTS], rtol=1e-6)
    assert rr.score_scale == "logit"
    assert [c["n"] for c in rr._model.calls] == [2, 2, 1]
    assert rr.spec() == {"kind": "cross-encoder", "model": "some/model", "batch_size": 2}
    assert isinstance(reranker_from_spec(rr.spec()), CrossEncoderReranker)


def test_cross_encoder_without_sentence_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install 'kbcore\[st\]'"):
        CrossEncoderReranker("some/model")


def test_cross_encoder_with_several_labels_is_refused():
    model = _FakeCrossEncoder("nli")
    model.config.num_labels = 3
    with pytest.raises(InvalidArgumentError, match="3 output labels"):
        CrossEncoderReranker(model)
