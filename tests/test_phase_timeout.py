"""The suite's guard against a stuck test (tests/conftest.py): a phase that runs longer than
KBCORE_TEST_TIMEOUT fails with every thread's stack, and the run goes on to the next test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path


def test_a_stuck_phase_fails_with_the_stacks_and_the_run_goes_on(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), suite / "conftest.py")
    (suite / "test_stuck.py").write_text(
        textwrap.dedent(
            """
            import threading, time
            import pytest

            def test_stuck_in_call():
                time.sleep(60)

            @pytest.fixture
            def stuck_fixture():
                threading.Event().wait(60)
                yield

            def test_stuck_in_setup(stuck_fixture):
                pass

            def test_after_them():
                pass
            """
        )
    )
    env = dict(os.environ, KBCORE_TEST_TIMEOUT="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 passed" in out and "1 failed" in out and "1 error" in out, out
    assert out.count("ran longer than KBCORE_TEST_TIMEOUT=1 s") >= 2, out
    assert "most recent call first" in out and "test_stuck_in_call" in out, out  # the stacks


def test_the_guard_can_be_turned_off(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), suite / "conftest.py")
    (suite / "test_slow.py").write_text("import time\n\ndef test_slow():\n    time.sleep(1.5)\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path,
        env=dict(os.environ, KBCORE_TEST_TIMEOUT="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout + run.stderr
