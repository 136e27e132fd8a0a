"""``ragsvc db upgrade|downgrade``: schema migrations (alembic)."""

from __future__ import annotations

from typing import Annotated

import typer

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, settings, stderr
from rag_service.redaction import hide_password

db_app = typer.Typer(help="Database schema migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")


def _migration(action: str, revision: str, as_json: bool) -> None:
    from rag_service.db import migrate
    from rag_service.db.engine import resolve_database_url

    config = settings()
    url = resolve_database_url(config)  # not runtime.database_url: that would upgrade on its own
    current = (migrate.upgrade if action == "upgrade" else migrate.downgrade)(url, config, revision)
    if as_json:
        emit_json({"action": action, "revision": current, "head": migrate.head_revision(),
                   "database": hide_password(url)})
    else:
        stderr.print(f"{action}: database is now at revision {current or 'none (empty)'}")


@db_app.command("upgrade")
@handle_errors
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    as_json: JsonFlag = False,
) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    _migration("upgrade", revision, as_json)


@db_app.command("downgrade")
@handle_errors
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision: -1 for one step, base for empty.")] = "-1",
    as_json: JsonFlag = False,
) -> None:
    """Revert migrations down to REVISION (default: one step)."""
    _migration("downgrade", revision, as_json)
