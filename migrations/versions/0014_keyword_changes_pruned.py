"""Prune the keyword change log by transaction id, not by age, and record how far.

Migration 0013 let the server delete change rows older than a day. A row's time is when its
transaction started, so a transaction that ran for hours could commit rows already older than that,
and a keyword index that had not read them yet would never see them. Now each cleanup records the
oldest snapshot xmin still running (``keyword_changes_marks``); rows below a mark at least a day old
are deleted and ``keyword_changes_pruned.below`` says so. An index that applied the log only below
that point rebuilds; every other index has nothing to lose.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("""
        DROP INDEX keyword_changes_at;
        CREATE TABLE keyword_changes_marks (
            at timestamptz PRIMARY KEY DEFAULT clock_timestamp(),
            below xid8 NOT NULL
        );
        CREATE TABLE keyword_changes_pruned (
            one boolean PRIMARY KEY DEFAULT true CHECK (one),
            below xid8 NOT NULL
        );
        INSERT INTO keyword_changes_pruned (below) VALUES ('0');
    """)


def downgrade() -> None:
    op.execute("""
        DROP TABLE keyword_changes_pruned;
        DROP TABLE keyword_changes_marks;
        CREATE INDEX keyword_changes_at ON keyword_changes (at);
    """)
