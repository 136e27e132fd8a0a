"""Query pipeline: versioned routing guidelines, queries, answers and conversation turns.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "guideline_sets",
        sa.Column("version", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("document", pg.JSONB, nullable=False),
        sa.Column("comment", sa.Text),
        sa.Column("created_by", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "conversations",
        sa.Column("id", sa.Text, primary_key=True),
        # A conversation belongs to the collection and caller (principals, sorted) that began it:
        # another caller using the same id neither reads nor extends it.
        sa.Column("collection", sa.Text, nullable=False),
        sa.Column("principals", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "queries",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("conversation_id", sa.Text, sa.ForeignKey("conversations.id", ondelete="SET NULL")),
        sa.Column("collection", sa.Text),
        # The question as logged: PII masked (the guardrails' masked copy).
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("resolved_question", sa.Text),
        sa.Column("intent", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("route", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("guardrails", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("outcome", sa.Text, nullable=False),  # answered | clarification | declined | failed
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_queries_conversation", "queries", ["conversation_id", "created_at"])
    op.create_table(
        "answers",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("query_id", pg.UUID(as_uuid=True), sa.ForeignKey("queries.id", ondelete="CASCADE"),
                  nullable=False, unique=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("short_answer", sa.Text),
        # [{n, chunk_id, document_id, source_uri, title, start_char, end_char, quote, verified}]
        sa.Column("citations", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("confidence", sa.Float),
        sa.Column("generator", sa.Text, nullable=False),  # extractive | llm
        sa.Column("model", sa.Text),
        sa.Column("prompt_name", sa.Text),
        sa.Column("prompt_version", sa.Integer),
        sa.Column("timings_ms", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_table(
        "conversation_turns",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("conversation_id", sa.Text, sa.ForeignKey("conversations.id", ondelete="CASCADE"), nullable=False),
        sa.Column("query_id", pg.UUID(as_uuid=True), sa.ForeignKey("queries.id", ondelete="CASCADE")),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("subject", sa.Text),
        sa.Column("answer", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_conversation_turns_conversation", "conversation_turns", ["conversation_id", "id"])


def downgrade() -> None:
    op.drop_table("conversation_turns")
    op.drop_table("answers")
    op.drop_table("queries")
    op.drop_table("conversations")
    op.drop_table("guideline_sets")
