"""Gate 1 of the early-rejection trial (issue 28): what a partial-distance test would reject.

Needs a build with benches/trials/early_reject_trace.patch applied (KBCORE_H52_TRACE: every
level-0 scored neighbour's slot, SQ8 distance and the walk's ef-th best distance when its list
is full, one record of -1 per walk). For each scored
neighbour whose list was full, the partial inner product on the first d' dims of a variance
permutation or of a PCA rotation, plus the mean of the rest, minus m standard deviations of
the rest (diagonal: sum q_i^2 sigma_i^2), gives a lower bound on its distance; it is rejected
when that exceeds the threshold. Also: the exact Cauchy-Schwarz bound on the rest (PCA order,
per-row norm of the rest), and ADSampling's test on a seeded random rotation (the squared L2
of the first d' dims scaled by D / d' against the threshold times (1 + eps0 / sqrt(d'))^2).

    mkdir -p /tmp/h52
    KBCORE_H52_TRACE=/tmp/h52/t-sf.bin python -m benches.trials.early_reject_numpy scifact 12,16,24,48
    KBCORE_H52_TRACE=/tmp/h52/t-sf.bin python -m benches.trials.early_reject_numpy analyse scifact
"""

from __future__ import annotations

import os
import sys

import numpy as np
from benches.trials.graph_trial import build, load

import kbcore


def main() -> None:
    name = sys.argv[1]
    efs = [int(e) for e in sys.argv[2].split(",")]
    ds = load(name)
    path = f"/tmp/h52/{name}.kbi"
    if os.path.exists(path):
        index = kbcore.Index.load(path)
    else:
        index = build(ds, "sq8", 16)
        index.save(path)
    nq = min(ds.nq, 300)
    for ef in efs:
        for q in ds.queries[:nq]:
            index.search(q, 10, ef=ef)
    # The trace is flushed at exit: `analyse` reads it in a second process.
    print(f"searched {len(efs)} x {nq}; recall:", end=" ")
    for ef in efs:
        ids, _ = index.search(ds.queries[:nq], 10, ef=ef, threads=1)
        print(ef, round(float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ds.gt_ids[:nq])])), 4), end="; ")
    print()
    np.save(f"/tmp/h52/{name}-meta.npy", np.array([nq] + efs))


def analyse() -> None:
    name = sys.argv[2]
    meta = np.load(f"/tmp/h52/{name}-meta.npy")
    nq, efs = int(meta[0]), [int(e) for e in meta[1:]]
    ds = load(name)
    rec = np.fromfile(os.environ["KBCORE_H52_TRACE"], dtype=np.float32).reshape(-1, 3)
    marks = np.flatnonzero(rec[:, 0] < 0)
    # the first len(efs) * nq walks are the single-query searches (the batch ones follow)
    base = ds.base
    rng = np.random.default_rng(0)
    sample = base[rng.choice(ds.n, min(ds.n, 20000), replace=False)].astype(np.float64)
    mu = sample.mean(axis=0)
    cen = sample - mu
    var = cen.var(axis=0)
    perm = np.argsort(-var)
    cov = cen.T @ cen / len(cen)
    w, v = np.linalg.eigh(cov)
    order = np.argsort(-w)
    pca_var, pca_vec = w[order], v[:, order]  # columns: components
    total = var.sum()
    print(
        f"{name}: variance in the first 64/96/128 dims: perm "
        + " / ".join(f"{var[perm[:d]].sum() / total:.3f}" for d in (64, 96, 128))
        + ", PCA "
        + " / ".join(f"{pca_var[:d].sum() / total:.3f}" for d in (64, 96, 128))
    )
    base_pca = ((base - mu) @ pca_vec).astype(np.float32)
    base_perm = (base - mu)[:, perm].astype(np.float32)
    rot, _ = np.linalg.qr(rng.standard_normal((ds.dim, ds.dim)))
    base_rot = (base @ rot).astype(np.float32)
    rest_norm = {d: np.linalg.norm(base_pca[:, d:], axis=1) for d in (64, 96, 128)}
    var_perm = var[perm]
    for e_i, ef in enumerate(efs):
        stats: dict = {}
        n_scored = n_full = n_over = 0
        for qi in range(nq):
            w_idx = e_i * nq + qi
            lo = marks[w_idx] + 1
            hi = marks[w_idx + 1] if w_idx + 1 < len(marks) else len(rec)
            r = rec[lo:hi]
            n_scored += len(r)
            full = np.isfinite(r[:, 2])
            r = r[full]
            n_full += len(r)
            slots = r[:, 0].astype(np.int64)
            dsq, thr = r[:, 1], r[:, 2]
            over = dsq >= thr
            n_over += int(over.sum())
            gt = set(ds.gt_ids[qi].tolist())
            is_gt = np.array([s in gt for s in slots])
            q = ds.queries[qi].astype(np.float64)
            qmu = float(q @ mu)
            for kind, rows, qv, vv in (
                ("perm", base_perm, q[perm], var_perm),
                ("pca", base_pca, q @ pca_vec, pca_var),
            ):
                x = rows[slots]
                for d in (64, 96, 128):
                    part = x[:, :d] @ qv[:d]
                    sd = float(np.sqrt(np.sum(qv[d:] ** 2 * vv[d:])))
                    for m in (1.5, 2.0, 2.5, 3.0):
                        lower = 1.0 - qmu - part - m * sd
                        rej = lower > thr
                        s = stats.setdefault((kind, d, m), [0, 0, 0])
                        s[0] += int(rej.sum())
                        s[1] += int((rej & ~over).sum())
                        s[2] += int((rej & is_gt).sum())
            # exact (Cauchy-Schwarz) bound on the rest in PCA order, and ADSampling's test on a
            # random rotation (L2 of unit vectors: 2 * cosine distance), eps0 = 1.0 / 2.1
            qp = q @ pca_vec
            qr = q @ rot
            xp = base_pca[slots]
            xr = base_rot[slots]
            for d in (64, 96, 128):
                part = xp[:, :d] @ qp[:d]
                lower = 1.0 - qmu - part - np.linalg.norm(qp[d:]) * rest_norm[d][slots]
                rej = lower > thr
                s = stats.setdefault(("cs", d, 0.0), [0, 0, 0])
                s[0] += int(rej.sum())
                s[1] += int((rej & ~over).sum())
                s[2] += int((rej & is_gt).sum())
                est = (ds.dim / d) * np.sum((xr[:, :d] - qr[:d]) ** 2, axis=1)
                for eps in (1.0, 2.1):
                    rej = est > 2 * thr * (1 + eps / np.sqrt(d)) ** 2
                    s = stats.setdefault(("ads", d, eps), [0, 0, 0])
                    s[0] += int(rej.sum())
                    s[1] += int((rej & ~over).sum())
                    s[2] += int((rej & is_gt).sum())
        print(
            f"ef {ef}: scored/query {n_scored / nq:.0f}, list full {n_full / n_scored:.3f}, "
            f"over threshold (rejectable) {n_over / n_scored:.3f}"
        )
        for (kind, d, m), (nr, nw, ng) in sorted(stats.items()):
            print(
                f"  {kind:4s} d'={d:3d} m={m}: rejected {nr / n_scored:.3f} of scored, "
                f"wrongly (would enter list) {nw / n_scored:.4f}, true top-10 rejected {ng / (nq * 10):.4f}"
            )


if __name__ == "__main__":
    if sys.argv[1] == "analyse":
        analyse()
    else:
        main()
