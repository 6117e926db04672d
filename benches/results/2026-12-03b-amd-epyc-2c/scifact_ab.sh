#!/usr/bin/env bash
# SciFact bench_quant runs alternating the kbcore of 02ca27a (the session's start; a copy of that
# install put first on PYTHONPATH) with f329a07+ (this folder's), the other libraries the same
# venv's, 9 passes, each run started below load 0.5. OLD=dir of the old kbcore package's parent.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/work/main/.venv/bin/python}
OLD=${OLD:-/tmp/mb/base}
load() { python3 -c "import os, time; print(time.strftime('%H:%M:%S'), '$1 loadavg', os.getloadavg(), flush=True)"; }
quiet() { for i in $(seq 1 60); do python3 -c "import os, sys; sys.exit(0 if os.getloadavg()[0] < 0.5 else 1)" && break; sleep 5; done; load "$1"; }
mkdir -p $HERE/ab
for r in 1 2 3; do
  for v in old new; do
    quiet "ab $v $r start"
    pp=""; [ $v = old ] && pp=$OLD
    (cd /work/main && PYTHONPATH=$pp KBCORE_DATA=/work/shared/data OPENBLAS_NUM_THREADS=1 timeout 1200 $PY -m benches.bench_quant \
      --datasets scifact --passes 9 --libs kbcore-sq8,zvec-int8,hnswlib --json $HERE/ab/$v$r.json) > $HERE/ab/$v$r.log 2>&1
    load "ab $v $r end"
  done
done
