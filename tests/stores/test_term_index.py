"""The tantivy keyword engine (``RAGSVC_KEYWORD_ENGINE=tantivy``) against a real PostgreSQL: the
keyword contract, the same top k as the SQL scoring on real SciFact text, and an index that follows
every committed write, including writes of other connections and transactions that finish late."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import event, select, text

from benchmarks.datasets import scifact
from rag_service.db.engine import Database
from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter
from rag_service.stores.pgvector import PgVectorStore, term_index
from rag_service.stores.pgvector.bm25 import _exact_scores, _slack
from rag_service.stores.pgvector.term_index import FORMAT, K1, B, TermIndex
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
        index = store.term_index
        assert index is not None
        before = index.answered
        hits = await store.keyword_search("PostgreSQL", SearchFilter(collection="kb", acl_bypass=True), 5)
        assert hits and index.answered == before + 1


def engine_store(database: Database, root: Path) -> PgVectorStore:
    return PgVectorStore(database, term_index=TermIndex(database, root, build_in_background=False))


async def write_document(writer: PgVectorStore, collection: str, key: str, texts: list[str], embed) -> DocumentRecord:
    """Write (or replace) the document ``t://<key>`` with one chunk per text."""
    doc = DocumentRecord(collection=collection, source_uri=f"t://{key}", content_hash=key)
    await writer.replace_documents([(doc, chunks_for(doc, texts, embed))])
    return doc


@pytest.fixture(scope="module")
def embed(local_embedder):
    return lambda text: local_embedder.encode([text])[0].tolist()


@pytest.fixture(scope="module")
def scifact_rows(local_embedder) -> list[tuple[str, str, list[float]]]:
    """SciFact's first documents (id, title and abstract, real vector), embedded once."""
    with scifact("test").corpus.open() as lines:
        corpus = [json.loads(line) for line, _ in zip(lines, range(SCIFACT_DOCS), strict=False)]
    texts = [f"{row['title']}. {row['text']}" for row in corpus]
    vectors = local_embedder.encode(texts)
    return [(row["_id"], body, vector.tolist()) for row, body, vector in zip(corpus, texts, vectors, strict=True)]


async def add_scifact(database: Database, rows: list[tuple[str, str, list[float]]]) -> tuple[str, list]:
    """A new collection of the given SciFact documents, one chunk each; its name and documents."""
    collection = new_collection()
    items = []
    for doc_id, body, vector in rows:
        doc = DocumentRecord(collection=collection, source_uri=f"scifact://{doc_id}", content_hash=doc_id)
        chunk = ChunkRecord(document_id=doc.id, ordinal=0, text=body, start_char=0, end_char=len(body),
                            token_count=len(body.split()), content_hash=doc_id, embedding=vector)
        items.append((doc, [chunk]))
    await PgVectorStore(database).replace_documents(items)
    return collection, [doc for doc, _ in items]


@pytest.fixture(scope="module")
async def scifact_collection(database: Database, scifact_rows) -> str:
    return (await add_scifact(database, scifact_rows))[0]


@pytest.mark.parametrize("top_k", [10, 50])
async def test_same_top_k_as_sql_scoring_on_scifact(database: Database, scifact_collection: str,
                                                    tmp_path: Path, top_k: int) -> None:
    """The index's answer is exactly the exhaustive BM25's: same chunks, same order, same scores,
    for every SciFact test query (most hold a term found in many of the chunks), and most of them
    proven by the bound rather than by reading every matching chunk."""
    sql, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=scifact_collection)
    queries = list(scifact("test").queries.values())
    for query in queries:
        want = await sql.keyword_search(query, flt, top_k)
        got = await engine.keyword_search(query, flt, top_k)
        assert [h.chunk_id for h in got] == [h.chunk_id for h in want], query
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-9, abs=1e-12)
    index = engine.term_index
    assert index is not None and index.fell_back == 0
    assert index.answered == len(queries)
    assert index.proven > len(queries) / 2


async def test_tantivy_scores_bound_the_exact_ones(database: Database, scifact_collection: str, tmp_path: Path) -> None:
    """What the proof rests on: no chunk's exact BM25 exceeds its tantivy score times the slack."""
    engine = engine_store(database, tmp_path)
    index = engine.term_index
    assert index is not None
    async with database.connect() as conn:
        collection_id, n, avgdl = (await conn.execute(text(
            "SELECT k.id, sum(s.chunk_count)::float8, sum(s.total_length)::float8 / sum(s.chunk_count) "
            "FROM collections k JOIN keyword_stats s ON s.collection_id = k.id WHERE k.name = :c GROUP BY k.id"),
            {"c": scifact_collection})).one()
    entry = await index.current(collection_id, wait=True)
    assert entry is not None
    checked = 0
    for query in list(scifact("test").queries.values())[:40]:
        async with database.connect() as conn:
            terms = (await conn.execute(text("SELECT array_agg(DISTINCT lexeme) FROM "
                                             "unnest(to_tsvector('english', :q))"), {"q": query})).scalar_one()
        found = index.candidates(entry.index.searcher(), terms, SCIFACT_DOCS)
        scored = _exact_scores(found, collection_id, n, avgdl, K1, B)
        async with database.connect() as conn:
            exact = dict((await conn.execute(select(scored.c.chunk_id, scored.c.score))).all())
        slack = _slack(found, n, avgdl)
        for chunk_id, bound in zip(found.chunk_ids, found.scores, strict=True):
            assert exact[chunk_id] <= bound * slack, query
            checked += 1
    assert checked > 1000


async def test_same_top_k_after_deletions(database: Database, scifact_rows, tmp_path: Path) -> None:
    """Deleted chunks stay in tantivy's statistics until their segment merges; the answer must
    still be the SQL scoring's, which counts only the chunks that exist."""
    collection, documents = await add_scifact(database, scifact_rows[:200])
    sql, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=collection)
    queries = list(scifact("test").queries.values())[:100]
    await engine.keyword_search(queries[0], flt, 10)  # built now
    for document in documents[::3]:
        await sql.delete_document(document.id)
    for query in queries:
        want = await sql.keyword_search(query, flt, 10)
        got = await engine.keyword_search(query, flt, 10)
        assert [h.chunk_id for h in got] == [h.chunk_id for h in want], query
        assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-9, abs=1e-12)
    index = engine.term_index
    assert index is not None and (index.answered, index.fell_back) == (len(queries) + 1, 0)


async def test_other_bm25_parameters_are_scored_in_sql(database: Database, scifact_collection: str,
                                                       tmp_path: Path) -> None:
    """tantivy scores with k1 1.2 and b 0.75 only: other parameters go to the SQL scoring."""
    sql, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=scifact_collection)
    got = await engine.keyword_search("cell protein", flt, 10, k1=2.0, b=0.3)
    assert [h.chunk_id for h in got] == [h.chunk_id for h in await sql.keyword_search("cell protein", flt, 10,
                                                                                      k1=2.0, b=0.3)]
    index = engine.term_index
    assert index is not None and (index.answered, index.fell_back, index.builds) == (0, 0, 0)


async def test_one_process_owns_the_indexes(database: Database, scifact_collection: str, tmp_path: Path) -> None:
    """A second index on the same directory (another process on the data dir) answers from SQL."""
    first, second = engine_store(database, tmp_path), engine_store(database, tmp_path)
    flt = SearchFilter(collection=scifact_collection)
    want = await first.keyword_search("cell protein", flt, 10)
    assert [h.chunk_id for h in await second.keyword_search("cell protein", flt, 10)] == [h.chunk_id for h in want]
    assert first.term_index is not None and second.term_index is not None
    assert (first.term_index.answered, second.term_index.answered, second.term_index.fell_back) == (1, 0, 1)
    await first.close()  # the owner stops: the other takes over (after its retry interval)
    second.term_index._owner_tried_at = -1e9
    await second.keyword_search("cell protein", flt, 10)
    assert second.term_index.answered == 1
    await second.close()


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
    assert engine.term_index is not None and engine.term_index.fell_back == 0


async def test_a_transaction_that_commits_late_is_not_missed(database: Database, embed, tmp_path: Path) -> None:
    """A writer that began early keeps the snapshots' xmin down while later writes commit: those are
    searchable at once, and its own chunk as soon as it commits."""
    collection = new_collection()
    writer, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=collection)
    await write_document(writer, collection, "1", ["heron"], embed)
    assert len(await engine.keyword_search("heron", flt, 5)) == 1
    late = DocumentRecord(collection=collection, source_uri="t://late", content_hash="late")
    async with database.begin() as held:  # the late writer: its transaction id is below the others'
        await writer._upsert_documents(held, [late])
        await writer._write_chunks(held, chunks_for(late, ["heron egret late"], embed))
        for n in range(2, 4):
            await write_document(writer, collection, str(n), [f"heron egret {n}"], embed)
            assert len(await engine.keyword_search("heron", flt, 5)) == n  # not the uncommitted one
    assert {h.text for h in await engine.keyword_search("egret", flt, 5)} == {
        "heron egret 2", "heron egret 3", "heron egret late"}
    index = engine.term_index
    assert index is not None and index.fell_back == 0
    entry = index._open[next(iter(index._open))]
    assert not entry.seen  # the window closed: nothing left to remember


async def test_rebuilds_after_a_crash(database: Database, embed, tmp_path: Path) -> None:
    collection = new_collection()
    writer = PgVectorStore(database)
    flt = SearchFilter(collection=collection)
    await write_document(writer, collection, "x", ["pelican"], embed)
    first = engine_store(database, tmp_path)
    assert len(await first.keyword_search("pelican", flt, 5)) == 1
    await first.close()
    [state_file] = list(tmp_path.glob("*/*/state.json"))  # noqa: ASYNC240 (a test's tmp dir)
    collection_dir = state_file.parent
    # A build that died half-way leaves its scratch directory; a state file may be torn.
    scratch = collection_dir.parent / f"{collection_dir.name}.building"
    scratch.mkdir()
    state_file.write_text("{not json")
    engine = engine_store(database, tmp_path)
    assert len(await engine.keyword_search("pelican", flt, 5)) == 1
    assert engine.term_index is not None and engine.term_index.builds == 1
    assert json.loads(state_file.read_text())["format"] == FORMAT
    assert not scratch.exists()  # noqa: ASYNC240
    await engine.close()


async def test_an_index_behind_the_pruned_log_rebuilds(database: Database, embed, tmp_path: Path) -> None:
    """Change rows are deleted below a transaction-id mark; an index that had not read that far
    cannot catch up from the log and is rebuilt, so the pruned writes are not lost."""
    collection = new_collection()
    writer, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=collection)
    await write_document(writer, collection, "p", ["puffin"], embed)
    assert len(await engine.keyword_search("puffin", flt, 5)) == 1
    await write_document(writer, collection, "q", ["puffin gannet"], embed)
    await writer.prune_keyword_changes(older_than_s=0)  # a mark above the write
    assert await writer.prune_keyword_changes(older_than_s=0) >= 1  # ... and the log below it deleted
    async with database.connect() as conn:
        left = (await conn.execute(text(
            "SELECT count(*) FROM keyword_changes WHERE collection_id = (SELECT id FROM collections WHERE name = :c)"),
            {"c": collection})).scalar_one()
    assert left == 0
    assert [h.text for h in await engine.keyword_search("gannet", flt, 5)] == ["puffin gannet"]
    assert engine.term_index is not None and engine.term_index.builds == 2


async def test_auto_uses_the_index_only_for_large_collections(database: Database, embed, tmp_path: Path) -> None:
    """``keyword_engine=auto``: a collection below ``min_chunks`` is scored in SQL and gets no index."""
    collection = new_collection()
    await write_document(PgVectorStore(database), collection, "g", ["gannet", "gannet gull", "gull"], embed)
    flt = SearchFilter(collection=collection)
    for min_chunks, by_index in ((4, 0), (3, 1)):
        index = TermIndex(database, tmp_path / str(min_chunks), build_in_background=False, min_chunks=min_chunks)
        hits = await PgVectorStore(database, term_index=index).keyword_search("gannet", flt, 5)
        assert [h.text for h in hits] == ["gannet", "gannet gull"]
        assert (index.answered, index.fell_back) == (by_index, 0)
        assert any((tmp_path / str(min_chunks)).glob("*/*/state.json")) == bool(by_index)  # noqa: ASYNC240


async def test_a_small_collection_is_not_asked_its_size_before_every_search(
        database: Database, embed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``min_chunks`` a collection's size is looked up once per SMALL_RECHECK_S, not before
    every search; grown past it meanwhile, it is still scored exactly (in SQL) until the next look."""
    collection = new_collection()
    writer = PgVectorStore(database)
    await write_document(writer, collection, "g", ["gannet", "gannet gull", "gull"], embed)
    index = TermIndex(database, tmp_path, build_in_background=False, min_chunks=4)
    store, flt = PgVectorStore(database, term_index=index), SearchFilter(collection=collection)
    looked_up: list[str] = []

    def before(conn, cursor, statement: str, *args) -> None:  # noqa: ANN001, ANN002
        if statement.lstrip().startswith("SELECT k.id"):
            looked_up.append(statement)

    event.listen(database.engine.sync_engine, "before_cursor_execute", before)
    try:
        for _ in range(3):
            assert [h.text for h in await store.keyword_search("gannet", flt, 5)] == ["gannet", "gannet gull"]
        assert len(looked_up) == 1
        await write_document(writer, collection, "h", ["gannet gannet gannet"], embed)  # 4 chunks: large enough
        hits = await store.keyword_search("gannet", flt, 5)
        assert [h.text for h in hits][0] == "gannet gannet gannet" and len(hits) == 3
        assert (len(looked_up), index.answered) == (1, 0)  # scored in SQL: the size was not asked again
        monkeypatch.setattr(term_index, "SMALL_RECHECK_S", 0.0)
        assert [h.text for h in await store.keyword_search("gannet", flt, 5)] == [h.text for h in hits]
        assert (len(looked_up), index.answered) == (2, 1)  # looked again: now from the index
    finally:
        event.remove(database.engine.sync_engine, "before_cursor_execute", before)


async def test_concurrent_searches_all_use_the_index(database: Database, scifact_rows, embed, tmp_path: Path) -> None:
    """Searches at once, with and without a change to apply, all use the index (none waits its
    turn by falling back to SQL, which at a million chunks takes seconds)."""
    collection, _ = await add_scifact(database, scifact_rows[:100])
    writer, engine = PgVectorStore(database), engine_store(database, tmp_path)
    flt = SearchFilter(collection=collection)
    queries = list(scifact("test").queries.values())[:16]
    await engine.keyword_search(queries[0], flt, 10)  # built now
    await asyncio.gather(*[engine.keyword_search(q, flt, 10) for q in queries])
    await write_document(writer, collection, "new", ["kestrel falcon"], embed)
    results = await asyncio.gather(*[engine.keyword_search("kestrel", flt, 10) for _ in range(8)])
    assert all([h.text for h in hits] == ["kestrel falcon"] for hits in results)
    index = engine.term_index
    assert index is not None and (index.answered, index.fell_back) == (1 + 16 + 8, 0)
