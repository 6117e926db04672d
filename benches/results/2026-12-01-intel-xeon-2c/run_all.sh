#!/usr/bin/env bash
# Quiet-machine benchmarks for the closing note. Run alone.
set -u
export KBCORE_DATA=/work/shared/data
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
OUT=/work/bench
load() { python3 -c "import os; print('$1 loadavg', os.getloadavg())"; }
load "start"
for r in 1 2 3; do
  load "engine old round $r"
  (cd /work/wt/base && /work/venv/bin/python -m benches.bench_engine --data /work/shared/data --json $OUT/eng_old_$r.json) > $OUT/eng_old_$r.log 2>&1
  load "engine new round $r"
  (cd /work/main && /work/main-venv/bin/python -m benches.bench_engine --data /work/shared/data --json $OUT/eng_new_$r.json) > $OUT/eng_new_$r.log 2>&1
done
load "engine end"
load "quant start"
(cd /work/main && timeout 1500 /work/main-venv/bin/python -m benches.bench_quant --datasets scifact,synthetic --n 100000 --passes 5 --json $OUT/quant.json) > $OUT/quant.log 2>&1
load "quant end"
load "distributed start"
(cd /work/main && timeout 900 /work/main-venv/bin/python -m benches.bench_distributed --no-synthetic --shards 1,2,4 --json $OUT/dist.json) > $OUT/dist.log 2>&1
load "distributed end"
