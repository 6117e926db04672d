"""A PDF has a parse budget (issue 30, item 6): decoded page content and time per document.

The crafted PDFs are built here with pypdf: one Flate-compressed content stream of seeded
random words, shared by every page, so a few KB of file make the text extractor read the
stream once per page (1 MB per page here: about 1-3.5 s each, so 200 pages take minutes on
the old code, which had no budget at all).
"""

from __future__ import annotations

import io
import random
import time

import pytest

pypdf = pytest.importorskip("pypdf", reason="pypdf (kbcore[pdf]) is not installed")

from pypdf.generic import ArrayObject, DecodedStreamObject, DictionaryObject, NameObject  # noqa: E402

from kbcore.errors import InvalidArgumentError  # noqa: E402
from kbcore.parsing import DEFAULT_PDF_MAX_CONTENT_BYTES, parse  # noqa: E402


def shared_stream_pdf(pages: int, content_bytes: int, *, refs: int = 1, seed: int = 7) -> bytes:
    """``pages`` pages whose /Contents all point at one stream of ``content_bytes`` bytes of
    text operators (``refs`` times each)."""
    rng = random.Random(seed)
    words = ["keys", "rotate", "every", "quarter", "signing", "audit", "vault", "token"]
    ops = []
    size = 0
    while size < content_bytes:
        op = f"BT /F1 9 Tf 10 {rng.randrange(10, 190)} Td ({rng.choice(words)} {rng.choice(words)}) Tj ET\n"
        ops.append(op)
        size += len(op)
    stream = DecodedStreamObject()
    stream.set_data("".join(ops).encode("ascii"))
    writer = pypdf.PdfWriter()
    ref = writer._add_object(stream.flate_encode())
    font = writer._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    resources = DictionaryObject({NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
    for _ in range(pages):
        page = writer.add_blank_page(200, 200)
        page[NameObject("/Resources")] = resources
        page[NameObject("/Contents")] = ArrayObject([ref] * refs) if refs > 1 else ref
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_pages_sharing_one_large_stream_exceed_the_default_content_budget_at_once():
    data = shared_stream_pdf(pages=200, content_bytes=1 << 20)  # 200 MiB of content to read
    assert len(data) < 200_000
    t0 = time.monotonic()
    with pytest.raises(InvalidArgumentError, match="parse budget") as info:
        parse(data, filename="crafted.pdf")
    assert time.monotonic() - t0 < 10.0  # refused before any text is extracted
    message = str(info.value)
    assert "'crafted.pdf'" in message and f"pdf_max_content_bytes={DEFAULT_PDF_MAX_CONTENT_BYTES:,}" in message


def test_one_page_repeating_a_stream_in_its_contents_array_counts_every_reference():
    data = shared_stream_pdf(pages=1, content_bytes=1 << 20, refs=400)
    with pytest.raises(InvalidArgumentError, match="pages 1-1 decodes to 419,4"):
        parse(data, filename="one-page.pdf")


def test_the_time_limit_stops_a_slow_extraction_mid_document():
    data = shared_stream_pdf(pages=30, content_bytes=1 << 20)
    t0 = time.monotonic()
    with pytest.raises(InvalidArgumentError, match=r"took more than time_limit=0.5 s") as info:
        parse(data, filename="slow.pdf", time_limit=0.5)
    assert time.monotonic() - t0 < 8.0  # 0.5 s, plus at most 256 operators and the reading
    assert "'slow.pdf'" in str(info.value)


def test_a_pdf_within_its_budget_is_read_whole():
    data = shared_stream_pdf(pages=3, content_bytes=2_000)
    doc = parse(data, filename="fine.pdf", pdf_max_content_bytes=7_000)
    assert doc.format == "pdf" and doc.text.count("Tj") == 0 and len(doc.text) > 100
    with pytest.raises(InvalidArgumentError, match="pages 1-3 decodes to"):
        parse(data, filename="fine.pdf", pdf_max_content_bytes=5_000)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pdf_max_content_bytes": 0},
        {"pdf_max_content_bytes": 1.5},
        {"time_limit": 0},
        {"time_limit": float("nan")},
    ],
)
def test_bad_budgets_are_refused(kwargs):
    with pytest.raises(InvalidArgumentError, match=next(iter(kwargs))):
        parse(b"hello", filename="a.txt", **kwargs)
