"""benches/bench_reorder_online.py runs end to end on a small index and reports its figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from benches import bench_reorder_online


def test_bench_reorder_online_reports_the_reorder_and_the_searches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["--n", "3000", "--before", "0.2", "--save", str(tmp_path)]
    assert bench_reorder_online.main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"reorder \(gorder\) of 3,000 rows: \d+\.\d\d s", out), out
    before = re.search(r"searches before: ([\d,]+), p50 \d+\.\d+ ms", out)
    assert before and int(before.group(1).replace(",", "")) > 0, out
    assert "searches during:" in out
    assert (tmp_path / "reorder-online-3000.kbi").exists()
    # a second run reuses the saved index
    assert bench_reorder_online.main([*args, "--method", "bfs"]) == 0
    out = capsys.readouterr().out
    assert "index of 3,000 rows ready" in out and "reorder (bfs) of 3,000 rows" in out
