"""Writes the committed office fixtures of tests/test_formats.py (run from anywhere):

    python tests/data/office/make_fixtures.py

- ``handbook.docx``: a Word file with a title, nested headings, a bulleted list and a table;
- ``inventory.xlsx``: a workbook of two sheets (``Fruit`` and ``Tools``);
- ``briefing.pptx``: a deck of three slides with speaker notes and a table;
- ``bundle.zip``: nested folders holding a Markdown file, a CSV, the Word file and an image
  (skipped: unsupported type).

The contents are fixed (no randomness); the libraries write their own timestamps, so the bytes
differ between runs but the text does not. Needs ``pip install 'kbcore[office]'``.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def handbook_docx() -> bytes:
    """A Word file with headings, a list and a table."""
    import docx

    d = docx.Document()
    d.add_heading("Field Handbook", level=0)
    d.add_heading("Safety", level=1)
    d.add_paragraph("Wear a helmet on every site visit. Report incidents within one hour.")
    d.add_paragraph("Gloves", style="List Bullet")
    d.add_paragraph("Goggles", style="List Bullet")
    d.add_heading("Equipment ratings", level=2)
    d.add_paragraph("The table lists the rated load of each lifting device.")
    table = d.add_table(rows=4, cols=3)
    for r, row in enumerate(
        [
            ("Device", "Rated load", "Inspection"),
            ("Chain hoist", "2 tonnes", "monthly"),
            ("Scissor lift", "450 kg", "weekly"),
            ("Pallet jack", "2.5 tonnes", "quarterly"),
        ]
    ):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    d.add_heading("Contacts", level=1)
    d.add_paragraph("The site manager answers the phone from 7 am to 5 pm.")
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def inventory_xlsx() -> bytes:
    """A workbook with two sheets of records."""
    import openpyxl

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Fruit"
    ws.append(["Name", "Colour", "Price per kg"])
    for row in [("Apple", "red", 2.5), ("Banana", "yellow", 1.25), ("Kiwi", "brown", 4)]:
        ws.append(row)
    tools = wb.create_sheet("Tools")
    tools.append(["Tool", "Owner"])
    tools.append(["Torque wrench", "Workshop B"])
    tools.append(["Laser level", "Survey team"])
    out = io.BytesIO()
    wb.save(out)
    return out.getvalue()


def briefing_pptx() -> bytes:
    """A deck of three slides with notes; the third holds a table."""
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    layout = deck.slide_layouts[1]
    for title, body, note in [
        ("Quarterly goals", "Ship the river survey\nHire two inspectors", "Stress the survey deadline of 30 June."),
        ("Risks", "Flooding of the east bank", "The insurer needs the flood plan by May."),
    ]:
        slide = deck.slides.add_slide(layout)
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
        slide.notes_slide.notes_text_frame.text = note
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Budget"
    shape = slide.shapes.add_table(3, 2, Inches(1), Inches(2), Inches(6), Inches(1.5))
    for r, row in enumerate([("Item", "Cost"), ("Boats", "12,000 EUR"), ("Sensors", "3,400 EUR")]):
        for c, value in enumerate(row):
            shape.table.cell(r, c).text = value
    slide.notes_slide.notes_text_frame.text = "Sensors are the cheapest line."
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def bundle_zip(handbook: bytes) -> bytes:
    """A zip with nested folders: Markdown, CSV, the Word file and an image (skipped)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("docs/", "")
        zf.writestr("docs/guide/intro.md", "# Intro\n\nThe ferry leaves at dawn.\n\n## Tickets\n\nBuy them on board.\n")
        zf.writestr("docs/data/ports.csv", "Port,Country\nBergen,Norway\nAarhus,Denmark\n")
        zf.writestr("manuals/handbook.docx", handbook)
        zf.writestr("manuals/images/logo.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 32)
    return out.getvalue()


def main() -> None:
    handbook = handbook_docx()
    files = {
        "handbook.docx": handbook,
        "inventory.xlsx": inventory_xlsx(),
        "briefing.pptx": briefing_pptx(),
        "bundle.zip": bundle_zip(handbook),
    }
    for name, data in files.items():
        assert len(data) < 50_000, (name, len(data))
        (HERE / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
