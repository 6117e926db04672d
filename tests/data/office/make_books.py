"""Writes the committed EPUB and OpenDocument fixtures of tests/test_formats_books.py:

    python tests/data/office/make_books.py

- ``lighthouse.epub``: a book of two chapters (the first with a sub-heading and a table, the
  second without a heading: its section is its table-of-contents title) and a nav document;
- ``logbook.odt``: a text document with nested headings, a bulleted list and a table.

Written by this project with EbookLib and odfdo; the text is made up here (no third-party
content). The libraries write their own timestamps and identifiers, so the bytes differ between
runs but the text does not. The same functions make the fixtures the tests build in memory.
Needs ``pip install 'kbcore[office]'``.
"""

from __future__ import annotations

import io
from pathlib import Path

HERE = Path(__file__).resolve().parent

KEEPERS = [("Keeper", "Years", "Lamp"), ("Ada Holm", "1901-1920", "oil"), ("Per Vik", "1921-1950", "electric")]


def lighthouse_epub() -> bytes:
    """An EPUB with two chapters, a sub-heading, a list and a table."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("kbcore-fixture-lighthouse")
    book.set_title("The Lighthouse")
    book.set_language("en")
    rows = "".join(f"<tr>{''.join(f'<{c}>{v}</{c}>' for v in row)}</tr>" for c, row in zip(["th", "td", "td"], KEEPERS))
    one = epub.EpubHtml(title="Chapter 1: The Rock", file_name="ch1.xhtml", lang="en")
    one.content = (
        "<h1>Chapter 1: The Rock</h1><p>The lighthouse stands on a granite skerry west of the harbour.</p>"
        "<h2>Keepers</h2><p>Three families kept the light.</p>"
        f"<table>{rows}</table>"
    )
    two = epub.EpubHtml(title="Chapter 2: Storms", file_name="ch2.xhtml", lang="en")
    two.content = (
        "<p>In the winter of 1913 the lantern glass broke twice.</p>"
        "<ul><li>January: hail</li><li>March: a drifting mast</li></ul>"
    )
    book.add_item(one)
    book.add_item(two)
    book.toc = (
        epub.Link("ch1.xhtml", "Chapter 1: The Rock", "ch1"),
        epub.Link("ch2.xhtml", "Chapter 2: Storms", "ch2"),
    )
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", one, two]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


def logbook_odt() -> bytes:
    """An OpenDocument text with nested headings, a list and a table."""
    from odfdo import Document, Header, List, Paragraph, Table

    doc = Document("text")
    body = doc.body
    body.clear()
    body.append(Header(1, "Harbour Logbook"))
    body.append(Paragraph("Entries of the harbour master, kept since the new pier opened."))
    body.append(Header(2, "Moorings"))
    body.append(Paragraph("Every berth is inspected before the summer season."))
    body.append(List(["North pier: twelve berths", "South pier: eight berths"]))
    body.append(Header(2, "Tides"))
    table = Table("Tides", width=3, height=3)
    table.set_values([["Day", "High water", "Low water"], ["Monday", "06:10", "12:25"], ["Tuesday", "06:55", "13:05"]])
    body.append(table)
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def main() -> None:
    for name, data in (("lighthouse.epub", lighthouse_epub()), ("logbook.odt", logbook_odt())):
        (HERE / name).write_bytes(data)
        print(f"wrote {name} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
