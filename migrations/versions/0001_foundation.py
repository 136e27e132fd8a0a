"""Foundation: collections, documents, chunks (pgvector embedding, generated tsvector), schema_info.

The embedding dimension, HNSW parameters and text search configuration are read from Settings
when this migration runs and recorded in ``schema_info``, which the store reads back: a later
change of those settings cannot silently disagree with the columns and indexes.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from rag_service.config import get_settings

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _has_extension(name: str) -> bool:
    if op.get_context().as_sql:  # offline (--sql) mode has no server to ask
        return False
    bind = op.get_bind()
    query = sa.text("SELECT 1 FROM pg_available_extensions WHERE name = :n")
    return bind.execute(query, {"n": name}).first() is not None


def upgrade() -> None:
    # The caller's Settings when run through rag_service.db.migrate, else the environment's.
    settings = op.get_context().config.attributes.get("settings") or get_settings()
    dim = settings.embedding_dimension
    ts_config = settings.text_search_config  # validated identifier, safe to interpolate
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")

    op.create_table(
        "schema_info",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.bulk_insert(
        sa.table("schema_info", sa.column("key", sa.Text), sa.column("value", sa.Text)),
        [
            {"key": "embedding_dimension", "value": str(dim)},
            {"key": "text_search_config", "value": ts_config},
            {"key": "hnsw_m", "value": str(settings.hnsw_m)},
            {"key": "hnsw_ef_construction", "value": str(settings.hnsw_ef_construction)},
        ],
    )

    op.create_table(
        "collections",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("description", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )

    op.create_table(
        "documents",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("collection_id", sa.BigInteger, sa.ForeignKey("collections.id", ondelete="CASCADE"), nullable=False),
        sa.Column("source_uri", sa.Text, nullable=False),
        sa.Column("title", sa.Text),
        sa.Column("content_hash", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="1"),
        sa.Column("metadata", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        # '*' = readable by everyone (see PgVectorStore.PUBLIC_PRINCIPAL); otherwise the principals.
        sa.Column("acl", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{*}'::text[]")),
        sa.Column("lob", sa.Text),
        sa.Column("tags", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        sa.Column("effective_date", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.UniqueConstraint("collection_id", "source_uri", name="uq_documents_collection_source"),
    )
    op.create_index("ix_documents_metadata", "documents", ["metadata"], postgresql_using="gin",
                    postgresql_ops={"metadata": "jsonb_path_ops"})
    op.create_index("ix_documents_acl", "documents", ["acl"], postgresql_using="gin")
    op.create_index("ix_documents_tags", "documents", ["tags"], postgresql_using="gin")
    op.create_index("ix_documents_effective_date", "documents", ["effective_date"])
    op.create_index("ix_documents_updated_at", "documents", ["updated_at"])
    op.create_index("ix_documents_lob", "documents", ["lob"])

    op.create_table(
        "chunks",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("document_id", pg.UUID(as_uuid=True), sa.ForeignKey("documents.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("collection_id", sa.BigInteger, sa.ForeignKey("collections.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("parent_id", pg.UUID(as_uuid=True), sa.ForeignKey("chunks.id", ondelete="CASCADE")),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("start_char", sa.Integer, nullable=False),
        sa.Column("end_char", sa.Integer, nullable=False),
        sa.Column("token_count", sa.Integer, nullable=False),
        sa.Column("content_hash", sa.String(128), nullable=False),
        sa.Column("metadata", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("end_char >= start_char", name="ck_chunks_offsets"),
    )
    # Columns whose types SQLAlchemy cannot express portably are added in plain DDL.
    op.execute(f"ALTER TABLE chunks ADD COLUMN embedding vector({dim})")
    op.execute(
        "ALTER TABLE chunks ADD COLUMN tsv tsvector "
        f"GENERATED ALWAYS AS (to_tsvector('{ts_config}'::regconfig, text)) STORED"
    )
    op.create_index("ix_chunks_document_ordinal", "chunks", ["document_id", "ordinal"])
    op.create_index("ix_chunks_collection", "chunks", ["collection_id"])
    op.create_index("ix_chunks_parent", "chunks", ["parent_id"])
    op.create_index("ix_chunks_content_hash", "chunks", ["content_hash"])
    op.create_index("ix_chunks_tsv", "chunks", ["tsv"], postgresql_using="gin")
    op.create_index("ix_chunks_metadata", "chunks", ["metadata"], postgresql_using="gin",
                    postgresql_ops={"metadata": "jsonb_path_ops"})
    op.execute(
        "CREATE INDEX ix_chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops) "
        f"WITH (m = {settings.hnsw_m}, ef_construction = {settings.hnsw_ef_construction})"
    )
    # pg_trgm speeds up literal/regex pattern search; the embedded server does not ship it.
    if _has_extension("pg_trgm"):
        op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        op.execute("CREATE INDEX ix_chunks_text_trgm ON chunks USING gin (text gin_trgm_ops)")
        op.execute("INSERT INTO schema_info (key, value) VALUES ('pg_trgm', 'yes')")


def downgrade() -> None:
    op.drop_table("chunks")
    op.drop_table("documents")
    op.drop_table("collections")
    op.drop_table("schema_info")
    # The vector and pg_trgm extensions stay: other schemas in the database may use them.
