"""QA pairs (``KnowledgeBase.ingest_qa``) and pipelines with steps (``create_pipeline(steps=)``,
``retrieve_text(...).intermediate_steps``): exact expectations, persistence, bad input."""

from __future__ import annotations

import csv
import io
import json
import os
import re

import pytest

from kbcore import Engine
from kbcore.engine import Step
from kbcore.errors import InvalidArgumentError, InvalidTypeError, NotFoundError

FAQ = [
    ("How do I reset my password?", "Use the Forgot link on the login page."),
    ("What is the refund window?", "Thirty days from delivery."),
    ("Which currencies are accepted?", "Euro, dollar and yen."),
]


def _csv(rows, header=("question", "answer"), sep=","):
    out = io.StringIO()
    writer = csv.writer(out, delimiter=sep, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().encode()


@pytest.fixture
def kb(tmp_path):
    engine = Engine(str(tmp_path / "data"))
    yield engine.create_knowledge_base("kb")
    engine.close()


# -- QA pairs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("search_type", ["vector", "full_text", "hybrid"])
def test_qa_question_is_searched_answer_is_returned(kb, search_type):
    res = kb.ingest_qa(_csv(FAQ), filename="faq.csv")
    assert (res.document_id, res.chunks, res.format) == ("faq.csv", 3, "qa")
    hit = kb.retrieve("refund window", 1, search_type=search_type)[0]
    assert hit.content == "Thirty days from delivery."
    assert hit.metadata["question"] == "What is the refund window?"
    assert hit.chunk_index == 1
    # the answer's words are not searched: BM25 finds nothing for a word only in an answer
    assert kb.retrieve("yen", 3, search_type="full_text") == []


def test_qa_formats_agree(kb, tmp_path):
    jsonl = "\n".join(json.dumps({"Q": q, "A": a}) for q, a in FAQ).encode()
    openpyxl = pytest.importorskip("openpyxl", reason="xlsx QA needs the office extra (openpyxl)")
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append(["Q", "A"])
    for q, a in FAQ:
        ws.append([q, a])
    buf = io.BytesIO()
    wb.save(buf)
    inputs = {
        "f.csv": _csv(FAQ, ("Q", "A")),
        "f.tsv": _csv(FAQ, ("Q", "A"), "\t"),
        "f.jsonl": jsonl,
        "f.xlsx": buf.getvalue(),
    }
    for name, data in inputs.items():
        kb.ingest_qa(data, filename=name, question_column="q", answer_column="a")
    for name in inputs:
        hits = kb.retrieve("accepted currencies", 1, search_type="full_text", filters={"document_id": name})
        assert [(h.content, h.metadata["question"]) for h in hits] == [(FAQ[2][1], FAQ[2][0])], name
    assert kb.document_text("f.jsonl") == "\n\n".join(f"Q: {q}\nA: {a}" for q, a in FAQ)


def test_qa_from_path_survives_reopen_and_compaction(tmp_path):
    path = tmp_path / "faq.csv"
    path.write_bytes(_csv(FAQ))
    engine = Engine(str(tmp_path / "data"))
    kb = engine.create_knowledge_base("kb")
    kb.ingest_qa(str(path), metadata={"lang": "en"})
    kb.ingest(text="An unrelated manual about passwords and refunds.", document_id="manual")
    engine.close()
    engine = Engine(str(tmp_path / "data"))
    kb = engine["kb"]
    for _ in range(2):
        hit = kb.retrieve("reset password", 1, search_type="full_text", filters={"lang": "en"})[0]
        assert (hit.content, hit.metadata["question"]) == (FAQ[0][1], FAQ[0][0])
        manual = kb.retrieve("unrelated manual", 1, search_type="full_text")[0]
        assert manual.content == "An unrelated manual about passwords and refunds."
        assert "question" not in manual.metadata
        kb.compact()
    assert kb.delete_document("faq.csv") == 3
    assert [h.document_id for h in kb.retrieve("passwords", 5, search_type="full_text")] == ["manual"]
    engine.close()


@pytest.mark.parametrize(
    ("data", "name", "message"),
    [
        (_csv(FAQ, ("question", "reply")), "a.csv", "row 1 (the header): no column 'answer'"),
        (_csv([FAQ[0], ("", "orphan answer")]), "b.csv", "row 3: the question ('question') is empty"),
        (_csv([FAQ[0], ("a question", " ")]), "c.csv", "row 3: the answer ('answer') is empty"),
        (b'{"question": "q", "answer": "a"}\n[1, 2]\n', "d.jsonl", "line 2: must be a JSON object"),
        (b'{"question": "q", "answer": "a"}\n{"question": "q2"}\n', "e.jsonl", "row 2: no column 'answer'"),
        (b'{"question": {"x": 1}, "answer": "a"}\n', "f.jsonl", "row 1: column 'question' must hold text"),
        (b"question,answer\n", "g.csv", "no question-answer rows"),
        (b"question,answer\nq,a\n", "h.txt", "are read from csv, tsv, jsonl, xlsx files"),
        (b"\xff\xfe", "i.csv", "not UTF-8"),
    ],
)
def test_qa_bad_rows_name_the_row_and_store_nothing(kb, data, name, message):
    kb.ingest_qa(_csv(FAQ[:1]), filename="keep.csv")
    before = (len(kb), kb.stats().generation)
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        kb.ingest_qa(data, filename=name)
    assert name in str(info.value)
    assert (len(kb), kb.stats().generation) == before
    assert name not in kb


def test_qa_reingest_replaces_and_reserved_metadata(kb):
    kb.ingest_qa(_csv(FAQ), filename="faq.csv")
    res = kb.ingest_qa(_csv(FAQ[:1]), filename="faq.csv")
    assert (res.replaced, res.chunks, len(kb)) == (True, 1, 1)
    with pytest.raises(InvalidArgumentError, match="'question' is reserved"):
        kb.ingest_qa(_csv(FAQ), filename="x.csv", metadata={"question": "no"})
    with pytest.raises(InvalidArgumentError, match="both 'q'"):
        kb.ingest_qa(_csv(FAQ), filename="x.csv", question_column="q", answer_column="Q")


# -- pipelines with steps ------------------------------------------------------------------------

TEXT = "Alpha beta gamma. " * 6 + "\n\n" + "Delta epsilon zeta. " * 6


def _summary(text: str) -> str:
    return "summary of " + text.split(".")[0]


def _steps_kb(kb, *, chunk_intermediate=True, summary_intermediate=True, parse_intermediate=False):
    kb.create_pipeline(
        "p",
        chunk_size=120,
        chunk_overlap=0,
        steps=[
            Step("parse", intermediate=parse_intermediate),
            Step("chunk", intermediate=chunk_intermediate),
            Step("summary", fn=_summary, intermediate=summary_intermediate),
        ],
    )
    kb.ingest(text=TEXT, document_id="doc", pipeline="p")


def test_steps_store_intermediates_and_retrieve_text_returns_the_winning_parts(kb):
    _steps_kb(kb)
    prepared = kb.prepare(text=TEXT, pipeline="p")
    assert prepared.texts == ["summary of Alpha beta gamma", "summary of Delta epsilon zeta"]
    assert kb.prepare(text=TEXT).steps is None  # the default pipeline has no steps
    results = kb.retrieve_text("summary of Delta epsilon zeta", 5, pipelines="p", search_type="full_text")
    assert len(results) == 1  # deduplicated: one per source record
    r = results[0]
    assert (r.key, r.pipeline_name, r.value, r.chunk) == ("doc", "p", TEXT, "summary of Delta epsilon zeta")
    assert r.part_ids[0] == 1 and sorted(r.part_ids) == [0, 1]
    assert r.intermediate_steps == {"chunk": ("Delta epsilon zeta. " * 6).strip(), "summary": r.chunk}
    every = kb.retrieve_text("summary of", 5, pipelines="p", search_type="full_text", deduplicate=False)
    assert sorted((x.part_ids, x.intermediate_steps["chunk"][:5]) for x in every) == [((0,), "Alpha"), ((1,), "Delta")]


def test_steps_without_intermediates_give_empty_and_parse_gives_the_document(kb):
    _steps_kb(kb, chunk_intermediate=False, summary_intermediate=False)
    assert kb.retrieve_text("summary", 2, pipelines="p", search_type="full_text")[0].intermediate_steps == {}
    kb.create_pipeline("q", steps=[Step("parse", intermediate=True), "chunk"])
    kb.ingest(text="Omega text here.", document_id="o", pipeline="q")
    kb.ingest(text="Omega text here.", document_id="o2")  # default pipeline: no steps at all
    got = {r.pipeline_name: r.intermediate_steps for r in kb.retrieve_text("omega", 5, search_type="full_text")}
    assert got == {"q": {"parse": "Omega text here."}, "default": {}}


def test_steps_persist_and_functions_must_be_given_again(tmp_path):
    engine = Engine(str(tmp_path / "data"))
    kb = engine.create_knowledge_base("kb")
    _steps_kb(kb)
    engine.close()
    engine = Engine(str(tmp_path / "data"))
    kb = engine["kb"]
    assert kb.pipelines["p"]["steps"] == [
        {"name": "parse", "intermediate": False},
        {"name": "chunk", "intermediate": True},
        {"name": "summary", "intermediate": True},
    ]
    r = kb.retrieve_text("summary of Alpha", 1, pipelines="p", search_type="full_text")[0]
    assert r.intermediate_steps["chunk"] == ("Alpha beta gamma. " * 6).strip()
    with pytest.raises(InvalidArgumentError, match=r"set_step_function\('p', 'summary', fn\)"):
        kb.ingest(text="new", document_id="n", pipeline="p")
    assert "n" not in kb
    kb.set_step_function("p", "summary", str.upper)
    kb.ingest(text="new text", document_id="n", pipeline="p")
    assert kb.retrieve_text("NEW TEXT", 1, pipelines="p", search_type="full_text")[0].intermediate_steps == {
        "chunk": "new text",
        "summary": "NEW TEXT",
    }
    kb.compact()
    assert kb.retrieve_text("NEW TEXT", 1, pipelines="p", search_type="full_text")[0].chunk == "NEW TEXT"
    assert kb.delete_document("doc") == 2
    with pytest.raises(NotFoundError):
        kb.set_step_function("p", "chunk", str.upper)
    engine.close()


@pytest.mark.parametrize(
    ("steps", "error", "message"),
    [
        (["chunk", "chunk"], InvalidArgumentError, "appears twice"),
        (["chunk", "parse"], InvalidArgumentError, "'parse' must be the first"),
        (["parse"], InvalidArgumentError, "must include 'chunk'"),
        ([Step("s", fn=str.upper), "chunk"], InvalidArgumentError, "comes before 'chunk'"),
        (["chunk", "summary"], InvalidArgumentError, "needs fn"),
        ([Step("chunk", fn=str.upper)], InvalidArgumentError, "takes no fn"),
        ([Step("chunk", intermediate=1)], InvalidTypeError, "intermediate must be"),
        (["chunk"] + [Step(f"s{i}", fn=str.upper) for i in range(10)], InvalidArgumentError, "1 to 10 steps"),
        ("chunk", InvalidTypeError, "list of Step"),
        ([Step("bad name", fn=str.upper)], InvalidArgumentError, "step name"),
    ],
)
def test_bad_steps_are_refused_before_anything_is_written(kb, steps, error, message):
    gen = kb.stats().generation
    with pytest.raises(error, match=message):
        kb.create_pipeline("p", steps=steps)
    assert "p" not in kb.pipelines and kb.stats().generation == gen


def test_a_step_returning_no_text_stores_nothing(kb):
    kb.create_pipeline("p", steps=["chunk", Step("s", fn=lambda t: "")])
    with pytest.raises(InvalidArgumentError, match="step 's' must return a non-empty str"):
        kb.ingest(text="some text", document_id="d", pipeline="p")
    assert len(kb) == 0


# -- the command line ------------------------------------------------------------------------------


def test_cli_ingest_qa_then_query(tmp_path, capsys, monkeypatch):
    from kbcore.cli import main

    monkeypatch.setenv("KBCORE_HOME", str(tmp_path / "home"))
    faq = tmp_path / "faq.tsv"
    faq.write_bytes(_csv(FAQ, ("Frage", "Antwort"), "\t"))
    argv = ["ingest", "--qa", str(faq), "--kb", "help", "--question-column", "frage", "--answer-column", "antwort"]
    assert main(argv) == 0
    assert "3 question-answer pairs" in capsys.readouterr().out
    assert main(["query", "refund window", "--kb", "help", "--top-k", "1", "--json"]) == 0
    hit = json.loads(capsys.readouterr().out)[0]
    assert (hit["content"], hit["metadata"]["question"]) == (FAQ[1][1], FAQ[1][0])
    bad = tmp_path / "bad.csv"
    bad.write_bytes(_csv([FAQ[0], ("", "x")]))
    assert main(["ingest", "--qa", str(bad), "--kb", "help"]) == 1
    assert "row 3: the question ('question') is empty" in capsys.readouterr().err


def test_qa_prepared_with_vectors_from_elsewhere(kb):
    prepared = kb.prepare_qa(_csv(FAQ), filename="faq.csv")
    assert prepared.texts == [q for q, _ in FAQ]
    assert prepared.contents == tuple(a for _, a in FAQ)
    vectors = kb.embedder.embed(prepared.texts)
    assert kb.ingest_prepared(prepared, vectors).chunks == 3
    hit = kb.retrieve("Which currencies are accepted?", 1)[0]
    assert (hit.content, hit.metadata["question"]) == (FAQ[2][1], FAQ[2][0])


# -- validation of what is stored --------------------------------------------------------------------

BAD_STEPS = [
    ("not a list", "pipelines.default.steps"),
    ([], "pipelines.default.steps"),
    ([{"name": "chunk"}], "pipelines.default.steps[0].intermediate"),
    ([{"name": "chunk", "intermediate": "yes"}], "pipelines.default.steps[0].intermediate"),
    ([{"name": "chunk", "intermediate": False}] * 2, "pipelines.default.steps[1].name"),
    ([{"name": "s", "intermediate": False}, {"name": "chunk", "intermediate": False}], "steps[0].name"),
    ([{"name": "chunk", "intermediate": False}, {"name": "parse", "intermediate": False}], "steps[1].name"),
    ([{"name": "parse", "intermediate": False}], "pipelines.default.steps"),
    ([{"name": "../x", "intermediate": False}], "steps[0].name"),
]


@pytest.mark.parametrize(("steps", "field"), BAD_STEPS)
def test_crafted_pipeline_steps_raise_format_error_naming_the_field(tmp_path, steps, field):
    from test_fuzz_kb_load import build_base_kb, write_crafted

    from kbcore.engine import storage
    from kbcore.errors import FormatError

    base = build_base_kb(str(tmp_path / "base" / "data"))
    m = storage.load_manifest(base)
    m["pipelines"]["default"]["steps"] = steps
    d = write_crafted(base, str(tmp_path / "w"), m)
    with pytest.raises(FormatError, match=re.escape(field)):
        Engine(os.path.dirname(d)).get_knowledge_base("kb")


@pytest.mark.parametrize("column", ["__content", "__steps"])
def test_crafted_optional_chunk_column_of_the_wrong_type_raises_format_error(tmp_path, column):
    import pyarrow as pa
    from test_fuzz_kb_load import write_crafted

    from kbcore.engine import storage
    from kbcore.errors import FormatError

    engine = Engine(str(tmp_path / "base" / "data"))
    kb = engine.create_knowledge_base("kb")
    kb.ingest_qa(_csv(FAQ), filename="faq.csv")
    engine.close()
    base = os.path.join(str(tmp_path / "base" / "data"), "kb")
    m = storage.load_manifest(base)
    name = m["segments"][0]["files"]["chunks"]["path"]
    with open(os.path.join(base, name), "rb") as f, pa.ipc.open_file(pa.py_buffer(f.read())) as r:
        table = r.read_all()
    table = table.drop_columns([c for c in ("__content", "__steps") if c in table.column_names])
    table = table.append_column(column, pa.array(range(table.num_rows), pa.int64()))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    d = write_crafted(base, str(tmp_path / "w"), m, {name: sink.getvalue().to_pybytes()})
    with pytest.raises(FormatError, match=f"column {column!r} has type int64"):
        Engine(os.path.dirname(d)).get_knowledge_base("kb")


def test_qa_xlsx_bad_row_is_named_by_its_sheet_row(kb):
    openpyxl = pytest.importorskip("openpyxl", reason="xlsx QA needs the office extra (openpyxl)")
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.append([None])  # an empty first row: the header is row 2
    ws.append(["Question", "Answer"])
    ws.append([FAQ[0][0], FAQ[0][1]])
    ws.append([42, "numbers are text too"])
    ws.append(["an unanswered question", None])
    buf = io.BytesIO()
    wb.save(buf)
    with pytest.raises(InvalidArgumentError, match=r"'faq\.xlsx' row 5: the answer \('answer'\) is empty"):
        kb.ingest_qa(buf.getvalue(), filename="faq.xlsx")
    assert len(kb) == 0
    ws.delete_rows(5)
    buf = io.BytesIO()
    wb.save(buf)
    kb.ingest_qa(buf.getvalue(), filename="faq.xlsx")
    assert kb.retrieve("42", 1, search_type="full_text")[0].content == "numbers are text too"
