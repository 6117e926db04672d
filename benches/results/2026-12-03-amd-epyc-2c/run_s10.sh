#!/usr/bin/env bash
# What ran for this folder (session 10, an AMD EPYC with 2 cores): the quiet-machine steps of
# ../2026-12-02d-intel-xeon-2c/run_s8.sh with this session's venv, output next to this script.
# Usage: run_s10.sh filter | quant | ...   (run alone: no helper, build or test at the same time)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE} PY=${PY:-/work/main/.venv/bin/python} bash "$HERE/../2026-12-02d-intel-xeon-2c/run_s8.sh" "$@"
# The refine / fast-scan anchors added this session, next to kbcore and the best anchors of the
# first quant run (written to quant_refine.json / .log):
#   QLIBS=kbcore-sq8,kbcore-rabitq,hnswlib,zvec-int8,zvec-int8-refine,faiss-sq8-refine,faiss-ivfpq-fs \
#     OUT=$HERE/refine bash run_s10.sh quant
