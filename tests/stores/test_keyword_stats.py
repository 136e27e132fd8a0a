"""Keyword statistics without a hot row (issue 15): writers append deltas to ``keyword_stats``
and readers sum them, so parallel writers keep exact counts and never wait for each other."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
from sqlalchemy import text

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.domain import ChunkRecord, DocumentRecord
from rag_service.stores.pgvector import PgVectorStore


async def _write(store: PgVectorStore, collection: str, texts: list[str], vector: list[float],
                 prefix: str = "doc") -> list[uuid.UUID]:
    """One document of one chunk per text, in batches of 500; the documents' ids."""
    batch, ids = [], []
    for i, body in enumerate(texts):
        doc = DocumentRecord(collection=collection, source_uri=f"{prefix}/{i}", content_hash=str(i))
        ids.append(doc.id)
        batch.append((doc, [ChunkRecord(document_id=doc.id, ordinal=0, text=body, start_char=0, end_char=len(body),
                                        token_count=len(body.split()), content_hash=str(i), embedding=vector)]))
        if len(batch) == 500:
            await store.replace_documents(batch)
            batch = []
    if batch:
        await store.replace_documents(batch)
    return ids


_VOCABULARY = [f"w{i}" for i in range(400)]


async def _counts(db: Database, collection: str) -> tuple[dict[str, int], dict[str, int], tuple, tuple]:
    """The postings' and the chunks' own term counts, the summed statistics and the chunks' own."""
    async with db.engine.connect() as conn:
        cid = (await conn.execute(text("SELECT id FROM collections WHERE name = :c"), {"c": collection})).scalar_one()
        postings = dict((await conn.execute(text(
            "SELECT term, count(*) FROM keyword_postings WHERE collection_id = :c GROUP BY term"), {"c": cid})).all())
        terms = dict((await conn.execute(text(
            "SELECT t.lexeme, count(*) FROM chunks, unnest(tsv) t WHERE collection_id = :c "
            "AND embedding IS NOT NULL GROUP BY t.lexeme"), {"c": cid})).all())
        stats = tuple((await conn.execute(text(
            "SELECT sum(chunk_count), sum(total_length) FROM keyword_stats WHERE collection_id = :c"),
            {"c": cid})).one())
        actual = tuple((await conn.execute(text(
            "SELECT count(*), coalesce(sum((SELECT sum(coalesce(array_length(u.positions, 1), 1)) "
            "FROM unnest(tsv) u)), 0) FROM chunks WHERE collection_id = :c AND embedding IS NOT NULL"),
            {"c": cid})).one())
    return postings, terms, tuple(int(v) for v in stats), tuple(int(v) for v in actual)


async def test_parallel_writers_keep_exact_statistics(databases, local_embedder) -> None:
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db)
    vector = local_embedder.encode(["writer"])[0].tolist()
    try:
        async def writer(n: int) -> None:
            rng = np.random.default_rng(n)
            ids = []
            for round_ in range(5):
                texts = [" ".join(rng.choice(_VOCABULARY[:50], size=20)) for _ in range(20)]
                ids += await _write(store, "shared", texts, vector, prefix=f"writer{n}/{round_}")
            for doc_id in ids[:5]:  # deltas go both ways
                await store.delete_document(doc_id)

        await asyncio.gather(*[writer(n) for n in range(8)])
        postings, terms, stats, actual = await _counts(db, "shared")
        assert postings == terms and stats == actual
        assert actual[0] == 8 * (5 * 20 - 5)
        # The fold leaves one row per collection, with the same sums.
        await store.fold_keyword_deltas()
        async with db.engine.connect() as conn:
            rows = (await conn.execute(text(
                "SELECT count(*) FROM keyword_stats s JOIN collections c ON c.id = s.collection_id "
                "WHERE c.name = 'shared'"))).scalar_one()
        assert rows == 1 and (await _counts(db, "shared"))[2] == actual
    finally:
        await db.dispose()


async def test_a_writer_never_waits_for_another_writers_statistics(databases, local_embedder) -> None:
    """Two open transactions write chunks of the same collection: the second does not wait for the
    first (one row per collection did: it was locked until the first committed)."""
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db)
    vector = local_embedder.encode(["concurrent"])[0].tolist()
    try:
        await _write(store, "hot", ["w0 w1 first"], vector, prefix="seed")
        first = DocumentRecord(collection="hot", source_uri="a", content_hash="a")
        second = DocumentRecord(collection="hot", source_uri="b", content_hash="b")
        async with db.engine.begin() as holder:
            await store._upsert_documents(holder, [first])
            await store._write_chunks(holder, [ChunkRecord(document_id=first.id, ordinal=0, text="w0 w1 open",
                                                           start_char=0, end_char=10, token_count=3, content_hash="a",
                                                           embedding=vector)])
            async with db.engine.begin() as other:
                await other.execute(text("SET LOCAL lock_timeout = '2s'"))
                await store._upsert_documents(other, [second])
                await store._write_chunks(other, [ChunkRecord(document_id=second.id, ordinal=0, text="w0 w1 other",
                                                              start_char=0, end_char=11, token_count=3,
                                                              content_hash="b", embedding=vector)])
        await store.fold_keyword_deltas()
        postings, terms, stats, actual = await _counts(db, "hot")
        assert postings == terms and stats == actual and actual[0] == 3
    finally:
        await db.dispose()


async def test_each_posting_holds_its_chunks_term_frequency_and_length(databases, local_embedder) -> None:
    """The insert and update triggers compute a chunk's length once for all its postings (migration
    0015); every posting must still carry its own chunk's length and the term's count in it, after
    an insert and after an update of the chunks' text (ON CONFLICT DO UPDATE)."""
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db)
    vector = local_embedder.encode(["lengths"])[0].tolist()
    docs = [DocumentRecord(collection="lengths", source_uri=f"doc/{i}", content_hash=str(i)) for i in range(4)]

    def chunks(texts: list[str]) -> list[ChunkRecord]:
        return [ChunkRecord(id=uuid.uuid5(doc.id, "0"), document_id=doc.id, ordinal=0, text=body, start_char=0,
                            end_char=len(body), token_count=len(body.split()), content_hash=body, embedding=vector)
                for doc, body in zip(docs, texts, strict=True)]

    async def postings() -> set[tuple]:
        async with db.engine.connect() as conn:
            return set((await conn.execute(text(
                "SELECT d.source_uri, p.term, p.tf, p.chunk_length FROM keyword_postings p "
                "JOIN documents d ON d.id = p.document_id WHERE d.collection_id = "
                "(SELECT id FROM collections WHERE name = 'lengths')"))).all())

    def expected(texts: list[str]) -> set[tuple]:
        return {(f"doc/{i}", word, body.split().count(word), len(body.split()))
                for i, body in enumerate(texts) for word in set(body.split())}

    first = ["w1 w1 w1 w2", "w2 w3 w4 w5 w6 w7 w8", "w9", "w1 w2 w1 w2 w1 w2 w3 w3 w10 w11 w12 w13"]
    second = ["w5 w5", "w2 w3", "w9 w9 w9 w1 w2", "w13"]
    try:
        await store.replace_documents([(doc, [chunk]) for doc, chunk in zip(docs, chunks(first), strict=True)])
        assert await postings() == expected(first)
        await store.upsert_chunks(chunks(second))  # the same ids: the update trigger
        assert await postings() == expected(second)
        _, _, stats, actual = await _counts(db, "lengths")
        assert stats == actual == (4, 2 + 2 + 5 + 1)
    finally:
        await db.dispose()


def test_iterative_scans_are_used_from_pgvector_0_8() -> None:
    from rag_service.stores.pgvector.connection import SchemaInfo, parse_version

    assert parse_version("0.8.0") == (0, 8, 0) and parse_version("0.6.2") == (0, 6, 2)
    assert parse_version(None) == (0,) and parse_version("1.0beta") == (0,)
    schema = SchemaInfo(384, "english", True, parse_version("0.6.2"))
    assert not schema.iterative_scans
    assert SchemaInfo(384, "english", True, parse_version("0.8.1")).iterative_scans
