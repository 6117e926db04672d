"""Writes the committed format-6 fixture in this folder: make_v5_fixture.py's index (an SQ8 index
with vectors="memory" over 24-dimensional cosine data, trained codes, removed rows, reused slots, a
text per row) under version 6 (version 5's layout, the payload under a block checksum), written
until version 7 aligned the codes to a 64-byte file offset. This file was made once with that
kbcore (commit 94c91e9) and is never regenerated (tests/test_index_mapped_codes.py loads it forever).

    python tests/data/make_v6_fixture.py      (with a kbcore that writes format 6)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).parent
FILE_NAME = "sq8_v6_hnsw_cosine.kbi"
FORMAT_VERSION = 6

_spec = importlib.util.spec_from_file_location("make_v5_fixture", HERE / "make_v5_fixture.py")
assert _spec is not None and _spec.loader is not None
_v5 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_v5)
SEED, N, DIM, REMOVED = _v5.SEED, _v5.N, _v5.DIM, _v5.REMOVED
fixture_rows = _v5.fixture_rows
text_of = _v5.text_of


def main() -> None:
    _v5.build().save(HERE / FILE_NAME)


if __name__ == "__main__":
    main()
