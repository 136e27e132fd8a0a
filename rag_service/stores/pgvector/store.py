"""PgVectorStore: the store adapter on PostgreSQL + pgvector, assembled from its parts."""

from __future__ import annotations

from rag_service.stores.pgvector.bm25 import PgKeywordSearch
from rag_service.stores.pgvector.search import PgSearches
from rag_service.stores.pgvector.write import PgWrites


class PgVectorStore(PgKeywordSearch, PgSearches, PgWrites):
    """Implements ``VectorStore`` and every capability: ``KeywordSearch``, ``MetadataSearch`` and
    ``PatternSearch`` (see ``rag_service.stores.base``).

    Each part is a mixin on ``PgStoreBase``, which holds the database, the tuning knobs
    (``ef_search``, ``pattern_timeout_ms``) and the schema read once from the migration; the
    constructor is that base class's.
    """
