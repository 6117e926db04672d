#!/usr/bin/env bash
# What ran for this folder (session 9): the quiet-machine steps of
# ../2026-12-02d-intel-xeon-2c/run_s8.sh (the same script, output to /work/bench/s9/f1), then the
# recall-only drift run, which needs no quiet machine.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/work/bench/s9/f1} bash "$HERE/../2026-12-02d-intel-xeon-2c/run_s8.sh" filter
(cd /work/main && OPENBLAS_NUM_THREADS=1 nice -n 19 /work/venv/bin/python -m benches.bench_quant_drift --n 50000 \
  --json /work/bench/s9/drift.json) > /work/bench/s9/drift.log 2>&1
