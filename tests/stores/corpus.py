"""The corpus every store contract searches, the filter cases run against it, and the fixtures that
load it. Loading uses only ``VectorStore.replace_documents``, so any store can be tested with it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from rag_service.domain import ChunkRecord, DocumentRecord, MetadataRange, SearchFilter
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


# Each filter with the corpus documents it keeps; every search of every capability is run with each.
FILTER_CASES = [
    pytest.param(SearchFilter(collection="other", acl_bypass=True), lambda d: d.collection == "other",
                 id="collection"),
    pytest.param(SearchFilter(metadata_equals={"team": "db"}, acl_bypass=True), lambda d: d.metadata["team"] == "db",
                 id="meta-eq"),
    pytest.param(SearchFilter(metadata_in={"team": ["kitchen", "hr"]}, acl_bypass=True),
                 lambda d: d.metadata["team"] in ("kitchen", "hr"), id="meta-in"),
    pytest.param(SearchFilter(metadata_range={"year": MetadataRange(gte=2024)}, acl_bypass=True),
                 lambda d: d.metadata["year"] >= 2024, id="meta-gte"),
    pytest.param(SearchFilter(metadata_range={"year": MetadataRange(gt=2021, lt=2025)}, acl_bypass=True),
                 lambda d: 2021 < d.metadata["year"] < 2025, id="meta-between"),
    pytest.param(SearchFilter(metadata_range={"published": MetadataRange(lte="2023-12-31")}, acl_bypass=True),
                 lambda d: d.metadata["published"] <= "2023-12-31", id="meta-date-str"),
    pytest.param(SearchFilter(date_from=datetime(2024, 1, 1, tzinfo=UTC), date_to=datetime(2025, 3, 1, tzinfo=UTC),
                              acl_bypass=True),
                 lambda d: datetime(2024, 1, 1, tzinfo=UTC) <= d.effective <= datetime(2025, 3, 1, tzinfo=UTC),
                 id="date-range"),
    pytest.param(SearchFilter(lob="infra", acl_bypass=True), lambda d: d.lob == "infra", id="lob"),
    pytest.param(SearchFilter(tags_any=("recipes", "deals"), acl_bypass=True),
                 lambda d: bool({"recipes", "deals"} & set(d.tags)), id="tags"),
    pytest.param(SearchFilter(collection="kb", metadata_equals={"team": "db"}, lob="infra", acl_bypass=True),
                 lambda d: d.key == "pg", id="combined"),
]
# One query that matches some chunk of every corpus document in text search, for the filter cases.
FILTER_QUERY = "PostgreSQL OR bread OR engineers OR error OR Falcon OR standby"
# The query of the ACL cases: it matches chunks of both public and restricted documents.
ACL_QUERY = "Falcon OR salary OR engineers OR error"


def new_collection() -> str:
    """A collection of its own, so a test's documents never show up in another's scoped search."""
    return f"c-{uuid.uuid4().hex[:8]}"


def chunks_for(document: DocumentRecord, texts: Sequence[str],
               embed: Callable[[str], list[float]]) -> list[ChunkRecord]:
    return [ChunkRecord(document_id=document.id, ordinal=i, text=t, start_char=0, end_char=len(t),
                        token_count=len(t.split()), content_hash=t, embedding=embed(t)) for i, t in enumerate(texts)]


def nul_document(collection: str, embed: Callable[[str], list[float]]) -> tuple[DocumentRecord, ChunkRecord]:
    """A document with NUL characters in its title, metadata and text (PostgreSQL refuses them)."""
    doc = DocumentRecord(collection=collection, source_uri="test://nul", content_hash="n", title="a\x00b",
                         metadata={"k\x00": "v\x00", "list": ["x\x00"]})
    chunk = ChunkRecord(document_id=doc.id, ordinal=0, text="nul\x00byte", start_char=0, end_char=8,
                        token_count=2, content_hash="n", metadata={"m": "\x00"}, embedding=embed("nul byte"))
    return doc, chunk


def parent_and_child(collection: str, embed: Callable[[str], list[float]]
                     ) -> tuple[DocumentRecord, ChunkRecord, ChunkRecord]:
    """A document whose one searchable chunk has a parent chunk (stored without an embedding)."""
    doc = DocumentRecord(collection=collection, source_uri="test://tree", content_hash="t")
    parent = ChunkRecord(document_id=doc.id, ordinal=0, text="quokka parent context", start_char=0,
                         end_char=21, token_count=3, content_hash="p")
    child = ChunkRecord(document_id=doc.id, parent_id=parent.id, ordinal=1, text="quokka child",
                        start_char=0, end_char=12, token_count=2, content_hash="c", embedding=embed("quokka"))
    return doc, parent, child


class CorpusFixtures:
    """The fixtures every contract shares. A test class provides ``store`` (class scope, empty,
    dimension 384); inheriting several contracts still loads the corpus once per class."""

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
            vectors = await local_embedder.embed(doc.texts)
            offset = 0
            chunks = []
            for ordinal, (chunk_text, vector) in enumerate(zip(doc.texts, vectors, strict=True)):
                chunks.append(ChunkRecord(
                    document_id=record.id, ordinal=ordinal, text=chunk_text, start_char=offset,
                    end_char=offset + len(chunk_text), token_count=len(chunk_text.split()),
                    content_hash=f"{doc.key}-{ordinal}", metadata={"page": ordinal + 1},
                    embedding=vector.tolist(),
                ))
                offset += len(chunk_text) + 1
            assert await store.replace_documents([(record, chunks)]) == len(chunks)
            by_id[record.id] = doc
        return by_id

    @pytest.fixture(scope="class")
    @classmethod
    def embed(cls, local_embedder) -> Callable[[str], list[float]]:
        return lambda text: local_embedder.encode([text])[0].tolist()
