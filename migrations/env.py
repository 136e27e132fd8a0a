"""Alembic environment. The URL comes from Settings (or from the caller), never from alembic.ini."""

from __future__ import annotations

from alembic import context

from rag_service.config import get_settings
from rag_service.db.engine import make_sync_engine, resolve_database_url
from rag_service.db.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.attributes.get("url") or resolve_database_url(get_settings()),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    settings = get_settings()
    engine = make_sync_engine(config.attributes.get("url") or resolve_database_url(settings), settings)
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
