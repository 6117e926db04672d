#!/usr/bin/env bash
# Static checks, as CI runs them. Needs the lint extra and a built kbcore (for stubtest):
#   pip install ".[test,lint]"   (or: pip install -e ".[test,lint]")
# The import-rule test (tests/test_import_rules.py) runs with pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY_DIRS=(src tests benches tools integrations)

echo "== ruff check"
ruff check "${PY_DIRS[@]}"

echo "== ruff format --check"
ruff format --check "${PY_DIRS[@]}"

echo "== mypy (src/kbcore; the native module through src/kbcore/_core.pyi)"
(cd src && mypy -p kbcore)

echo "== stubtest (src/kbcore/_core.pyi against the built extension)"
# Run outside src/ so that the installed package (with the compiled _core) is the one imported.
(cd tools && python -m mypy.stubtest kbcore._core --allowlist stubtest-allowlist.txt)
# stubtest cannot see pybind11 parameter lists; this compares them with the docstring signatures.
python tools/check_core_stub.py

if [ -f .clang-format ]; then
  echo "== clang-format --dry-run -Werror (cpp/, python/)"
  # The lint extra's pinned clang-format (on PATH in the venv), else the system's.
  CLANG_FORMAT="${CLANG_FORMAT:-$(command -v clang-format || command -v clang-format-14 || true)}"
  [ -n "$CLANG_FORMAT" ] || { echo "clang-format not found (apt-get install clang-format)" >&2; exit 1; }
  find cpp python \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' \) -print0 \
    | xargs -0 -r "$CLANG_FORMAT" --dry-run -Werror
else
  echo "== clang-format: no .clang-format in the tree, skipped"
fi
echo "lint: all checks passed"
