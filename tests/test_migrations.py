"""Schema changes only through alembic: upgrade, downgrade and upgrade again on a fresh database."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text

from rag_service.config import load_settings
from rag_service.db import migrate

TABLES = {"collections", "documents", "chunks", "schema_info", "ingest_jobs", "ingest_uploads", "procrastinate_jobs"}


def _state(url: str) -> tuple[set[str], str | None, set[str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            indexes = {
                row[0] for row in conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'chunks'"))
            }
            return tables, migrate.current_revision(conn), indexes
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(databases) -> None:
    url = databases.create(migrated=False)
    settings = load_settings(database_url=url)
    assert _state(url)[0] & TABLES == set()

    migrate.upgrade(url, settings)
    tables, revision, indexes = _state(url)
    assert TABLES <= tables
    assert revision == migrate.head_revision()
    assert {"ix_chunks_embedding_hnsw", "ix_chunks_tsv", "ix_chunks_metadata", "ix_chunks_document_ordinal"} <= indexes

    migrate.downgrade(url, settings, "base")
    tables, revision, _ = _state(url)
    assert tables & TABLES == set()
    assert revision is None

    migrate.upgrade(url, settings)
    assert TABLES <= _state(url)[0]


def test_schema_follows_settings(databases) -> None:
    url = databases.create(migrated=False)
    migrate.upgrade(url, load_settings(database_url=url, text_search_config="simple"))
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            info = dict(conn.execute(text("SELECT key, value FROM schema_info")).all())
            typmod = conn.execute(text(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'"
            )).scalar_one()
            generated = conn.execute(text(
                "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef d JOIN pg_attribute a "
                "ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
                "WHERE d.adrelid = 'chunks'::regclass AND a.attname = 'tsv'"
            )).scalar_one()
    finally:
        engine.dispose()
    assert info["text_search_config"] == "simple" and info["embedding_dimension"] == "384"
    assert typmod == 384
    assert "simple" in generated
