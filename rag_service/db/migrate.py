"""Run alembic migrations programmatically (``ragsvc db upgrade|downgrade`` and start-up)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

import migrations
from rag_service.config import Settings
from rag_service.db.engine import make_sync_engine


def alembic_config(url: str, settings: Settings | None = None) -> Config:
    cfg = Config()
    cfg.attributes["settings"] = settings
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # env.py reads the URL from here; set_main_option would need '%' escaped.
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, settings: Settings, revision: str = "head") -> None:
    cfg = alembic_config(url, settings)
    engine = make_sync_engine(url, settings)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


def downgrade(url: str, settings: Settings, revision: str = "-1") -> None:
    cfg = alembic_config(url, settings)
    engine = make_sync_engine(url, settings)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    finally:
        engine.dispose()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()
