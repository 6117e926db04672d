"""Index.load against crafted files whose checksum is recomputed (tools/fuzz_index_load.py).

A crafted file is rejected with FormatError, or it loads into an index on which every
operation works and which saves back to the same bytes; the process never crashes. Files are
loaded in a child process so that a crash fails the test instead of killing pytest.

Bounded by default (fixed seeds, well under a minute); ``KBCORE_FUZZ_LONG=1`` runs the long
sweep and a long atheris run (see tools/fuzz_index_load.py for runs by hand).
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kbcore
from kbcore import _core, errors

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).parent / "data" / "fuzz"
LONG = os.environ.get("KBCORE_FUZZ_LONG") == "1"

sys.path.insert(0, str(ROOT / "tools"))
import fuzz_index_load as fuzz  # noqa: E402

# The defect each committed crafted file carries, and the words of its FormatError.
EXPECTED_REJECTION = {
    "bm25_k1_inf": "invalid BM25 parameters",
    "bm25_rows_out_of_order": "out-of-order slot",
    "bm25_term_not_utf8": "BM25 term is not valid UTF-8",
    "huge_level_count": "graph level count out of range",
    "link_to_itself": "node links to itself",
    "metadata_bool_minus_one": "invalid bool value",
    "metadata_list_str_not_utf8": "not valid UTF-8",
    "metadata_str_not_utf8": "not valid UTF-8",
    "repeated_link": "repeated link in one list",
    "reserved_id_minus_one": "reserved id -1",
    "sq8_code_padding_nonzero": "nonzero padding byte",
    "sq8_fewer_codes_than_rows": "code count does not match the rows",
    "sq8_scale_negative": "negative, NaN or infinite",
    "sq8_unknown_quantization": "invalid quantization code 2",
    "unknown_code_type": "unknown code type 'xq8'",
    "upper_link_to_node_without_that_level": "link to a node without that level",
    "vector_inf": "NaN or infinity",
    "vector_nan": "NaN or infinity",
}
#: Defects of the BM25 leg's terms and term lists, which Index.load leaves to the leg's first
#: use (cpp/bm25_index.h load_deferred): FormatError there, before any text answer.
AT_FIRST_USE = {"bm25_term_not_utf8"}


def test_python_checksum_matches_the_native_checksum():
    rng = random.Random(5)
    for n in [0, 1, 7, 8, 9, 15, 16, 17, 100, 1000]:
        data = bytes(rng.randrange(256) for _ in range(n))
        assert fuzz.checksum64(data) == _core.checksum64(data), n


def test_resealing_an_unchanged_file_gives_the_same_bytes():
    for path in sorted(CORPUS.glob("seed_*.kbi")) + sorted((CORPUS.parent).glob("index_v1_*.kbi")):
        blob = path.read_bytes()
        assert fuzz.reseal(blob) == blob, path.name


def test_field_parser_covers_every_byte_of_the_committed_files():
    for path in sorted(CORPUS.glob("seed_*.kbi")) + sorted((CORPUS.parent).glob("*_v[125]*.kbi")):
        assert len(fuzz.parse_fields(path.read_bytes())) > 50, path.name


def test_every_committed_crafted_file_is_rejected_with_format_error_naming_its_defect():
    files = sorted(CORPUS.glob("reject_*.kbi"))
    assert {p.stem.removeprefix("reject_") for p in files} == set(EXPECTED_REJECTION)
    results = fuzz.run_files(files, timeout=120)
    assert {p.name: results[p]["result"] for p in files} == {p.name: "rejected" for p in files}
    for path in files:
        defect = path.stem.removeprefix("reject_")
        with pytest.raises(errors.FormatError, match=EXPECTED_REJECTION[defect]):
            if defect not in AT_FIRST_USE:
                kbcore.Index.load(path)
            else:  # loads and answers vector searches; the text leg's first use refuses
                index = kbcore.Index.load(path)
                assert len(index.search(np.ones(index.dim, np.float32), k=3)[0]) == 3
                index.search_text("word1", k=3)


def test_committed_seed_files_load_work_and_save_back_identically():
    files = sorted(CORPUS.glob("seed_*.kbi"))
    assert len(files) == 5  # hnsw (l2; cosine with pending rows), flat, hnsw with sq8 (versions 2 and 5)
    for path in files:
        assert fuzz.check_file(path)["result"] == "accepted", path.name


def test_crafted_files_from_the_seeds_match_the_committed_ones(tmp_path):
    # The corpus is reproducible: the regression files come from the committed seed.
    seed = (CORPUS / "seed_hnsw_l2.kbi").read_bytes()
    for name, blob in fuzz.regression_files(seed).items():
        assert (CORPUS / f"reject_{name}.kbi").read_bytes() == blob, name
    seed = (CORPUS / "seed_hnsw_l2_sq8.kbi").read_bytes()
    for name, blob in fuzz.regression_files_sq8(seed).items():
        assert (CORPUS / f"reject_{name}.kbi").read_bytes() == blob, name
    seed = (CORPUS / "seed_hnsw_l2_sq8_v5.kbi").read_bytes()
    for name, blob in fuzz.regression_files_tagged(seed).items():
        assert (CORPUS / f"reject_{name}.kbi").read_bytes() == blob, name


def test_seed_files_are_reproducible(tmp_path):
    for path in fuzz.make_seed_files(tmp_path):
        assert (CORPUS / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("seed", [1, 2] if not LONG else list(range(1, 9)))
def test_structure_fuzz_never_crashes_nor_accepts_a_file_that_fails_later(tmp_path, seed):
    files = 1500 if not LONG else 20000
    seeds = sorted(CORPUS.glob("seed_*.kbi"))
    counts, findings = fuzz.sweep(seeds, files, seed, tmp_path)
    assert sum(counts.values()) == files // len(seeds) * len(seeds)
    assert counts.get("rejected", 0) > files // 2  # the mutations do reach the validators
    assert not findings, findings[:10]


def test_atheris_fuzzing_of_load_finds_nothing(tmp_path):
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (pip install atheris); the seeded sweep above still runs")
    runs = 400 if not LONG else 200000
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "fuzz_index_load.py"),
            "--atheris",
            "--",
            f"-runs={runs}",
            "-seed=7",
            f"-artifact_prefix={tmp_path}/",
        ],
        capture_output=True,
        text=True,
        timeout=3600 if LONG else 120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"Done {runs} runs" in proc.stderr
