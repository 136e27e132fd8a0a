"""A log of the searchable chunks each transaction wrote, for keyword indexes kept beside PostgreSQL.

The tantivy keyword engine (``RAGSVC_KEYWORD_ENGINE=tantivy``) mirrors ``keyword_postings`` in an
index on local disk. It learns what changed from this log: one row per chunk inserted, deleted or
updated, with the writing transaction's id. A reader takes everything from transactions at or above
its last snapshot's xmin (all older ones had finished, so it has seen them), which is exact without
a lock or a shared counter that writers would queue on. Rows older than a day are deleted by the
server's hourly cleanup; an index that has not caught up for that long is rebuilt.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _log(rows: str) -> str:
    # Only chunks the keyword index holds (those with an embedding: the postings' own condition).
    return (f"INSERT INTO keyword_changes (collection_id, chunk_id) "
            f"SELECT collection_id, id FROM {rows} WHERE embedding IS NOT NULL;")


def upgrade() -> None:
    op.execute(f"""
        CREATE TABLE keyword_changes (
            seq bigserial PRIMARY KEY,
            xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
            collection_id bigint NOT NULL,
            chunk_id uuid NOT NULL,
            at timestamptz NOT NULL DEFAULT now()
        );
        CREATE INDEX keyword_changes_since ON keyword_changes (collection_id, xid);
        CREATE INDEX keyword_changes_at ON keyword_changes (at);
        CREATE FUNCTION keyword_changes_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_log("new_rows")} RETURN NULL; END $$;
        CREATE FUNCTION keyword_changes_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_log("old_rows")} RETURN NULL; END $$;
        CREATE FUNCTION keyword_changes_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_log("old_rows")} {_log("new_rows")} RETURN NULL; END $$;
        CREATE TRIGGER chunks_keyword_changes_insert AFTER INSERT ON chunks
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION keyword_changes_insert();
        CREATE TRIGGER chunks_keyword_changes_delete AFTER DELETE ON chunks
            REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION keyword_changes_delete();
        CREATE TRIGGER chunks_keyword_changes_update AFTER UPDATE ON chunks
            REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION keyword_changes_update();
    """)


def downgrade() -> None:
    op.execute("""
        DROP TRIGGER chunks_keyword_changes_insert ON chunks;
        DROP TRIGGER chunks_keyword_changes_delete ON chunks;
        DROP TRIGGER chunks_keyword_changes_update ON chunks;
        DROP FUNCTION keyword_changes_insert();
        DROP FUNCTION keyword_changes_delete();
        DROP FUNCTION keyword_changes_update();
        DROP TABLE keyword_changes;
    """)
