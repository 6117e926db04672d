#!/usr/bin/env bash
# Quiet-machine benchmarks for session 8 (RaBitQ next to SQ8). Run alone (no helper, build or
# test). Usage: run_s8.sh quant | quant1m | filter | drift
set -u
export KBCORE_DATA=/work/shared/data OPENBLAS_NUM_THREADS=1
OUT=${OUT:-/work/bench/s8}
mkdir -p $OUT
PY=${PY:-/work/venv/bin/python}
load() { python3 -c "import os, time; print(time.strftime('%H:%M:%S'), '$1 loadavg', os.getloadavg(), flush=True)"; }
quiet() {  # wait (at most 300 s) for the 1-minute load to fall below 0.5
  for i in $(seq 1 60); do
    python3 -c "import os, sys; sys.exit(0 if os.getloadavg()[0] < 0.5 else 1)" && break
    sleep 5
  done
  load "$1"
}
for step in "$@"; do
  case $step in
  quant)
    quiet "quant start"
    (cd /work/main && timeout 4500 $PY -m benches.bench_quant --datasets scifact,synthetic --n 100000 --passes 5 \
      ${QLIBS:+--libs $QLIBS} \
      --json $OUT/quant.json) > $OUT/quant.log 2>&1
    load "quant end";;
  quant1m)
    quiet "quant 1M start"
    (cd /work/main && timeout 4500 $PY -m benches.bench_quant --datasets synthetic --n 1000000 --passes 5 \
      --efs 10,16,24,32,48,64,96,128,192,256,384,512 --libs ${QLIBS:-kbcore-sq8,kbcore-rabitq,kbcore-rabitq2,hnswlib} \
      --json $OUT/quant1m.json) > $OUT/quant1m.log 2>&1
    load "quant 1M end";;
  filter)
    quiet "filter start"
    (cd /work/main && timeout 3000 $PY -m benches.bench_filter --libs ${FLIBS:-kbcore-sq8,kbcore-rabitq,hnswlib,faiss,numpy} \
      --json $OUT/filter.json) > $OUT/filter.log 2>&1
    load "filter end";;
  drift)
    (cd /work/main && timeout 3000 $PY -m benches.bench_quant_drift --n 50000 --json $OUT/drift.json) > $OUT/drift.log 2>&1;;
  esac
done
