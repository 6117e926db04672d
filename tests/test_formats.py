"""Office formats, tables, zip archives and structure-aware chunking (docs/formats.md).

The committed files under tests/data/office/ come from tests/data/office/make_fixtures.py;
the other fixtures are built here with the same libraries (python-docx, openpyxl,
python-pptx, zipfile), seeded where they are random.
"""

from __future__ import annotations

import io
import re
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from kbcore import Engine
from kbcore.chunking import chunk_text
from kbcore.errors import InvalidArgumentError
from kbcore.parsers import archive
from kbcore.parsing import parse, parse_archive
from kbcore.sections import Part, chunk_sections, join_parts

docx = pytest.importorskip("docx", reason="the office extra (python-docx) is not installed")
openpyxl = pytest.importorskip("openpyxl", reason="the office extra (openpyxl) is not installed")
pptx = pytest.importorskip("pptx", reason="the office extra (python-pptx) is not installed")

OFFICE = Path(__file__).resolve().parent / "data" / "office"


def _read(name: str) -> bytes:
    return (OFFICE / name).read_bytes()


@pytest.fixture
def engine(tmp_path):
    e = Engine(tmp_path / "data")
    yield e
    e.close()


@pytest.fixture
def kb(engine):
    return engine.create_knowledge_base("kb", chunk_size=200, chunk_overlap=20)


def _table_rows_are_whole(chunks, header: str, rows: list[str]) -> None:
    """Every table chunk is the header plus whole rows; the rows appear once, in order."""
    seen: list[str] = []
    for c in chunks:
        assert c.text.startswith(header + "\n"), c.text
        seen.extend(c.text[len(header) + 1 :].split("\n"))
    assert seen == rows


# -- committed real-world-shaped files -------------------------------------------------------


def test_committed_fixtures_are_small():
    for name in ("handbook.docx", "inventory.xlsx", "briefing.pptx", "bundle.zip"):
        assert 0 < len(_read(name)) < 50_000


def test_docx_headings_lists_and_table_become_sections():
    doc = parse(_read("handbook.docx"), filename="handbook.docx")
    assert doc.format == "docx"
    paths = [s.path for s in doc.sections]
    assert paths == [
        "Field Handbook",
        "Field Handbook > Safety",
        "Field Handbook > Safety > Equipment ratings",
        "Field Handbook > Safety > Equipment ratings",
        "Field Handbook > Contacts",
    ]
    assert "- Gloves\n- Goggles" in doc.text
    table = doc.sections[3]
    assert table.kind == "table"
    assert table.header == "| Device | Rated load | Inspection |\n| --- | --- | --- |"
    assert "| Scissor lift | 450 kg | weekly |" in doc.text[table.start : table.end]
    for s in doc.sections:  # sections are spans of the text
        assert doc.text[s.start : s.end].strip() == doc.text[s.start : s.end]


def test_xlsx_sheets_are_table_sections_with_their_header():
    doc = parse(_read("inventory.xlsx"), filename="inventory.xlsx")
    assert [(s.path, s.kind) for s in doc.sections] == [("Fruit", "table"), ("Tools", "table")]
    assert "| Banana | yellow | 1.25 |" in doc.text and "| Kiwi | brown | 4 |" in doc.text
    chunks = chunk_sections(doc.text, doc.sections, chunk_size=110, chunk_overlap=10)
    fruit = [c for c in chunks if c.section == "Fruit"]
    _table_rows_are_whole(
        fruit, doc.sections[0].header, ["| Apple | red | 2.5 |", "| Banana | yellow | 1.25 |", "| Kiwi | brown | 4 |"]
    )
    assert len(fruit) >= 2  # the size forced a cut, between rows


def test_pptx_has_one_section_per_slide_with_notes_and_page():
    doc = parse(_read("briefing.pptx"), filename="briefing.pptx")
    assert [(s.path, s.page) for s in doc.sections] == [
        ("Slide 1: Quarterly goals", 1),
        ("Slide 2: Risks", 2),
        ("Slide 3: Budget", 3),
    ]
    risks = doc.text[doc.sections[1].start : doc.sections[1].end]
    assert "Flooding of the east bank" in risks and "The insurer needs the flood plan by May." in risks
    assert "| Boats | 12,000 EUR |" in doc.text


def test_zip_members_of_nested_folders_become_documents_and_the_rest_is_reported():
    parsed = parse_archive(_read("bundle.zip"), filename="bundle.zip")
    assert [m.path for m in parsed.members] == ["docs/guide/intro.md", "docs/data/ports.csv", "manuals/handbook.docx"]
    assert [m.parsed.format for m in parsed.members] == ["markdown", "csv", "docx"]
    assert parsed.skipped == (("manuals/images/logo.png", "unsupported file type '.png'"),)
    with pytest.raises(InvalidArgumentError, match="parse_archive"):
        parse(_read("bundle.zip"), filename="bundle.zip")


# -- seeded generated files -------------------------------------------------------------------


def _docx_bytes(rows: list[tuple[str, ...]], heading: str = "Report") -> bytes:
    d = docx.Document()
    d.add_heading(heading, level=1)
    d.add_paragraph("Intro paragraph before the table.")
    t = d.add_table(rows=len(rows), cols=len(rows[0]))
    for r, row in enumerate(rows):
        for c, v in enumerate(row):
            t.cell(r, c).text = v
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def test_a_long_docx_table_is_cut_between_rows_with_the_header_repeated():
    rng = np.random.default_rng(7)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
    rows = [("Code", "Owner", "Note")] + [
        (f"C{i}", str(rng.choice(words)), " ".join(rng.choice(words, int(rng.integers(1, 6))))) for i in range(60)
    ]
    doc = parse(_docx_bytes(rows), filename="r.docx")
    table = next(s for s in doc.sections if s.kind == "table")
    chunks = [
        c for c in chunk_sections(doc.text, doc.sections, chunk_size=150, chunk_overlap=30) if c.start >= table.start
    ]
    assert len(chunks) > 5
    _table_rows_are_whole(chunks, table.header, ["| " + " | ".join(r) + " |" for r in rows[1:]])
    assert all(len(c.text) <= 150 for c in chunks)
    assert {c.section for c in chunks} == {"Report"}


def test_a_header_wider_than_half_a_chunk_is_not_repeated_and_rows_stay_whole():
    header_cells = [f"column number {i}" for i in range(8)]
    rows = [header_cells] + [[f"r{r}c{c}" for c in range(8)] for r in range(30)]
    csv_text = "\n".join(",".join(r) for r in rows)
    doc = parse(csv_text.encode(), filename="wide.csv")
    table = doc.sections[0]
    assert len(table.header) > 100
    chunks = chunk_sections(doc.text, doc.sections, chunk_size=200, chunk_overlap=0)
    assert all(len(c.text) <= 200 and c.text == doc.text[c.start : c.end] for c in chunks)
    lines = [line for c in chunks for line in c.text.split("\n")]
    assert lines == doc.text.split("\n")  # every row whole, once, in order


def test_csv_and_tsv_keep_quoted_cells_and_rows_whole():
    rows = [["id", "comment"], ["1", "has, a comma"], ["2", 'a "quote" and\na newline'], ["3", "pipe | inside"]]
    buf = io.StringIO()
    import csv

    csv.writer(buf).writerows(rows)
    doc = parse(buf.getvalue().encode(), filename="c.csv")
    assert doc.sections[0].path == "c.csv" and doc.sections[0].kind == "table"
    assert doc.text.split("\n") == [
        "| id | comment |",
        "| --- | --- |",
        "| 1 | has, a comma |",
        '| 2 | a "quote" and a newline |',
        "| 3 | pipe \\| inside |",
    ]
    tsv = parse(b"a\tb\n1\t2\n", filename="t.tsv")
    assert tsv.text == "| a | b |\n| --- | --- |\n| 1 | 2 |"


# -- structure-aware chunking ----------------------------------------------------------------


def test_chunks_never_cross_a_section_unless_sections_are_small():
    rng = np.random.default_rng(11)
    words = "the river survey team measured flow depth and sediment at each station".split()
    parts = []
    for i in range(40):
        n = int(rng.integers(3, 120))
        parts.append(Part(" ".join(rng.choice(words, n)) + ".", path=f"H{i}", page=i + 1))
    text, sections = join_parts(parts)
    size, min_section = 200, 50
    chunks = chunk_sections(text, sections, chunk_size=size, chunk_overlap=20, min_section=min_section)
    covered = set()
    for c in chunks:
        assert c.text == text[c.start : c.end] and len(c.text) <= size
        inside = [s for s in sections if s.start < c.end and c.start < s.end]
        if len(inside) > 1:  # only small neighbours merge
            assert any(s.end - s.start < min_section for s in inside)
        assert c.section in {s.path for s in inside}
        covered.update(range(c.start, c.end))
    for s in sections:  # every section's text is in some chunk
        assert set(range(s.start, s.end)) <= covered
    big = [s for s in sections if s.end - s.start >= size]
    assert big and all({c.section for c in chunks if s.start <= c.start < s.end} == {s.path} for s in big)


def test_cjk_sentence_ends_are_boundaries():
    text = "今日は晴れです。明日は雨が降るでしょう！本当ですか？" * 6
    chunks = chunk_text(text, chunk_size=30, chunk_overlap=0)
    assert len(chunks) > 1
    assert all(c.text[-1] in "。！？" for c in chunks)
    text2, sections = join_parts([Part("第一章\n" + "这是第一句。这是第二句！" * 5, path="第一章")])
    for c in chunk_sections(text2, sections, chunk_size=25, chunk_overlap=0):
        assert c.text[-1] in "。！？章" and c.section == "第一章"


def test_markdown_and_html_headings_give_heading_paths():
    md = parse(
        b"# Guide\n\nIntro.\n\n## Install\n\nRun pip.\n\n```\n# not a heading\n```\n\n## Use\n\nCall it.",
        filename="g.md",
    )
    assert [s.path for s in md.sections] == ["Guide", "Guide > Install", "Guide > Use"]
    assert "not a heading" in md.text  # inside a code fence: no section
    html = parse(
        b"<html><body><h1>Manual</h1><p>Read me.</p><h2>Safety</h2><p>Wear gloves.</p>"
        b"<h2 hidden>Ghost</h2><h3>Eyes</h3><p>Goggles.</p></body></html>",
        filename="m.html",
    )
    assert [s.path for s in html.sections] == ["Manual", "Manual > Safety", "Manual > Safety > Eyes"]
    assert parse(b"no headings here", filename="a.md").sections == ()


def test_markdown_page_markers_give_pages_under_the_heading_path_in_force():
    md = parse(
        b"Cover text.\n\n<!-- PAGE:1 -->\n# Survey\n\nWelcome.\n\n<!-- PAGE:2 -->\nStill the survey.\n\n"
        b"## Method\n\nWe measured.\n\n```\n<!-- PAGE:9 -->\n```\n\n<!-- PAGE:0 -->\nNot a page.\n\n"
        b"<!-- page three -->\n  <!-- PAGE: 3 -->\nLast page.",
        filename="s.md",
    )
    pieces = [(s.path, s.page, md.text[s.start : s.end]) for s in md.sections]
    assert pieces == [
        ("", None, "Cover text."),
        ("Survey", 1, "Survey\n\nWelcome."),
        ("Survey", 2, "Still the survey."),
        ("Survey > Method", 2, "Method\n\nWe measured.\n\nNot a page."),
        ("Survey > Method", 3, "Last page."),
    ]
    assert "PAGE" not in md.text
    plain = parse(b"Just text.\n\n<!-- PAGE:1 -->\nOn page one.", filename="p.md")
    assert [(s.page, plain.text[s.start : s.end]) for s in plain.sections] == [
        (None, "Just text."),
        (1, "On page one."),
    ]


def test_pdf_pages_carry_the_outline_path():
    pypdf = pytest.importorskip("pypdf", reason="the pdf extra (pypdf) is not installed")
    from test_parsing import _minimal_pdf

    writer = pypdf.PdfWriter()
    for text in ("Welcome to the survey", "How we measured", "Where we sampled"):
        writer.append(pypdf.PdfReader(io.BytesIO(_minimal_pdf(text))))
    writer.add_outline_item(title="Intro", page_number=0)
    methods = writer.add_outline_item(title="Methods", page_number=1)
    writer.add_outline_item(title="Sampling", page_number=2, parent=methods)
    out = io.BytesIO()
    writer.write(out)
    doc = parse(out.getvalue(), filename="s.pdf")
    assert [(s.path, s.page) for s in doc.sections] == [("Intro", 1), ("Methods", 2), ("Methods > Sampling", 3)]
    assert "Where we sampled" in doc.text[doc.sections[2].start : doc.sections[2].end]


# -- the engine -------------------------------------------------------------------------------


def test_section_and_page_are_chunk_metadata_filterable_with_where(kb):
    kb.ingest(_read("handbook.docx"), filename="handbook.docx", document_id="hb")
    kb.ingest(_read("briefing.pptx"), filename="briefing.pptx", document_id="deck")
    section = "Field Handbook > Safety > Equipment ratings"
    hits = kb.retrieve("Scissor lift rated load", top_k=20, filters={"section": {"$eq": section}})
    assert hits and all(h.metadata["section"] == section for h in hits)
    assert any("| Scissor lift | 450 kg | weekly |" in h.content for h in hits)
    assert any(h.content.startswith("| Device | Rated load | Inspection |") for h in hits)
    deck = kb.retrieve("flood plan", top_k=20, filters={"page": {"$eq": 2}})
    assert deck and all(h.document_id == "deck" and h.metadata["page"] == 2 for h in deck)
    assert "insurer" in deck[0].content
    page = (
        b"<html><body><h1>Oncall</h1><p>Pages go to the primary.</p><h2>Escalation</h2>"
        b"<p>After ten minutes the secondary is paged.</p></body></html>"
    )
    kb.ingest(page, filename="oncall.html", document_id="web")
    web = kb.retrieve("secondary paged", top_k=5, filters={"section": {"$eq": "Oncall > Escalation"}})
    assert [h.document_id for h in web] == ["web"] and "ten minutes" in web[0].content


def test_a_zip_ingests_one_document_per_member_and_deletes_as_a_group(kb):
    res = kb.ingest(_read("bundle.zip"), filename="bundle.zip", document_id="z")
    ids = ["z/docs/guide/intro.md", "z/docs/data/ports.csv", "z/manuals/handbook.docx"]
    assert res.document_id == "z" and res.format == "zip"
    assert [m.document_id for m in res.members] == ids
    assert res.chunks == sum(m.chunks for m in res.members) > 0
    assert res.skipped == (("manuals/images/logo.png", "unsupported file type '.png'"),)
    docs = {d.document_id: d for d in kb.documents()}
    assert set(docs) == set(ids)
    assert docs["z/docs/data/ports.csv"].filename == "bundle.zip/docs/data/ports.csv"
    assert all(d.metadata == {"archive": "z"} for d in docs.values())
    hits = kb.retrieve("Bergen Norway", top_k=3, filters={"archive": {"$eq": "z"}})
    assert hits[0].document_id == "z/docs/data/ports.csv"
    # re-ingesting with one member fewer replaces the others and drops the stale one
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(_read("bundle.zip"))) as src, zipfile.ZipFile(buf, "w") as dst:
        for info in src.infolist():
            if info.filename != "docs/data/ports.csv":
                dst.writestr(info, src.read(info))
    again = kb.ingest(buf.getvalue(), filename="bundle.zip", document_id="z")
    assert again.replaced and [m.document_id for m in again.members] == [ids[0], ids[2]]
    assert {d.document_id for d in kb.documents()} == {ids[0], ids[2]}
    assert kb.delete_document("z") > 0
    assert kb.documents() == [] and len(kb) == 0


def _zip(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, body in members.items():
            zf.writestr(name, body)
    return buf.getvalue()


def test_a_zip_with_a_bad_member_is_refused_whole_and_stores_nothing(kb):
    data = _zip({"a/good.md": b"# Good\n\nFine text.", "b/bad.docx": b"PK\x03\x04 not a docx", "c.txt": b"ok"})
    with pytest.raises(InvalidArgumentError, match=r"b/bad\.docx.*not a valid Word document.*not ingested"):
        kb.ingest(data, filename="mixed.zip")
    assert len(kb) == 0 and kb.documents() == []


# -- hostile files ----------------------------------------------------------------------------


def test_zip_bomb_by_ratio_is_refused_before_unpacking():
    data = _zip({"zeros.txt": b"\0" * (8 << 20)})  # 8 MiB -> ~8 KiB: ratio ~1000
    assert len(data) < 100_000
    tracemalloc.start()
    with pytest.raises(InvalidArgumentError, match=r"zeros\.txt.*zip bomb"):
        parse_archive(data, filename="bomb.zip")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak <= 4 * len(data) + (1 << 20)
    with pytest.raises(InvalidArgumentError, match="zip bomb"):  # the same inside an office file
        parse(data, filename="bomb.docx")


def _declare_sizes(data: bytes, size: int) -> bytes:
    """``data`` with every member's declared unpacked size (central directory) set to ``size``."""
    out = bytearray(data)
    for m in re.finditer(rb"PK\x01\x02", bytes(out)):
        out[m.start() + 24 : m.start() + 28] = size.to_bytes(4, "little")
    return bytes(out)


def test_zip_declaring_more_than_the_unpacked_limit_is_refused():
    rng = np.random.default_rng(3)
    members = {f"{i}.txt": rng.bytes(2 << 20) for i in range(3)}  # incompressible
    data = _declare_sizes(_zip(members, zipfile.ZIP_STORED), 100 << 20)  # 100 MiB each: ratio 50
    with pytest.raises(InvalidArgumentError, match=r"unpacks to 314572800 bytes, more than the limit of 268435456"):
        parse_archive(data, filename="huge.zip")


def test_zip_with_too_many_members_is_refused():
    data = _zip({f"d/{i}.txt": b"x" for i in range(10_000)}, zipfile.ZIP_STORED)
    t = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match=r"10000 members, more than the limit of 5000"):
        parse_archive(data, filename="many.zip")
    assert time.perf_counter() - t < 30


@pytest.mark.parametrize("name", ["../../x.txt", "/etc/passwd.txt", "a/../../x.txt", "C:evil.txt"])
def test_zip_member_escaping_the_archive_refuses_it_and_stores_nothing(kb, name):
    data = _zip({"ok.txt": b"fine", name: b"evil"})
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(name)) + ".*outside the archive"):
        kb.ingest(data, filename="trav.zip")
    assert len(kb) == 0


def test_an_encrypted_member_refuses_the_archive():
    data = bytearray(_zip({"a.txt": b"fine", "secret.txt": b"hidden"}, zipfile.ZIP_STORED))
    for sig, flag_at in ((rb"PK\x03\x04", 6), (rb"PK\x01\x02", 8)):  # set the "encrypted" flag bit
        for m in re.finditer(sig, bytes(data)):
            data[m.start() + flag_at] |= 1
    with pytest.raises(InvalidArgumentError, match=r"member 'a.txt' cannot be unpacked .*encrypted"):
        parse_archive(bytes(data), filename="enc.zip")


def test_nested_zips_are_not_followed():
    inner = _zip({"deep.txt": b"deep text"})
    parsed = parse_archive(_zip({"top.txt": b"top text", "in/inner.zip": inner}), filename="n.zip")
    assert [m.path for m in parsed.members] == ["top.txt"]
    assert parsed.skipped == (("in/inner.zip", "a nested archive (not followed)"),)


@pytest.mark.parametrize(
    "data,name,match",
    [
        (b"PK\x03\x04\x14\x00garbage", "c.docx", "not a valid Word document"),
        (_zip({"word/document.xml": b"<not xml"}), "c.docx", "could not read the Word document"),
        (_zip({"x": b"y"}), "c.pptx", "could not read the PowerPoint presentation"),
        (_zip({"x": b"y"}), "c.xlsx", "could not read the workbook"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "old.xls", r"legacy binary \.xls format.*convert the file to \.xlsx"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "old.ppt", r"convert the file to \.pptx"),
    ],
)
def test_corrupt_and_legacy_office_files_raise_naming_the_file(data, name, match):
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(name)) + ".*" + match):
        parse(data, filename=name)


@pytest.mark.parametrize("name", ["e.docx", "e.xlsx", "e.pptx", "e.csv", "e.zip"])
def test_a_zero_byte_file_is_refused(kb, name):
    with pytest.raises(InvalidArgumentError, match=re.escape(repr(name)) + " is empty"):
        kb.ingest(b"", filename=name)
    assert len(kb) == 0


def _empty_rows_xlsx(n: int) -> bytes:
    """A workbook of a header, one row and then empty rows up to row ``n`` (as Excel writes
    them: ``<row r=".."/>`` elements, the dimension declared)."""
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "S"
    ws.append(["h1", "h2"])
    ws.append(["a", "b"])
    base = io.BytesIO()
    wb.save(base)
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(base.getvalue())) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == "xl/worksheets/sheet1.xml":
                xml = re.sub(r'<dimension ref="[^"]*"/>', f'<dimension ref="A1:B{n}"/>', body.decode())
                rows = "".join(f'<row r="{r}"/>' for r in range(3, n + 1))
                body = xml.replace("</sheetData>", rows + "</sheetData>").encode()
            dst.writestr(info, body)
    return out.getvalue()


def test_a_workbook_of_a_million_empty_rows_is_refused_in_bounded_time_and_memory():
    data = _empty_rows_xlsx(1_000_000)
    tracemalloc.start()
    t = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match=r"'S' has more than 10000 empty rows in a row \(from row 3\)"):
        parse(data, filename="empty.xlsx")
    elapsed = time.perf_counter() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak <= 4 * len(data) + (8 << 20), peak
    assert elapsed < 30
    # a few thousand empty rows in a row are fine
    assert parse(_empty_rows_xlsx(5000), filename="ok.xlsx").text == "| h1 | h2 |\n| --- | --- |\n| a | b |"


def test_parsing_a_csv_peaks_under_four_times_its_size():
    rng = np.random.default_rng(5)
    letters = np.array(list("abcdefghij"))
    lines = ["id,name,score"] + [f"{i},{''.join(rng.choice(letters, 12))},{rng.integers(100)}" for i in range(50_000)]
    data = "\n".join(lines).encode()
    tracemalloc.start()
    doc = parse(data, filename="big.csv")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert doc.text.count("\n") == 50_001
    assert peak <= 4 * len(data) + (1 << 20), (peak, len(data))


def test_archive_limits_are_what_the_docs_say():
    assert (archive.MAX_MEMBERS, archive.MAX_UNPACKED, archive.MAX_RATIO) == (5000, 256 << 20, 100)
    assert archive.MAX_OFFICE_UNPACKED == 64 << 20
