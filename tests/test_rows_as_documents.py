"""Spreadsheets of records ingested one document per row (issue 27, item 1's row mode)."""

from __future__ import annotations

import datetime as dt
import io
import tracemalloc

import pytest

from kbcore import Engine
from kbcore.engine import Document
from kbcore.errors import InvalidArgumentError, InvalidTypeError
from kbcore.parsers import tables
from kbcore.parsing import parse_records

CSV = b"sku,name,price,stock\nA1,Red widget,9.5,3\nA2,Blue widget,12,0\n\nA3,Green gadget,7.25,7\n"


@pytest.fixture
def kb(tmp_path):
    engine = Engine(tmp_path)
    yield engine.create_knowledge_base("kb", index="flat")
    engine.close()


def test_each_row_is_a_document_with_typed_metadata(kb):
    res = kb.ingest(CSV, filename="items.csv", rows_as_documents=True, id_column="sku")
    assert (res.document_id, res.format, res.chunks) == ("items.csv", "csv", 3)
    assert [m.document_id for m in res.members] == ["items.csv/A1", "items.csv/A2", "items.csv/A3"]
    hit = kb.retrieve("blue widget", top_k=1)[0]
    assert hit.document_id == "items.csv/A2"
    assert hit.content == "sku: A2\nname: Blue widget\nprice: 12\nstock: 0"
    meta = hit.metadata
    assert (meta["sku"], meta["name"], meta["price"], meta["stock"], meta["archive"]) == (
        "A2",
        "Blue widget",
        12.0,
        0,
        "items.csv",
    )
    assert isinstance(meta["stock"], int) and isinstance(meta["price"], float)
    in_stock = kb.retrieve("widget gadget", filters={"stock": {"$gte": 1}}, top_k=10)
    assert sorted(h.document_id for h in in_stock) == ["items.csv/A1", "items.csv/A3"]
    cheap = kb.retrieve("widget gadget", filters={"price": {"$lt": 10}}, top_k=10)
    assert sorted(h.document_id for h in cheap) == ["items.csv/A1", "items.csv/A3"]


def test_reingest_replaces_the_rows_and_delete_takes_them_all(kb):
    kb.ingest(CSV, filename="items.csv", rows_as_documents=True, id_column="sku")
    fewer = b"sku,name,price,stock\nA1,Red widget,9.5,4\n"
    res = kb.ingest(fewer, filename="items.csv", rows_as_documents=True, id_column="sku")
    assert [m.document_id for m in res.members] == ["items.csv/A1"]
    assert sorted(d.document_id for d in kb.documents()) == ["items.csv/A1"]
    assert kb.retrieve("red widget", top_k=1)[0].metadata["stock"] == 4
    assert kb.delete_document("items.csv") == 1
    assert len(kb) == 0


def test_row_numbers_when_no_id_column_and_tsv(kb):
    tsv = b"a\tb\nx\t1\n\ny\t2\n"
    res = kb.ingest(tsv, filename="t.tsv", rows_as_documents=True)
    # the header is row 1; the empty line is row 3
    assert [m.document_id for m in res.members] == ["t.tsv/2", "t.tsv/4"]
    assert res.format == "tsv"


def test_header_names_become_valid_metadata_keys():
    data = b"document_id,archive,a,a,,$x\n1,2,3,4,5,6\n"
    (rec,) = parse_records(data, filename="k.csv")
    assert rec.fields == {"col_document_id": 1, "col_archive": 2, "a": 3, "a_2": 4, "column_5": 5, "col_$x": 6}
    assert rec.text == "document_id: 1\narchive: 2\na: 3\na: 4\ncolumn_5: 5\n$x: 6"


def test_a_column_of_mixed_values_is_text():
    (r1, r2) = parse_records(b"v,w\n10,1\nn/a,2.5\n", filename="m.csv")
    assert (r1.fields, r2.fields) == ({"v": "10", "w": 1.0}, {"v": "n/a", "w": 2.5})


def test_workbook_rows_keep_their_types(tmp_path, kb):
    openpyxl = pytest.importorskip("openpyxl", reason="the office extra (openpyxl) is not installed")
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Staff"
    ws.append(["id", "name", "age", "active", "joined"])
    ws.append(["e1", "Ada", 36, True, dt.date(2020, 1, 2)])
    ws.append(["e2", "Linus", 28.5, False, dt.date(2021, 3, 4)])
    other = wb.create_sheet("Rooms")
    other.append(["room", "seats"])
    other.append(["Blue", 8])
    buf = io.BytesIO()
    wb.save(buf)
    res = kb.ingest(buf.getvalue(), filename="hr.xlsx", rows_as_documents=True)
    assert [m.document_id for m in res.members] == ["hr.xlsx/Staff/2", "hr.xlsx/Staff/3", "hr.xlsx/Rooms/2"]
    hit = kb.retrieve("Ada", top_k=1, filters={"active": {"$eq": True}})[0]
    assert hit.document_id == "hr.xlsx/Staff/2"
    assert (hit.metadata["age"], hit.metadata["active"], hit.metadata["joined"]) == (36.0, True, "2020-01-02T00:00:00")
    assert hit.content == "id: e1\nname: Ada\nage: 36\nactive: True\njoined: 2020-01-02T00:00:00"
    with pytest.raises(InvalidArgumentError, match="'x' of row 3 appears twice"):
        bad = openpyxl.Workbook()
        bad.active.append(["id"])
        bad.active.append(["x"])
        bad.active.append(["x"])
        buf = io.BytesIO()
        bad.save(buf)
        kb.ingest(buf.getvalue(), filename="dup.xlsx", rows_as_documents=True, id_column="id")


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"source": CSV, "filename": "i.csv", "id_column": "code"}, InvalidArgumentError, "no column 'code'.*sku"),
        ({"source": b"k\nx\nx\n", "filename": "i.csv", "id_column": "k"}, InvalidArgumentError, "appears twice"),
        ({"source": b"k,v\n,1\n", "filename": "i.csv", "id_column": "k"}, InvalidArgumentError, "row 2 has no value"),
        ({"source": b"just text", "filename": "a.txt"}, InvalidArgumentError, "needs a .csv, .tsv or .xlsx"),
        ({"text": "a,b\n1,2"}, InvalidArgumentError, "not text"),
        ({"source": b"a,b\n", "filename": "h.csv"}, InvalidArgumentError, "no data row"),
        ({"source": b"", "filename": "e.csv"}, InvalidArgumentError, "empty"),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(kb, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        kb.ingest(rows_as_documents=True, **kwargs)
    assert len(kb) == 0


def test_option_checks(kb):
    with pytest.raises(InvalidArgumentError, match="id_column is only used"):
        kb.ingest(CSV, filename="i.csv", id_column="sku")
    with pytest.raises(InvalidTypeError, match="rows_as_documents"):
        kb.ingest(CSV, filename="i.csv", rows_as_documents="yes")
    with pytest.raises(InvalidArgumentError, match="id_column"):
        parse_records(CSV, filename="i.csv", id_column="")


def test_row_limit(monkeypatch, kb):
    monkeypatch.setattr(tables, "MAX_RECORDS", 2)
    with pytest.raises(InvalidArgumentError, match="more than 2 rows"):
        kb.ingest(CSV, filename="i.csv", rows_as_documents=True)
    assert len(kb) == 0


def test_ingest_many_and_sync_take_the_option(tmp_path, kb):
    kb.ingest_many([Document(CSV, filename="a.csv", rows_as_documents=True, id_column="sku")], progress=False)
    assert len(kb) == 3
    report = kb.sync(
        [Document(CSV, filename="s.csv", rows_as_documents=True, id_column="sku")],
        delete_missing=False,
        progress=False,
    )
    assert report.added and report.chunks_embedded == 3
    assert sorted(d.document_id for d in kb.documents() if d.document_id.startswith("s.csv/")) == [
        "s.csv/A1",
        "s.csv/A2",
        "s.csv/A3",
    ]


def test_parse_memory_is_bounded_per_row():
    rows = ["id,name,qty,price,note"] + [f"{i},item {i},{i % 997},{i % 89}.25,some words {i}" for i in range(20_000)]
    data = "\n".join(rows).encode()
    tracemalloc.start()
    try:
        records = parse_records(data, filename="big.csv")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(records) == 20_000
    # measured 1.6 KB a row (34x this file); the bound: 2 KB a row, so <= 200 MB at MAX_RECORDS
    assert peak <= 2048 * len(records)
