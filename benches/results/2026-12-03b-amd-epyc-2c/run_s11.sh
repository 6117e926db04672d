#!/usr/bin/env bash
# What ran for this folder (session 11, the same AMD EPYC with 2 cores as ../2026-12-03-amd-epyc-2c),
# after f329a07 (int8 query + VPDPBUSD, the single-query binding path, the huge-page tail in 4 KiB
# pages). Run alone: no helper, build or test at the same time. Each step waits (at most 300 s)
# for the 1-minute load to fall below 0.5 and logs the load before and after.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
S8=$HERE/../2026-12-02d-intel-xeon-2c/run_s8.sh
export PY=${PY:-/work/main/.venv/bin/python}
# 1. SciFact and synthetic 100k: kbcore's quantized modes against hnswlib and the best anchors.
QLIBS=kbcore-sq8,kbcore-rabitq,hnswlib,faiss-sq8,zvec-int8,zvec-int8-refine OUT=$HERE bash "$S8" quant
# 2. SciFact again (the contested cell: sq8 against zvec INT8 at recall 0.95), 9 passes.
load() { python3 -c "import os, time; print(time.strftime('%H:%M:%S'), '$1 loadavg', os.getloadavg(), flush=True)"; }
load "scifact2 start"
(cd /work/main && KBCORE_DATA=/work/shared/data OPENBLAS_NUM_THREADS=1 timeout 1800 $PY -m benches.bench_quant \
  --datasets scifact --passes 9 --libs kbcore-sq8,zvec-int8,hnswlib --json $HERE/scifact2.json) > $HERE/scifact2.log 2>&1
load "scifact2 end"
# 3. (after scifact_runs.sh and scifact_ab.sh) every anchor, as for the README's main table:
#   OUT=$HERE/all bash "$S8" quant
