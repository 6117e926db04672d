#!/usr/bin/env bash
# Quiet-machine benchmark for session 7: bench_quant on the opt-in 1M x 384 synthetic set.
# Run alone (no helper, build or test). Usage: run_s7.sh quant1m
set -u
export KBCORE_DATA=/work/shared/data
OUT=/work/bench/s7
mkdir -p $OUT
PY=/work/main-venv/bin/python
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
  quant1m)
    quiet "quant 1M start"
    (cd /work/main && timeout 4500 $PY -m benches.bench_quant --datasets synthetic --n 1000000 --passes 5 \
      --efs 10,16,24,32,48,64,96,128,192,256,384,512 --libs ${QLIBS:-kbcore-sq8,kbcore,hnswlib,zvec-int8} \
      --json $OUT/quant1m.json) > $OUT/quant1m.log 2>&1
    load "quant 1M end";;
  esac
done
