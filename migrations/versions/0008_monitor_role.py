"""The ``monitor`` role: an API key that may scrape ``GET /metrics`` and nothing else.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("ck_api_keys_role", "api_keys", type_="check")
    op.create_check_constraint("ck_api_keys_role", "api_keys",
                               "role IN ('reader', 'ingester', 'reviewer', 'admin', 'monitor')")


def downgrade() -> None:
    op.execute("DELETE FROM api_keys WHERE role = 'monitor'")
    op.drop_constraint("ck_api_keys_role", "api_keys", type_="check")
    op.create_check_constraint("ck_api_keys_role", "api_keys", "role IN ('reader', 'ingester', 'reviewer', 'admin')")
