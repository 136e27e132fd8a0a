"""The behaviour every VectorStore must show. A store's test module subclasses
``VectorStoreContract`` and provides a class-scoped ``store`` fixture holding an empty store."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_service.domain import ChunkRecord, DocumentRecord, MetadataRange, SearchFilter, SearchHit
from rag_service.errors import InvalidInputError
from rag_service.stores.base import VectorStore

ALL = SearchFilter(acl_bypass=True)


@dataclass(frozen=True)
class Doc:
    key: str
    collection: str
    texts: tuple[str, ...]
    metadata: dict
    lob: str | None = None
    tags: tuple[str, ...] = ()
    acl: tuple[str, ...] = ()
    effective: datetime | None = None


CORPUS = [
    Doc("pg", "kb", (
        "PostgreSQL performance depends on shared_buffers and work_mem settings.",
        "Error E-4012 occurs when the connection pool is exhausted; raise max_connections.",
    ), {"team": "db", "year": 2024, "published": "2024-03-01"}, "infra", ("database", "ops"),
        (), datetime(2024, 3, 1, tzinfo=UTC)),
    Doc("bread", "kb", (
        "Baking bread requires flour, water, yeast and salt.",
        "Knead the dough for ten minutes and let it rise until doubled, about 50% larger.",
    ), {"team": "kitchen", "year": 2021, "published": "2021-05-01"}, "food", ("recipes",),
        (), datetime(2021, 5, 1, tzinfo=UTC)),
    Doc("merger", "kb", (
        "Confidential: Project Falcon will acquire a competitor next quarter.",
        "Legal review found error E-4012 in the draft contract numbering.",
    ), {"team": "legal", "year": 2025, "published": "2025-01-10"}, "legal", ("deals",),
        ("legal-team",), datetime(2025, 1, 10, tzinfo=UTC)),
    Doc("salaries", "kb", (
        "Salary bands for engineers were revised in 2025.",
        "Senior engineers moved to band 7 after the review.",
    ), {"team": "hr", "year": 2025, "published": "2025-06-01"}, "people", ("compensation",),
        ("hr", "legal-team"), datetime(2025, 6, 1, tzinfo=UTC)),
    Doc("replication", "other", (
        "PostgreSQL replication ships write-ahead log segments to standby servers.",
        "A standby can be promoted when the primary fails.",
    ), {"team": "db", "year": 2023, "published": "2023-09-15"}, "infra", ("database",),
        (), datetime(2023, 9, 15, tzinfo=UTC)),
]
PRINCIPALS = ["hr", "legal-team", "eng", "ops"]


def visible(doc: Doc, principals: set[str]) -> bool:
    return not doc.acl or bool(set(doc.acl) & principals)


class VectorStoreContract:
    """Inherit and provide ``store`` (class scope, empty, dimension 384)."""

    @pytest.fixture(scope="class")
    @classmethod
    async def corpus(cls, store: VectorStore, local_embedder) -> dict[uuid.UUID, Doc]:
        by_id: dict[uuid.UUID, Doc] = {}
        for doc in CORPUS:
            record = DocumentRecord(
                collection=doc.collection, source_uri=f"test://{doc.key}", title=doc.key.title(),
                content_hash=doc.key, metadata=doc.metadata, acl=doc.acl, lob=doc.lob, tags=doc.tags,
                effective_date=doc.effective,
            )
            doc_id = await store.upsert_document(record)
            vectors = await local_embedder.embed(doc.texts)
            offset = 0
            chunks = []
            for ordinal, (chunk_text, vector) in enumerate(zip(doc.texts, vectors, strict=True)):
                chunks.append(ChunkRecord(
                    document_id=doc_id, ordinal=ordinal, text=chunk_text, start_char=offset,
                    end_char=offset + len(chunk_text), token_count=len(chunk_text.split()),
                    content_hash=f"{doc.key}-{ordinal}", metadata={"page": ordinal + 1},
                    embedding=vector.tolist(),
                ))
                offset += len(chunk_text) + 1
            assert await store.upsert_chunks(chunks) == len(chunks)
            by_id[doc_id] = doc
        return by_id

    @pytest.fixture(scope="class")
    @classmethod
    def embed(cls, local_embedder) -> Callable[[str], list[float]]:
        return lambda text: local_embedder.encode([text])[0].tolist()

    @staticmethod
    async def run_all(store: VectorStore, flt: SearchFilter, query: str, vector: list[float],
                      top_k: int = 50) -> dict[str, list[SearchHit]]:
        return {
            "vector": await store.vector_search(vector, flt, top_k),
            "vector-exact": await store.vector_search(vector, flt, top_k, exact=True),
            "text": await store.text_search(query, flt, top_k),
            "keyword": await store.keyword_search(query.replace(" OR ", " "), flt, top_k),
            "metadata": await store.metadata_search(flt, top_k),
            "pattern": await store.pattern_search("e", flt, top_k),
        }

    # --- writes ----------------------------------------------------------------------------

    async def test_counts_after_upsert(self, store: VectorStore, corpus) -> None:
        counts = await store.counts()
        assert counts.documents >= len(CORPUS)
        assert counts.chunks >= 2 * len(CORPUS)
        assert counts.embedded_chunks == counts.chunks

    async def test_reupsert_is_idempotent_and_updates(self, store: VectorStore, embed) -> None:
        collection = f"c-{uuid.uuid4().hex[:8]}"
        doc = DocumentRecord(collection=collection, source_uri="test://idem", content_hash="h1")
        doc_id = await store.upsert_document(doc)
        again = await store.upsert_document(doc.model_copy(update={"id": uuid.uuid4(), "content_hash": "h2"}))
        assert again == doc_id, "the same source_uri in the same collection is the same document"
        chunk = ChunkRecord(document_id=doc_id, ordinal=0, text="alpha beta gamma", start_char=0, end_char=16,
                            token_count=3, content_hash="x", embedding=embed("alpha beta gamma"))
        before = await store.counts()
        await store.upsert_chunks([chunk])
        await store.upsert_chunks([chunk])
        await store.upsert_chunks([chunk, chunk])
        after = await store.counts()
        assert after.chunks == before.chunks + 1
        changed = chunk.model_copy(update={"text": "delta epsilon", "embedding": embed("delta epsilon")})
        await store.upsert_chunks([changed])
        hits = await store.text_search("epsilon", SearchFilter(collection=collection), 5)
        assert [h.chunk_id for h in hits] == [chunk.id]
        assert await store.text_search("gamma", SearchFilter(collection=collection), 5) == []

    async def test_chunks_of_unknown_document_are_refused_whole(self, store: VectorStore, embed) -> None:
        before = await store.counts()
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
        assert (await store.counts()).chunks == before.chunks

    async def test_wrong_dimension_is_refused(self, store: VectorStore, corpus) -> None:
        doc_id = next(iter(corpus))
        bad = ChunkRecord(document_id=doc_id, ordinal=9, text="x", start_char=0, end_char=1, token_count=1,
                          content_hash="x", embedding=[0.1] * 10)
        with pytest.raises(InvalidInputError, match="384"):
            await store.upsert_chunks([bad])
        with pytest.raises(InvalidInputError, match="dimensions"):
            await store.vector_search([0.1] * 10, ALL, 5)

    async def test_delete_document_removes_its_chunks(self, store: VectorStore, embed) -> None:
        collection = f"c-{uuid.uuid4().hex[:8]}"
        doc_id = await store.upsert_document(
            DocumentRecord(collection=collection, source_uri="test://del", content_hash="d"))
        await store.upsert_chunks([
            ChunkRecord(document_id=doc_id, ordinal=i, text=f"zebra crossing {i}", start_char=0, end_char=16,
                        token_count=3, content_hash=str(i), embedding=embed(f"zebra crossing {i}"))
            for i in range(3)
        ])
        flt = SearchFilter(collection=collection)
        assert len(await store.text_search("zebra", flt, 10)) == 3
        assert await store.delete_document(doc_id) is True
        hits = await self.run_all(store, flt, "zebra", embed("zebra"))
        assert all(result == [] for result in hits.values())
        assert await store.delete_document(doc_id) is False

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

    async def test_text_search_uses_web_search_syntax(self, store: VectorStore, corpus) -> None:
        hits = await store.text_search("yeast flour", ALL, 5)
        assert {corpus[h.document_id].key for h in hits} == {"bread"}
        with_postgres = await store.text_search("PostgreSQL", ALL, 10)
        without_replication = await store.text_search("PostgreSQL -replication", ALL, 10)
        assert {corpus[h.document_id].key for h in with_postgres} == {"pg", "replication"}
        assert {corpus[h.document_id].key for h in without_replication} == {"pg"}
        assert await store.text_search("the and of", ALL, 5) == []  # only stop words

    async def test_keyword_search_is_okapi_bm25(self, store: VectorStore, embed) -> None:
        """Scores equal the BM25 formula (Lucene/bm25s variant, k1=1.2, b=0.75) worked by hand."""
        collection = f"c-{uuid.uuid4().hex[:8]}"
        doc_id = await store.upsert_document(DocumentRecord(collection=collection, source_uri="t://b",
                                                            content_hash="b"))
        texts = ["zebra zebra lion", "zebra", "lion tiger"]
        chunks = [ChunkRecord(document_id=doc_id, ordinal=i, text=t, start_char=0, end_char=len(t),
                              token_count=len(t.split()), content_hash=str(i), embedding=embed(t))
                  for i, t in enumerate(texts)]
        await store.upsert_chunks(chunks)
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
        assert await store.searchable_chunks(collection) == 3
        assert await store.collection_exists(collection) and not await store.collection_exists(collection + "x")

    async def test_keyword_index_follows_updates_and_deletes(self, store: VectorStore, embed) -> None:
        collection = f"c-{uuid.uuid4().hex[:8]}"
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
        assert await store.searchable_chunks(collection) == 1
        await store.delete_document(doc_id)
        assert await store.keyword_search("seal", flt, 5) == []
        assert await store.searchable_chunks(collection) == 0

    async def test_keyword_search_keeps_web_search_operators(self, store: VectorStore, corpus) -> None:
        plain = {corpus[h.document_id].key for h in await store.keyword_search("PostgreSQL", ALL, 10)}
        assert plain == {"pg", "replication"}
        excluded = {corpus[h.document_id].key for h in await store.keyword_search("PostgreSQL -replication", ALL, 10)}
        assert excluded == {"pg"}
        phrase = await store.keyword_search('"connection pool"', ALL, 10)
        assert [corpus[h.document_id].key for h in phrase] == ["pg"]

    async def test_embeddings_and_chunks_by_id(self, store: VectorStore, corpus, embed) -> None:
        hit = (await store.vector_search(embed("yeast and flour"), ALL, 1))[0]
        vectors = await store.embeddings_by_id([hit.chunk_id, uuid.uuid4()])
        assert list(vectors) == [hit.chunk_id]
        assert float(vectors[hit.chunk_id] @ np.asarray(embed("yeast and flour"))) == pytest.approx(hit.score, abs=1e-5)
        chunks = await store.chunks_by_id([hit.chunk_id])
        assert chunks[hit.chunk_id][0].text == hit.text and chunks[hit.chunk_id][1] is None

    async def test_pattern_prefilter_narrows_by_whole_tokens(self, store: VectorStore, corpus) -> None:
        hits = await store.pattern_search(r"(^|[^[:alnum:]_])E\-4012($|[^[:alnum:]_])", ALL, 10, mode="regex",
                                          prefilter="E-4012")
        assert {corpus[h.document_id].key for h in hits} == {"pg", "merger"}
        # A prefilter of stop words only cannot narrow anything and is ignored.
        assert len(await store.pattern_search("the", ALL, 50, prefilter="the")) == len(
            await store.pattern_search("the", ALL, 50))

    async def test_metadata_search_orders_by_date(self, store: VectorStore, corpus) -> None:
        flt = SearchFilter(collection="kb", acl_bypass=True)
        newest = [corpus[h.document_id].key for h in await store.metadata_search(flt, 20)]
        oldest = [corpus[h.document_id].key for h in await store.metadata_search(flt, 20, order="oldest")]
        assert newest[0] == "salaries" and newest[-1] == "bread"
        assert oldest[0] == "bread"
        scores = [h.score for h in await store.metadata_search(flt, 20)]
        assert scores == sorted(scores, reverse=True)

    async def test_pattern_search_literal_and_regex(self, store: VectorStore, corpus) -> None:
        literal = await store.pattern_search("E-4012", ALL, 10)
        assert {corpus[h.document_id].key for h in literal} == {"pg", "merger"}
        regex = await store.pattern_search(r"E-\d{4}", ALL, 10, mode="regex")
        assert {h.chunk_id for h in regex} == {h.chunk_id for h in literal}
        # LIKE wildcards in a literal match only themselves.
        assert [corpus[h.document_id].key for h in await store.pattern_search("50%", ALL, 10)] == ["bread"]
        assert await store.pattern_search("5_%", ALL, 10) == []
        assert await store.pattern_search("postgresql performance", ALL, 10, case_sensitive=True) == []
        assert len(await store.pattern_search("postgresql performance", ALL, 10)) == 1

    async def test_pattern_search_scores_by_occurrences(self, store: VectorStore, corpus) -> None:
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
    async def test_pattern_search_rejects_unsafe_patterns(self, store: VectorStore, pattern, mode, message) -> None:
        with pytest.raises(InvalidInputError, match=message):
            await store.pattern_search(pattern, ALL, 5, mode=mode)

    @pytest.mark.parametrize("flt, keep", [
        (SearchFilter(collection="other", acl_bypass=True), lambda d: d.collection == "other"),
        (SearchFilter(metadata_equals={"team": "db"}, acl_bypass=True), lambda d: d.metadata["team"] == "db"),
        (SearchFilter(metadata_in={"team": ["kitchen", "hr"]}, acl_bypass=True),
         lambda d: d.metadata["team"] in ("kitchen", "hr")),
        (SearchFilter(metadata_range={"year": MetadataRange(gte=2024)}, acl_bypass=True),
         lambda d: d.metadata["year"] >= 2024),
        (SearchFilter(metadata_range={"year": MetadataRange(gt=2021, lt=2025)}, acl_bypass=True),
         lambda d: 2021 < d.metadata["year"] < 2025),
        (SearchFilter(metadata_range={"published": MetadataRange(lte="2023-12-31")}, acl_bypass=True),
         lambda d: d.metadata["published"] <= "2023-12-31"),
        (SearchFilter(date_from=datetime(2024, 1, 1, tzinfo=UTC), date_to=datetime(2025, 3, 1, tzinfo=UTC),
                      acl_bypass=True), lambda d: datetime(2024, 1, 1, tzinfo=UTC) <= d.effective
         <= datetime(2025, 3, 1, tzinfo=UTC)),
        (SearchFilter(lob="infra", acl_bypass=True), lambda d: d.lob == "infra"),
        (SearchFilter(tags_any=("recipes", "deals"), acl_bypass=True),
         lambda d: bool({"recipes", "deals"} & set(d.tags))),
        (SearchFilter(collection="kb", metadata_equals={"team": "db"}, lob="infra", acl_bypass=True),
         lambda d: d.key == "pg"),
    ], ids=["collection", "meta-eq", "meta-in", "meta-gte", "meta-between", "meta-date-str", "date-range",
            "lob", "tags", "combined"])
    async def test_every_search_applies_every_filter(self, store: VectorStore, corpus, embed, flt, keep) -> None:
        expected = {doc_id for doc_id, doc in corpus.items() if keep(doc)}
        assert expected, "the case must select something"
        results = await self.run_all(store, flt, "PostgreSQL OR bread OR engineers OR error OR Falcon OR standby",
                                     embed("database error"))
        for strategy, hits in results.items():
            found = {h.document_id for h in hits}
            assert found <= expected, f"{strategy} returned documents outside the filter"
        # Strategies that match everything in scope must find every expected document.
        for strategy in ("vector", "vector-exact", "metadata"):
            assert {h.document_id for h in results[strategy]} == expected, strategy

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(principals=st.sets(st.sampled_from(PRINCIPALS)))
    async def test_acl_never_leaks(self, store: VectorStore, corpus, embed, principals: set[str]) -> None:
        flt = SearchFilter(principals=tuple(sorted(principals)))
        results = await self.run_all(store, flt, "Falcon OR salary OR engineers OR error", embed("confidential"))
        allowed = {doc_id for doc_id, doc in corpus.items() if visible(doc, principals)}
        for strategy, hits in results.items():
            leaked = {corpus[h.document_id].key for h in hits if h.document_id in corpus} - {
                corpus[d].key for d in allowed}
            assert not leaked, f"{strategy} leaked {leaked} to a caller with {principals}"
        # And what the caller may see is really found (the check above is not vacuous).
        assert {h.document_id for h in results["metadata"] if h.document_id in corpus} == allowed

    async def test_top_k_is_validated(self, store: VectorStore, embed) -> None:
        for bad in (0, -1, 100_000):
            with pytest.raises(InvalidInputError, match="top_k"):
                await store.vector_search(embed("x"), ALL, bad)

    async def test_scores_are_finite(self, store: VectorStore, corpus, embed) -> None:
        results = await self.run_all(store, ALL, "PostgreSQL", embed("PostgreSQL"))
        assert all(np.isfinite(h.score) for hits in results.values() for h in hits)

    async def test_replace_documents_swaps_chunks_atomically(self, store: VectorStore, embed) -> None:
        collection = f"c-{uuid.uuid4().hex[:8]}"
        doc = DocumentRecord(collection=collection, source_uri="test://swap", content_hash="v1")

        def chunks_for(document: DocumentRecord, texts: list[str]) -> list[ChunkRecord]:
            return [ChunkRecord(document_id=document.id, ordinal=i, text=t, start_char=0, end_char=len(t),
                                token_count=2, content_hash=t, embedding=embed(t)) for i, t in enumerate(texts)]

        await store.replace_documents([(doc, chunks_for(doc, ["old walrus", "old narwhal"]))])
        flt = SearchFilter(collection=collection)
        assert len(await store.text_search("old", flt, 10)) == 2
        v2 = doc.model_copy(update={"content_hash": "v2", "version": 2})
        await store.replace_documents([(v2, chunks_for(v2, ["new walrus"]))])
        assert await store.text_search("old", flt, 10) == []
        assert [h.text for h in await store.text_search("walrus", flt, 10)] == ["new walrus"]

        # A failing batch leaves every document as it was.
        other = DocumentRecord(collection=collection, source_uri="test://other", content_hash="o")
        broken = chunks_for(other, ["other text"]) + [
            ChunkRecord(document_id=uuid.uuid4(), ordinal=0, text="orphan", start_char=0, end_char=6,
                        token_count=1, content_hash="x", embedding=embed("orphan"))]
        v3 = doc.model_copy(update={"content_hash": "v3", "version": 3})
        with pytest.raises(InvalidInputError):
            await store.replace_documents([(v3, chunks_for(v3, ["third walrus"])), (other, broken)])
        assert [h.text for h in await store.text_search("walrus", flt, 10)] == ["new walrus"]
        assert await store.text_search("other", flt, 10) == []

    async def test_regex_word_boundaries_use_the_store_dialect(self, store: VectorStore, corpus) -> None:
        hits = await store.pattern_search(r"\yE-4012\y", ALL, 10, mode="regex")
        assert {corpus[h.document_id].key for h in hits} == {"pg", "merger"}

    async def test_parent_chunks_are_stored_but_never_searched(self, store: VectorStore, embed) -> None:
        collection = f"c-{uuid.uuid4().hex[:8]}"
        doc = DocumentRecord(collection=collection, source_uri="test://tree", content_hash="t")
        parent = ChunkRecord(document_id=doc.id, ordinal=0, text="quokka parent context", start_char=0,
                             end_char=21, token_count=3, content_hash="p")
        child = ChunkRecord(document_id=doc.id, parent_id=parent.id, ordinal=1, text="quokka child",
                            start_char=0, end_char=12, token_count=2, content_hash="c", embedding=embed("quokka"))
        await store.replace_documents([(doc, [parent, child])])
        flt = SearchFilter(collection=collection)
        results = await self.run_all(store, flt, "quokka", embed("quokka"))
        results["pattern"] = await store.pattern_search("quokka", flt, 5)
        for strategy, hits in results.items():
            assert [h.chunk_id for h in hits] == [child.id], strategy
        assert results["pattern"][0].parent_id == parent.id

    async def test_unknown_parent_is_refused(self, store: VectorStore, embed) -> None:
        doc = DocumentRecord(collection="kb-parents", source_uri="test://orphan-child", content_hash="o")
        child = ChunkRecord(document_id=doc.id, parent_id=uuid.uuid4(), ordinal=0, text="x", start_char=0,
                            end_char=1, token_count=1, content_hash="x", embedding=embed("x"))
        with pytest.raises(InvalidInputError, match="parent_id"):
            await store.replace_documents([(doc, [child])])

    async def test_nul_characters_are_dropped_not_fatal(self, store: VectorStore, embed) -> None:
        collection = f"c-{uuid.uuid4().hex[:8]}"
        doc = DocumentRecord(collection=collection, source_uri="test://nul", content_hash="n", title="a\x00b",
                             metadata={"k\x00": "v\x00", "list": ["x\x00"]})
        chunk = ChunkRecord(document_id=doc.id, ordinal=0, text="nul\x00byte", start_char=0, end_char=8,
                            token_count=2, content_hash="n", metadata={"m": "\x00"}, embedding=embed("nul byte"))
        await store.replace_documents([(doc, [chunk])])
        [hit] = await store.pattern_search("nulbyte", SearchFilter(collection=collection), 5)
        assert hit.title == "ab" and hit.metadata == {"m": ""}

    async def test_reusing_a_document_id_for_another_source_is_refused(self, store: VectorStore) -> None:
        doc = DocumentRecord(collection="kb-ids", source_uri="test://first", content_hash="f")
        await store.upsert_document(doc)
        with pytest.raises(InvalidInputError):
            await store.upsert_document(doc.model_copy(update={"source_uri": "test://second"}))

    async def test_degenerate_query_vectors_are_refused(self, store: VectorStore) -> None:
        with pytest.raises(InvalidInputError, match="zeros"):
            await store.vector_search([0.0] * 384, ALL, 5)
