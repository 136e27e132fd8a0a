"""BM25 that does not read whole posting lists (issue 15): the threshold algorithm returns exactly
the exhaustive BM25's top k, and the keyword statistics have no row that writers wait on."""

from __future__ import annotations

import asyncio
import json
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from rag_service.config import load_settings
from rag_service.db.engine import Database
from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter, SearchHit
from rag_service.stores.pgvector import PgVectorStore
from tests.conftest import SHARED_DATA


def assert_same_top_k(fast: list[SearchHit], exact: list[SearchHit]) -> None:
    """Same chunks in the same order with the same scores (to rounding); chunks whose scores tie
    may swap, and a tie at the last place may bring in another chunk of that score."""
    assert len(fast) == len(exact)
    np.testing.assert_allclose([h.score for h in fast], [h.score for h in exact], rtol=1e-9)
    for got, want in zip(fast, exact, strict=True):
        if got.chunk_id != want.chunk_id:
            tied = [h for h in exact if h.chunk_id == got.chunk_id] or [exact[-1]]
            assert abs(tied[0].score - got.score) <= 1e-9 * max(1.0, abs(got.score)), (got, want)


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


@pytest.fixture(scope="module")
async def scifact_store(databases, local_embedder):
    """SciFact's 5,183 documents, one chunk each (title and text); the vector is irrelevant here."""
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db, keyword_exhaustive_below=0)  # the threshold path at any size
    rows = [json.loads(line) for line in (SHARED_DATA / "scifact" / "corpus.jsonl").read_text().splitlines()]
    vector = local_embedder.encode(["scientific claim"])[0].tolist()
    await _write(store, "scifact", [f"{r['title']}. {r['text']}" for r in rows], vector)
    async with db.engine.connect() as conn:
        await (await conn.execution_options(isolation_level="AUTOCOMMIT")).execute(text("VACUUM ANALYZE"))
    yield store
    await db.dispose()


@pytest.mark.parametrize("top_k", [10, 100])
async def test_threshold_top_k_is_the_exhaustive_bm25_on_scifact(scifact_store: PgVectorStore, top_k: int) -> None:
    queries = [json.loads(line)["text"] for line in (SHARED_DATA / "scifact" / "queries.jsonl").read_text()
               .splitlines()][:400]
    flt = SearchFilter(collection="scifact")
    before = scifact_store.keyword_paths.copy()
    for query in queries:
        assert_same_top_k(await scifact_store.keyword_search(query, flt, top_k),
                          await scifact_store.keyword_search(query, flt, top_k, exhaustive=True))
    used = scifact_store.keyword_paths - before
    # Not vacuous: the proof from the best postings decides some of them (the rest read every posting).
    assert used["threshold proved"] >= 0.1 * len(queries), used


_VOCABULARY = [f"w{i}" for i in range(400)]
_WEIGHTS = 1 / np.arange(1, len(_VOCABULARY) + 1)  # Zipf: w0 is in most chunks, w399 in few


@pytest.fixture(scope="module")
async def zipf_store(databases, local_embedder):
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db, keyword_exhaustive_below=0)  # the threshold path at any size
    rng = np.random.default_rng(11)
    texts = [" ".join(rng.choice(_VOCABULARY, size=int(rng.integers(3, 120)), p=_WEIGHTS / _WEIGHTS.sum()))
             for _ in range(3000)]
    await _write(store, "zipf", texts, local_embedder.encode(["zipf"])[0].tolist())
    # Filters: every third document is visible to one principal only.
    async with db.engine.begin() as conn:
        await conn.execute(text("UPDATE documents SET acl = ARRAY['team-a'] WHERE source_uri ~ '[0369]$'"))
    yield store
    await db.dispose()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(_VOCABULARY[:40] + _VOCABULARY[-40:]), min_size=1, max_size=8),
       top_k=st.sampled_from([1, 5, 20, 80]), principal=st.sampled_from([None, "team-b"]))
async def test_threshold_top_k_is_the_exhaustive_bm25_for_common_and_rare_terms(
        zipf_store: PgVectorStore, words: list[str], top_k: int, principal: str | None) -> None:
    flt = SearchFilter(collection="zipf", principals=(principal,) if principal else ())
    query = " ".join(words)
    assert_same_top_k(await zipf_store.keyword_search(query, flt, top_k),
                      await zipf_store.keyword_search(query, flt, top_k, exhaustive=True))


async def test_common_terms_beside_a_rare_one_stop_before_their_lists_end(zipf_store: PgVectorStore) -> None:
    """The rare term's chunks score far above anything the common terms alone can reach, so the
    proof holds from the best postings of the common ones (their lists are longer than the depth)."""
    before = zipf_store.keyword_paths.copy()
    for query in ("w0 w399", "w0 w1 w380", "w1 w2 w390"):
        await zipf_store.keyword_search(query, SearchFilter(collection="zipf"), 10)
    assert (zipf_store.keyword_paths - before)["threshold proved"] == 3


async def test_the_threshold_path_is_off_by_default_and_skips_short_lists(zipf_store: PgVectorStore) -> None:
    default = PgVectorStore(zipf_store._db)
    await default.keyword_search("w0 w1", SearchFilter(collection="zipf"), 10)
    assert default.keyword_paths == {"exhaustive": 1}
    from_long_lists = PgVectorStore(zipf_store._db, keyword_exhaustive_below=1_000_000)
    await from_long_lists.keyword_search("w0 w1", SearchFilter(collection="zipf"), 10)
    assert from_long_lists.keyword_paths == {"exhaustive": 1}


async def _counts(db: Database, collection: str) -> tuple[dict[str, int], dict[str, int], tuple[int, int], tuple]:
    async with db.engine.connect() as conn:
        cid = (await conn.execute(text("SELECT id FROM collections WHERE name = :c"), {"c": collection})).scalar_one()
        postings = dict((await conn.execute(text(
            "SELECT term, count(*) FROM keyword_postings WHERE collection_id = :c GROUP BY term"), {"c": cid})).all())
        kept = dict((await conn.execute(text(
            "SELECT term, sum(df) FROM (SELECT term, df FROM keyword_terms WHERE collection_id = :c UNION ALL "
            "SELECT term, df FROM keyword_term_deltas WHERE collection_id = :c) x GROUP BY term HAVING sum(df) <> 0"),
            {"c": cid})).all())
        stats = tuple((await conn.execute(text(
            "SELECT sum(chunk_count), sum(total_length) FROM keyword_stats WHERE collection_id = :c"),
            {"c": cid})).one())
        actual = tuple((await conn.execute(text(
            "SELECT count(*), coalesce(sum((SELECT sum(coalesce(array_length(u.positions, 1), 1)) "
            "FROM unnest(tsv) u)), 0) FROM chunks WHERE collection_id = :c AND embedding IS NOT NULL"),
            {"c": cid})).one())
    return postings, {t: int(v) for t, v in kept.items()}, tuple(int(v) for v in stats), tuple(int(v) for v in actual)


async def test_parallel_writers_keep_exact_statistics(databases, local_embedder) -> None:
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db, keyword_exhaustive_below=0)  # the threshold path at any size
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
        postings, kept, stats, actual = await _counts(db, "shared")
        assert kept == postings and stats == actual
        assert actual[0] == 8 * (5 * 20 - 5)
    finally:
        await db.dispose()


async def test_a_writer_never_waits_for_another_writers_statistics(databases, local_embedder) -> None:
    """Two open transactions write chunks of the same collection: the second does not wait for the
    first (one row per collection did: it was locked until the first committed)."""
    url = databases.create()
    db = Database.from_settings(load_settings(database_url=url), url=url)
    store = PgVectorStore(db, keyword_exhaustive_below=0)  # the threshold path at any size
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
        postings, kept, stats, actual = await _counts(db, "hot")
        assert kept == postings and stats == actual and actual[0] == 3
    finally:
        await db.dispose()


def test_iterative_scans_are_used_from_pgvector_0_8() -> None:
    from rag_service.stores.pgvector.connection import SchemaInfo, parse_version

    assert parse_version("0.8.0") == (0, 8, 0) and parse_version("0.6.2") == (0, 6, 2)
    assert parse_version(None) == (0,) and parse_version("1.0beta") == (0,)
    schema = SchemaInfo(384, "english", True, parse_version("0.6.2"))
    assert not schema.iterative_scans
    assert SchemaInfo(384, "english", True, parse_version("0.8.1")).iterative_scans
