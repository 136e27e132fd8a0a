"""Keyword index for BM25: one posting per (collection, lexeme, chunk) plus per-collection totals.

PostgreSQL's ``ts_rank_cd`` has no document-frequency or length normalisation, so it ranks
worse than BM25 (measured on SciFact, see docs/benchmarks.md). BM25 needs, per query term, the
term's document frequency and, per chunk, the term frequency and the chunk length: the postings
table holds exactly that, keyed so one index range scan per query term reads a posting list,
and carries the document id so filters are checked on documents before any chunk row is read.

Triggers on ``chunks`` keep it in step with every write path, inside the writer's transaction:
the postings are derived from the generated ``tsv`` column, so they use the same text search
configuration as full-text search. Parent chunks (no embedding) are not searched and get none.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Rows of a transition table ``rows`` expanded to postings. A lexeme of a very long text may
# lose its positions (tsvector keeps at most 256 per lexeme): it then counts once.
_POSTINGS = """
    SELECT r.collection_id, t.lexeme, r.id, r.document_id, coalesce(array_length(t.positions, 1), 1), l.len
    FROM {rows} r
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)::int AS len FROM unnest(r.tsv) u
    ) l
    CROSS JOIN LATERAL unnest(r.tsv) t
    WHERE r.embedding IS NOT NULL
"""


def _add(rows: str) -> str:
    return f"""
    INSERT INTO keyword_postings (collection_id, term, chunk_id, document_id, tf, chunk_length)
    {_POSTINGS.format(rows=rows)};
    INSERT INTO keyword_stats AS s (collection_id, chunk_count, total_length)
        SELECT collection_id, count(*), sum(len) FROM (
            SELECT r.collection_id, (SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)
                                     FROM unnest(r.tsv) u) AS len
            FROM {rows} r WHERE r.embedding IS NOT NULL
        ) x GROUP BY collection_id
        -- A fixed lock order: two writers touching the same collections cannot deadlock here.
        ORDER BY collection_id
        ON CONFLICT (collection_id) DO UPDATE
        SET chunk_count = s.chunk_count + EXCLUDED.chunk_count, total_length = s.total_length + EXCLUDED.total_length;
    """


def _remove(rows: str) -> str:
    # Deleting through the primary key (collection, lexeme, chunk) needs no second index.
    return f"""
    DELETE FROM keyword_postings p USING (
        SELECT r.collection_id, t.lexeme, r.id FROM {rows} r CROSS JOIN LATERAL unnest(r.tsv) t
        WHERE r.embedding IS NOT NULL
    ) o WHERE p.collection_id = o.collection_id AND p.term = o.lexeme AND p.chunk_id = o.id;
    UPDATE keyword_stats s SET chunk_count = s.chunk_count - x.n, total_length = s.total_length - x.len
    FROM (
        SELECT r.collection_id, count(*) AS n,
               sum((SELECT coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0) FROM unnest(r.tsv) u)) AS len
        FROM {rows} r WHERE r.embedding IS NOT NULL GROUP BY r.collection_id
    ) x WHERE s.collection_id = x.collection_id;
    """


def upgrade() -> None:
    op.execute("""
        CREATE TABLE keyword_postings (
            collection_id bigint NOT NULL,
            term text NOT NULL,
            chunk_id uuid NOT NULL,
            document_id uuid NOT NULL,
            tf integer NOT NULL,
            chunk_length integer NOT NULL,
            -- Everything a query reads is in the index: scoring is an index-only scan.
            PRIMARY KEY (collection_id, term, chunk_id) INCLUDE (document_id, tf, chunk_length)
        )
    """)
    op.execute("""
        CREATE TABLE keyword_stats (
            collection_id bigint PRIMARY KEY,
            chunk_count bigint NOT NULL,
            total_length bigint NOT NULL
        )
    """)
    op.execute(f"""
        CREATE FUNCTION keyword_index_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_add("new_rows")} RETURN NULL; END $$;
        CREATE FUNCTION keyword_index_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_remove("old_rows")} RETURN NULL; END $$;
        CREATE FUNCTION keyword_index_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_remove("old_rows")} {_add("new_rows")} RETURN NULL; END $$;
    """)
    # Transition tables need one trigger per event.
    op.execute("""
        CREATE TRIGGER chunks_keyword_insert AFTER INSERT ON chunks
            REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION keyword_index_insert();
        CREATE TRIGGER chunks_keyword_delete AFTER DELETE ON chunks
            REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION keyword_index_delete();
        CREATE TRIGGER chunks_keyword_update AFTER UPDATE ON chunks
            REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION keyword_index_update();
    """)
    # Chunks already stored (an upgrade of a populated database) get their postings now.
    op.execute(_add("chunks"))


def downgrade() -> None:
    op.execute("""
        DROP TRIGGER chunks_keyword_insert ON chunks;
        DROP TRIGGER chunks_keyword_delete ON chunks;
        DROP TRIGGER chunks_keyword_update ON chunks;
        DROP FUNCTION keyword_index_insert();
        DROP FUNCTION keyword_index_delete();
        DROP FUNCTION keyword_index_update();
        DROP TABLE keyword_stats;
        DROP TABLE keyword_postings;
    """)
