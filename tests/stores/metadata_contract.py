"""The behaviour of a store with the MetadataSearch capability: chunks chosen by the structured
filter alone. Subclass ``MetadataSearchContract`` next to ``VectorStoreContract``."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_service.domain import DocumentRecord, SearchFilter
from rag_service.stores.base import MetadataSearch, VectorStore
from tests.stores.corpus import (
    ALL,
    FILTER_CASES,
    PRINCIPALS,
    CorpusFixtures,
    chunks_for,
    new_collection,
    parent_and_child,
    visible,
)


class MetadataStore(VectorStore, MetadataSearch, Protocol):
    """What this contract needs: the core to write with, and the capability under test."""


class MetadataSearchContract(CorpusFixtures):
    """Inherit and provide ``store`` (class scope, empty, dimension 384)."""

    async def test_metadata_search_orders_by_date(self, store: MetadataStore, corpus) -> None:
        flt = SearchFilter(collection="kb", acl_bypass=True)
        newest = [corpus[h.document_id].key for h in await store.metadata_search(flt, 20)]
        oldest = [corpus[h.document_id].key for h in await store.metadata_search(flt, 20, order="oldest")]
        assert newest[0] == "salaries" and newest[-1] == "bread"
        assert oldest[0] == "bread"
        scores = [h.score for h in await store.metadata_search(flt, 20)]
        assert scores == sorted(scores, reverse=True)

    @pytest.mark.parametrize("flt, keep", FILTER_CASES)
    async def test_metadata_search_applies_every_filter(self, store: MetadataStore, corpus, flt, keep) -> None:
        expected = {doc_id for doc_id, doc in corpus.items() if keep(doc)}
        assert expected, "the case must select something"
        # Metadata search matches everything in scope, so it must find every expected document.
        assert {h.document_id for h in await store.metadata_search(flt, 50)} == expected

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(principals=st.sets(st.sampled_from(PRINCIPALS)))
    async def test_metadata_search_acl_never_leaks(self, store: MetadataStore, corpus, principals: set[str]) -> None:
        hits = await store.metadata_search(SearchFilter(principals=tuple(sorted(principals))), 50)
        allowed = {doc_id for doc_id, doc in corpus.items() if visible(doc, principals)}
        leaked = {corpus[h.document_id].key for h in hits if h.document_id in corpus} - {corpus[d].key for d in allowed}
        assert not leaked, f"metadata leaked {leaked} to a caller with {principals}"
        # And what the caller may see is really found (the check above is not vacuous).
        assert {h.document_id for h in hits if h.document_id in corpus} == allowed

    async def test_metadata_scores_are_finite(self, store: MetadataStore, corpus) -> None:
        assert all(np.isfinite(h.score) for h in await store.metadata_search(ALL, 50))

    async def test_metadata_search_forgets_deleted_documents(self, store: MetadataStore, embed) -> None:
        collection = new_collection()
        doc = DocumentRecord(collection=collection, source_uri="test://del", content_hash="d")
        await store.replace_documents([(doc, chunks_for(doc, [f"zebra crossing {i}" for i in range(3)], embed))])
        flt = SearchFilter(collection=collection)
        assert len(await store.metadata_search(flt, 10)) == 3
        assert await store.delete_document(doc.id) is True
        assert await store.metadata_search(flt, 10) == []

    async def test_parent_chunks_are_never_metadata_searched(self, store: MetadataStore, embed) -> None:
        collection = new_collection()
        doc, parent, child = parent_and_child(collection, embed)
        await store.replace_documents([(doc, [parent, child])])
        hits = await store.metadata_search(SearchFilter(collection=collection), 5)
        assert [h.chunk_id for h in hits] == [child.id]
