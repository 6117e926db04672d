"""The suite's own configuration, run on a small throw-away suite with this repository's
pyproject.toml and tests/conftest.py: pytest-timeout ends a stuck test with every thread's
stack and the run goes on; a bare run selects the fast tier only, ``-m ""`` every tier."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
PYPROJECT = TESTS.parent / "pyproject.toml"


def _suite(tmp_path: Path, files: dict[str, str]) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(TESTS / "conftest.py", suite / "conftest.py")
    for name, text in files.items():
        (suite / name).write_text(textwrap.dedent(text))
    return suite


def _pytest(suite: Path, *args: str, **env: str) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(PYPROJECT), "--rootdir", str(suite)]
        + [*args, str(suite)],
        cwd=suite,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run.returncode, run.stdout + run.stderr


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="pytest-timeout's signal method needs SIGALRM (POSIX)")
def test_a_stuck_test_fails_with_the_stacks_and_the_run_goes_on(tmp_path):
    suite = _suite(
        tmp_path,
        {
            "test_stuck.py": """
            import threading, time
            import pytest

            def test_stuck_in_call():
                release = threading.Event()
                worker = threading.Thread(target=release.wait, name="stuck-worker", daemon=True)
                worker.start()
                try:
                    time.sleep(60)
                finally:
                    release.set()

            @pytest.fixture
            def stuck_fixture():
                threading.Event().wait(60)
                yield

            def test_stuck_in_setup(stuck_fixture):
                pass

            def test_after_them():
                pass
            """
        },
    )
    code, out = _pytest(suite, "-q", PYTEST_TIMEOUT="1")
    assert code == 1, out
    assert "1 passed" in out and "1 failed" in out and "1 error" in out, out
    assert out.count("Timeout (>1.0s)") + out.count("Timeout >1.0s") >= 2, out
    # the main thread's stack in the failure, every other thread's in the timeout report
    assert "time.sleep(60)" in out and "Stack of stuck-worker" in out, out


def test_the_timeout_can_be_turned_off(tmp_path):
    suite = _suite(tmp_path, {"test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(1.5)\n"})
    code, out = _pytest(suite, "-q", "--timeout=1", PYTEST_TIMEOUT="0")
    assert code == 1 and "1 failed" in out, out  # the command line wins over the environment
    code, out = _pytest(suite, "-q", PYTEST_TIMEOUT="0")
    assert code == 0 and "1 passed" in out, out


def test_a_bare_run_is_the_fast_tier_and_an_empty_mark_expression_runs_every_tier(tmp_path):
    import conftest

    langbot_module = next(m for m, tier in conftest.MODULE_TIERS.items() if tier == "langbot")
    slow_module, slow_test = sorted(conftest.SLOW_TESTS)[0].split("::")
    first_module, first_test = sorted(conftest.FIRST_CASE_FAST)[0].split("::")
    param_module, slow_ids = sorted(conftest.SLOW_PARAMS.items())[0]
    assert len({langbot_module, slow_module, first_module, param_module}) == 4
    suite = _suite(
        tmp_path,
        {
            "test_plain.py": "def test_fast():\n    pass\n",
            f"{langbot_module}.py": "def test_in_the_langbot_tier():\n    pass\n",
            f"{slow_module}.py": f"def {slow_test}():\n    pass\n",
            f"{first_module}.py": f"""
            import pytest

            @pytest.mark.parametrize("case", ["one", "two", "three"])
            def {first_test}(case):
                pass
            """,
            f"{param_module}.py": f"""
            import pytest

            @pytest.mark.parametrize("kind", ["kept", {sorted(slow_ids)[0]!r}])
            def test_by_parameter(kind):
                pass
            """,
            "test_ray_fixture.py": """
            import pytest

            @pytest.fixture
            def ray_local():
                yield None

            def test_uses_ray(ray_local):
                pass

            @pytest.mark.slow
            def test_marked_slow():
                pass

            @pytest.mark.integration
            def test_marked_integration():
                pass
            """,
        },
    )
    code, out = _pytest(suite, "-q", "-rA")
    assert code == 0 and "3 passed, 8 deselected" in out, out
    passed = {line.split()[1] for line in out.splitlines() if line.startswith("PASSED ")}
    assert passed == {
        "test_plain.py::test_fast",
        f"{first_module}.py::{first_test}[one]",
        f"{param_module}.py::test_by_parameter[kept]",
    }, out
    code, out = _pytest(suite, "-q", "-m", "")
    assert code == 0 and "11 passed" in out and "deselected" not in out, out
    code, out = _pytest(suite, "-q", "-rA", "-m", "ray or langbot")
    assert code == 0 and "2 passed, 9 deselected" in out, out
    assert "test_uses_ray" in out and "test_in_the_langbot_tier" in out, out
    code, out = _pytest(suite, "-q", "-m", "slow")
    assert code == 0 and "5 passed, 6 deselected" in out, out  # 2 later cases, 1 parameter, 1 test, 1 mark
