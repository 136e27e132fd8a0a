"""The tantivy keyword engine (``RAGSVC_KEYWORD_ENGINE=tantivy``) against a real PostgreSQL: the
keyword contract, the same top k as the SQL scoring on real SciFact text, and an index that follows
every committed write, including writes of other connections and transactions that finish late."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from benchmarks.datasets import scifact
from rag_service.db.engine import Database
from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter
from rag_service.stores.pgvector import PgVectorStore
from rag_service.stores.pgvector.term_index import FORMAT, TermIndex
from tests.stores.corpus import chunks_for, new_collection
from tests.stores.keyword_contract import KeywordSearchContract

SCIFACT_DOCS = 400


class TestTantivyKeywordContract(KeywordSearchContract):
    """Every keyword behaviour (filters, ACLs, deletes, BM25 by hand) holds with the engine on."""

    @pytest.fixture(scope="class")
    @classmethod
    async def store(cls, database: Database, tmp_path_factory: pytest.TempPathFactory) -> PgVectorStore:
        index = TermIndex(database, tmp_path_factory.mktemp("terms"), build_in_background=False)
        return PgVectorStore(database, ef_search=40, term_index=index)

    async def test_collection_searches_are_answered_by_the_index(self, store: PgVectorStore, corpus) -> None:
        index = store._term_index
        assert index is not None
        before = index.answered
        hits = await store.keyword_search("PostgreSQL", SearchFilter(collection="kb", acl_bypass=True), 5)
        assert hits and index.answered == before + 1


def engine_store(database: Database, root: Path) -> PgVectorStore:
    return PgVectorStore(database, term_index=TermIndex(database, root, build_in_background=False))


@pytest.fixture(scope="module")
def embed(local_embedder):
    return lambda text: local_embedder.encode([text])[0].tolist()


@pytest.fixture(scope="module")
async def scifact_collection(database: Database, local_embedder) -> str:
    """SciFact's first documents, one chunk each (title and abstract), with real vectors."""
    collection = new_collection()
    with scifact("test").corpus.open() as lines:
        corpus = [json.loads(line) for line, _ in zip(lines, range(SCIFACT_DOCS), strict=False)]
    texts = [f"{row['title']}. {row['text']}" for row in corpus]
    vectors = local_embedder.encode(texts)
    items = []
    for doc_id, body, vector in zip([row["_id"] for row in corpus], texts, vectors, strict=True):
        doc = DocumentRecord(collection=collection, source_uri=f"scifact://{doc_id}", content_hash=doc_id)
        chunk = ChunkRecord(document_id=doc.id, ordinal=0, text=body, start_char=0, end_char=len(body),
                            token_count=len(body.split()), content_hash=doc_id, embedding=vector.tolist())
        items.append((doc, [chunk]))
    await PgVectorStore(database).replace_documents(items)
    return collection


@pytest.mark.parametrize("top_k", [10, 100])
async def test_same_top_k_as_sql_scoring_on_scifact(database: Database, scifact_collection: str,
                                                    tmp_path: Path, top_k: int) -> None:
    """The index's answer is exactly the exhaustive BM25's: same chunks, same order, same scores,
    for every SciFact test query (most hold a term found in many of the chunks)."""
    sql, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=scifact_collection)
    queries = list(scifact("test").queries.values())
    for query in queries:
        want = await sql.keyword_search(query, flt, top_k)
        got = await engine.keyword_search(query, flt, top_k)
        assert [h.chunk_id for h in got] == [h.chunk_id for h in want], query
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-9, abs=1e-12)
    index = engine._term_index
    assert index is not None and index.fell_back == 0
    assert index.answered == len(queries)


async def test_filters_apply_before_the_top_k(database: Database, scifact_collection: str, tmp_path: Path) -> None:
    """A selective filter still gets a full top k (more candidates are read until one is proven)."""
    sql, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=scifact_collection, metadata_equals={"missing": "x"})
    assert await engine.keyword_search("cell", flt, 10) == []
    async with database.begin() as conn:
        await conn.execute(text(
            "UPDATE documents SET metadata = jsonb_build_object('pick', 'yes') WHERE collection_id = "
            "(SELECT id FROM collections WHERE name = :c) AND source_uri IN (SELECT source_uri FROM documents "
            "WHERE collection_id = (SELECT id FROM collections WHERE name = :c) ORDER BY source_uri DESC LIMIT 60)"),
            {"c": scifact_collection})
    try:
        picked = SearchFilter(collection=scifact_collection, metadata_equals={"pick": "yes"})
        want = await sql.keyword_search("cells protein expression", picked, 10)
        got = await engine.keyword_search("cells protein expression", picked, 10)
        assert len(want) == 10
        assert [h.chunk_id for h in got] == [h.chunk_id for h in want]
    finally:
        async with database.begin() as conn:
            await conn.execute(text("UPDATE documents SET metadata = '{}' WHERE collection_id = "
                                    "(SELECT id FROM collections WHERE name = :c)"), {"c": scifact_collection})


async def test_follows_writes_of_other_connections(database: Database, embed, tmp_path: Path) -> None:
    collection = new_collection()
    writer, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=collection)
    docs = {key: DocumentRecord(collection=collection, source_uri=f"t://{key}", content_hash=key)
            for key in ("a", "b")}
    await writer.replace_documents([(docs["a"], chunks_for(docs["a"], ["walrus tusks"], embed)),
                                    (docs["b"], chunks_for(docs["b"], ["otter whiskers"], embed))])
    assert {h.text for h in await engine.keyword_search("walrus otter", flt, 10)} == {"walrus tusks", "otter whiskers"}
    # Another connection replaces one document and deletes the other.
    new_a = docs["a"].model_copy(update={"content_hash": "a2"})
    await writer.replace_documents([(new_a, chunks_for(new_a, ["narwhal tusks"], embed))])
    await writer.delete_document(docs["b"].id)
    assert [h.text for h in await engine.keyword_search("walrus otter narwhal", flt, 10)] == ["narwhal tusks"]
    assert engine._term_index is not None and engine._term_index.fell_back == 0


async def test_a_transaction_that_commits_late_is_not_missed(database: Database, embed, tmp_path: Path) -> None:
    """A transaction holding an early id keeps the snapshot's xmin down while later writes commit;
    they are applied at once, and applied only once."""
    collection = new_collection()
    writer, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=collection)
    first = DocumentRecord(collection=collection, source_uri="t://1", content_hash="1")
    await writer.replace_documents([(first, chunks_for(first, ["heron"], embed))])
    assert len(await engine.keyword_search("heron", flt, 5)) == 1
    async with database.connect() as held:
        await held.execute(text("BEGIN"))
        await held.execute(text("SELECT pg_current_xact_id()"))  # an xid below the writes that follow
        for n in range(2, 4):
            doc = DocumentRecord(collection=collection, source_uri=f"t://{n}", content_hash=str(n))
            await writer.replace_documents([(doc, chunks_for(doc, [f"heron egret {n}"], embed))])
            assert len(await engine.keyword_search("heron", flt, 5)) == n
        await held.execute(text("ROLLBACK"))
    assert len(await engine.keyword_search("egret", flt, 5)) == 2
    index = engine._term_index
    assert index is not None and index.fell_back == 0
    entry = index._open[next(iter(index._open))]
    assert not entry.seen  # the window closed: nothing left to remember


async def test_rebuilds_after_a_crash_or_when_too_old(database: Database, embed, tmp_path: Path) -> None:
    collection = new_collection()
    writer = PgVectorStore(database)
    flt = SearchFilter(collection=collection)
    doc = DocumentRecord(collection=collection, source_uri="t://x", content_hash="x")
    await writer.replace_documents([(doc, chunks_for(doc, ["pelican"], embed))])
    assert len(await engine_store(database, tmp_path).keyword_search("pelican", flt, 5)) == 1
    [state_file] = list(tmp_path.glob("*/*/state.json"))  # noqa: ASYNC240 (a test's tmp dir)
    collection_dir = state_file.parent
    # A build that died half-way leaves a scratch directory; a state file may be torn.
    (collection_dir.parent / f"{collection_dir.name}.building-1").mkdir()
    state_file.write_text("{not json")
    engine = engine_store(database, tmp_path)
    assert len(await engine.keyword_search("pelican", flt, 5)) == 1
    assert json.loads(state_file.read_text())["format"] == FORMAT
    # An index that has not caught up for longer than the change log is kept is rebuilt.
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "checked_at": time.time() - 2 * 86_400}))
    await writer.replace_documents([(doc.model_copy(update={"content_hash": "y"}),
                                     chunks_for(doc, ["pelican stork"], embed))])
    engine = engine_store(database, tmp_path)
    assert [h.text for h in await engine.keyword_search("stork", flt, 5)] == ["pelican stork"]


async def test_auto_uses_the_index_only_for_large_collections(database: Database, embed, tmp_path: Path) -> None:
    """``keyword_engine=auto``: a collection below ``min_chunks`` is scored in SQL and gets no index."""
    collection = new_collection()
    doc = DocumentRecord(collection=collection, source_uri="t://g", content_hash="g")
    await PgVectorStore(database).replace_documents([(doc, chunks_for(doc, ["gannet", "gannet gull", "gull"], embed))])
    flt = SearchFilter(collection=collection)
    for min_chunks, by_index in ((4, 0), (3, 1)):
        index = TermIndex(database, tmp_path / str(min_chunks), build_in_background=False, min_chunks=min_chunks)
        hits = await PgVectorStore(database, term_index=index).keyword_search("gannet", flt, 5)
        assert [h.text for h in hits] == ["gannet", "gannet gull"]
        assert (index.answered, index.fell_back) == (by_index, 0)
        assert any((tmp_path / str(min_chunks)).glob("*/*/state.json")) == bool(by_index)  # noqa: ASYNC240


async def test_old_change_rows_are_pruned(database: Database, embed) -> None:
    collection = new_collection()
    writer = PgVectorStore(database)
    doc = DocumentRecord(collection=collection, source_uri="t://p", content_hash="p")
    await writer.replace_documents([(doc, chunks_for(doc, ["puffin"], embed))])
    async with database.begin() as conn:
        await conn.execute(text("UPDATE keyword_changes SET at = now() - interval '2 days' WHERE collection_id = "
                                "(SELECT id FROM collections WHERE name = :c)"), {"c": collection})
    assert await writer.prune_keyword_changes() >= 1
    async with database.connect() as conn:
        left = (await conn.execute(text(
            "SELECT count(*) FROM keyword_changes WHERE collection_id = (SELECT id FROM collections WHERE name = :c)"),
            {"c": collection})).scalar_one()
    assert left == 0
