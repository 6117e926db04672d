"""Incremental sync and re-embedding (issue 27, items 4 and 5), timed as ratios in one process.

Run from the repository root with kbcore importable::

    python -m benches.bench_sync [--docs 5000] [--reembed-chunks 100000] [--repeat 3] [--slow-rate 2000]
                                 [--skip-sync] [--json OUT]

What it measures:

1. **Unchanged sync.** A folder of ``--docs`` text files (5 paragraphs each) is synced into an
   empty knowledge base (the first ingest), then synced again unchanged. Gate: the second
   sync takes <= 5 % of the first, with zero embedding calls (a counting embedder). The same
   files through ``ingest_many`` are timed too, as the plain first ingest.
2. **1 % edited.** One paragraph of 1 % of the files is edited; the embedding calls must be
   exactly the chunks whose text changed (an oracle from the chunker).
3. **Re-embedding.** ``--reembed-chunks`` chunks (pre-embedded with ``ingest_table``) are
   re-embedded ``--repeat`` times (default 3) with the built-in HashingEmbedder, then as often
   with a HashingEmbedder that also sleeps per text (``--slow-rate``, default ~2,000 chunks/s:
   a neural model's speed without its CPU use), all in one process; the median of each is
   reported. The report's ``embed_seconds`` is the time inside the embedder. Gate: everything
   else (reading texts, index adds not hidden behind the embedder, checkpoint, commit) <= 10 %
   of the total; ``rest_chunks_per_s`` is the speed of that rest alone (an embedder
   slower than a ninth of it meets the gate). A flat index by default; with
   ``--reembed-index hnsw`` the graph linking that runs afterwards in the background, as
   after an ingest, is timed separately (``wait_until_indexed``).

Wall-clock timings on a shared machine are noisy; the gates are ratios measured in one process.
Nothing asserts: the script prints PASS / FAIL per gate.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

import numpy as np

from kbcore import Engine
from kbcore.chunking import chunk_text
from kbcore.embedders import HashingEmbedder
from kbcore.engine import Document

WORDS = "alpha beta gamma delta omega sigma kappa lambda theta zeta river stone cloud forest signal".split()


class Counting:
    """HashingEmbedder counting the texts it embeds."""

    def __init__(self, dim: int = 384) -> None:
        self.inner = HashingEmbedder(dim=dim)
        self.dim = dim
        self.texts = 0

    def spec(self) -> dict:
        return self.inner.spec()

    def embed(self, texts):
        self.texts += len(texts)
        return self.inner.embed(texts)


def _paragraph(rng: random.Random, i: int, j: int) -> str:
    return f"Document {i}, paragraph {j}. " + " ".join(rng.choice(WORDS) for _ in range(40)) + "."


def make_folder(root: str, n: int, seed: int = 1) -> dict[str, str]:
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        rel = f"d{i % 50:02d}/doc{i:05d}.txt"
        text = "\n\n".join(_paragraph(rng, i, j) for j in range(5))
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
            f.write(text)
        out[rel] = text
    return out


def bench_sync(tmp: str, ndocs: int) -> dict:
    src = os.path.join(tmp, "src")
    texts = make_folder(src, ndocs)
    emb = Counting()
    engine = Engine(os.path.join(tmp, "data"), embedder=emb)
    plain = engine.create_knowledge_base("plain", embedder=emb)
    t0 = time.perf_counter()
    plain.ingest_many([Document(os.path.join(src, r), document_id=r) for r in texts], progress=False)
    t_ingest = time.perf_counter() - t0
    plain.wait_until_indexed()  # its background HNSW linking must not slow the sync timed next
    kb = engine.create_knowledge_base("synced", embedder=emb)
    emb.texts = 0
    t0 = time.perf_counter()
    first = kb.sync(src, progress=False)
    t_first = time.perf_counter() - t0
    kb.wait_until_indexed()  # background HNSW linking: not part of either sync
    emb.texts = 0
    t0 = time.perf_counter()
    again = kb.sync(src, progress=False)
    t_again = time.perf_counter() - t0
    calls_unchanged = emb.texts
    rng = random.Random(2)
    edited = rng.sample(sorted(texts), max(1, ndocs // 100))
    want = 0
    for rel in edited:
        parts = texts[rel].split("\n\n")
        parts[3] = parts[3].replace("paragraph 3.", "paragraph three (edited).")
        new = "\n\n".join(parts)
        with open(os.path.join(src, rel), "w", encoding="utf-8") as f:
            f.write(new)
        old_chunks = {c.text for c in chunk_text(texts[rel], chunk_size=500, chunk_overlap=50)}
        want += sum(c.text not in old_chunks for c in chunk_text(new, chunk_size=500, chunk_overlap=50))
    emb.texts = 0
    kb.wait_until_indexed()
    t0 = time.perf_counter()
    edit = kb.sync(src, progress=False)
    t_edit = time.perf_counter() - t0
    engine.close()
    return {
        "docs": ndocs,
        "chunks": first.chunks_embedded,
        "ingest_many_s": t_ingest,
        "first_sync_s": t_first,
        "unchanged_sync_s": t_again,
        "unchanged_ratio_vs_first_sync": t_again / t_first,
        "unchanged_ratio_vs_ingest_many": t_again / t_ingest,
        "unchanged_embedding_calls": calls_unchanged,
        "unchanged_reported": len(again.unchanged),
        "edited_docs": len(edited),
        "edited_embedded": edit.chunks_embedded,
        "edited_embedded_oracle": want,
        "edited_reused": edit.chunks_reused,
        "edited_sync_s": t_edit,
    }


class Sleepy:
    """HashingEmbedder that also sleeps a fixed time per text: a stand-in for a slower (neural)
    embedder at about ``rate`` chunks/s, without its CPU use."""

    def __init__(self, dim: int, rate: float) -> None:
        self.inner = HashingEmbedder(dim=dim)
        self.dim = dim
        self.rate = rate

    def spec(self) -> dict:
        return {**self.inner.spec(), "sleep_rate": self.rate}

    def embed(self, texts):
        time.sleep(len(texts) / self.rate)
        return self.inner.embed(texts)


def bench_reembed(tmp: str, n: int, kind: str, repeat: int, slow_rate: float) -> dict:
    """Re-embeds one knowledge base of ``n`` chunks ``repeat`` times with the HashingEmbedder,
    then ``repeat`` times with :class:`Sleepy` (when ``slow_rate`` > 0), in one process; the
    figures are the medians of each."""
    import pyarrow as pa

    rng = np.random.default_rng(3)
    words = np.array(WORDS)
    texts = [" ".join(words[rng.integers(0, len(words), 30)]) + f" row{i}" for i in range(n)]
    vecs = rng.standard_normal((n, 384), dtype=np.float32)
    table = pa.table({"text": texts, "document_id": [f"doc{i // 10}" for i in range(n)]})
    engine = Engine(os.path.join(tmp, "re"))
    kb = engine.create_knowledge_base("kb", embedder=HashingEmbedder(dim=384), index=kind)
    kb.ingest_table(table, vectors=vecs)
    kb.wait_until_indexed()
    kb.checkpoint()
    out: dict = {"chunks": n}
    variants = [("hashing", lambda: HashingEmbedder(dim=256))]
    if slow_rate > 0:
        variants.append((f"sleepy{int(slow_rate)}", lambda: Sleepy(256, slow_rate)))
    for name, make in variants:
        runs = []
        for _ in range(repeat):
            report = kb.reembed(make(), batch_size=1024, progress=False)
            t0 = time.perf_counter()
            kb.wait_until_indexed()
            rest = report.total_seconds - report.embed_seconds
            runs.append((report.total_seconds, report.embed_seconds, rest, time.perf_counter() - t0))
        fractions = [r[2] / r[0] for r in runs]
        med = sorted(range(repeat), key=lambda i: fractions[i])[repeat // 2]
        total, embed, rest, link = runs[med]
        out[name] = {
            "total_s": total,
            "embedder_s": embed,
            "rest_s": rest,
            "rest_fraction": fractions[med],
            "rest_fractions": fractions,
            "embedder_chunks_per_s": n / embed,
            "rest_chunks_per_s": n / rest,
            "background_linking_s": link,
        }
    engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--reembed-chunks", type=int, default=100_000)
    ap.add_argument(
        "--reembed-index",
        default="flat",
        choices=("flat", "hnsw"),
        help="index kind of the re-embedded knowledge base (hnsw adds minutes of graph linking before and after)",
    )
    ap.add_argument("--repeat", type=int, default=3, help="re-embeds per embedder (the median is reported)")
    ap.add_argument(
        "--slow-rate",
        type=float,
        default=2000.0,
        help="chunks/s of the sleeping embedder timed after the hashing one (0: skip it)",
    )
    ap.add_argument("--skip-sync", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s = {} if args.skip_sync else bench_sync(tmp, args.docs)
        r = bench_reembed(tmp, args.reembed_chunks, args.reembed_index, args.repeat, args.slow_rate)
    flat = {f"sync.{k}": v for k, v in s.items()}
    for k, v in r.items():
        if isinstance(v, dict):
            flat.update({f"reembed.{k}.{kk}": vv for kk, vv in v.items()})
        else:
            flat[f"reembed.{k}"] = v
    for k, v in flat.items():
        print(f"{k:<45} {v:.4f}" if isinstance(v, float) else f"{k:<45} {v}")
    gates = {
        f"reembed ({name}): the rest <= 10% of the time (median)": v["rest_fraction"] <= 0.10
        for name, v in r.items()
        if isinstance(v, dict)
    }
    if s:
        gates["unchanged sync <= 5% of the first sync, 0 embedding calls"] = (
            s["unchanged_ratio_vs_first_sync"] <= 0.05 and s["unchanged_embedding_calls"] == 0
        )
        gates["1% edited: embedding calls == changed chunks"] = s["edited_embedded"] == s["edited_embedded_oracle"]
    for name, ok in gates.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sync": s, "reembed": r, "gates": gates}, f, indent=1)


if __name__ == "__main__":
    main()
