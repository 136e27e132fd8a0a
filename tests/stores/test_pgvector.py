"""PgVectorStore against a real PostgreSQL + pgvector: the shared contract plus pgvector specifics."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter
from rag_service.stores.base import VectorStore
from rag_service.stores.pgvector import PgVectorStore
from tests.stores.contract import VectorStoreContract


class TestPgVectorStore(VectorStoreContract):
    @pytest.fixture(scope="class")
    @classmethod
    async def store(cls, database: Database) -> PgVectorStore:
        return PgVectorStore(database, ef_search=40)

    def test_satisfies_the_protocol(self, store: PgVectorStore) -> None:
        assert isinstance(store, VectorStore)


def _random_unit_vectors(rng: np.random.Generator, n: int, dim: int = 384) -> np.ndarray:
    """Shaped like sentence embeddings: a shared direction (they are anisotropic), 50 overlapping
    topics, and per-text noise. Fully separated random clusters would instead split the HNSW
    graph into islands, which real embeddings do not."""
    common = rng.normal(size=dim)
    centres = rng.normal(size=(50, dim))
    vectors = 0.8 * common + centres[rng.integers(0, 50, size=n)] + 1.2 * rng.normal(size=(n, dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.slow
async def test_vector_search_uses_the_hnsw_index_at_realistic_size(databases) -> None:
    url = databases.create()
    from rag_service.config import load_settings

    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db, ef_search=40)
    rng = np.random.default_rng(7)
    n_docs, per_doc = 200, 100  # 20,000 chunks
    vectors = _random_unit_vectors(rng, n_docs * per_doc)
    try:
        for d in range(n_docs):
            doc_id = await store.upsert_document(DocumentRecord(
                collection="big", source_uri=f"test://big/{d}", content_hash=str(d),
                acl=("team-a",) if d % 10 == 0 else ()))
            await store.upsert_chunks([
                ChunkRecord(document_id=doc_id, ordinal=i, text=f"chunk {d}-{i}", start_char=0, end_char=10,
                            token_count=2, content_hash=f"{d}-{i}", embedding=vectors[d * per_doc + i].tolist())
                for i in range(per_doc)
            ])
        async with db.engine.begin() as conn:
            await conn.execute(text("ANALYZE chunks; ANALYZE documents"))
        query = vectors[123] + 0.05 * rng.normal(size=384).astype(np.float32)
        flt = SearchFilter(collection="big", principals=("team-b",))
        plan = await store.explain(store.vector_query(query.tolist(), flt, 10, 384))
        assert "ix_chunks_embedding_hnsw" in plan, plan

        hits = await store.vector_search(query.tolist(), flt, 10)
        assert len(hits) == 10
        # Compare with exact search over what this caller may see: HNSW recall@10 must be high.
        visible = np.array([(i // per_doc) % 10 != 0 for i in range(len(vectors))])
        sims = vectors @ (query / np.linalg.norm(query))
        sims[~visible] = -np.inf
        exact = set(np.argsort(-sims)[:10].tolist())
        got = {int(h.text.split()[1].split("-")[0]) * per_doc + int(h.text.split("-")[1]) for h in hits}
        assert len(exact & got) >= 8, f"HNSW recall@10 = {len(exact & got) / 10}"
    finally:
        await db.dispose()


async def test_selective_filter_falls_back_to_exact_search(databases) -> None:
    """A filter that keeps few rows must still return them all, though HNSW filters late."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    url = databases.create()
    # Make the planner take the HNSW index even for this small table, as it would for a big one.
    engine = create_async_engine(url, connect_args={"options": "-c enable_seqscan=off -c enable_bitmapscan=off"})
    db = Database(url=url, engine=engine, sessions=async_sessionmaker(engine))
    store = PgVectorStore(db, ef_search=10)
    try:
        rng = np.random.default_rng(3)
        vectors = _random_unit_vectors(rng, 2000)
        doc_id = await store.upsert_document(DocumentRecord(collection="c", source_uri="test://many", content_hash="m"))
        await store.upsert_chunks([
            ChunkRecord(document_id=doc_id, ordinal=i, text=f"n{i}", start_char=0, end_char=2, token_count=1,
                        content_hash=str(i), embedding=vectors[i].tolist()) for i in range(2000)])
        rare = await store.upsert_document(DocumentRecord(collection="c", source_uri="test://rare", content_hash="r",
                                                          tags=("rare",)))
        rare_ids = [uuid.uuid4() for _ in range(5)]
        await store.upsert_chunks([
            ChunkRecord(id=cid, document_id=rare, ordinal=i, text=f"r{i}", start_char=0, end_char=2, token_count=1,
                        content_hash=f"r{i}", embedding=(-vectors[i]).tolist()) for i, cid in enumerate(rare_ids)])
        # With these indexes the planner would (rightly) find the 5 rows first; without them it
        # takes the HNSW index, as it does on big tables when it misjudges a filter.
        async with db.engine.begin() as conn:
            await conn.execute(text("DROP INDEX ix_chunks_document_ordinal; DROP INDEX ix_documents_tags"))
        flt = SearchFilter(tags_any=("rare",))
        statement = store.vector_query(vectors[0].tolist(), flt, 5, 384)
        assert "ix_chunks_embedding_hnsw" in await store.explain(statement)
        async with db.connect() as conn:
            await conn.execute(text("SET LOCAL hnsw.ef_search = 10"))
            index_only = (await conn.execute(statement)).all()
        assert len(index_only) < 5, "the index scan alone misses rows that the filter keeps"

        hits = await store.vector_search(vectors[0].tolist(), flt, 5)
        assert {h.chunk_id for h in hits} == set(rare_ids)
    finally:
        await db.dispose()
