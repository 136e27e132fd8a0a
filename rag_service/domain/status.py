"""What `ragsvc status` reports about a running service: its database, embedder and contents."""

from __future__ import annotations

from pydantic import BaseModel

from rag_service.domain.documents import StoreCounts


class DatabaseStatus(BaseModel):
    url: str
    embedded: bool
    server_version: str
    pgvector_version: str | None
    schema_revision: str | None
    schema_head: str | None
    text_search_config: str | None
    pg_trgm: bool | None


class EmbeddingStatus(BaseModel):
    provider: str
    model: str
    dimension: int
    stored_dimension: int | None


class ServiceStatus(BaseModel):
    """What `ragsvc status` shows."""

    version: str
    database: DatabaseStatus
    embedding: EmbeddingStatus
    counts: StoreCounts | None
