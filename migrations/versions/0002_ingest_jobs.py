"""Ingestion jobs: our job table, uploaded content, and procrastinate's queue schema.

procrastinate's schema is the one shipped with the pinned procrastinate release (see
pyproject.toml); a procrastinate upgrade that changes it gets its own migration here.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PROCRASTINATE_TABLES = ("procrastinate_events", "procrastinate_periodic_defers", "procrastinate_jobs",
                        "procrastinate_workers")


def upgrade() -> None:
    from procrastinate.schema import SchemaManager

    op.create_table(
        "ingest_jobs",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("collection", sa.String(200), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("params", pg.JSONB, nullable=False),
        sa.Column("progress", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("report", pg.JSONB),
        sa.Column("error", sa.Text),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('queued', 'running', 'succeeded', 'failed')", name="ck_ingest_jobs_status"),
    )
    op.create_index("ix_ingest_jobs_created_at", "ingest_jobs", ["created_at"])
    op.create_table(
        "ingest_uploads",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job_id", pg.UUID(as_uuid=True), sa.ForeignKey("ingest_jobs.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("source_uri", sa.Text, nullable=False),
        sa.Column("filename", sa.Text, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
        sa.Column("title", sa.Text),
        sa.Column("metadata", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.create_index("ix_ingest_uploads_job", "ingest_uploads", ["job_id"])
    # procrastinate's SQL uses '%' literally; go around SQLAlchemy's parameter parsing.
    op.get_bind().exec_driver_sql(SchemaManager.get_schema().replace("%", "%%"))


def downgrade() -> None:
    op.drop_table("ingest_uploads")
    op.drop_table("ingest_jobs")
    op.execute(f"DROP TABLE IF EXISTS {', '.join(PROCRASTINATE_TABLES)} CASCADE")
    op.execute(
        "DO $$ DECLARE f regprocedure; BEGIN "
        "FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname LIKE 'procrastinate\\_%' LOOP "
        "EXECUTE 'DROP FUNCTION IF EXISTS ' || f || ' CASCADE'; END LOOP; END $$"
    )
    op.execute(
        "DO $$ DECLARE t text; BEGIN "
        "FOR t IN SELECT typname FROM pg_type WHERE typname LIKE 'procrastinate\\_%' AND typtype IN ('e', 'c') LOOP "
        "EXECUTE 'DROP TYPE IF EXISTS ' || quote_ident(t) || ' CASCADE'; END LOOP; END $$"
    )
