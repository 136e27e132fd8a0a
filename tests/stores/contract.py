"""The behaviour every VectorStore must show, through the core Protocol alone. A store's test module
subclasses ``VectorStoreContract``, and the capability contracts (``keyword_contract``,
``metadata_contract``, ``pattern_contract``) of the capabilities it has, and provides a
class-scoped ``store`` fixture holding an empty store."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_service.domain import ChunkRecord, DocumentRecord, SearchFilter, SearchHit
from rag_service.errors import InvalidInputError
from rag_service.stores.base import VectorStore
from tests.stores.corpus import (
    ALL,
    CORPUS,
    FILTER_CASES,
    PRINCIPALS,
    CorpusFixtures,
    Doc,
    chunks_for,
    new_collection,
    nul_document,
    parent_and_child,
    visible,
)

# Other test packages load the same corpus and import it from here.
__all__ = ["ALL", "CORPUS", "PRINCIPALS", "Doc", "VectorStoreContract", "visible"]


async def vector_searches(store: VectorStore, flt: SearchFilter, vector: list[float],
                          top_k: int = 50) -> dict[str, list[SearchHit]]:
    return {
        "vector": await store.vector_search(vector, flt, top_k),
        "vector-exact": await store.vector_search(vector, flt, top_k, exact=True),
    }


class VectorStoreContract(CorpusFixtures):
    """Inherit and provide ``store`` (class scope, empty, dimension 384)."""

    @staticmethod
    async def stored_texts(store: VectorStore, collection: str, embed: Callable[[str], list[float]]) -> set[str]:
        """Every searchable chunk text in the collection (exact search returns all of a small one)."""
        hits = await store.vector_search(embed("anything"), SearchFilter(collection=collection), 50, exact=True)
        return {h.text for h in hits}

    # --- writes ----------------------------------------------------------------------------

    async def test_wrong_dimension_is_refused(self, store: VectorStore, embed) -> None:
        doc = DocumentRecord(collection=new_collection(), source_uri="test://dim", content_hash="d")
        bad = ChunkRecord(document_id=doc.id, ordinal=0, text="x", start_char=0, end_char=1, token_count=1,
                          content_hash="x", embedding=[0.1] * 10)
        with pytest.raises(InvalidInputError, match="384"):
            await store.replace_documents([(doc, [bad])])
        with pytest.raises(InvalidInputError, match="dimensions"):
            await store.vector_search([0.1] * 10, ALL, 5)

    async def test_delete_document_removes_its_chunks(self, store: VectorStore, embed) -> None:
        collection = new_collection()
        doc = DocumentRecord(collection=collection, source_uri="test://del", content_hash="d")
        await store.replace_documents([(doc, chunks_for(doc, [f"zebra crossing {i}" for i in range(3)], embed))])
        flt = SearchFilter(collection=collection)
        assert len(await store.vector_search(embed("zebra"), flt, 10, exact=True)) == 3
        assert await store.delete_document(doc.id) is True
        hits = await vector_searches(store, flt, embed("zebra"))
        assert all(result == [] for result in hits.values())
        assert await store.delete_document(doc.id) is False

    async def test_replace_documents_swaps_chunks_atomically(self, store: VectorStore, embed) -> None:
        collection = new_collection()
        doc = DocumentRecord(collection=collection, source_uri="test://swap", content_hash="v1")
        await store.replace_documents([(doc, chunks_for(doc, ["old walrus", "old narwhal"], embed))])
        assert await self.stored_texts(store, collection, embed) == {"old walrus", "old narwhal"}
        v2 = doc.model_copy(update={"content_hash": "v2", "version": 2})
        await store.replace_documents([(v2, chunks_for(v2, ["new walrus"], embed))])
        assert await self.stored_texts(store, collection, embed) == {"new walrus"}

        # A failing batch leaves every document as it was.
        other = DocumentRecord(collection=collection, source_uri="test://other", content_hash="o")
        broken = chunks_for(other, ["other text"], embed) + [
            ChunkRecord(document_id=uuid.uuid4(), ordinal=0, text="orphan", start_char=0, end_char=6,
                        token_count=1, content_hash="x", embedding=embed("orphan"))]
        v3 = doc.model_copy(update={"content_hash": "v3", "version": 3})
        with pytest.raises(InvalidInputError):
            await store.replace_documents([(v3, chunks_for(v3, ["third walrus"], embed)), (other, broken)])
        assert await self.stored_texts(store, collection, embed) == {"new walrus"}

    async def test_unknown_parent_is_refused(self, store: VectorStore, embed) -> None:
        doc = DocumentRecord(collection="kb-parents", source_uri="test://orphan-child", content_hash="o")
        child = ChunkRecord(document_id=doc.id, parent_id=uuid.uuid4(), ordinal=0, text="x", start_char=0,
                            end_char=1, token_count=1, content_hash="x", embedding=embed("x"))
        with pytest.raises(InvalidInputError, match="parent_id"):
            await store.replace_documents([(doc, [child])])

    async def test_nul_characters_are_dropped_not_fatal(self, store: VectorStore, embed) -> None:
        collection = new_collection()
        doc, chunk = nul_document(collection, embed)
        await store.replace_documents([(doc, [chunk])])
        hit, _ = (await store.chunks_by_id([chunk.id]))[chunk.id]
        assert hit.title == "ab" and hit.metadata == {"m": ""} and hit.text == "nulbyte"

    async def test_reusing_a_document_id_for_another_source_is_refused(self, store: VectorStore, embed) -> None:
        doc = DocumentRecord(collection="kb-ids", source_uri="test://first", content_hash="f")
        await store.replace_documents([(doc, chunks_for(doc, ["first"], embed))])
        with pytest.raises(InvalidInputError):
            await store.replace_documents([(doc.model_copy(update={"source_uri": "test://second"}), [])])

    # --- searches --------------------------------------------------------------------------

    async def test_vector_search_ranks_by_meaning(self, store: VectorStore, corpus, embed) -> None:
        hits = await store.vector_search(embed("how do I make a loaf of bread at home"), ALL, 3)
        assert corpus[hits[0].document_id].key == "bread"
        assert hits[0].score >= hits[-1].score
        assert 0.0 < hits[0].score <= 1.0

    async def test_hits_carry_citation_fields(self, store: VectorStore, corpus, embed) -> None:
        hit = (await store.vector_search(embed("yeast and flour"), ALL, 1))[0]
        doc = corpus[hit.document_id]
        assert hit.source_uri == f"test://{doc.key}"
        assert hit.title == doc.key.title()
        assert hit.text in doc.texts
        assert hit.end_char - hit.start_char == len(hit.text)
        assert hit.metadata["page"] == hit.ordinal + 1

    async def test_similarities_and_chunks_by_id(self, store: VectorStore, corpus, embed) -> None:
        hits = await store.vector_search(embed("yeast and flour"), ALL, 5)
        similarities = await store.similarities_by_id([h.chunk_id for h in hits] + [uuid.uuid4()],
                                                      embed("yeast and flour"))
        # Unknown ids are absent; the others get vector_search's own score for the same query.
        assert similarities == {h.chunk_id: h.score for h in hits}
        other = await store.similarities_by_id([hits[0].chunk_id], embed("database error"))
        assert other[hits[0].chunk_id] < hits[0].score
        hit = hits[0]
        chunks = await store.chunks_by_id([hit.chunk_id])
        assert chunks[hit.chunk_id][0].text == hit.text and chunks[hit.chunk_id][1] is None

    @pytest.mark.parametrize("flt, keep", FILTER_CASES)
    async def test_vector_search_applies_every_filter(self, store: VectorStore, corpus, embed, flt, keep) -> None:
        expected = {doc_id for doc_id, doc in corpus.items() if keep(doc)}
        assert expected, "the case must select something"
        results = await vector_searches(store, flt, embed("database error"))
        # Vector search matches everything in scope, so it must find every expected document.
        for strategy, hits in results.items():
            assert {h.document_id for h in hits} == expected, strategy

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(principals=st.sets(st.sampled_from(PRINCIPALS)))
    async def test_vector_search_acl_never_leaks(self, store: VectorStore, corpus, embed, principals: set[str]) -> None:
        flt = SearchFilter(principals=tuple(sorted(principals)))
        results = await vector_searches(store, flt, embed("confidential"))
        allowed = {doc_id for doc_id, doc in corpus.items() if visible(doc, principals)}
        for strategy, hits in results.items():
            leaked = {corpus[h.document_id].key for h in hits if h.document_id in corpus} - {
                corpus[d].key for d in allowed}
            assert not leaked, f"{strategy} leaked {leaked} to a caller with {principals}"
        # And what the caller may see is really found (the check above is not vacuous).
        assert {h.document_id for h in results["vector-exact"] if h.document_id in corpus} == allowed

    async def test_top_k_is_validated(self, store: VectorStore, embed) -> None:
        for bad in (0, -1, 100_000):
            with pytest.raises(InvalidInputError, match="top_k"):
                await store.vector_search(embed("x"), ALL, bad)

    async def test_vector_scores_are_finite(self, store: VectorStore, corpus, embed) -> None:
        results = await vector_searches(store, ALL, embed("PostgreSQL"))
        assert all(np.isfinite(h.score) for hits in results.values() for h in hits)

    async def test_parent_chunks_are_stored_but_never_searched(self, store: VectorStore, embed) -> None:
        collection = new_collection()
        doc, parent, child = parent_and_child(collection, embed)
        await store.replace_documents([(doc, [parent, child])])
        results = await vector_searches(store, SearchFilter(collection=collection), embed("quokka"))
        for strategy, hits in results.items():
            assert [h.chunk_id for h in hits] == [child.id], strategy
            assert hits[0].parent_id == parent.id, strategy
        stored = await store.chunks_by_id([parent.id], with_embeddings=True)
        assert stored[parent.id][0].text == parent.text and stored[parent.id][1] is None

    async def test_degenerate_query_vectors_are_refused(self, store: VectorStore) -> None:
        with pytest.raises(InvalidInputError, match="zeros"):
            await store.vector_search([0.0] * 384, ALL, 5)
