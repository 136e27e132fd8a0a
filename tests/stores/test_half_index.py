"""The optional half-precision HNSW index (stores/pgvector/half.py, RAGSVC_VECTOR_INDEX=half): refused
clearly where pgvector lacks halfvec (the embedded 0.6.2), walked and scored in full precision where
it has it, and never in the way: configured but missing, search walks the full-precision index."""

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
from rag_service.stores.pgvector.half import (
    HALF_INDEX,
    build_half_index,
    check_memory,
    drop_half_index,
    require_half_support,
)
from tests.stores.test_pgvector import _database_preferring_indexes, _random_unit_vectors


def test_servers_without_halfvec_and_bad_memory_sizes_are_named() -> None:
    with pytest.raises(ConfigError, match="needs pgvector 0.7 or later; this server has 0.6.2"):
        require_half_support((0, 6, 2))
    require_half_support((0, 7, 0))
    assert check_memory("512MB") == "512MB" and check_memory("4GB") == "4GB"
    for bad in ("0MB", "64kB", "4G'; DROP TABLE chunks; --", "lots"):
        with pytest.raises(ConfigError, match="maintenance_work_mem"):
            check_memory(bad)


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
    # The planner takes HNSW at this small size only when told to and when no b-tree can serve
    # (as the iterative-scan test in test_pgvector.py does), as it would on a big table.
    preferring = _database_preferring_indexes(url)
    full = PgVectorStore(db, ef_search=40)
    try:
        rng = np.random.default_rng(11)
        vectors = _random_unit_vectors(rng, 2000)
        row = await _filled(full, vectors)
        async with db.engine.begin() as conn:
            await conn.execute(text("DROP INDEX ix_chunks_collection; DROP INDEX ix_chunks_document_ordinal"))
        schema = await full.schema()
        dim = schema.embedding_dimension
        query = vectors[5] + 0.05 * rng.normal(size=dim).astype(np.float32)
        flt = SearchFilter(collection="c")
        exact = await full.vector_search(query.tolist(), flt, 10, exact=True)
        half = PgVectorStore(preferring, ef_search=40, vector_index="half")
        # Configured but missing: refused at start-up, and search walks the full-precision index meanwhile.
        refusal = "ragsvc db half-index" if schema.halfvec else "pgvector 0.7 or later"
        with pytest.raises(ConfigError, match=refusal):
            await half.check_vector_index()
        assert [h.chunk_id for h in await half.vector_search(query.tolist(), flt, 10)] == [h.chunk_id for h in exact]
        if not schema.halfvec:
            pytest.skip(f"the half-precision index needs pgvector 0.7+ (this server: {schema.pgvector_version})")
        assert await build_half_index(db, dim, m=16, ef_construction=64) is not None
        assert await build_half_index(db, dim, m=16, ef_construction=64) is None  # already there
        half = PgVectorStore(preferring, ef_search=40, vector_index="half")
        await half.check_vector_index()
        plan = await half.explain(half.vector_query(query.tolist(), flt, 10, dim, half=True))
        assert f"using {HALF_INDEX} on" in plan, plan
        got = await half.vector_search(query.tolist(), flt, 10)
        assert len({h.chunk_id for h in got} & {h.chunk_id for h in exact}) >= 8
        unit = query / np.linalg.norm(query)
        for hit in got:  # the full-precision cosine, not the half-precision one, and in its order
            assert hit.score == pytest.approx(float(vectors[row[hit.chunk_id]] @ unit), abs=1e-5)
        assert [h.score for h in got] == sorted((h.score for h in got), reverse=True)
        assert await drop_half_index(db) and not await drop_half_index(db)
    finally:
        await preferring.dispose()
        await db.dispose()
