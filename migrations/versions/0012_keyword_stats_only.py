"""Keep only what the keyword search reads: drop 0011's impact-ordered postings and per-term tables.

Migration 0011 stored each posting's BM25 impact in an ordered index and kept per-term document
frequencies in ``keyword_terms`` (with per-term deltas), for a threshold-algorithm top k that
would not read whole posting lists. Measured, that path was slower than scoring every posting (on
SciFact and on 100,000 chunks; docs/scaling.md), so it was off, while the extra index, the per-term
deltas and their fold added work to every chunk write. This migration removes them.

What stays from 0011: ``keyword_stats`` holds delta rows (writers append, readers sum, and
``keyword_fold`` folds them one folder at a time), so concurrent writers never wait on one row.
Document frequencies come from counting the query terms' postings, as before 0011.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LENGTH = "(SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest(r.tsv) u)"


def _add(rows: str) -> str:
    return f"""
    INSERT INTO keyword_postings (collection_id, term, chunk_id, document_id, tf, chunk_length)
    SELECT r.collection_id, t.lexeme, r.id, r.document_id, coalesce(array_length(t.positions, 1), 1), l.len
    FROM {rows} r
    CROSS JOIN LATERAL (SELECT {_LENGTH}::int AS len) l
    CROSS JOIN LATERAL unnest(r.tsv) t
    WHERE r.embedding IS NOT NULL;
    INSERT INTO keyword_stats (collection_id, chunk_count, total_length)
        SELECT r.collection_id, count(*), sum({_LENGTH}) FROM {rows} r WHERE r.embedding IS NOT NULL
        GROUP BY r.collection_id;
    """


def _remove(rows: str) -> str:
    # Deleting through the primary key (collection, lexeme, chunk) needs no second index.
    return f"""
    DELETE FROM keyword_postings p USING (
        SELECT r.collection_id, t.lexeme, r.id FROM {rows} r CROSS JOIN LATERAL unnest(r.tsv) t
        WHERE r.embedding IS NOT NULL
    ) o WHERE p.collection_id = o.collection_id AND p.term = o.lexeme AND p.chunk_id = o.id;
    INSERT INTO keyword_stats (collection_id, chunk_count, total_length)
        SELECT r.collection_id, -count(*), -sum({_LENGTH}) FROM {rows} r WHERE r.embedding IS NOT NULL
        GROUP BY r.collection_id;
    """


_FOLD = """
CREATE OR REPLACE FUNCTION keyword_fold(target bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- One folder per collection; a writer never waits for it (writers only append).
    IF NOT pg_try_advisory_xact_lock(hashtextextended('ragsvc keyword_fold ' || target, 0)) THEN
        RETURN false;
    END IF;
    WITH moved AS (
        DELETE FROM keyword_stats WHERE collection_id = target RETURNING chunk_count, total_length
    )
    INSERT INTO keyword_stats (collection_id, chunk_count, total_length)
    SELECT target, sum(chunk_count), sum(total_length) FROM moved HAVING count(*) > 0;
    RETURN true;
END $$;
"""


def _triggers(module: ModuleType | None = None) -> str:
    add, remove = (module._add, module._remove) if module is not None else (_add, _remove)
    return f"""
        CREATE OR REPLACE FUNCTION keyword_index_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {add("new_rows")} RETURN NULL; END $$;
        CREATE OR REPLACE FUNCTION keyword_index_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {remove("old_rows")} RETURN NULL; END $$;
        CREATE OR REPLACE FUNCTION keyword_index_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {remove("old_rows")} {add("new_rows")} RETURN NULL; END $$;
    """


def upgrade() -> None:
    op.execute(_triggers())
    op.execute(_FOLD)
    op.execute("""
        DROP TABLE keyword_term_deltas;
        DROP TABLE keyword_terms;
        DROP INDEX keyword_postings_impact;
        ALTER TABLE keyword_postings DROP COLUMN impact;
    """)


def _previous() -> ModuleType:
    source = Path(__file__).with_name("0011_keyword_scale.py")
    spec = importlib.util.spec_from_file_location("keyword_scale_0011", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def downgrade() -> None:
    previous = _previous()
    op.execute(f"ALTER TABLE keyword_postings ADD COLUMN impact double precision "
               f"GENERATED ALWAYS AS ({previous._IMPACT}) STORED")
    op.execute("CREATE INDEX keyword_postings_impact ON keyword_postings (collection_id, term, impact DESC) "
               "INCLUDE (chunk_id)")
    op.execute("CREATE TABLE keyword_terms (collection_id bigint NOT NULL, term text NOT NULL, df bigint NOT NULL, "
               "PRIMARY KEY (collection_id, term))")
    op.execute("CREATE TABLE keyword_term_deltas (collection_id bigint NOT NULL, term text NOT NULL, "
               "df bigint NOT NULL)")
    op.execute("CREATE INDEX keyword_term_deltas_term ON keyword_term_deltas (collection_id, term)")
    op.execute("INSERT INTO keyword_terms SELECT collection_id, term, count(*) FROM keyword_postings "
               "GROUP BY collection_id, term")
    op.execute(_triggers(previous))
    op.execute(previous._FOLD.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
