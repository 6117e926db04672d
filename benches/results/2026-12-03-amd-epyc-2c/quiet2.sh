#!/usr/bin/env bash
# Quiet window after CI: A/B of the per-node filter predicate, the fast-scan anchor on SciFact with
# the wider nprobe range, and the grouped / hybrid / engine modules of the report.
set -u
D=/work/main/benches/results/2026-12-03-amd-epyc-2c
load() { python3 -c "import os, time; print(time.strftime('%H:%M:%S'), '$1 loadavg', os.getloadavg(), flush=True)"; }
quiet() { for i in $(seq 1 60); do python3 -c "import os, sys; sys.exit(0 if os.getloadavg()[0] < 0.5 else 1)" && break; sleep 5; done; load "$1"; }
export KBCORE_DATA=/work/shared/data OPENBLAS_NUM_THREADS=1
mkdir -p $D/ab $D/ivf $D/report
quiet "ab start"; bash /work/ab/run.sh > $D/ab/ab.log 2>&1; load "ab end"
quiet "ivf start"
(cd /work/main && .venv/bin/python -m benches.bench_quant --datasets scifact --passes 5 \
  --libs kbcore-sq8,zvec-int8,faiss-ivfpq-fs --json $D/ivf/quant.json) > $D/ivf/quant.log 2>&1
load "ivf end"
quiet "report start"
(cd /work/main && .venv/bin/python -m benches.report --only groups,hybrid,engine,engine_hybrid --out $D/report) > $D/report/run.log 2>&1
load "report end"
