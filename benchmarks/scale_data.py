"""Collections of 10k to 1M chunks for the scale benchmark, built without running the embedder per chunk.

The seed is SciFact as the service ingested it (its real chunks, real vectors and real documents,
read from the SciFact benchmark data dir and cached as one file). A collection of N chunks holds
every real SciFact document (so its qrels still judge the results) plus generated documents up to
N chunks:

- text: words drawn from the seed's own word distribution (which is Zipfian, as any corpus's), with
  chunk lengths and chunks per document drawn from the seed's, split into sentences of 8-30 words;
- vectors: each generated document picks one real chunk vector as its topic, and each of its chunks
  is a vector near that topic. How near, and in which direction, is the choice that decides how
  hard the collection is for an approximate index (``VECTOR_MODES``):

  - ``local`` (the default): as far from the topic as real chunks are from their nearest real
    neighbour (a cosine drawn from the seed's own nearest-neighbour cosines, median 0.76), in a
    direction that is a random Gaussian combination of the topic's 20 nearest real neighbours'
    offsets. The generated vectors stay on the surface the real ones span, so the collection keeps
    the real data's low local intrinsic dimensionality: the query-side maximum-likelihood LID
    (Levina-Bickel, k 20) is 30 for a 1,000-topic, 100-per-topic sample against 20 for the real
    chunks alone.
  - ``isotropic`` (the first version): the topic plus isotropic Gaussian noise over all 384
    dimensions, renormalised (cosine to the topic 0.8). Its LID on the same sample is 41: each
    topic grows a ball of near-equidistant vectors whose order for a query is set by the noise, so
    an approximate index has to visit nearly all of them. Real text embeddings do not look like
    this (Aumueller and Ceccarello, "The role of local intrinsic dimensionality in benchmarking
    nearest neighbor search", 2019: recall at fixed effort falls as LID rises). Kept to compare.

Everything is written through the store's bulk write path (``replace_documents``: binary COPY, the
keyword-index triggers, the HNSW index maintained as rows arrive), in batches of documents.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import select, text

from rag_service.db.models import Chunk, Collection, Document
from rag_service.domain import ChunkRecord, DocumentRecord
from rag_service.stores.pgvector.half import HALF_INDEX

SEED_COLLECTION = "scifact"
TOPIC_NOISE = 0.75  # isotropic mode: |noise| / |topic|, so cosine to the topic 1/sqrt(1 + 0.75^2) = 0.8
LOCAL_NEIGHBOURS = 20  # local mode: the real neighbours whose offsets span a generated vector's direction
VECTOR_MODES = ("local", "isotropic")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9-]*")


@dataclass
class SeedChunk:
    ordinal: int
    text: str
    start_char: int
    end_char: int
    token_count: int
    parent: int | None          # index of its parent within the document's chunks
    metadata: dict
    vector: np.ndarray | None   # None for parent chunks


@dataclass
class SeedDocument:
    source_uri: str
    title: str | None
    content_hash: str
    metadata: dict
    chunks: list[SeedChunk]


@dataclass
class Seed:
    documents: list[SeedDocument]

    @property
    def leaves(self) -> list[SeedChunk]:
        return [c for d in self.documents for c in d.chunks if c.vector is not None]

    @property
    def chunk_count(self) -> int:
        return len(self.leaves)


async def read_seed(runtime, collection: str = SEED_COLLECTION) -> Seed:  # noqa: ANN001 - a Runtime
    """The collection's documents and chunks, vectors included, in a stable order."""
    stmt = (
        select(Document.source_uri, Document.title, Document.content_hash, Document.metadata_.label("doc_meta"),
               Chunk.id, Chunk.parent_id, Chunk.ordinal, Chunk.text, Chunk.start_char, Chunk.end_char,
               Chunk.token_count, Chunk.metadata_.label("chunk_meta"), Chunk.embedding)
        .join(Chunk, Chunk.document_id == Document.id).join(Collection, Collection.id == Document.collection_id)
        .where(Collection.name == collection).order_by(Document.source_uri, Chunk.ordinal, Chunk.id)
    )
    async with runtime.db.engine.connect() as conn:
        rows = (await conn.execute(stmt)).all()
    documents: dict[str, SeedDocument] = {}
    positions: dict[uuid.UUID, int] = {}
    pending: list[tuple[SeedChunk, uuid.UUID | None]] = []
    for r in rows:
        doc = documents.setdefault(
            r.source_uri, SeedDocument(r.source_uri, r.title, r.content_hash, r.doc_meta or {}, []))
        positions[r.id] = len(doc.chunks)
        chunk = SeedChunk(r.ordinal, r.text, r.start_char, r.end_char, r.token_count, None, r.chunk_meta or {},
                          None if r.embedding is None else np.asarray(r.embedding, dtype=np.float32))
        doc.chunks.append(chunk)
        pending.append((chunk, r.parent_id))
    for chunk, parent_id in pending:
        chunk.parent = positions[parent_id] if parent_id is not None else None
    return Seed(list(documents.values()))


def save_seed(seed: Seed, path: Path) -> None:
    leaves = [c.vector for d in seed.documents for c in d.chunks if c.vector is not None]
    docs = [{"source_uri": d.source_uri, "title": d.title, "content_hash": d.content_hash, "metadata": d.metadata,
             "chunks": [{"ordinal": c.ordinal, "text": c.text, "start_char": c.start_char, "end_char": c.end_char,
                         "token_count": c.token_count, "parent": c.parent, "metadata": c.metadata,
                         "leaf": c.vector is not None} for c in d.chunks]} for d in seed.documents]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, vectors=np.vstack(leaves), documents=np.frombuffer(json.dumps(docs).encode(), np.uint8))


def load_seed(path: Path) -> Seed:
    data = np.load(path)
    vectors = iter(data["vectors"])
    documents = []
    for d in json.loads(data["documents"].tobytes()):
        chunks = [SeedChunk(c["ordinal"], c["text"], c["start_char"], c["end_char"], c["token_count"], c["parent"],
                            c["metadata"], next(vectors) if c["leaf"] else None) for c in d["chunks"]]
        documents.append(SeedDocument(d["source_uri"], d["title"], d["content_hash"], d["metadata"], chunks))
    return Seed(documents)


class Generator:
    """Generated documents that follow the seed's word, length and topic distributions."""

    def __init__(self, seed: Seed, rng: np.random.Generator, vectors: str = "local") -> None:
        if vectors not in VECTOR_MODES:
            raise ValueError(f"vectors must be one of {VECTOR_MODES}, not {vectors!r}")
        counts: dict[str, int] = {}
        lengths = []
        for chunk in seed.leaves:
            words = _WORD.findall(chunk.text)
            lengths.append(len(words))
            for w in words:
                counts[w.lower()] = counts.get(w.lower(), 0) + 1
        self.words = np.array(list(counts))
        freq = np.array(list(counts.values()), dtype=np.float64)
        # Words are drawn by inverse CDF: rng.choice(p=...) rebuilds the CDF over the whole
        # vocabulary on every call, and was half of a 1,000,000-chunk build's time.
        self.cdf = np.cumsum(freq / freq.sum())
        self.lengths = np.array([n for n in lengths if n > 0])
        self.chunks_per_doc = np.array([sum(c.vector is not None for c in d.chunks) for d in seed.documents])
        self.chunks_per_doc = self.chunks_per_doc[self.chunks_per_doc > 0]
        self.topics = np.vstack([c.vector for c in seed.leaves]).astype(np.float32)
        self.rng = rng
        self.mode = vectors
        if vectors == "local":
            self.neighbours, self.neighbour_cosines = nearest_neighbours(self.topics, LOCAL_NEIGHBOURS)

    def text(self) -> str:
        n = int(self.rng.choice(self.lengths))
        draws = np.searchsorted(self.cdf, self.rng.random(max(n, 1)) * self.cdf[-1], side="right")
        words = self.words[np.minimum(draws, len(self.words) - 1)].tolist()
        sentences, i = [], 0
        while i < len(words):
            step = int(self.rng.integers(8, 31))
            part = words[i:i + step]
            sentences.append(part[0].capitalize() + (" " + " ".join(part[1:]) if len(part) > 1 else "") + ".")
            i += step
        return " ".join(sentences)

    def vectors(self, n: int) -> np.ndarray:
        index = int(self.rng.integers(len(self.topics)))
        topic = self.topics[index]
        if self.mode == "local":
            return self._local(index, n)
        noise = self.rng.standard_normal((n, topic.shape[0])).astype(np.float32)
        noise *= TOPIC_NOISE / np.linalg.norm(noise, axis=1, keepdims=True)
        out = topic[None, :] + noise
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def _local(self, index: int, n: int) -> np.ndarray:
        topic = self.topics[index]
        offsets = self.topics[self.neighbours[index]] - topic[None, :]
        directions = self.rng.standard_normal((n, len(offsets))).astype(np.float32) @ offsets
        directions -= (directions @ topic)[:, None] * topic[None, :]  # orthogonal to the topic
        norms = np.linalg.norm(directions, axis=1, keepdims=True)
        if (norms < 1e-6).any():  # neighbours identical to the topic (duplicate chunks): any direction
            fallback = self.rng.standard_normal((n, topic.shape[0])).astype(np.float32)
            fallback -= (fallback @ topic)[:, None] * topic[None, :]
            directions = np.where(norms < 1e-6, fallback, directions)
            norms = np.linalg.norm(directions, axis=1, keepdims=True)
        cosine = self.rng.choice(self.neighbour_cosines, size=(n, 1)).astype(np.float32)
        out = cosine * topic[None, :] + np.sqrt(1 - cosine ** 2) * directions / norms
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def document(self, collection: str, index: int, budget: int) -> tuple[DocumentRecord, list[ChunkRecord]]:
        n = max(1, min(budget, int(self.rng.choice(self.chunks_per_doc))))
        doc = DocumentRecord(collection=collection, source_uri=f"generated/{index:07d}", title=f"Generated {index}",
                             content_hash=f"generated-{index}", metadata={"generated": True})
        texts = [self.text() for _ in range(n)]
        chunks, offset = [], 0
        for ordinal, (body, vector) in enumerate(zip(texts, self.vectors(n), strict=True)):
            chunks.append(ChunkRecord(document_id=doc.id, ordinal=ordinal, text=body, start_char=offset,
                                      end_char=offset + len(body), token_count=len(body.split()),
                                      content_hash=f"generated-{index}-{ordinal}", embedding=vector.tolist()))
            offset += len(body) + 1
        return doc, chunks


def nearest_neighbours(vectors: np.ndarray, k: int, block: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """Each unit vector's k nearest others by cosine (indices, one row each) and every vector's
    cosine to its nearest other, exactly, in blocks."""
    k = min(k, len(vectors) - 1)
    indices = np.empty((len(vectors), k), dtype=np.int64)
    nearest = np.empty(len(vectors), dtype=np.float32)
    for start in range(0, len(vectors), block):
        sims = vectors[start:start + block] @ vectors.T
        rows = np.arange(sims.shape[0])
        sims[rows, start + rows] = -np.inf  # not itself
        part = np.argpartition(-sims, k, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sims, part, axis=1), axis=1)
        indices[start:start + block] = np.take_along_axis(part, order, axis=1)
        nearest[start:start + block] = sims.max(axis=1)
    return indices, np.clip(nearest, -1.0, 1.0)


def real_documents(seed: Seed, collection: str) -> Iterator[tuple[DocumentRecord, list[ChunkRecord]]]:
    """The seed's documents as they were ingested (new ids; parents kept)."""
    for d in seed.documents:
        doc = DocumentRecord(collection=collection, source_uri=d.source_uri, title=d.title,
                             content_hash=d.content_hash, metadata=d.metadata)
        ids = [uuid.uuid4() for _ in d.chunks]
        yield doc, [ChunkRecord(id=ids[i], document_id=doc.id, parent_id=None if c.parent is None else ids[c.parent],
                                ordinal=c.ordinal, text=c.text, start_char=c.start_char, end_char=c.end_char,
                                token_count=c.token_count, content_hash=f"{d.content_hash}-{i}", metadata=c.metadata,
                                embedding=None if c.vector is None else c.vector.tolist())
                    for i, c in enumerate(d.chunks)]


async def build(store, seed: Seed, collection: str, chunks: int, *, batch_chunks: int = 2000,  # noqa: ANN001
                progress: Callable[[int], None] | None = None, rng_seed: int = 0,
                present: frozenset[str] = frozenset(), vectors: str = "local") -> float:
    """Write the seed's documents and generated ones until ``chunks`` searchable chunks; seconds taken.
    The documents are the same on every run (seeded), so a build cut short resumes: documents whose
    source URI is in ``present`` are counted but not written again (each batch commits whole)."""
    generator = Generator(seed, np.random.default_rng(rng_seed), vectors)
    started = time.perf_counter()
    written = 0
    batch: list[tuple[DocumentRecord, list[ChunkRecord]]] = []

    async def flush() -> None:
        if batch:
            await store.replace_documents(batch)
            batch.clear()

    def searchable(items: list[ChunkRecord]) -> int:
        return sum(c.embedding is not None for c in items)

    def documents() -> Iterator[tuple[DocumentRecord, list[ChunkRecord]]]:
        yield from real_documents(seed, collection)
        index = 0
        while written < chunks:
            yield generator.document(collection, index, chunks - written)
            index += 1

    pending = 0
    for item in documents():
        if item[0].source_uri in present:
            written += searchable(item[1])
            continue
        batch.append(item)
        pending += len(item[1])
        written += searchable(item[1])
        if pending >= batch_chunks:
            await flush()
            pending = 0
            if progress:
                progress(written)
    await flush()
    if progress:
        progress(written)
    return time.perf_counter() - started


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# The data dir's state, for a build that resumes and a load without the HNSW index.

async def source_uris(runtime) -> frozenset[str]:  # noqa: ANN001
    """The documents already in the collection (a build cut short resumes after them)."""
    async with runtime.db.engine.connect() as conn:
        rows = await conn.execute(text(
            "SELECT d.source_uri FROM documents d JOIN collections k ON k.id = d.collection_id "
            "WHERE k.name = :c"), {"c": SEED_COLLECTION})
        return frozenset(r[0] for r in rows)


async def chunk_count(runtime) -> int:  # noqa: ANN001
    async with runtime.db.engine.connect() as conn:
        return int((await conn.execute(text(
            "SELECT count(*) FROM chunks c JOIN collections k ON k.id = c.collection_id "
            "WHERE k.name = :c AND c.embedding IS NOT NULL"), {"c": SEED_COLLECTION})).scalar_one())


HNSW_INDEX = "ix_chunks_embedding_hnsw"
# The HNSW indexes a bulk load drops and rebuilds, each with the file that keeps its definition: the
# full-precision one (migration 0001) and the optional half-precision one (``ragsvc db half-index``),
# which would slow the load as much.
HNSW_INDEXES = ((HNSW_INDEX, "hnsw-index.sql"), (HALF_INDEX, "hnsw-half-index.sql"))


async def drop_hnsw(runtime, data_dir: Path) -> None:  # noqa: ANN001
    """Drop the HNSW indexes for a bulk load, keeping their definitions beside the data so that
    ``ensure_hnsw`` rebuilds the same indexes, also after a build cut short."""
    async with runtime.db.engine.begin() as conn:
        for name, saved in HNSW_INDEXES:
            definition = (await conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = :n"),
                                             {"n": name})).scalar_one_or_none()
            if definition is None:
                continue
            (data_dir / saved).write_text(definition)
            await conn.execute(text(f"DROP INDEX {name}"))


async def ensure_hnsw(runtime, data_dir: Path) -> float | None:  # noqa: ANN001
    """Build the HNSW indexes a bulk load dropped; seconds taken, or None when none was missing."""
    took: float | None = None
    for name, saved_name in HNSW_INDEXES:
        saved = data_dir / saved_name
        async with runtime.db.engine.begin() as conn:  # SET LOCAL: nothing stays on the pooled connection
            present = (await conn.execute(text("SELECT 1 FROM pg_indexes WHERE indexname = :n"),
                                          {"n": name})).scalar_one_or_none()
            if present or not saved.exists():
                continue
            log(f"building the HNSW index: {saved.read_text()}")
            started = time.perf_counter()
            # pgvector builds the graph in memory when it fits (about 2 GB for 1,000,000 x 384), else
            # on disk and far slower; one parallel worker beside the leader uses both cores.
            await conn.execute(text("SET LOCAL statement_timeout = 0"))  # the service's bound is for queries
            await conn.execute(text("SET LOCAL maintenance_work_mem = '4GB'"))
            await conn.execute(text("SET LOCAL max_parallel_maintenance_workers = 1"))
            await conn.execute(text(saved.read_text()))
            took = (took or 0.0) + time.perf_counter() - started
    return took


async def maintenance(runtime) -> float:  # noqa: ANN001
    """VACUUM ANALYZE (as autovacuum would for a long-running server); the database's size in MB."""
    async with runtime.db.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE"))
        return round(int((await conn.execute(text("SELECT pg_database_size(current_database())"))).scalar_one())
                     / 2**20, 1)
