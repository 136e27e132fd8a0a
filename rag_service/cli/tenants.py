"""``ragsvc tenant list|delete``: the tenants keys and collections belong to (domain/tenants.py)."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, run_with_runtime, stderr
from rag_service.db.repos.keys import KEY_CACHE_S
from rag_service.domain import TENANT_PATTERN
from rag_service.errors import InvalidInputError

if TYPE_CHECKING:
    from rag_service.runtime import Runtime

tenant_app = typer.Typer(help="Tenants: each key belongs to one (`ragsvc keys create --tenant T`), and so do the "
                              "collections its requests create.", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")


@tenant_app.command("list")
@handle_errors
def tenant_list(as_json: JsonFlag = False) -> None:
    """Tenants with their active keys, collections and documents."""
    from rag_service.db.repos.tenants import TenantRepository

    async def collect(runtime: Runtime) -> list[dict[str, object]]:
        return await TenantRepository(runtime.db).list()

    tenants = run_with_runtime(collect, check_schema=True)
    if as_json:
        emit_json({"data": tenants, "count": len(tenants)})
        return
    table = Table("tenant", "active keys", "collections", "documents")
    for t in tenants:
        table.add_row(str(t["tenant"]), str(t["keys"]), str(t["collections"]), str(t["documents"]))
    Console().print(table)


@tenant_app.command("delete")
@handle_errors
def tenant_delete(
    tenant: Annotated[str, typer.Argument(help="The tenant to delete.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do it without asking.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Delete everything of a tenant in one transaction: its collections with their documents, chunks
    and keyword index, ingestion jobs and uploads, queries, answers, conversations, reviews, golden
    items, traces, eval runs, and its API keys. A running server stops accepting the keys within seconds."""
    from rag_service.db.repos.tenants import TenantRepository

    if not re.fullmatch(TENANT_PATTERN, tenant):
        raise InvalidInputError(f"{tenant!r} is not a tenant name (lowercase letters, digits, '_' or '-')")
    if not yes and not typer.confirm(f"Delete every document, answer, review, job and key of tenant {tenant!r}?"):
        raise typer.Exit(1)

    async def delete(runtime: Runtime) -> dict[str, int]:
        tenants = TenantRepository(runtime.db)
        if await tenants.revoke_keys(tenant):
            # Running servers remember a key for KEY_CACHE_S: past it, none writes for the tenant any more.
            stderr.print(f"revoked the tenant's keys; waiting {KEY_CACHE_S + 1:.0f} s for running servers to "
                         "stop accepting them", highlight=False)
            await asyncio.sleep(KEY_CACHE_S + 1)
        return await tenants.delete(tenant)

    deleted = run_with_runtime(delete, check_schema=True)
    if as_json:
        emit_json({"tenant": tenant, "deleted": deleted})
    else:
        stderr.print(f"deleted tenant {tenant}: " + ", ".join(f"{n:,} {table}" for table, n in deleted.items()),
                     highlight=False)
