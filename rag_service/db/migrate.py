"""Run alembic migrations programmatically (``ragsvc db upgrade|downgrade`` and start-up)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError, SQLAlchemyError

import migrations
from rag_service.config import Settings
from rag_service.db.engine import embedded_pgdata, make_sync_engine, storage_error, translate_db_error
from rag_service.errors import InvalidInputError, SchemaMismatchError
from rag_service.redaction import hide_password


def alembic_config(url: str, settings: Settings | None = None) -> Config:
    cfg = Config()
    cfg.attributes["settings"] = settings
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # env.py reads the URL from here; set_main_option would need '%' escaped.
    cfg.attributes["url"] = url
    return cfg


def _run(action: str, url: str, settings: Settings, revision: str) -> str | None:
    """Run one alembic command in a transaction; returns the revision the database is now at."""
    cfg = alembic_config(url, settings)
    engine = make_sync_engine(url, settings)
    try:
        with engine.begin() as conn:
            # Two processes starting on a fresh database (serve + ingest, or replicas) would both
            # try to create the schema; the second waits here and then finds nothing to do.
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('rag-service migrations'))"))
            cfg.attributes["connection"] = conn
            (command.upgrade if action == "upgrade" else command.downgrade)(cfg, revision)
            return current_revision(conn)
    except CommandError as exc:
        raise InvalidInputError(f"cannot {action} to {revision!r}: {exc}") from exc
    except OperationalError as exc:
        raise translate_db_error(exc, hide_password(url), embedded_pgdata(settings)) from exc
    except SQLAlchemyError as exc:
        if (storage := storage_error(exc, hide_password(url), embedded_pgdata(settings))) is not None:
            raise storage from exc
        raise SchemaMismatchError(f"{action} to {revision} failed and was rolled back: {exc.orig or exc}") from exc
    finally:
        engine.dispose()


def upgrade(url: str, settings: Settings, revision: str = "head") -> str | None:
    return _run("upgrade", url, settings, revision)


def downgrade(url: str, settings: Settings, revision: str = "-1") -> str | None:
    return _run("downgrade", url, settings, revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()
