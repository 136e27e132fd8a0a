"""Embedding throughput of the local model on real 256-token chunks.

    .venv/bin/python -m benchmarks.embedding [--chunks 1024] [--batch-sizes 16,32,64]

Chunks are cut from SciFact abstracts (../shared/data/scifact/corpus.jsonl) to exactly 256
model tokens including [CLS]/[SEP], so the figure is chunks/s at the chunk size ingestion uses.
Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from rag_service.providers.embeddings import LocalEmbedder

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "scifact" / "corpus.jsonl"


def make_chunks(embedder: LocalEmbedder, n: int, tokens: int = 256) -> list[str]:
    tokenizer = embedder._load().tokenizer
    stream: list[int] = []
    chunks: list[str] = []
    with CORPUS.open() as f:
        for line in f:
            doc = json.loads(line)
            stream.extend(tokenizer(doc["title"] + ". " + doc["text"], add_special_tokens=False)["input_ids"])
            while len(stream) >= tokens - 2 and len(chunks) < n:
                chunks.append(tokenizer.decode(stream[: tokens - 2]))
                stream = stream[tokens - 2 :]
            if len(chunks) >= n:
                break
    return chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="16,32,64")
    args = parser.parse_args()

    probe = LocalEmbedder()
    t0 = time.perf_counter()
    probe.encode(["load"])
    load_s = time.perf_counter() - t0
    chunks = make_chunks(probe, args.chunks)
    lengths = [len(probe._load().tokenizer(c)["input_ids"]) for c in chunks[:50]]
    print(f"{len(chunks)} chunks from SciFact, token lengths (first 50): min {min(lengths)} max {max(lengths)}")
    results: dict[str, float] = {}
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        embedder = LocalEmbedder(batch_size=batch_size)
        embedder._model = probe._model  # same loaded model, different batch size
        embedder.encode(chunks[:batch_size])  # warm the kernels for this shape
        start = time.perf_counter()
        embedder.encode(chunks)
        seconds = time.perf_counter() - start
        results[f"chunks_per_s_batch{batch_size}"] = round(len(chunks) / seconds, 1)
        print(f"batch {batch_size:>3}: {len(chunks) / seconds:7.1f} chunks/s ({seconds:.1f} s)")
    print(json.dumps({
        "benchmark": "embedding", "model": probe.name, "chunk_tokens": 256, "chunks": len(chunks),
        "model_load_s": round(load_s, 2), **results, "cpus": os.cpu_count(), "machine": platform.machine(),
    }))


if __name__ == "__main__":
    main()
