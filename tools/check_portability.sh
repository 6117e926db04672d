#!/usr/bin/env bash
# Cross-compiles kbcore's native core and its C++ tests for the platforms this machine cannot
# run natively, with whichever cross compilers are installed, and says plainly which targets it
# skipped. With --run, it also runs the C++ tests of each target under its emulator
# (qemu-aarch64 for aarch64, wine for Windows) when the emulator is installed.
#
#   tools/check_portability.sh [--run] [--strict] [--build-dir DIR]
#
# Targets:
#   aarch64        aarch64-linux-gnu-g++ (Debian/Ubuntu: g++-aarch64-linux-gnu; run: qemu-user)
#   windows-mingw  x86_64-w64-mingw32-g++-posix (g++-mingw-w64-x86-64; run: wine64). The
#                  closest proxy for Windows available on Linux: MSVC itself is not checked.
#   clang-x86_64   clang++ on this machine (the front end Apple clang is built on; the x86 SIMD
#                  kernels under clang). Not macOS: no macOS SDK here.
#   clang-aarch64  clang++ --target=aarch64-linux-gnu, with the aarch64 cross headers.
# --strict: exit non-zero when a target is skipped (CI installs every compiler).
# Exit status: non-zero if any attempted target fails to build or (with --run) to pass.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN=0
STRICT=0
OUT="$ROOT/build/portability"
while [ $# -gt 0 ]; do
  case "$1" in
    --run) RUN=1 ;;
    --strict) STRICT=1 ;;
    --build-dir) OUT="$2"; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
  shift
done
JOBS="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
declare -a SUMMARY=()
FAILED=0
SKIPPED=0

note() { SUMMARY+=("$1"); echo "== $1"; }

# build NAME RUNNER CMAKE_ARGS...: configure and build the core and the C++ tests in
# $OUT/NAME; with --run and a runner, run ctest through it.
build() {
  local name="$1" runner="$2"
  shift 2
  local dir="$OUT/$name"
  echo "-- $name: configuring in $dir"
  if ! cmake -S "$ROOT" -B "$dir" -DKBCORE_BUILD_PYTHON=OFF -DKBCORE_BUILD_TESTS=ON \
      -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.log" 2>&1; then
    tail -30 "$dir.log"
    note "$name: FAILED to configure (log: $dir.log)"
    FAILED=1
    return
  fi
  if ! cmake --build "$dir" -j "$JOBS" >>"$dir.log" 2>&1; then
    grep -E "error|Error" "$dir.log" | head -40
    note "$name: FAILED to build (log: $dir.log)"
    FAILED=1
    return
  fi
  if grep -q "warning:" "$dir.log"; then
    grep "warning:" "$dir.log" | sort -u | head -20
    note "$name: built, WITH WARNINGS (log: $dir.log)"
  else
    note "$name: built without warnings"
  fi
  if [ "$RUN" = 1 ]; then
    if [ -z "$runner" ]; then
      note "$name: tests NOT run (no emulator installed)"
      SKIPPED=1
    elif (cd "$dir" && ctest --output-on-failure --timeout 1800 >>"$dir.log" 2>&1); then
      note "$name: C++ tests passed under $runner"
    else
      grep -E "FAIL|Failed|tests passed" "$dir.log" | tail -20
      note "$name: C++ tests FAILED under $runner (log: $dir.log)"
      FAILED=1
    fi
  fi
}

skip() {
  note "$1: SKIPPED ($2)"
  SKIPPED=1
}

mkdir -p "$OUT"

# Linux aarch64 (the manylinux / musllinux aarch64 wheels; the portable scalar kernels).
if command -v aarch64-linux-gnu-g++ >/dev/null; then
  runner=""
  emu=()
  if command -v qemu-aarch64 >/dev/null && [ -d /usr/aarch64-linux-gnu ]; then
    runner="qemu-aarch64"
    emu=(-DCMAKE_CROSSCOMPILING_EMULATOR="qemu-aarch64;-L;/usr/aarch64-linux-gnu")
  fi
  build aarch64 "$runner" -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ "${emu[@]}"
else
  skip aarch64 "no aarch64-linux-gnu-g++; apt-get install g++-aarch64-linux-gnu"
fi

# Windows x86-64 through MinGW-w64 (the posix thread model: std::thread needs it in GCC 12).
# Linked statically, so that wine needs no MinGW runtime DLLs.
MINGW=""
for c in x86_64-w64-mingw32-g++-posix x86_64-w64-mingw32-g++; do
  if command -v "$c" >/dev/null; then MINGW="$c"; break; fi
done
if [ -n "$MINGW" ]; then
  WINE=""
  for w in wine64 /usr/lib/wine/wine64 wine; do
    if command -v "$w" >/dev/null; then WINE="$(command -v "$w")"; break; fi
  done
  runner=""
  emu=()
  if [ -n "$WINE" ]; then
    runner="wine"
    emu=(-DCMAKE_CROSSCOMPILING_EMULATOR="$WINE")
    export WINEDEBUG="${WINEDEBUG:--all}"
  fi
  build windows-mingw "$runner" -DCMAKE_SYSTEM_NAME=Windows -DCMAKE_SYSTEM_PROCESSOR=AMD64 \
    -DCMAKE_CXX_COMPILER="$MINGW" -DCMAKE_EXE_LINKER_FLAGS="-static" "${emu[@]}"
else
  skip windows-mingw "no x86_64-w64-mingw32-g++; apt-get install g++-mingw-w64-x86-64 (MSVC is never checked here)"
fi

# clang on x86-64 (Apple clang's front end; the AVX2 / AVX-512 kernels under clang).
if command -v clang++ >/dev/null; then
  build clang-x86_64 "native" -DCMAKE_CXX_COMPILER=clang++
  if command -v aarch64-linux-gnu-g++ >/dev/null; then
    runner=""
    emu=()
    if command -v qemu-aarch64 >/dev/null; then
      runner="qemu-aarch64"
      emu=(-DCMAKE_CROSSCOMPILING_EMULATOR="qemu-aarch64;-L;/usr/aarch64-linux-gnu")
    fi
    build clang-aarch64 "$runner" -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
      -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_COMPILER_TARGET=aarch64-linux-gnu "${emu[@]}"
  else
    skip clang-aarch64 "needs the aarch64 cross headers and libraries (g++-aarch64-linux-gnu)"
  fi
else
  skip clang-x86_64 "no clang++; apt-get install clang"
  skip clang-aarch64 "no clang++; apt-get install clang"
fi

echo
echo "Portability summary (macOS and MSVC are not checked by this script: no SDK or compiler here):"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
if [ "$FAILED" != 0 ]; then exit 1; fi
if [ "$STRICT" = 1 ] && [ "$SKIPPED" != 0 ]; then
  echo "--strict: a target or its tests were skipped" >&2
  exit 1
fi
exit 0
