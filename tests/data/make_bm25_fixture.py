"""Writes bm25_rows.json (texts) and bm25_rows_v1.kbi (a flat index of them, written by the
kbcore of commit 3a838e9, which set BM25 rows one at a time). The test
tests/test_bm25.py::test_batch_ingest_writes_the_committed_bm25_fixture_byte_for_byte rebuilds
the index with the current code and compares the bytes: term numbering, postings and lengths must
not change with the ingest implementation. Never regenerate the .kbi with a newer kbcore.

    python tests/data/make_bm25_fixture.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

import kbcore

HERE = Path(__file__).parent
WORDS = [
    "alpha",
    "Beta",
    "gamma",
    "delta",
    "e1234",
    "42",
    "x",
    "café",
    "ÉCOLE",
    "naïve",
    "σοφία",
    "Кремль",
    "東京都の天気",
    "大阪",
    "テスト",
    "한국어",
    "Ａｂｃ",
    "ß",
    "İstanbul",
    "don't",
    "co-op",
]


def rows() -> list[str | None]:
    rnd = random.Random(20261130)
    out: list[str | None] = []
    for i in range(80):
        if i % 13 == 6:
            out.append(None)
        elif i % 17 == 3:
            out.append(" ... ")
        else:
            out.append(" ".join(rnd.choices(WORDS, k=rnd.randint(1, 25))))
    return out


def build(texts: list[str | None], threads: int = 1) -> kbcore.Index:
    index = kbcore.Index(dim=4, metric="cosine", kind="flat")
    vecs = np.random.default_rng(5).standard_normal((len(texts), 4)).astype(np.float32)
    index.add(vecs, np.arange(len(texts)) * 2 + 1, texts=texts, threads=threads)
    return index


def main() -> None:
    texts = rows()
    (HERE / "bm25_rows.json").write_text(json.dumps(texts, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    build(texts).save(HERE / "bm25_rows_v1.kbi")


if __name__ == "__main__":
    main()
