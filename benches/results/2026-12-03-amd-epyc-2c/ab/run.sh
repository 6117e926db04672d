#!/usr/bin/env bash
# A/B of the filtered walk at 50 % (synthetic 100k, sq8, ef 16): 1d82d0b (bitmap) vs HEAD (per-node
# predicate), alternating processes, 7 rounds, the order swapped each round.
python3 -c "import os; print('load start', os.getloadavg())"
for r in 1 2 3 4 5 6 7; do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    if [ $v = old ]; then /work/venv-old/bin/python /work/ab/pass.py old; else /work/main/.venv/bin/python /work/ab/pass.py new; fi
  done
done
python3 -c "import os; print('load end', os.getloadavg())"
