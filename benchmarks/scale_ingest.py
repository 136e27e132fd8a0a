"""Ingestion into a 1,000,000-chunk collection against an empty database, side by side (issue 15).

    .venv/bin/python -m benchmarks.scale_ingest [--size 1000000] [--docs 300] [--chunks 2000] [--rounds 2] [--json]

The big data dir is ``benchmarks/scale.py``'s (``.bench-data/scale-N``; build it first with
``python -m benchmarks.scale --sizes N --build-only``); the empty one is
``.bench-data/scale-ingest-empty`` (migrated, nothing in it). The rounds alternate (empty, big,
empty, big, ...), and each one measures in that data dir:

1. **the pipeline**: the same ``--docs`` SciFact documents (a fixed sample) ingested by the default
   ingestor (chunking, embedding, writing) into a new collection: wall seconds and chunks/s;
2. **the store alone**: ``--chunks`` real SciFact chunks with their stored vectors written through
   ``replace_documents`` (the bulk path) into another new collection: seconds and chunks/s. This is
   what the HNSW insertion into a graph of that size, the GIN indexes and the keyword triggers cost;
3. a calibration: the raw embedder's chunks/s on 256 fixed SciFact chunks.

The probe collections' documents are deleted at the end of each round, so every round writes into
the same state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import text

from benchmarks.calibration import calibration, calibration_texts
from benchmarks.datasets import BENCH_DATA, open_runtime, scifact
from benchmarks.scale import chunk_count, ensure_hnsw, log, seed
from benchmarks.scale_data import Seed, real_documents
from ingestion.pipeline import IngestOptions

EMPTY_DIR = BENCH_DATA / "scale-ingest-empty"


def sample_rows(n: int) -> list[dict]:
    rows = [json.loads(line) for line in scifact("test").corpus.read_text().splitlines() if line.strip()]
    return random.Random(0).sample(rows, min(n, len(rows)))


def store_batch(the_seed: Seed, collection: str, chunks: int) -> list:
    batch, held = [], 0
    for doc, items in real_documents(the_seed, collection):
        batch.append((doc, items))
        held += sum(c.embedding is not None for c in items)
        if held >= chunks:
            break
    return batch


async def delete_collection_documents(runtime, collection: str) -> int:  # noqa: ANN001
    async with runtime.db.engine.connect() as conn:
        ids = [r[0] for r in await conn.execute(text(
            "SELECT d.id FROM documents d JOIN collections k ON k.id = d.collection_id WHERE k.name = :c"),
            {"c": collection})]
    for document_id in ids:
        await runtime.store.delete_document(document_id)
    return len(ids)


async def one_round(data_dir: Path, rows: list[dict], the_seed: Seed, chunks: int) -> dict:
    runtime = open_runtime(data_dir)
    tag = uuid.uuid4().hex[:8]
    pipeline_collection, store_collection = f"probe-pipeline-{tag}", f"probe-store-{tag}"
    try:
        await ensure_hnsw(runtime, data_dir)  # a scale build cut short after dropping it
        held = await chunk_count(runtime)
        calibration_chunks_per_s = calibration(runtime, calibration_texts(the_seed))
        with tempfile.TemporaryDirectory() as workdir:
            warm, corpus = Path(workdir) / "warm.jsonl", Path(workdir) / "corpus.jsonl"
            # Unmeasured: a few other documents first, so that loading the chunker's tokenizer and
            # the model's first shapes are not in the figure.
            warm.write_text("".join(json.dumps(dict(r, _id=f"warm-{r['_id']}")) + "\n" for r in rows[:8]))
            corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
            options = IngestOptions(collection=pipeline_collection, format="beir",
                                    batch_documents=runtime.settings.ingest_batch_documents)
            await runtime.ingestor().ingest_paths([warm], options)
            report = await runtime.ingestor().ingest_paths([corpus], options)
        batch = store_batch(the_seed, store_collection, chunks)
        written = sum(c.embedding is not None for _, items in batch for c in items)
        started = time.perf_counter()
        for start in range(0, len(batch), 200):  # as the scale build writes: a few hundred documents a call
            await runtime.store.replace_documents(batch[start:start + 200])
        store_s = time.perf_counter() - started
        for collection in (pipeline_collection, store_collection):
            await delete_collection_documents(runtime, collection)
        return {"data_dir": data_dir.name, "chunks_before": held,
                "pipeline_s": round(report.seconds, 2), "pipeline_documents": report.added,
                "pipeline_chunks": report.chunks_embedded,
                "pipeline_chunks_per_s": round(report.chunks_embedded / report.seconds, 1),
                "store_chunks": written, "store_s": round(store_s, 2),
                "store_chunks_per_s": round(written / store_s, 1),
                "calibration_chunks_per_s": calibration_chunks_per_s}
    finally:
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1_000_000, help="the scale data dir to compare with an empty one")
    parser.add_argument("--docs", type=int, default=300, help="SciFact documents the pipeline ingests per round")
    parser.add_argument("--chunks", type=int, default=2000, help="pre-embedded chunks the store writes per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per data dir, alternating")
    parser.add_argument("--json", action="store_true", help="only one JSON object per round, then the summary")
    args = parser.parse_args()
    if os.environ.get("RAGSVC_DATABASE_URL"):
        raise SystemExit("RAGSVC_DATABASE_URL is set: both rounds would use that one database; unset it")
    big = BENCH_DATA / f"scale-{args.size}"
    if not big.exists():
        raise SystemExit(f"{big} does not exist: build it with python -m benchmarks.scale --sizes {args.size} "
                         "--build-only")
    the_seed, rows = seed(), sample_rows(args.docs)
    results: dict[str, list[dict]] = {"empty": [], "big": []}
    for i in range(args.rounds):
        for name, data_dir in (("empty", EMPTY_DIR), ("big", big)):
            log(f"round {i + 1}: {data_dir.name}")
            result = asyncio.run(one_round(data_dir, rows, the_seed, args.chunks))
            results[name].append(result)
            print(json.dumps(result), flush=True)

    def mean(name: str, key: str) -> float:
        return round(statistics.fmean(r[key] for r in results[name]), 2)

    summary = {
        "size": args.size,
        **{f"{name}_{key}": mean(name, key) for name in results
           for key in ("pipeline_chunks_per_s", "store_chunks_per_s", "calibration_chunks_per_s")},
    }
    summary["pipeline_big_over_empty"] = round(summary["big_pipeline_chunks_per_s"]
                                               / summary["empty_pipeline_chunks_per_s"], 3)
    summary["store_big_over_empty"] = round(summary["big_store_chunks_per_s"] / summary["empty_store_chunks_per_s"], 3)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
