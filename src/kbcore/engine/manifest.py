"""The checkpoint and compaction policy."""

from __future__ import annotations

#: A checkpoint of the index is written when the rows not covered by the last one exceed
#: max(CKPT_MIN_ROWS, CKPT_FRACTION * rows in it): reopening replays at most that many.
CKPT_MIN_ROWS = 4096
CKPT_FRACTION = 0.5
#: Compaction runs when more than this many segments exist, or when deleted rows are more
#: than half of the stored rows.
MAX_SEGMENTS = 32
