"""Parsing files into text: formats, detection and clear errors (kbcore.parsing)."""

from __future__ import annotations

import codecs
import importlib.util

import pytest

from kbcore.errors import InvalidArgumentError
from kbcore.parsing import detect_format, parse


def test_plain_text_is_decoded_and_normalised():
    doc = parse(b"Line one\r\nLine two   \r\n\r\n\r\n\r\nPara two\n", filename="a.txt")
    assert doc.format == "text"
    assert doc.text == "Line one\nLine two\n\nPara two"


@pytest.mark.parametrize(
    "bom,enc", [(codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")]
)
def test_byte_order_marks_select_the_encoding(bom, enc):
    assert parse(bom + "héllo wörld".encode(enc), filename="a.txt").text == "héllo wörld"


def test_markdown_keeps_words_and_drops_syntax():
    md = (
        b"---\ntitle: x\n---\n# Title #\n\nSee [the docs](http://x.y/z) and ![a cat](c.png).\n\n"
        b"Some **bold** and `code` here.\n\n```python\nprint(1)\n```\n<!-- hidden -->\n"
    )
    doc = parse(md, filename="n.md")
    assert doc.format == "markdown"
    assert doc.text == "Title\n\nSee the docs and a cat.\n\nSome bold and code here.\n\nprint(1)"


def test_html_gives_visible_text_only():
    html = b"""<!doctype html><html><head><title>Page T</title><style>p{}</style>
    <script>var secret = 1;</script></head><body><nav hidden>menu</nav>
    <h1>Head</h1><p>First &amp; <b>bold</b>
    paragraph.</p><div style="display:none">invisible</div><p>Second<br>line</p></body></html>"""
    doc = parse(html, filename="p.html")
    assert doc.format == "html" and doc.title == "Page T"
    assert doc.text == "Page T\n\nHead\n\nFirst & bold paragraph.\n\nSecond\nline"
    for hidden in ("secret", "menu", "invisible", "p{}"):
        assert hidden not in doc.text


def test_jsonl_records_become_paragraphs():
    data = b'{"title": "T1", "text": "body one"}\n\n"plain string"\n{"content": "body two"}\n'
    assert parse(data, filename="r.jsonl").text == "T1\nbody one\n\nplain string\n\nbody two"


@pytest.mark.parametrize(
    "data,match",
    [
        (b'{"text": "ok"}\n{not json}\n', "line 2 is not valid JSON"),
        (b'{"other": 1}\n', "line 1 has no string field"),
        (b"[1, 2]\n", "line 1 must be a JSON string or object"),
    ],
)
def test_bad_jsonl_names_the_line(data, match):
    with pytest.raises(InvalidArgumentError, match=match):
        parse(data, filename="r.jsonl")


def test_format_detection_from_name_and_content():
    assert detect_format("a.MD", b"") == "markdown"
    assert detect_format("a.htm", b"") == "html"
    assert detect_format(None, b"  %PDF-1.7 ...") == "pdf"
    assert detect_format(None, b"<!DOCTYPE html><html>") == "html"
    assert detect_format(None, b"hello") == "text"
    assert detect_format("notes", b"hello") == "text"


@pytest.mark.parametrize(
    "data,filename,match",
    [
        (b"", "a.txt", "is empty"),
        (b"   \n\t ", "a.txt", "is empty"),
        (b"\x80\x81garbage\xfa", "a.txt", "not valid UTF-8"),
        (b"\xff\xfe\xfa\x00garbage", "a.txt", "not a multiple of 2 bytes"),
        (b"abc\x00def", "a.txt", "NUL bytes"),
        (b"<html><script>x</script></html>", "a.html", "contains no text"),
        (b"PK\x03\x04", "a.docx", "not a valid Word document"),
        (b"\xd0\xcf\x11\xe0 legacy", "a.doc", "convert the file to .docx"),
        (b"x", "a.odp", "unsupported file type '.odp'"),
    ],
)
def test_bad_input_raises_a_clear_error(data, filename, match):
    with pytest.raises(InvalidArgumentError, match=match):
        parse(data, filename=filename)


def test_unknown_format_argument_raises():
    with pytest.raises(InvalidArgumentError, match="unknown format"):
        parse(b"x", format="rtf")


def _minimal_pdf(text: str) -> bytes:
    """A one-page PDF showing `text` in Helvetica (hand-built, valid cross-reference table)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


@pytest.mark.skipif(importlib.util.find_spec("pypdf") is None, reason="pypdf (kbcore[pdf]) not installed")
def test_pdf_text_is_extracted():
    doc = parse(_minimal_pdf("Rotate the signing keys every quarter"), filename="h.pdf")
    assert doc.format == "pdf"
    assert "Rotate the signing keys every quarter" in doc.text


@pytest.mark.skipif(importlib.util.find_spec("pypdf") is None, reason="pypdf (kbcore[pdf]) not installed")
def test_a_broken_pdf_raises_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="could not read the PDF"):
        parse(b"%PDF-1.4\nthis is not a pdf at all", filename="bad.pdf")


def test_pdf_without_pypdf_says_how_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "pypdf":
            raise ImportError("no pypdf")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=r"kbcore\[pdf\]"):
        parse(b"%PDF-1.4 whatever", filename="x.pdf")
