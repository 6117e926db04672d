#!/usr/bin/env bash
# Quiet-machine benchmarks for the session-5 closing note. Run alone (no helper, build or test).
# Usage: run_final.sh [engine] [dist] [quant] [dist1m] [filter]   (default: engine dist quant)
set -u
export KBCORE_DATA=/work/shared/data
OUT=/work/bench/s5
mkdir -p $OUT
PY=/work/main-venv/bin/python
load() { python3 -c "import os; print('$1 loadavg', os.getloadavg(), flush=True)"; }
quiet() {  # wait (at most 240 s) for the 1-minute load to fall below 0.5
  for i in $(seq 1 48); do
    python3 -c "import os, sys; sys.exit(0 if os.getloadavg()[0] < 0.5 else 1)" && break
    sleep 5
  done
  load "$1"
}
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(engine dist quant)
for step in "${steps[@]}"; do
  case $step in
  engine)
    for r in 1 2 3; do
      quiet "engine old round $r"
      (cd /work/wt/base && /work/venv/bin/python -m benches.bench_engine --data /work/shared/data --json $OUT/eng_old_$r.json) > $OUT/eng_old_$r.log 2>&1
      load "engine new round $r start"
      (cd /work/main && $PY -m benches.bench_engine --data /work/shared/data --json $OUT/eng_new_$r.json) > $OUT/eng_new_$r.log 2>&1
    done
    load "engine end";;
  dist)
    quiet "distributed scifact start"
    (cd /work/main && timeout 900 $PY -m benches.bench_distributed --shards 0,1,2,4 --transports actor,compiled --json $OUT/dist.json) > $OUT/dist.log 2>&1
    load "distributed scifact end";;
  dist1m)
    quiet "distributed 1M start"
    (cd /work/main && timeout 1500 $PY -m benches.bench_distributed ${DIST1M_ARGS:---no-scifact --n 1000000 --shards 0,1,2,4 --transports actor} --json $OUT/dist1m.json) > $OUT/dist1m.log 2>&1
    load "distributed 1M end";;
  quant)
    quiet "quant start"
    (cd /work/main && timeout 1500 $PY -m benches.bench_quant --datasets scifact,synthetic --n 100000 --passes 5 --json $OUT/quant.json) > $OUT/quant.log 2>&1
    load "quant end";;
  filter)
    quiet "filter start"
    (cd /work/main && timeout 1800 $PY -m benches.bench_filter --libs kbcore,kbcore-sq8,hnswlib,faiss,numpy --json $OUT/filter.json) > $OUT/filter.log 2>&1
    load "filter end";;
  esac
done
