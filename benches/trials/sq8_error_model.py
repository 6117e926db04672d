"""Checks the SQ8 error model of the re-rank stop-rule trial (sq8_stop_rule_trial.patch) in numpy.

For each query, the 60 nearest rows (exact cosine) are estimated as the SQ8 kernels estimate
them (ranges from an evenly strided sample of at most 16,384 rows, the query folded with the
scales and rounded to int8 with one factor), centred by the model's bias, and divided by the
model's standard deviation at |x - q|^2 = 2 * distance. Rows whose range was clipped are left
out of the spread (the trial never skips a row with a code 0 or 255). Then the stop rule is
replayed on each query's best 16 estimates (k 10): how many of the 6 rows past k it skips at
each z, and how many answers (top-10 sets) change against reading all 16.

    KBCORE_DATA=../shared/data python -m benches.trials.sq8_error_model --dataset scifact --z 6,8,10
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from benches.datasets import make_synthetic


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name.startswith("synthetic"):
        d = make_synthetic(int(name.split("-")[1]), 500)
        return d.base, d.queries
    root = os.path.join(os.environ.get("KBCORE_DATA", "../shared/data"), name)
    return np.load(os.path.join(root, "chunk_embeddings.npy")), np.load(os.path.join(root, "query_embeddings.npy"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="scifact", help="scifact, arguana or synthetic-N")
    p.add_argument("--z", default="6,8,10", help="standard deviations allowed before a row is skipped")
    args = p.parse_args()
    zs = [float(z) for z in args.z.split(",")]
    x, queries = load(args.dataset)
    x = x.astype(np.float64)
    queries = queries.astype(np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    n, dim = x.shape
    sample = x[np.arange(min(16384, n)) * n // min(16384, n)]
    lo = sample.min(0)
    scale = (sample.max(0) - lo) / 255
    inv = np.where(scale > 0, 1 / np.where(scale > 0, scale, 1), 0)
    codes = np.clip(np.round((x - lo) * inv), 0, 255)
    at_end = ((codes == 0) | (codes == 255)).any(1)
    sims = x @ queries.T
    depth, k = 16, 10
    ratios = []
    skipped = dict.fromkeys(zs, 0)
    changed = dict.fromkeys(zs, 0)
    for j, q in enumerate(queries):
        f = q * scale
        a = np.abs(f).max() / 127
        qi = np.round(f / a)
        e = f - a * qi
        bias = float(e @ ((q - lo) * inv))
        row_var = float((f**2).sum() / 12)
        query_coef = float(((e * inv) ** 2).sum() / dim)
        near = np.argsort(-sims[:, j])[:60]
        est = 1 - (float(q @ lo) + a * (codes[near] @ qi))
        exact = 1 - sims[near, j]
        spread = np.sqrt(row_var + query_coef * 2 * np.maximum(exact, 0))
        ratios.append(((est - bias - exact) / spread)[~at_end[near]])
        order = np.argsort(est)[:depth]
        want = set(near[order[np.argsort(exact[order])[:k]]].tolist())
        first = order[:k]
        kth = float(exact[first].max())
        cut_spread = np.sqrt(row_var + query_coef * 2 * max(kth, 0.0))
        for z in zs:
            rest = [m for m in order[k:] if not (est[m] > kth + bias + z * cut_spread and not at_end[near[m]])]
            read = np.concatenate([first, np.array(rest, int)])
            got = set(near[read[np.argsort(exact[read])[:k]]].tolist())
            skipped[z] += depth - len(read)
            changed[z] += got != want
    r = np.concatenate(ratios)
    print(
        f"{args.dataset}: rows with a code 0 or 255 {at_end.mean():.3f}; (estimate - bias - exact) / spread over "
        f"{r.size} unclipped candidates: std {r.std():.2f}, max |.| {np.abs(r).max():.1f}, "
        f"99.99th percentile {np.quantile(np.abs(r), 0.9999):.1f}"
    )
    for z in zs:
        print(
            f"  z {z:g}: rows skipped per query {skipped[z] / len(queries):.2f} of {depth - k}; "
            f"answers changed {changed[z]} of {len(queries)}"
        )


if __name__ == "__main__":
    main()
