"""The fresh-process harness of the filter benchmark (``benches/fresh_filter.py``, issue 28):
which process it keeps for kbcore and for a competitor, and the per-process ratio spread.

``benches/`` is not part of the installed package: the module is skipped, saying so, when the
checkout's ``benches/`` folder is not next to ``tests/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if not (REPO / "benches" / "fresh_filter.py").exists():
    pytest.skip(f"benches/fresh_filter.py not found under {REPO} (outside a checkout)", allow_module_level=True)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benches import fresh_filter  # noqa: E402


def _run(qps: dict[str, float], recall: float, load: float = 0.1) -> dict:
    case = {
        "fraction": 0.1,
        "libs": {"kbcore-sq8": {"recall": recall, "qps": qps["kbcore-sq8"]}},
        "interleaved": {"qps_median": qps},
    }
    return {
        "loadavg_start": [load, 0, 0],
        "loadavg_end": [load, 0, 0],
        "datasets": [{"name": "scifact", "cases": {"bucket<100": case}}],
    }


def test_kbcore_keeps_its_median_process_and_a_competitor_its_best():
    runs = [
        _run({"kbcore-sq8": 100.0, "hnswlib": 40.0, "qdrant-edge": 50.0}, 0.99),
        _run({"kbcore-sq8": 300.0, "hnswlib": 80.0, "qdrant-edge": 20.0}, 0.97),
        _run({"kbcore-sq8": 200.0, "hnswlib": 30.0, "qdrant-edge": 60.0}, 1.0),
    ]
    (row,) = fresh_filter.summarise(runs)
    assert row["kbcore_qps"] == 200.0  # median process, not the best (300)
    assert row["best_anchor"] == "hnswlib" and row["anchor_qps"] == 80.0  # best process of the best anchor
    assert row["ratio"] == pytest.approx(200.0 / 80.0)
    # per process: 100/50, 300/80, 200/60
    assert row["ratio_min"] == pytest.approx(2.0) and row["ratio_max"] == pytest.approx(300.0 / 80.0)
    assert row["recall"] == pytest.approx(0.97)  # the worst process's recall is the one shown
    assert "**2.50×**" in fresh_filter.markdown([row])


def test_even_count_takes_the_lower_middle():
    assert fresh_filter.lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0
    assert fresh_filter.lower_median([5.0]) == 5.0


def test_too_few_repeats_is_refused():
    with pytest.raises(SystemExit):
        fresh_filter.main(["--repeats", "2"])
