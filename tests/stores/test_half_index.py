"""The optional half-precision HNSW index (stores/pgvector/half.py, RAGSVC_VECTOR_INDEX=half): refused
clearly where pgvector lacks halfvec (the embedded 0.6.2), used and kept exact-scored where it has it."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from sqlalchemy import text

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter
from rag_service.errors import ConfigError
from rag_service.stores.pgvector import PgVectorStore
from rag_service.stores.pgvector.half import HALF_INDEX, build_half_index, drop_half_index, require_half_support
from tests.stores.test_pgvector import _database_preferring_indexes, _random_unit_vectors


def test_servers_without_halfvec_are_named() -> None:
    with pytest.raises(ConfigError, match="needs pgvector 0.7 or later; this server has 0.6.2"):
        require_half_support((0, 6, 2))
    require_half_support((0, 7, 0))
    require_half_support((0, 8, 5))


async def _filled(store: PgVectorStore, vectors: np.ndarray) -> dict[uuid.UUID, int]:
    doc = await store.upsert_document(DocumentRecord(collection="c", source_uri="test://half", content_hash="h"))
    ids = [uuid.uuid4() for _ in vectors]
    await store.upsert_chunks([
        ChunkRecord(id=cid, document_id=doc, ordinal=i, text=f"n{i}", start_char=0, end_char=2, token_count=1,
                    content_hash=str(i), embedding=vectors[i].tolist()) for i, cid in enumerate(ids)])
    return {cid: i for i, cid in enumerate(ids)}


async def test_the_half_index_is_walked_and_scores_stay_full_precision(databases) -> None:
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    full, half = PgVectorStore(db, ef_search=40), PgVectorStore(db, ef_search=40, vector_index="half")
    try:
        rng = np.random.default_rng(11)
        vectors = _random_unit_vectors(rng, 2000)
        row = await _filled(full, vectors)
        schema = await full.schema()
        if schema.pgvector_version < (0, 7):
            # The embedded server: asking for the half index is a configuration error that says why.
            with pytest.raises(ConfigError, match="pgvector 0.7 or later"):
                await half.vector_search(vectors[0].tolist(), SearchFilter(collection="c"), 10)
            return
        with pytest.raises(ConfigError, match="ragsvc db half-index"):
            await half.vector_search(vectors[0].tolist(), SearchFilter(collection="c"), 10)
        assert await build_half_index(db, schema.embedding_dimension) is not None
        assert await build_half_index(db, schema.embedding_dimension) is None  # already there
        half = PgVectorStore(db, ef_search=40, vector_index="half")  # reads the schema again
        query = vectors[5] + 0.05 * rng.normal(size=384).astype(np.float32)
        flt = SearchFilter(collection="c")
        # The planner takes HNSW at this small size only when told to and when no b-tree can serve
        # (as the iterative-scan test in test_pgvector.py does), as it would on a big table.
        async with db.engine.begin() as conn:
            await conn.execute(text("DROP INDEX ix_chunks_collection; DROP INDEX ix_chunks_document_ordinal"))
        preferring = _database_preferring_indexes(url)
        try:
            plan = await PgVectorStore(preferring, vector_index="half").explain(
                half.vector_query(query.tolist(), flt, 10, 384))
        finally:
            await preferring.dispose()
        assert HALF_INDEX in plan, plan
        got, want = await half.vector_search(query.tolist(), flt, 10), await full.vector_search(query.tolist(), flt, 10)
        assert len({h.chunk_id for h in got} & {h.chunk_id for h in want}) >= 8
        unit = query / np.linalg.norm(query)
        for hit in got:  # the full-precision cosine, not the half-precision one
            assert hit.score == pytest.approx(float(vectors[row[hit.chunk_id]] @ unit), abs=1e-5)
        assert await drop_half_index(db) and not await drop_half_index(db)
    finally:
        await db.dispose()
