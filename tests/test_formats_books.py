"""EPUB and OpenDocument text (docs/formats.md): sections by heading and chapter, tables as
Markdown rows, the archive limits of every zip-based format, and hostile files.

The committed files tests/data/office/lighthouse.epub and logbook.odt come from
tests/data/office/make_books.py; the other fixtures are built here with the same libraries
(EbookLib, odfdo) or with zipfile.
"""

from __future__ import annotations

import importlib.util
import io
import random
import re
import sys
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from kbcore import Engine
from kbcore.errors import InvalidArgumentError
from kbcore.parsing import parse, parse_archive

epub = pytest.importorskip("ebooklib.epub", reason="the office extra (EbookLib) is not installed")
odfdo = pytest.importorskip("odfdo", reason="the office extra (odfdo) is not installed")

OFFICE = Path(__file__).resolve().parent / "data" / "office"


def _books():
    spec = importlib.util.spec_from_file_location("kbcore_test_make_books", OFFICE / "make_books.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


BOOKS = _books()
KEEPER_ROWS = ["| " + " | ".join(r) + " |" for r in BOOKS.KEEPERS]


@pytest.fixture
def kb(tmp_path):
    engine = Engine(tmp_path / "data")
    yield engine.create_knowledge_base("kb", chunk_size=200, chunk_overlap=0)
    engine.close()


def _sections(doc):
    return [(s.path, s.kind, doc.text[s.start : s.end]) for s in doc.sections]


@pytest.mark.parametrize(
    "data", [pytest.param(BOOKS.lighthouse_epub(), id="built"), pytest.param(None, id="committed")]
)
def test_an_epub_becomes_chapter_and_heading_sections_with_a_markdown_table(data):
    data = (OFFICE / "lighthouse.epub").read_bytes() if data is None else data
    doc = parse(data, filename="lighthouse.epub")
    assert doc.format == "epub"
    got = _sections(doc)
    assert [(p, k) for p, k, _ in got] == [
        ("Chapter 1: The Rock", "text"),
        ("Chapter 1: The Rock > Keepers", "text"),
        ("Chapter 1: The Rock > Keepers", "table"),
        ("Chapter 2: Storms", "text"),  # no heading: the table of contents names the chapter
    ]
    table = got[2][2].split("\n")
    assert table == [KEEPER_ROWS[0], "| --- | --- | --- |", *KEEPER_ROWS[1:]]
    assert "- January: hail\n- March: a drifting mast" in got[3][2]
    assert "Table of Contents" not in doc.text  # the nav document is not content


@pytest.mark.parametrize("data", [pytest.param(BOOKS.logbook_odt(), id="built"), pytest.param(None, id="committed")])
def test_an_odt_becomes_heading_sections_with_a_list_and_a_markdown_table(data):
    data = (OFFICE / "logbook.odt").read_bytes() if data is None else data
    doc = parse(data, filename="logbook.odt")
    assert doc.format == "odt"
    got = _sections(doc)
    assert [(p, k) for p, k, _ in got] == [
        ("Harbour Logbook", "text"),
        ("Harbour Logbook > Moorings", "text"),
        ("Harbour Logbook > Tides", "text"),
        ("Harbour Logbook > Tides", "table"),
    ]
    assert got[1][2].endswith("- North pier: twelve berths\n- South pier: eight berths")
    assert got[3][2].split("\n") == [
        "| Day | High water | Low water |",
        "| --- | --- | --- |",
        "| Monday | 06:10 | 12:25 |",
        "| Tuesday | 06:55 | 13:05 |",
    ]


def test_epub_and_odt_chunks_carry_their_section_and_find_a_table_cell(kb):
    kb.ingest((OFFICE / "lighthouse.epub").read_bytes(), filename="lighthouse.epub")
    kb.ingest((OFFICE / "logbook.odt").read_bytes(), filename="logbook.odt")
    hits = kb.retrieve("Per Vik electric", 1)
    assert hits[0].metadata["document_id"] == "lighthouse.epub"
    assert hits[0].metadata["section"] == "Chapter 1: The Rock > Keepers"
    assert "| Per Vik | 1921-1950 | electric |" in hits[0].content
    assert kb.count({"section": "Harbour Logbook > Tides"}) >= 1


def test_a_zip_holding_an_epub_and_an_odt_ingests_both_members(kb):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("books/lighthouse.epub", BOOKS.lighthouse_epub())
        zf.writestr("notes/logbook.odt", BOOKS.logbook_odt())
    kb.ingest(buf.getvalue(), filename="shelf.zip")
    assert sorted(d.document_id for d in kb.documents()) == [
        "shelf.zip/books/lighthouse.epub",
        "shelf.zip/notes/logbook.odt",
    ]


def _odt_with_body(xml: str) -> bytes:
    """An odfdo document whose body's XML is replaced by ``xml`` (inside office:text)."""
    base = io.BytesIO()
    odfdo.Document("text").save(base)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base.getvalue())) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == "content.xml":
                text = body.decode("utf-8")
                text = re.sub(
                    r"<office:text>.*</office:text>|<office:text/>",
                    f"<office:text>{xml}</office:text>",
                    text,
                    flags=re.S,
                )
                body = text.encode("utf-8")
            dst.writestr(info, body)
    return out.getvalue()


def test_odt_repetition_counts_are_not_expanded():
    """A crafted content.xml asks for two billion spaces, a billion repeated cells and rows:
    the text stays small and the parse bounded."""
    xml = (
        '<text:h text:outline-level="1">Big</text:h>'
        '<text:p>a<text:s text:c="2000000000"/>b</text:p>'
        '<table:table table:name="T"><table:table-row><table:table-cell><text:p>h</text:p></table:table-cell>'
        '<table:table-cell table:number-columns-repeated="1000000000"/></table:table-row>'
        "<table:table-row><table:table-cell><text:p>v</text:p></table:table-cell></table:table-row>"
        '<table:table-row table:number-rows-repeated="1000000000"><table:table-cell/></table:table-row>'
        "</table:table>"
    )
    data = _odt_with_body(xml)
    tracemalloc.start()
    doc = parse(data, filename="rep.odt")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "a b" in doc.text and "| h |\n| --- |\n| v |" in doc.text
    assert peak < 64 << 20


def test_an_odt_row_wider_than_the_limit_with_text_is_refused():
    xml = (
        '<table:table table:name="T"><table:table-row>'
        '<table:table-cell table:number-columns-repeated="5000"><text:p>x</text:p></table:table-cell>'
        "</table:table-row></table:table>"
    )
    with pytest.raises(InvalidArgumentError, match=r"'wide\.odt': a table row has more than 1024 cells"):
        parse(_odt_with_body(xml), filename="wide.odt")


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, body in members.items():
            zf.writestr(name, body)
    return buf.getvalue()


@pytest.mark.parametrize("name", ["bomb.epub", "bomb.odt"])
def test_a_zip_bomb_book_is_refused_before_unpacking(name):
    data = _zip({"mimetype": b"application/epub+zip", "OEBPS/zeros.xhtml": b"\0" * (8 << 20)})
    tracemalloc.start()
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(name)) + r".*zeros\.xhtml.*zip bomb"):
        parse(data, filename=name)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak <= 4 * len(data) + (1 << 20)


def test_a_book_with_too_many_members_is_refused():
    data = _zip({f"OEBPS/{i}.xhtml": b"<p>x</p>" for i in range(6000)})
    with pytest.raises(InvalidArgumentError, match=r"'many\.epub'.*6000 members, more than the limit of 5000"):
        parse(data, filename="many.epub")


def _spreadsheet_as_odt() -> bytes:
    buf = io.BytesIO()
    odfdo.Document("spreadsheet").save(buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    "data,name,match",
    [
        (b"PK\x03\x04\x14\x00garbage", "c.epub", "not a valid EPUB book"),
        (
            _zip({"mimetype": b"application/epub+zip", "META-INF/container.xml": b"<not xml"}),
            "c.epub",
            "could not read the EPUB book",
        ),
        (_zip({"x": b"y"}), "c.epub", "could not read the EPUB book"),
        (b"PK\x03\x04\x14\x00garbage", "c.odt", "not a valid OpenDocument text"),
        (_zip({"content.xml": b"<not xml"}), "c.odt", "could not read the OpenDocument text"),
        (_spreadsheet_as_odt(), "c.odt", "not an OpenDocument text .*spreadsheet"),
    ],
)
def test_corrupt_books_raise_naming_the_file(data, name, match):
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(name)) + ".*" + match):
        parse(data, filename=name)


@pytest.mark.parametrize("name", ["e.epub", "e.odt"])
def test_a_zero_byte_book_is_refused_and_stores_nothing(kb, name):
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(name)) + " is empty"):
        kb.ingest(b"", filename=name)
    assert len(kb) == 0


def test_a_corrupt_member_book_refuses_the_whole_archive(kb):
    data = _zip({"good.txt": b"fine text", "bad/book.epub": b"PK\x03\x04 not a book"})
    with pytest.raises(InvalidArgumentError, match=r"bad/book\.epub.*not a valid EPUB book"):
        kb.ingest(data, filename="mixed.zip")
    assert len(kb) == 0
    assert parse_archive(_zip({"a.odt": BOOKS.logbook_odt()}), filename="one.zip").members[0].parsed.format == "odt"


@pytest.mark.parametrize("name", ["lighthouse.epub", "logbook.odt"])
def test_mutated_books_give_a_document_or_a_clear_error(name):
    """Random bytes changed inside the XML members of a committed book (seeded): parse returns
    a document or raises InvalidArgumentError, never another exception."""
    rng = random.Random(name)
    base = (OFFICE / name).read_bytes()
    for _ in range(40):
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(base)) as zin, zipfile.ZipFile(out, "w") as zout:
            for info in zin.infolist():
                body = bytearray(zin.read(info))
                if info.filename.endswith((".xml", ".xhtml", ".opf", ".ncx")) and body and rng.random() < 0.5:
                    for _ in range(rng.randint(1, 5)):
                        body[rng.randrange(len(body))] = rng.randrange(256)
                zout.writestr(info, bytes(body))
        try:
            assert parse(out.getvalue(), filename=name).text
        except InvalidArgumentError:
            pass
