"""PgVectorStore: the store adapter on PostgreSQL + pgvector, assembled from its parts."""

from __future__ import annotations

from rag_service.config import Settings
from rag_service.db.engine import Database
from rag_service.stores.pgvector.bm25 import PgKeywordSearch
from rag_service.stores.pgvector.search import PgSearches
from rag_service.stores.pgvector.term_index import TermIndex
from rag_service.stores.pgvector.write import PgWrites


class PgVectorStore(PgKeywordSearch, PgSearches, PgWrites):
    """Implements ``VectorStore`` and every capability: ``KeywordSearch``, ``MetadataSearch`` and
    ``PatternSearch`` (see ``rag_service.stores.base``).

    Each part is a mixin on ``PgStoreBase``, which holds the database, the tuning knobs
    (``ef_search``, ``pattern_timeout_ms``) and the schema read once from the migration; the
    constructor is that base class's.
    """

    @classmethod
    def from_settings(cls, db: Database, settings: Settings) -> PgVectorStore:
        """The store the Settings describe: HNSW's ef_search, the pattern timeout, and the tantivy
        keyword index under the data dir unless ``keyword_engine`` is ``postgres`` (``auto`` uses
        it from ``keyword_index_min_chunks`` chunks, ``tantivy`` always)."""
        term_index = None if settings.keyword_engine == "postgres" else TermIndex(
            db, settings.data_dir / "keyword-index",
            min_chunks=settings.keyword_index_min_chunks if settings.keyword_engine == "auto" else 0)
        return cls(db, ef_search=settings.hnsw_ef_search, pattern_timeout_ms=settings.pattern_timeout_ms,
                   term_index=term_index, vector_index=settings.vector_index)
