"""Offline evaluation runs: one row per run (what was run, on which data, under which
configuration, and how far it got) and one row per item and repetition, written as each finishes
so an interrupted run resumes without redoing them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "eval_runs",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.Text),
        sa.Column("status", sa.Text, nullable=False, server_default="queued"),
        sa.Column("dataset", pg.JSONB, nullable=False),  # DatasetRef: kind, name, version, split, source, items
        sa.Column("dataset_version", sa.Text, nullable=False),
        sa.Column("mode", sa.Text, nullable=False),
        sa.Column("collection", sa.Text, nullable=False),
        sa.Column("request", pg.JSONB, nullable=False),
        sa.Column("config", pg.JSONB, nullable=False),
        sa.Column("config_hash", sa.Text, nullable=False),
        sa.Column("code_version", sa.Text),
        sa.Column("seed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("items_total", sa.Integer, nullable=False),
        sa.Column("summary", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("error", sa.Text),
        sa.Column("created_by", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("status IN ('queued', 'running', 'finished', 'failed')", name="eval_runs_status"),
        sa.CheckConstraint("mode IN ('retrieval', 'full')", name="eval_runs_mode"),
    )
    op.create_index("eval_runs_created", "eval_runs", [sa.text("created_at DESC")])
    op.create_index("eval_runs_name", "eval_runs", ["name"])
    op.create_table(
        "eval_results",
        sa.Column("run_id", pg.UUID(as_uuid=True), sa.ForeignKey("eval_runs.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("item_id", sa.Text, nullable=False),
        sa.Column("repetition", sa.Integer, nullable=False),
        sa.Column("position", sa.Integer, nullable=False),  # the item's place in the dataset, for stable order
        sa.Column("result", pg.JSONB, nullable=False),  # EvalItemResult
        sa.Column("failed", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("finished_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "item_id", "repetition"),
    )


def downgrade() -> None:
    op.drop_table("eval_results")
    op.drop_table("eval_runs")
