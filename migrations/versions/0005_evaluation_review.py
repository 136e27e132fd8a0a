"""Evaluation and review: answer scores (one row per answer and scorer), the review queue with
its decisions, golden question/answer items, user feedback, and API keys with roles.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    # The same question asked again raises its review priority: a hash of the normalised, masked
    # question counts the traffic without comparing texts.
    op.add_column("queries", sa.Column("question_hash", sa.Text))
    op.add_column("queries", sa.Column("principals", pg.ARRAY(sa.Text), nullable=False,
                                       server_default=sa.text("'{}'::text[]")))
    op.add_column("queries", sa.Column("api_key_id", pg.UUID(as_uuid=True)))
    op.create_index("ix_queries_question_hash", "queries", ["question_hash", "created_at"])
    # hold mode: an answer kept from the caller until a reviewer decides
    op.add_column("answers", sa.Column("held", sa.Boolean, nullable=False, server_default=sa.false()))
    # What the generator read: [{"n": 1, "chunk_id": "...", "score": 0.8}], for reviewers.
    op.add_column("answers", sa.Column("context", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")))

    op.create_table(
        "api_keys",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text),
        # The first characters of the key, shown in listings so a key can be recognised.
        sa.Column("prefix", sa.Text, nullable=False),
        # SHA-256 of the key: keys are 256-bit random strings, so a fast hash does not make them guessable.
        sa.Column("key_hash", sa.Text, nullable=False, unique=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("principals", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        sa.Column("collections", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        _created_at(),
        sa.Column("last_used_at", sa.DateTime(timezone=True)),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("role IN ('reader', 'ingester', 'reviewer', 'admin')", name="ck_api_keys_role"),
    )

    op.create_table(
        "answer_scores",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("query_id", pg.UUID(as_uuid=True), sa.ForeignKey("queries.id", ondelete="CASCADE"),
                  nullable=False),
        # local-v1 | combined (local with LLM judge and ragas) ...
        sa.Column("scorer", sa.Text, nullable=False),
        # {"faithfulness": {"value": 0.9, "reason": "...", "scorer": "local-v1"}, ...}
        sa.Column("metrics", pg.JSONB, nullable=False),
        sa.Column("overall", sa.Float),
        sa.Column("needs_review", sa.Boolean, nullable=False),
        sa.Column("reasons", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        _created_at(),
        sa.UniqueConstraint("query_id", "scorer", name="uq_answer_scores_query_scorer"),
    )

    op.create_table(
        "review_items",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        # At most one item per answer, however often it is triggered (evaluator, feedback, both).
        sa.Column("query_id", pg.UUID(as_uuid=True), sa.ForeignKey("queries.id", ondelete="CASCADE"),
                  nullable=False, unique=True),
        sa.Column("collection", sa.Text, nullable=False),
        sa.Column("question_hash", sa.Text),
        sa.Column("trigger", sa.Text, nullable=False),  # evaluator | feedback
        sa.Column("tier", sa.Text, nullable=False),  # high | normal
        sa.Column("reasons", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        # metrics below their threshold, for the "metric" filter
        sa.Column("metrics", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")),
        sa.Column("overall", sa.Float),
        sa.Column("prompt_name", sa.Text),
        sa.Column("prompt_version", sa.Integer),
        sa.Column("held", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("claimed_by", pg.UUID(as_uuid=True)),
        sa.Column("claimed_at", sa.DateTime(timezone=True)),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        _created_at(),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('pending', 'claimed', 'approved', 'rejected', 'edited', 'expired')",
                           name="ck_review_items_status"),
        sa.CheckConstraint("tier IN ('high', 'normal')", name="ck_review_items_tier"),
    )
    op.create_index("ix_review_items_queue", "review_items", ["status", "tier", "created_at"])

    op.create_table(
        "review_decisions",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("review_id", pg.UUID(as_uuid=True), sa.ForeignKey("review_items.id", ondelete="CASCADE"),
                  nullable=False, unique=True),
        sa.Column("reviewer_key_id", pg.UUID(as_uuid=True)),
        sa.Column("decision", sa.Text, nullable=False),  # approved | rejected | edited
        sa.Column("category", sa.Text, nullable=False),  # routing | answer_quality | relevance | other
        sa.Column("feedback", sa.Text),
        sa.Column("corrected_answer", sa.Text),
        sa.Column("corrected_routing", pg.JSONB),
        sa.Column("corrected_prompt", sa.Text),
        sa.Column("time_to_review_s", sa.Float),
        sa.Column("prompt_name", sa.Text),
        sa.Column("prompt_version", sa.Integer),
        _created_at(),
    )

    op.create_table(
        "golden_items",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("review_id", pg.UUID(as_uuid=True), sa.ForeignKey("review_items.id", ondelete="SET NULL"),
                  unique=True),
        sa.Column("collection", sa.Text, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("answer", sa.Text, nullable=False),
        sa.Column("citations", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column("source", sa.Text, nullable=False),  # approved | edited
        _created_at(),
    )

    op.create_table(
        "answer_feedback",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("query_id", pg.UUID(as_uuid=True), sa.ForeignKey("queries.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("rating", sa.Integer, nullable=False),
        sa.Column("comment", sa.Text),
        sa.Column("api_key_id", pg.UUID(as_uuid=True)),
        _created_at(),
    )


def downgrade() -> None:
    op.drop_table("answer_feedback")
    op.drop_table("golden_items")
    op.drop_table("review_decisions")
    op.drop_table("review_items")
    op.drop_table("answer_scores")
    op.drop_table("api_keys")
    op.drop_column("answers", "context")
    op.drop_column("answers", "held")
    op.drop_index("ix_queries_question_hash", table_name="queries")
    op.drop_column("queries", "api_key_id")
    op.drop_column("queries", "principals")
    op.drop_column("queries", "question_hash")
