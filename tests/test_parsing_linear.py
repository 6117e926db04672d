"""Every parser and the chunker take time linear in their input (issue 30, item 4).

Each case is an adversarial 1 MB input built against one pattern of kbcore.parsing /
kbcore.chunking: unclosed constructs repeated from many start positions, long runs of spaces,
long lines that a lazy group rescans. The bound, :data:`BOUND` seconds per 1 MB input, is
generous for a loaded CI machine (each case takes 0.01-0.5 s here with 8 jobs on 2 cores), and
far below the patterns they replace: the Markdown heading regex took 71 s for 4 KB (cubic), the
whitespace, comment, image, link, reference-definition and emphasis regexes 2.6-9.4 s for
32 KB (quadratic), so hours at 1 MB.

A second test compares the linear Markdown scans with the regexes they replace (kept here as
the reference) on generated short texts, where the regexes are fast: same output.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kbcore import parsing
from kbcore.chunking import chunk_text
from kbcore.parsing import parse

#: Seconds one 1 MB input may take, twice that for HTML (KBCORE_PARSE_BOUND overrides, e.g.
#: under ASan).
BOUND = float(os.environ.get("KBCORE_PARSE_BOUND", "5.0"))
MB = 1_000_000


def _rep(unit: bytes, prefix: bytes = b"", suffix: bytes = b"") -> bytes:
    return prefix + unit * ((MB - len(prefix) - len(suffix)) // len(unit)) + suffix


CASES = {
    # markdown
    "heading with a long space run": ("a.md", _rep(b" ", b"# a", b"x")),
    "heading of hashes and spaces": ("a.md", _rep(b" #", b"#")),
    "unclosed comments": ("a.md", _rep(b"<!--")),
    "unclosed images": ("a.md", _rep(b"![")),
    "unclosed links": ("a.md", _rep(b"[")),
    "links without targets": ("a.md", _rep(b"[a]")),
    "unclosed link targets": ("a.md", _rep(b"[a](")),
    "reference labels without end": ("a.md", _rep(b"[a\n")),
    "reference labels sharing an empty target": ("a.md", _rep(b"[\n", b"", b"]:" + b" " * 1000 + b"\n")),
    "unclosed emphasis": ("a.md", _rep(b"*a ")),
    "emphasis closed on the next line": ("a.md", _rep(b"*a _b ~~c ", b"", b"\nb* b_ c~~")),
    "bold and italic mixed": ("a.md", _rep(b"**a *")),
    "unclosed code": ("a.md", _rep(b"`a")),
    "fences": ("a.md", _rep(b" " * 50 + b"``\n")),
    # html (the standard library's html.parser, before CPython's CVE-2025-6069 fix, rescans
    # unclosed constructs from each "<"; kbcore turns constructs that can never close into text)
    "html unclosed tags": ("a.html", _rep(b"<a ")),
    "html unclosed end tags": ("a.html", _rep(b"</")),
    "html unclosed declarations": ("a.html", _rep(b"<!")),
    "html unclosed processing instructions": ("a.html", _rep(b"<?")),
    "html lone angle brackets": ("a.html", _rep(b"<")),
    "html unclosed comments": ("a.html", _rep(b"<!--")),
    "html unclosed comments among tags": ("a.html", _rep(b"<!--a>")),
    "html brackets then one close": ("a.html", _rep(b"< ", b"", b">")),
    "html many tags": ("a.html", _rep(b"<p>a</p>")),
    # every format's whitespace normalisation
    "text with a long space run": ("a.txt", _rep(b" ", b"a", b"a")),
    "text with mixed blank lines": ("a.txt", _rep(b" \t\n\n\n")),
    "markdown with a long space run": ("a.md", _rep(b" ", b"a", b"a")),
    "json lines": ("a.jsonl", _rep(b'"a  "\n')),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parsing_a_1mb_adversarial_input_takes_linear_time(case):
    filename, data = CASES[case]
    t0 = time.perf_counter()
    try:
        parse(data, filename=filename)
    except ValueError:  # some inputs hold no text: an error is fine, a long wait is not
        pass
    took = time.perf_counter() - t0
    bound = 2 * BOUND if filename.endswith(".html") else BOUND  # html.parser: ~1 us per construct
    assert took < bound, f"{case}: {took:.2f} s for {len(data):,} bytes"


CHUNK_CASES = {
    "spaces": " a" + " " * (MB - 3) + "b",
    "blank lines with spaces": "a\n" + " \n" * (MB // 2),
    "sentence marks with closing quotes": ".)" * (MB // 2),
    "sentences": "Ab. " * (MB // 4),
    "one long word": "x" * MB,
}


def test_html_parsing_past_its_time_limit_is_a_clear_error():
    # the backstop for whatever html.parser may still rescan: its time is bounded as well
    data = _rep(b"<p>a</p>")
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"'slow.html': the HTML exceeds its parse budget.*time_limit=0.01 s"):
        parse(data, filename="slow.html", time_limit=0.01)
    assert time.perf_counter() - t0 < BOUND


@pytest.mark.parametrize("case", sorted(CHUNK_CASES))
def test_chunking_a_1mb_adversarial_text_takes_linear_time(case):
    t0 = time.perf_counter()
    chunk_text(CHUNK_CASES[case], chunk_size=500, chunk_overlap=50)
    took = time.perf_counter() - t0
    assert took < BOUND, f"{case}: {took:.2f} s"


# -- the linear scans agree with the regexes they replace -----------------------------------

_REF = {
    "comment": re.compile(r"<!--.*?-->", re.DOTALL),
    "image": re.compile(r"!\[([^\]]*)\]\([^)]*\)"),
    "link": re.compile(r"\[([^\]]+)\]\([^)]*\)"),
    "ref_def": re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]+\S+.*$", re.MULTILINE),
    "heading": re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$", re.MULTILINE),
    "emphasis": re.compile(r"(\*\*|__|\*|_|~~)(?=\S)(.+?)(?<=\S)\1"),
}


def reference_markdown(text: str) -> str:
    """kbcore's Markdown cleaning as the (super-linear) regexes did it."""
    text = parsing._FRONT_MATTER.sub("", text)
    text = _REF["comment"].sub("", text)
    text = _REF["image"].sub(r"\1", text)
    text = _REF["link"].sub(r"\1", text)
    text = _REF["ref_def"].sub("", text)
    text = _REF["heading"].sub(r"\1", text)
    text = parsing._MD_FENCE.sub("", text)
    text = _REF["emphasis"].sub(r"\2", text)
    text = parsing._MD_CODE.sub(r"\1", text)
    return reference_normalise(text)


def reference_normalise(text: str) -> str:
    text = re.sub(r"[^\S\n]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


_PIECES = list("*_~#[]()!<>-: \t\nab`") + ["<!--", "-->", "**", "~~", "](", "]: ", "# ", "\n#", "\n[", "\u3000", "\x0b"]


@seed(20261205)
@settings(
    max_examples=1500, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_linear_markdown_cleaning_matches_the_reference_regexes(text):
    assert parsing._markdown(text) == reference_markdown(text)
    assert parsing._normalise(text) == reference_normalise(text.replace("\r\n", "\n").replace("\r", "\n"))
