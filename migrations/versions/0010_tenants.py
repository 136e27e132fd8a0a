"""Tenants: a collection belongs to the tenant named in its stored key, an API key to one tenant.

A collection's stored name is its key (rag_service/domain/tenants.py): the bare name for the
default tenant, ``tenant/name`` otherwise. ``ragsvc_tenant_of`` reads the tenant back out of a key
so that listings filter by tenant in SQL; ``collections.tenant`` is generated from it. Existing
collections and keys belong to the default tenant, unchanged.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The tables whose listings filter by tenant; each names its collection's key in ``collection``.
_LISTED = ("ingest_jobs", "review_items", "eval_runs", "query_traces")


# A key is a tenant (at most 63 characters), "/" and a name (at most 200).
KEY_CHARS = 264


def upgrade() -> None:
    op.alter_column("collections", "name", type_=sa.String(KEY_CHARS))
    op.alter_column("ingest_jobs", "collection", type_=sa.String(KEY_CHARS))
    # IMMUTABLE: it reads only its argument, so it may define a generated column and an index.
    op.execute("""
        CREATE FUNCTION ragsvc_tenant_of(collection text) RETURNS text
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
        AS $$ SELECT CASE WHEN strpos(collection, '/') > 0 THEN split_part(collection, '/', 1)
                          ELSE 'default' END $$
    """)
    op.add_column("collections", sa.Column("tenant", sa.Text, sa.Computed("ragsvc_tenant_of(name)", persisted=True),
                                           nullable=False))
    op.create_index("ix_collections_tenant", "collections", ["tenant", "name"])
    op.add_column("api_keys", sa.Column("tenant", sa.Text, nullable=False, server_default="default"))
    op.create_check_constraint("ck_api_keys_tenant", "api_keys", r"tenant ~ '^[a-z0-9][a-z0-9_\-]{0,62}$'")
    for table in _LISTED:
        op.execute(f"CREATE INDEX ix_{table}_tenant ON {table} (ragsvc_tenant_of(collection))")


def downgrade() -> None:
    for table in _LISTED:
        op.execute(f"DROP INDEX ix_{table}_tenant")
    op.drop_constraint("ck_api_keys_tenant", "api_keys", type_="check")
    op.drop_column("api_keys", "tenant")
    op.drop_index("ix_collections_tenant", "collections")
    op.drop_column("collections", "tenant")
    op.execute("DROP FUNCTION ragsvc_tenant_of(text)")
