"""The behaviour of a store with the KeywordSearch capability (``text_search``, ``keyword_search``).
Subclass ``KeywordSearchContract`` next to ``VectorStoreContract``; data is written through the
core Protocol, so the contract holds for any store that has both."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_service.domain import DocumentRecord, SearchFilter, SearchHit
from rag_service.stores.base import KeywordSearch, VectorStore
from tests.stores.corpus import (
    ACL_QUERY,
    ALL,
    FILTER_CASES,
    FILTER_QUERY,
    PRINCIPALS,
    CorpusFixtures,
    chunks_for,
    new_collection,
    parent_and_child,
    visible,
)


class KeywordStore(VectorStore, KeywordSearch, Protocol):
    """What this contract needs: the core to write with, and the capability under test."""


async def keyword_searches(store: KeywordStore, flt: SearchFilter, query: str,
                           top_k: int = 50) -> dict[str, list[SearchHit]]:
    return {
        "text": await store.text_search(query, flt, top_k),
        # BM25 takes any term; OR is web-search syntax only.
        "keyword": await store.keyword_search(query.replace(" OR ", " "), flt, top_k),
    }


class KeywordSearchContract(CorpusFixtures):
    """Inherit and provide ``store`` (class scope, empty, dimension 384)."""

    async def test_text_search_uses_web_search_syntax(self, store: KeywordStore, corpus) -> None:
        hits = await store.text_search("yeast flour", ALL, 5)
        assert {corpus[h.document_id].key for h in hits} == {"bread"}
        with_postgres = await store.text_search("PostgreSQL", ALL, 10)
        without_replication = await store.text_search("PostgreSQL -replication", ALL, 10)
        assert {corpus[h.document_id].key for h in with_postgres} == {"pg", "replication"}
        assert {corpus[h.document_id].key for h in without_replication} == {"pg"}
        assert await store.text_search("the and of", ALL, 5) == []  # only stop words

    async def test_keyword_search_is_okapi_bm25(self, store: KeywordStore, embed) -> None:
        """Scores equal the BM25 formula (Lucene/bm25s variant, k1=1.2, b=0.75) worked by hand."""
        collection = new_collection()
        doc = DocumentRecord(collection=collection, source_uri="t://b", content_hash="b")
        chunks = chunks_for(doc, ["zebra zebra lion", "zebra", "lion tiger"], embed)
        await store.replace_documents([(doc, chunks)])
        hits = await store.keyword_search("zebra", SearchFilter(collection=collection), 10)
        idf = np.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # N=3 chunks, df=2
        avgdl = 6 / 3

        def bm25(tf: int, length: int) -> float:
            return idf * tf * 2.2 / (tf + 1.2 * (1 - 0.75 + 0.75 * length / avgdl))

        # Length normalisation puts the short chunk first despite its lower term frequency.
        assert bm25(1, 1) > bm25(2, 3)
        assert [h.chunk_id for h in hits] == [chunks[1].id, chunks[0].id]
        assert hits[0].score == pytest.approx(bm25(1, 1), rel=1e-6)
        assert hits[1].score == pytest.approx(bm25(2, 3), rel=1e-6)
        # Any query term may match (OR), unlike websearch_to_tsquery's AND.
        either = await store.keyword_search("tiger zebra", SearchFilter(collection=collection), 10)
        assert {h.chunk_id for h in either} == {c.id for c in chunks}

    async def test_keyword_index_follows_replacements_and_deletes(self, store: KeywordStore, embed) -> None:
        collection = new_collection()
        flt = SearchFilter(collection=collection)
        doc = DocumentRecord(collection=collection, source_uri="t://k", content_hash="k1")
        [chunk] = chunks_for(doc, ["walrus colony"], embed)
        await store.replace_documents([(doc, [chunk])])
        assert [h.chunk_id for h in await store.keyword_search("walrus", flt, 5)] == [chunk.id]
        # The same chunk id with new text: the old terms must go, the new ones come.
        await store.replace_documents([(doc, [chunk.model_copy(update={"text": "penguin colony"})])])
        for search in (store.keyword_search, store.text_search):
            assert await search("walrus", flt, 5) == []
            assert len(await search("penguin", flt, 5)) == 1
        [replacement] = chunks_for(doc, ["seal pup"], embed)
        await store.replace_documents([(doc, [replacement])])
        for search in (store.keyword_search, store.text_search):
            assert await search("penguin", flt, 5) == []
            assert [h.chunk_id for h in await search("seal", flt, 5)] == [replacement.id]
        await store.delete_document(doc.id)
        for search in (store.keyword_search, store.text_search):
            assert await search("seal", flt, 5) == []

    async def test_keyword_search_keeps_web_search_operators(self, store: KeywordStore, corpus) -> None:
        plain = {corpus[h.document_id].key for h in await store.keyword_search("PostgreSQL", ALL, 10)}
        assert plain == {"pg", "replication"}
        excluded = {corpus[h.document_id].key for h in await store.keyword_search("PostgreSQL -replication", ALL, 10)}
        assert excluded == {"pg"}
        phrase = await store.keyword_search('"connection pool"', ALL, 10)
        assert [corpus[h.document_id].key for h in phrase] == ["pg"]

    @pytest.mark.parametrize("flt, keep", FILTER_CASES)
    async def test_keyword_searches_apply_every_filter(self, store: KeywordStore, corpus, flt, keep) -> None:
        expected = {doc_id for doc_id, doc in corpus.items() if keep(doc)}
        assert expected, "the case must select something"
        for strategy, hits in (await keyword_searches(store, flt, FILTER_QUERY)).items():
            found = {h.document_id for h in hits}
            assert found <= expected, f"{strategy} returned documents outside the filter"

    # Two stores run this contract (SQL and tantivy keyword scoring): the same test, two executors.
    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors])
    @given(principals=st.sets(st.sampled_from(PRINCIPALS)))
    async def test_keyword_searches_acl_never_leaks(self, store: KeywordStore, corpus, principals: set[str]) -> None:
        flt = SearchFilter(principals=tuple(sorted(principals)))
        results = await keyword_searches(store, flt, ACL_QUERY)
        allowed = {doc_id for doc_id, doc in corpus.items() if visible(doc, principals)}
        for strategy, hits in results.items():
            leaked = {corpus[h.document_id].key for h in hits if h.document_id in corpus} - {
                corpus[d].key for d in allowed}
            assert not leaked, f"{strategy} leaked {leaked} to a caller with {principals}"
            # The documents holding a query word that the caller may see are really found.
            matching = {d for d in allowed if corpus[d].key in ("pg", "merger", "salaries")}
            assert {h.document_id for h in hits if h.document_id in corpus} == matching, strategy

    async def test_keyword_scores_are_finite(self, store: KeywordStore, corpus) -> None:
        results = await keyword_searches(store, ALL, "PostgreSQL")
        assert all(np.isfinite(h.score) for hits in results.values() for h in hits)

    async def test_keyword_searches_forget_deleted_documents(self, store: KeywordStore, embed) -> None:
        collection = new_collection()
        doc = DocumentRecord(collection=collection, source_uri="test://del", content_hash="d")
        await store.replace_documents([(doc, chunks_for(doc, [f"zebra crossing {i}" for i in range(3)], embed))])
        flt = SearchFilter(collection=collection)
        assert len(await store.text_search("zebra", flt, 10)) == 3
        assert len(await store.keyword_search("zebra", flt, 10)) == 3
        assert await store.delete_document(doc.id) is True
        assert all(result == [] for result in (await keyword_searches(store, flt, "zebra")).values())

    async def test_parent_chunks_are_never_keyword_searched(self, store: KeywordStore, embed) -> None:
        collection = new_collection()
        doc, parent, child = parent_and_child(collection, embed)
        await store.replace_documents([(doc, [parent, child])])
        for strategy, hits in (await keyword_searches(store, SearchFilter(collection=collection), "quokka")).items():
            assert [h.chunk_id for h in hits] == [child.id], strategy
