"""``ragsvc db upgrade|downgrade``: schema migrations (alembic); ``ragsvc db half-index``: the optional
half-precision HNSW index (stores/pgvector/half.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, run_with_runtime, settings, stderr
from rag_service.redaction import hide_password

if TYPE_CHECKING:
    from rag_service.runtime import Runtime

db_app = typer.Typer(help="Database schema migrations, and the optional half-precision index.",
                     no_args_is_help=True)
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


@db_app.command("half-index")
@handle_errors
def db_half_index(
    drop: Annotated[bool, typer.Option("--drop", help="Drop the half-precision index instead.")] = False,
    maintenance_work_mem: Annotated[str, typer.Option(
        help="PostgreSQL's memory for the build, in MB or GB; an index that fits builds far faster (about "
             "1.2 GB at a million 384-dimension chunks).")] = "1GB",
    as_json: JsonFlag = False,
) -> None:
    """Build (or drop) the half-precision HNSW index that RAGSVC_VECTOR_INDEX=half searches
    (pgvector 0.7 or later; minutes at a million chunks, built concurrently so writes go on).
    PostgreSQL keeps it up to date afterwards; running services pick it up, or notice it gone,
    within a minute."""
    from rag_service.stores.pgvector.half import (
        build_half_index,
        check_memory,
        drop_half_index,
        require_half_support,
    )

    check_memory(maintenance_work_mem)  # before opening anything

    async def work(runtime: Runtime) -> dict:
        if drop:
            return {"action": "drop", "dropped": await drop_half_index(runtime.db)}
        schema = await runtime.store.schema()
        require_half_support(schema.pgvector_version)
        stderr.print("building the half-precision index (minutes for a million chunks) ...")
        seconds = await build_half_index(
            runtime.db, schema.embedding_dimension, m=runtime.settings.hnsw_m,
            ef_construction=runtime.settings.hnsw_ef_construction, maintenance_work_mem=maintenance_work_mem)
        return {"action": "build", "built": seconds is not None,
                "seconds": round(seconds, 1) if seconds is not None else None}

    result = run_with_runtime(work, check_schema=True)
    if as_json:
        emit_json(result)
    elif drop:
        stderr.print("dropped the half-precision index" if result["dropped"] else "there was no half-precision index")
    elif result["built"]:
        stderr.print(f"built the half-precision index in {result['seconds']} s; set RAGSVC_VECTOR_INDEX=half to use it")
    else:
        stderr.print("the half-precision index already exists; set RAGSVC_VECTOR_INDEX=half to use it")
