#!/usr/bin/env bash
# Five SciFact-only runs in a row (the contested cell: sq8 against zvec INT8 at recall 0.95), each
# started only once the 1-minute load is below 0.5 (at most 300 s of waiting), 9 passes each.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-/work/main/.venv/bin/python}
load() { python3 -c "import os, time; print(time.strftime('%H:%M:%S'), '$1 loadavg', os.getloadavg(), flush=True)"; }
quiet() { for i in $(seq 1 60); do python3 -c "import os, sys; sys.exit(0 if os.getloadavg()[0] < 0.5 else 1)" && break; sleep 5; done; load "$1"; }
for r in 1 2 3 4 5; do
  quiet "scifact run $r start"
  (cd /work/main && KBCORE_DATA=/work/shared/data OPENBLAS_NUM_THREADS=1 timeout 1200 $PY -m benches.bench_quant \
    --datasets scifact --passes 9 --libs kbcore-sq8,kbcore-rabitq,hnswlib,faiss-sq8,zvec-int8 \
    --json $HERE/scifact_run$r.json) > $HERE/scifact_run$r.log 2>&1
  load "scifact run $r end"
done
