"""The store on PostgreSQL + pgvector: ``PgVectorStore`` and the SQL pieces other code shares.

Modules: ``connection`` (database, schema, EXPLAIN), ``filters`` (SearchFilter as WHERE clauses),
``write`` (documents and bulk chunk writes), ``search`` (vector, full-text, metadata and pattern
search, reads by id), ``bm25`` (keyword search), ``store`` (the class composed from them).
"""

from rag_service.stores.pgvector.connection import SchemaInfo
from rag_service.stores.pgvector.filters import MAX_TOP_K, PUBLIC_PRINCIPAL, build_filter, web_search_restriction
from rag_service.stores.pgvector.store import PgVectorStore

__all__ = ["MAX_TOP_K", "PUBLIC_PRINCIPAL", "PgVectorStore", "SchemaInfo", "build_filter", "web_search_restriction"]
