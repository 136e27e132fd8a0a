"""PgVectorStore against a real PostgreSQL + pgvector: the shared contracts (core and every
capability) plus what only pgvector has: single-document and chunk upserts, and the catalog's
counts over the same tables."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from sqlalchemy import text

from rag_service.db.engine import Database
from rag_service.db.repos.catalog import DocumentCatalog
from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter
from rag_service.errors import InvalidInputError
from rag_service.stores.base import KeywordSearch, MetadataSearch, PatternSearch, VectorStore
from rag_service.stores.pgvector import PgVectorStore
from tests.stores.contract import VectorStoreContract
from tests.stores.corpus import CORPUS, new_collection
from tests.stores.keyword_contract import KeywordSearchContract
from tests.stores.metadata_contract import MetadataSearchContract
from tests.stores.pattern_contract import PatternSearchContract


class TestPgVectorStore(VectorStoreContract, KeywordSearchContract, MetadataSearchContract, PatternSearchContract):
    @pytest.fixture(scope="class")
    @classmethod
    async def store(cls, database: Database) -> PgVectorStore:
        return PgVectorStore(database, ef_search=40)

    @pytest.fixture(scope="class")
    @classmethod
    def catalog(cls, database: Database) -> DocumentCatalog:
        return DocumentCatalog(database)

    def test_satisfies_the_protocols(self, store: PgVectorStore) -> None:
        for protocol in (VectorStore, KeywordSearch, MetadataSearch, PatternSearch):
            assert isinstance(store, protocol), protocol.__name__

    async def test_keyword_query_keys_equate_what_bm25_reads_alike(self, store: PgVectorStore) -> None:
        """Stopwords, word order and the hyphens of a hyphenated word (PostgreSQL indexes its parts
        too) do not change the key; another word, an exclusion, a quoted phrase, or a hyphen the
        parser reads otherwise (a signed number, a host name) does."""
        texts = ["What is a sex-determining gene?", "sex determining gene", "gene determining sex",
                 "sex gene", "sex determining gene -mouse", 'sex "determining gene"', "sex-determining-gene",
                 "2-3 genes", "2 3 genes", "foo-bar.com", "foo bar.com"]
        keys = await store.keyword_query_keys(texts)
        assert keys[0] == keys[1] == keys[2] == keys[6]
        assert len({keys[0], keys[3], keys[4], keys[5]}) == 4
        assert keys[7] != keys[8] and keys[9] != keys[10]

    # --- pgvector only: upsert_document / upsert_chunks, and the catalog over the same tables ---

    async def test_counts_after_upsert(self, catalog: DocumentCatalog, corpus) -> None:
        counts = await catalog.counts()
        assert counts.documents >= len(CORPUS)
        assert counts.chunks >= 2 * len(CORPUS)
        # Parent chunks (no embedding) stored by the contracts' tests, which run first, make
        # embedded_chunks < chunks store-wide; the corpus' own collections must be fully embedded.
        by_collection = {c: sum(len(d.texts) for d in CORPUS if d.collection == c) for c in ("kb", "other")}
        for collection, chunks in by_collection.items():
            assert await catalog.searchable_chunks(collection) == chunks, collection
        assert counts.embedded_chunks == await catalog.searchable_chunks(None)

    async def test_reupsert_is_idempotent_and_updates(self, store: PgVectorStore, catalog: DocumentCatalog,
                                                      embed) -> None:
        collection = new_collection()
        doc = DocumentRecord(collection=collection, source_uri="test://idem", content_hash="h1")
        doc_id = await store.upsert_document(doc)
        again = await store.upsert_document(doc.model_copy(update={"id": uuid.uuid4(), "content_hash": "h2"}))
        assert again == doc_id, "the same source_uri in the same collection is the same document"
        chunk = ChunkRecord(document_id=doc_id, ordinal=0, text="alpha beta gamma", start_char=0, end_char=16,
                            token_count=3, content_hash="x", embedding=embed("alpha beta gamma"))
        before = await catalog.counts()
        await store.upsert_chunks([chunk])
        await store.upsert_chunks([chunk])
        await store.upsert_chunks([chunk, chunk])
        after = await catalog.counts()
        assert after.chunks == before.chunks + 1
        changed = chunk.model_copy(update={"text": "delta epsilon", "embedding": embed("delta epsilon")})
        await store.upsert_chunks([changed])
        hits = await store.text_search("epsilon", SearchFilter(collection=collection), 5)
        assert [h.chunk_id for h in hits] == [chunk.id]
        assert await store.text_search("gamma", SearchFilter(collection=collection), 5) == []

    async def test_chunks_of_unknown_document_are_refused_whole(self, store: PgVectorStore,
                                                                catalog: DocumentCatalog, embed) -> None:
        before = await catalog.counts()
        good_doc = await store.upsert_document(
            DocumentRecord(collection="kb-orphans", source_uri="test://good", content_hash="g"))
        chunks = [
            ChunkRecord(document_id=good_doc, ordinal=0, text="fine", start_char=0, end_char=4, token_count=1,
                        content_hash="a", embedding=embed("fine")),
            ChunkRecord(document_id=uuid.uuid4(), ordinal=0, text="orphan", start_char=0, end_char=6,
                        token_count=1, content_hash="b", embedding=embed("orphan")),
        ]
        with pytest.raises(InvalidInputError, match="do not exist"):
            await store.upsert_chunks(chunks)
        assert (await catalog.counts()).chunks == before.chunks

    async def test_upsert_chunks_refuses_wrong_dimension(self, store: PgVectorStore, corpus) -> None:
        doc_id = next(iter(corpus))
        bad = ChunkRecord(document_id=doc_id, ordinal=9, text="x", start_char=0, end_char=1, token_count=1,
                          content_hash="x", embedding=[0.1] * 10)
        with pytest.raises(InvalidInputError, match="384"):
            await store.upsert_chunks([bad])

    async def test_catalog_sees_searchable_chunks_and_collections(self, store: PgVectorStore,
                                                                  catalog: DocumentCatalog, embed) -> None:
        collection = new_collection()
        doc_id = await store.upsert_document(DocumentRecord(collection=collection, source_uri="t://b",
                                                            content_hash="b"))
        texts = ["zebra zebra lion", "zebra", "lion tiger"]
        await store.upsert_chunks([
            ChunkRecord(document_id=doc_id, ordinal=i, text=t, start_char=0, end_char=len(t),
                        token_count=len(t.split()), content_hash=str(i), embedding=embed(t))
            for i, t in enumerate(texts)])
        assert await catalog.searchable_chunks(collection) == 3
        assert await catalog.collection_exists(collection) and not await catalog.collection_exists(collection + "x")

    async def test_keyword_index_follows_updates_and_deletes(self, store: PgVectorStore,
                                                             catalog: DocumentCatalog, embed) -> None:
        collection = new_collection()
        flt = SearchFilter(collection=collection)
        doc = DocumentRecord(collection=collection, source_uri="t://k", content_hash="k1")
        doc_id = await store.upsert_document(doc)
        chunk = ChunkRecord(document_id=doc_id, ordinal=0, text="walrus colony", start_char=0, end_char=13,
                            token_count=2, content_hash="w", embedding=embed("walrus colony"))
        await store.upsert_chunks([chunk])
        assert [h.chunk_id for h in await store.keyword_search("walrus", flt, 5)] == [chunk.id]
        await store.upsert_chunks([chunk.model_copy(update={"text": "penguin colony"})])
        assert await store.keyword_search("walrus", flt, 5) == []
        assert len(await store.keyword_search("penguin", flt, 5)) == 1
        replacement = chunk.model_copy(update={"id": uuid.uuid4(), "text": "seal pup"})
        await store.replace_documents([(doc.model_copy(update={"id": doc_id}), [replacement])])
        assert await store.keyword_search("penguin", flt, 5) == []
        assert [h.chunk_id for h in await store.keyword_search("seal", flt, 5)] == [replacement.id]
        assert await catalog.searchable_chunks(collection) == 1
        await store.delete_document(doc_id)
        assert await store.keyword_search("seal", flt, 5) == []
        assert await catalog.searchable_chunks(collection) == 0

    async def test_upsert_document_refuses_reusing_an_id_for_another_source(self, store: PgVectorStore) -> None:
        doc = DocumentRecord(collection=new_collection(), source_uri="test://first", content_hash="f")
        await store.upsert_document(doc)
        with pytest.raises(InvalidInputError):
            await store.upsert_document(doc.model_copy(update={"source_uri": "test://second"}))


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
    from rag_service.config import Settings, load_settings

    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db, ef_search=Settings.model_fields["hnsw_ef_search"].default)  # the service's default
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
        flt = SearchFilter(collection="big", principals=("team-b",))
        visible = np.array([(i // per_doc) % 10 != 0 for i in range(len(vectors))])
        # Recall is averaged over 20 queries: pgvector draws each node's graph level at random
        # (unseeded), and one query in an unlucky build can miss its neighbourhood entirely (it
        # happened once at ef_search 40: recall 0.0 on a single query); one such query is allowed.
        recalls = []
        for source in rng.choice(np.flatnonzero(visible), size=20, replace=False):
            query = vectors[source] + 0.05 * rng.normal(size=384).astype(np.float32)
            if not recalls:
                plan = await store.explain(store.vector_query(query.tolist(), flt, 10, 384))
                assert "ix_chunks_embedding_hnsw" in plan, plan
            hits = await store.vector_search(query.tolist(), flt, 10)
            assert len(hits) == 10
            # Against exact search over what this caller may see.
            sims = vectors @ (query / np.linalg.norm(query))
            sims[~visible] = -np.inf
            exact = set(np.argsort(-sims)[:10].tolist())
            got = {int(h.text.split()[1].split("-")[0]) * per_doc + int(h.text.split("-")[1]) for h in hits}
            recalls.append(len(exact & got) / 10)
        assert np.mean(recalls) >= 0.95 and sum(r < 0.8 for r in recalls) <= 1, f"HNSW recall@10: {recalls}"
    finally:
        await db.dispose()


def _database_preferring_indexes(url: str) -> Database:
    """Make the planner take the HNSW index even for a small table, as it would for a big one."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    engine = create_async_engine(url, connect_args={"options": "-c enable_seqscan=off -c enable_bitmapscan=off"})
    return Database(url=url, engine=engine, sessions=async_sessionmaker(engine))


async def test_selective_filter_falls_back_to_exact_search(databases) -> None:
    """A filter that keeps few rows must still return them all, though HNSW filters late."""
    db = _database_preferring_indexes(databases.create())
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


async def test_the_stores_ef_search_is_set_once_per_connection(databases) -> None:
    """Its own hnsw.ef_search is set for the connection's session once, not before every search
    (a round trip each); a wider one for a top k above it stays local to that search."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    url = databases.create()
    engine = create_async_engine(url, connect_args={"options": "-c enable_seqscan=off -c enable_bitmapscan=off"})
    db = Database(url=url, engine=engine, sessions=async_sessionmaker(engine))
    store = PgVectorStore(db, ef_search=10)
    sets: list[str] = []
    try:
        vectors = _random_unit_vectors(np.random.default_rng(11), 40)
        doc = await store.upsert_document(DocumentRecord(collection="c", source_uri="test://ef", content_hash="e"))
        await store.upsert_chunks([
            ChunkRecord(document_id=doc, ordinal=i, text=f"e{i}", start_char=0, end_char=2, token_count=1,
                        content_hash=str(i), embedding=vectors[i].tolist()) for i in range(40)])
        await engine.dispose()  # a fresh pool: the searches, one at a time, all take its one new connection
        event.listen(engine.sync_engine, "before_cursor_execute",
                     lambda _c, _cur, statement, *_: sets.append(statement) if statement.startswith("SET") else None)
        flt = SearchFilter(collection="c")
        first = await store.vector_search(vectors[3].tolist(), flt, 5)
        again = await store.vector_search(vectors[3].tolist(), flt, 5)
        wide = await store.vector_search(vectors[3].tolist(), flt, 30)
        after = await store.vector_search(vectors[3].tolist(), flt, 5)
        assert sets == ["SET hnsw.ef_search = 10", "SET LOCAL hnsw.ef_search = 30"]
        assert first[0].text == "e3" and [h.chunk_id for h in again] == [h.chunk_id for h in first]
        assert [h.chunk_id for h in after] == [h.chunk_id for h in first]
        assert len(wide) == 30 and wide[0].text == "e3"
        async with db.connect() as conn:  # the wider value ended with its search
            assert (await conn.execute(text("SHOW hnsw.ef_search"))).scalar_one() == "10"
    finally:
        await db.dispose()


def test_widened_ef_search_follows_the_share_the_filter_kept() -> None:
    from rag_service.stores.pgvector.search import HNSW_MAX_EF_SEARCH, widened_ef_search

    assert widened_ef_search(40, 4, 10) == 150      # kept 10%: 1.5 x 10 / 0.1
    assert widened_ef_search(100, 50, 100) == 300   # kept half: three times as deep
    assert widened_ef_search(40, 0, 10) is None     # under 1/40 of the rows: scan them exactly
    assert widened_ef_search(40, 10, 10) is None    # nothing missing
    assert widened_ef_search(40, 1, 100) is None    # past pgvector's bound: exact
    assert widened_ef_search(100, 10, 100) is None  # 1,500 wanted: exact
    assert widened_ef_search(HNSW_MAX_EF_SEARCH, 500, 1000) is None  # cannot go wider


def test_the_second_scan_widens_where_it_fits_then_iterates_then_scans_exactly() -> None:
    from rag_service.stores.pgvector.search import ITERATIVE_EF_SEARCH, second_scan

    assert second_scan(100, 10, 10, iterative=True) is None                 # filled: nothing more
    assert second_scan(40, 4, 10, iterative=True) == ("widen", 150)         # widening fits: on any server
    assert second_scan(40, 4, 10, iterative=False) == ("widen", 150)
    # Kept 10 of 100 for top 100 (a 10% filter): widening would pass pgvector's bound.
    assert second_scan(100, 10, 100, iterative=True) == ("iterative", ITERATIVE_EF_SEARCH)
    assert second_scan(100, 10, 100, iterative=False) is None               # before 0.8: exact
    # Kept 1 of 100 (about 1%, from a single row): the exact scan, faster and exact for such filters.
    assert second_scan(100, 1, 10, iterative=True) is None
    assert second_scan(100, 0, 10, iterative=True) is None
    assert second_scan(1000, 60, 1000, iterative=True) == ("iterative", 1000)


async def test_a_filter_keeping_an_eighth_for_a_wide_top_k_uses_the_iterative_scan(databases) -> None:
    """On pgvector 0.8: top 200 under a filter keeping 1/8 of the rows leaves about 25 of 200
    candidates, too few to widen within pgvector's bound and enough to show the filter is not
    selective: the iterative scan answers, with all 200 rows the filter keeps nearest."""
    db = _database_preferring_indexes(databases.create())
    store = PgVectorStore(db, ef_search=10)
    try:
        if not (await store.schema()).iterative_scans:
            pytest.skip("iterative scans need pgvector 0.8 (the embedded server has 0.6.2)")
        rng = np.random.default_rng(7)
        vectors = _random_unit_vectors(rng, 2000)
        tagged: set[uuid.UUID] = set()
        for d in range(8):
            doc = await store.upsert_document(DocumentRecord(
                collection="c", source_uri=f"test://{d}", content_hash=str(d), tags=("some",) if d == 0 else ()))
            ids = [uuid.uuid4() for _ in range(250)]
            await store.upsert_chunks([
                ChunkRecord(id=cid, document_id=doc, ordinal=i, text=f"{d}-{i}", start_char=0, end_char=3,
                            token_count=1, content_hash=f"{d}-{i}", embedding=vectors[d * 250 + i].tolist())
                for i, cid in enumerate(ids)])
            if d == 0:
                tagged.update(ids)
        async with db.engine.begin() as conn:
            await conn.execute(text("DROP INDEX ix_chunks_document_ordinal; DROP INDEX ix_documents_tags"))
        flt = SearchFilter(tags_any=("some",))
        hits = await store.vector_search(vectors[7].tolist(), flt, 200)
        assert (store.vector_iterative, store.vector_widened, store.vector_exact_fallbacks) == (1, 0, 0)
        assert len(hits) == 200 and {h.chunk_id for h in hits} <= tagged
    finally:
        await db.dispose()


async def test_a_filter_keeping_a_quarter_widens_the_index_scan(databases) -> None:
    """A filter keeping a quarter of the rows leaves about a quarter of the index's candidates: the
    store asks the index again, deeper, instead of scanning exactly (on every pgvector)."""
    db = _database_preferring_indexes(databases.create())
    store = PgVectorStore(db, ef_search=10)
    try:
        rng = np.random.default_rng(5)
        vectors = _random_unit_vectors(rng, 2000)
        tagged: set[uuid.UUID] = set()
        for d in range(8):
            doc = await store.upsert_document(DocumentRecord(
                collection="c", source_uri=f"test://{d}", content_hash=str(d), tags=("some",) if d < 2 else ()))
            ids = [uuid.uuid4() for _ in range(250)]
            await store.upsert_chunks([
                ChunkRecord(id=cid, document_id=doc, ordinal=i, text=f"{d}-{i}", start_char=0, end_char=3,
                            token_count=1, content_hash=f"{d}-{i}", embedding=vectors[d * 250 + i].tolist())
                for i, cid in enumerate(ids)])
            if d < 2:
                tagged.update(ids)
        async with db.engine.begin() as conn:
            await conn.execute(text("DROP INDEX ix_chunks_document_ordinal; DROP INDEX ix_documents_tags"))
        flt = SearchFilter(tags_any=("some",))
        assert "ix_chunks_embedding_hnsw" in await store.explain(store.vector_query(vectors[7].tolist(), flt, 8, 384))

        hits = await store.vector_search(vectors[7].tolist(), flt, 8)  # a tagged chunk's own vector
        assert store.vector_widened == 1
        assert len(hits) == 8 and {h.chunk_id for h in hits} <= tagged
        assert hits[0].text == "0-7"
    finally:
        await db.dispose()


async def test_each_new_connection_gets_pgvector_types_without_new_classes(database: Database) -> None:
    """pgvector's own registration makes new dumper classes for every connection, and psycopg keeps
    every dumper class it is given for the life of the process: with the pool opening and closing
    overflow connections under load, that was the server's steady memory growth (issue 14). Each new
    connection must get the same classes, and vectors must still go both ways, in text and binary."""
    import psycopg
    from pgvector import Vector
    from psycopg.adapt import PyFormat

    from rag_service.db.engine import libpq_conninfo
    from rag_service.stores.pgvector.connection import register_vector_types

    dumpers: set[type] = set()
    for _ in range(3):
        async with await psycopg.AsyncConnection.connect(libpq_conninfo(database.url)) as raw:
            await register_vector_types(raw)
            dumpers |= {raw.adapters.get_dumper(kind, fmt) for kind in (Vector, np.ndarray)
                        for fmt in (PyFormat.TEXT, PyFormat.BINARY)}
            sent = np.array([0.5, -1.0, 2.0], dtype=np.float32)
            for binary in (False, True):
                async with raw.cursor(binary=binary) as cur:
                    await cur.execute("SELECT %s::vector, %b::vector", (sent, Vector(sent.tolist())))
                    got = await cur.fetchone()
                assert [v.to_numpy().tolist() for v in got] == [sent.tolist()] * 2
    assert len(dumpers) == 2, "one text and one binary dumper class, shared by every connection"
