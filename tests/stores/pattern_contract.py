"""The behaviour of a store with the PatternSearch capability: literal and regex matches in chunk
text. Subclass ``PatternSearchContract`` next to ``VectorStoreContract``."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_service.domain import DocumentRecord, SearchFilter
from rag_service.errors import InvalidInputError, PatternTooCommonError
from rag_service.stores.base import PatternSearch, VectorStore
from tests.stores.corpus import (
    ALL,
    FILTER_CASES,
    PRINCIPALS,
    CorpusFixtures,
    chunks_for,
    new_collection,
    nul_document,
    parent_and_child,
    visible,
)


class PatternStore(VectorStore, PatternSearch, Protocol):
    """What this contract needs: the core to write with, and the capability under test."""


class PatternSearchContract(CorpusFixtures):
    """Inherit and provide ``store`` (class scope, empty, dimension 384)."""

    async def test_pattern_prefilter_narrows_by_whole_tokens(self, store: PatternStore, corpus) -> None:
        hits = await store.pattern_search(r"(^|[^[:alnum:]_])E\-4012($|[^[:alnum:]_])", ALL, 10, mode="regex",
                                          prefilter="E-4012")
        assert {corpus[h.document_id].key for h in hits} == {"pg", "merger"}
        # A prefilter of stop words only cannot narrow anything and is ignored.
        assert len(await store.pattern_search("the", ALL, 50, prefilter="the")) == len(
            await store.pattern_search("the", ALL, 50))

    async def test_pattern_search_literal_and_regex(self, store: PatternStore, corpus) -> None:
        literal = await store.pattern_search("E-4012", ALL, 10)
        assert {corpus[h.document_id].key for h in literal} == {"pg", "merger"}
        regex = await store.pattern_search(r"E-\d{4}", ALL, 10, mode="regex")
        assert {h.chunk_id for h in regex} == {h.chunk_id for h in literal}
        # LIKE wildcards in a literal match only themselves.
        assert [corpus[h.document_id].key for h in await store.pattern_search("50%", ALL, 10)] == ["bread"]
        assert await store.pattern_search("5_%", ALL, 10) == []
        assert await store.pattern_search("postgresql performance", ALL, 10, case_sensitive=True) == []
        assert len(await store.pattern_search("postgresql performance", ALL, 10)) == 1

    async def test_pattern_search_stops_past_max_matches(self, store: PatternStore, corpus) -> None:
        every = await store.pattern_search("e", ALL, 1000)
        assert 2 < len(every) < 1000  # all of them, so the count below is exact
        assert await store.pattern_search("e", ALL, 5, max_matches=len(every)) == every[:5]
        with pytest.raises(PatternTooCommonError, match=f"more than {len(every) - 1} chunks"):
            await store.pattern_search("e", ALL, 5, max_matches=len(every) - 1)
        # Counted under the caller's filter: what it may not read does not count.
        hidden = await store.pattern_search("E-4012", SearchFilter(principals=()), 10, max_matches=1)
        assert len(hidden) == 1 and corpus[hidden[0].document_id].key == "pg"
        # A bounded pattern found nowhere finds nothing; a bounded regex ranks as an unbounded one
        # and is refused past its bound, as a literal is.
        assert await store.pattern_search("no-such-pattern", ALL, 5, max_matches=1) == []
        regex = await store.pattern_search("e[a-z]", ALL, 1000, mode="regex")
        assert 2 < len(regex) < 1000
        assert await store.pattern_search("e[a-z]", ALL, 5, mode="regex", max_matches=len(regex)) == regex[:5]
        with pytest.raises(PatternTooCommonError, match=f"more than {len(regex) - 1} chunks"):
            await store.pattern_search("e[a-z]", ALL, 5, mode="regex", max_matches=len(regex) - 1)

    async def test_pattern_search_scores_by_occurrences(self, store: PatternStore, corpus) -> None:
        hits = await store.pattern_search("e", ALL, 50)
        assert hits[0].score == max(h.text.lower().count("e") for h in hits)
        assert all(h.score == h.text.lower().count("e") for h in hits)

    @pytest.mark.parametrize("pattern, mode, message", [
        ("(", "regex", "invalid regex"),
        ("(?P<n>x)", "regex", "invalid regex"),
        (r"(a)\1", "regex", "back-references"),
        ("x" * 300, "literal", "limit"),
        ("   ", "literal", "empty"),
        ("a", "glob", "mode"),
    ])
    async def test_pattern_search_rejects_unsafe_patterns(self, store: PatternStore, pattern, mode, message) -> None:
        with pytest.raises(InvalidInputError, match=message):
            await store.pattern_search(pattern, ALL, 5, mode=mode)

    async def test_regex_word_boundaries_use_the_store_dialect(self, store: PatternStore, corpus) -> None:
        hits = await store.pattern_search(r"\yE-4012\y", ALL, 10, mode="regex")
        assert {corpus[h.document_id].key for h in hits} == {"pg", "merger"}

    @pytest.mark.parametrize("flt, keep", FILTER_CASES)
    async def test_pattern_search_applies_every_filter(self, store: PatternStore, corpus, flt, keep) -> None:
        expected = {doc_id for doc_id, doc in corpus.items() if keep(doc)}
        assert expected, "the case must select something"
        found = {h.document_id for h in await store.pattern_search("e", flt, 50)}
        assert found <= expected, "pattern returned documents outside the filter"

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(principals=st.sets(st.sampled_from(PRINCIPALS)))
    async def test_pattern_search_acl_never_leaks(self, store: PatternStore, corpus, principals: set[str]) -> None:
        hits = await store.pattern_search("e", SearchFilter(principals=tuple(sorted(principals))), 50)
        allowed = {doc_id for doc_id, doc in corpus.items() if visible(doc, principals)}
        leaked = {corpus[h.document_id].key for h in hits if h.document_id in corpus} - {corpus[d].key for d in allowed}
        assert not leaked, f"pattern leaked {leaked} to a caller with {principals}"
        # Every corpus document has an "e": what the caller may see is really found.
        assert {h.document_id for h in hits if h.document_id in corpus} == allowed

    async def test_pattern_scores_are_finite(self, store: PatternStore, corpus) -> None:
        assert all(np.isfinite(h.score) for h in await store.pattern_search("e", ALL, 50))

    async def test_pattern_search_forgets_deleted_documents(self, store: PatternStore, embed) -> None:
        collection = new_collection()
        doc = DocumentRecord(collection=collection, source_uri="test://del", content_hash="d")
        await store.replace_documents([(doc, chunks_for(doc, [f"zebra crossing {i}" for i in range(3)], embed))])
        flt = SearchFilter(collection=collection)
        assert len(await store.pattern_search("zebra", flt, 10)) == 3
        assert await store.delete_document(doc.id) is True
        assert await store.pattern_search("zebra", flt, 10) == []

    async def test_parent_chunks_are_never_pattern_searched(self, store: PatternStore, embed) -> None:
        collection = new_collection()
        doc, parent, child = parent_and_child(collection, embed)
        await store.replace_documents([(doc, [parent, child])])
        hits = await store.pattern_search("quokka", SearchFilter(collection=collection), 5)
        assert [h.chunk_id for h in hits] == [child.id]
        assert hits[0].parent_id == parent.id

    async def test_nul_characters_are_dropped_before_pattern_search(self, store: PatternStore, embed) -> None:
        collection = new_collection()
        doc, chunk = nul_document(collection, embed)
        await store.replace_documents([(doc, [chunk])])
        [hit] = await store.pattern_search("nulbyte", SearchFilter(collection=collection), 5)
        assert hit.title == "ab" and hit.metadata == {"m": ""}
