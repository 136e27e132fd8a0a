"""Keyword index that scales: impact-ordered postings, per-term document frequencies, no hot rows.

Before, a query counted each of its terms' postings for the document frequency and scored every
posting of every term: a common term's list grows with the collection. Now:

- ``keyword_postings.impact`` is each posting's BM25 term-frequency part (k1 1.2, b 0.75) at a
  reference chunk length of 128, and an index orders each term's postings by it, so a query can
  read the best postings of each term first and stop once nothing unread can reach the top k
  (Fagin's threshold algorithm; rag_service/stores/pgvector/bm25.py holds the bound).
- ``keyword_terms`` holds each term's document frequency per collection.
- Writers never update a shared row: the triggers append deltas (``keyword_term_deltas``, and
  ``keyword_stats`` now holds delta rows, summed by readers), and ``keyword_fold(collection)``
  folds them into one row per term and collection, one folder at a time (an advisory lock), after
  the write has committed. Readers add the deltas not yet folded, so every count is exact at all
  times.

Upgrading rewrites ``keyword_postings`` (the stored ``impact`` column) and builds its index: chunk
writes and keyword searches wait for it, about as long as the first build of the keyword index.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# k1 1.2, b 0.75 at a reference length of 128 (bm25.py's IMPACT_* constants, removed with 0012).
_IMPACT = ("tf * 2.2::float8 / (tf + 1.2::float8 * (0.25::float8 + 0.75::float8 * chunk_length / 128.0::float8))")

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
    INSERT INTO keyword_term_deltas (collection_id, term, df)
        SELECT r.collection_id, t.lexeme, count(*) FROM {rows} r CROSS JOIN LATERAL unnest(r.tsv) t
        WHERE r.embedding IS NOT NULL GROUP BY r.collection_id, t.lexeme;
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
    INSERT INTO keyword_term_deltas (collection_id, term, df)
        SELECT r.collection_id, t.lexeme, -count(*) FROM {rows} r CROSS JOIN LATERAL unnest(r.tsv) t
        WHERE r.embedding IS NOT NULL GROUP BY r.collection_id, t.lexeme;
    """


_FOLD = """
CREATE FUNCTION keyword_fold(target bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    -- One folder per collection; a writer never waits for it (writers only append).
    IF NOT pg_try_advisory_xact_lock(hashtextextended('ragsvc keyword_fold ' || target, 0)) THEN
        RETURN false;
    END IF;
    WITH moved AS (
        DELETE FROM keyword_term_deltas WHERE collection_id = target RETURNING term, df
    ), summed AS (
        SELECT term, sum(df) AS df FROM moved GROUP BY term
    )
    -- A term whose chunks are all gone keeps a row with df 0, which scoring skips.
    INSERT INTO keyword_terms AS k (collection_id, term, df)
    SELECT target, term, df FROM summed WHERE df <> 0
    ON CONFLICT (collection_id, term) DO UPDATE SET df = k.df + EXCLUDED.df;
    WITH moved AS (
        DELETE FROM keyword_stats WHERE collection_id = target RETURNING chunk_count, total_length
    )
    INSERT INTO keyword_stats (collection_id, chunk_count, total_length)
    SELECT target, sum(chunk_count), sum(total_length) FROM moved HAVING count(*) > 0;
    RETURN true;
END $$;
"""


def upgrade() -> None:
    op.execute(f"ALTER TABLE keyword_postings ADD COLUMN impact double precision "
               f"GENERATED ALWAYS AS ({_IMPACT}) STORED")
    op.execute("CREATE INDEX keyword_postings_impact ON keyword_postings (collection_id, term, impact DESC) "
               "INCLUDE (chunk_id)")
    op.execute("CREATE TABLE keyword_terms (collection_id bigint NOT NULL, term text NOT NULL, df bigint NOT NULL, "
               "PRIMARY KEY (collection_id, term))")
    op.execute("CREATE TABLE keyword_term_deltas (collection_id bigint NOT NULL, term text NOT NULL, "
               "df bigint NOT NULL)")
    op.execute("CREATE INDEX keyword_term_deltas_term ON keyword_term_deltas (collection_id, term)")
    op.execute("INSERT INTO keyword_terms SELECT collection_id, term, count(*) FROM keyword_postings "
               "GROUP BY collection_id, term")
    op.execute("ALTER TABLE keyword_stats DROP CONSTRAINT keyword_stats_pkey")
    op.execute("CREATE INDEX keyword_stats_collection ON keyword_stats (collection_id)")
    op.execute(f"""
        CREATE OR REPLACE FUNCTION keyword_index_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_add("new_rows")} RETURN NULL; END $$;
        CREATE OR REPLACE FUNCTION keyword_index_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_remove("old_rows")} RETURN NULL; END $$;
        CREATE OR REPLACE FUNCTION keyword_index_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {_remove("old_rows")} {_add("new_rows")} RETURN NULL; END $$;
    """)
    op.execute(_FOLD)


def downgrade() -> None:
    import importlib.util
    from pathlib import Path

    source = Path(__file__).with_name("0003_keyword_index.py")
    spec = importlib.util.spec_from_file_location("keyword_index_0003", source)
    assert spec is not None and spec.loader is not None
    previous = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(previous)
    op.execute("DROP FUNCTION keyword_fold(bigint)")
    op.execute(f"""
        CREATE OR REPLACE FUNCTION keyword_index_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {previous._add("new_rows")} RETURN NULL; END $$;
        CREATE OR REPLACE FUNCTION keyword_index_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {previous._remove("old_rows")} RETURN NULL; END $$;
        CREATE OR REPLACE FUNCTION keyword_index_update() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN {previous._remove("old_rows")} {previous._add("new_rows")} RETURN NULL; END $$;
    """)
    op.execute("""
        CREATE TEMP TABLE folded AS SELECT collection_id, sum(chunk_count) AS chunk_count,
            sum(total_length) AS total_length FROM keyword_stats GROUP BY collection_id;
        DELETE FROM keyword_stats;
        INSERT INTO keyword_stats SELECT * FROM folded;
        DROP TABLE folded;
        DROP INDEX keyword_stats_collection;
        ALTER TABLE keyword_stats ADD PRIMARY KEY (collection_id);
        DROP TABLE keyword_term_deltas;
        DROP TABLE keyword_terms;
        DROP INDEX keyword_postings_impact;
        ALTER TABLE keyword_postings DROP COLUMN impact;
    """)
