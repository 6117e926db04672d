#!/usr/bin/env bash
# Quiet-machine benchmarks for the session-6 closing note. Run alone (no helper, build or test).
# Usage: run_s6.sh step...   steps: dist dist1m quant filter
set -u
export KBCORE_DATA=/work/shared/data
OUT=/work/bench/s6
mkdir -p $OUT
PY=/work/main-venv/bin/python
load() { python3 -c "import os, time; print(time.strftime('%H:%M:%S'), '$1 loadavg', os.getloadavg(), flush=True)"; }
quiet() {  # wait (at most 240 s) for the 1-minute load to fall below 0.5
  for i in $(seq 1 48); do
    python3 -c "import os, sys; sys.exit(0 if os.getloadavg()[0] < 0.5 else 1)" && break
    sleep 5
  done
  load "$1"
}
for step in "$@"; do
  case $step in
  dist)
    quiet "distributed scifact start"
    (cd /work/main && timeout 900 $PY -m benches.bench_distributed --shards 0,1,2,4 --transports ${TRANSPORTS:-actor,compiled,socket} --json $OUT/dist.json) > $OUT/dist.log 2>&1
    load "distributed scifact end";;
  dist1m)
    quiet "distributed 1M start"
    (cd /work/main && timeout 1800 $PY -m benches.bench_distributed --no-scifact --n 1000000 --shards 0,1,2,4 --transports ${TRANSPORTS1M:-actor,socket} --json $OUT/dist1m.json) > $OUT/dist1m.log 2>&1
    load "distributed 1M end";;
  quant)
    quiet "quant start"
    (cd /work/main && timeout 1800 $PY -m benches.bench_quant --datasets scifact,synthetic --n 100000 --passes 5 --libs ${QLIBS:?set QLIBS} --json $OUT/quant.json) > $OUT/quant.log 2>&1
    load "quant end";;
  filter)
    quiet "filter start"
    (cd /work/main && timeout 1800 $PY -m benches.bench_filter --libs kbcore,kbcore-sq8,hnswlib,faiss,numpy --json $OUT/filter.json) > $OUT/filter.log 2>&1
    load "filter end";;
  esac
done
