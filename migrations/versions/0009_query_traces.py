"""Stored query traces (GET /v1/queries/{id}/trace), kept for RAGSVC_TRACE_RETENTION_DAYS.

No foreign key to ``queries``: a trace is written even when the query log's write failed (that
failure is in the trace), and traces are deleted by age on their own.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "query_traces",
        sa.Column("query_id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("collection", sa.Text, nullable=False),
        sa.Column("api_key_id", pg.UUID(as_uuid=True)),
        sa.Column("trace", pg.JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_query_traces_created", "query_traces", ["created_at"])


def downgrade() -> None:
    op.drop_table("query_traces")
