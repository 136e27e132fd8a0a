"""``ragsvc keys create|list|revoke``: API keys with roles (the HTTP API's authentication)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from rag_service.cli.common import JsonFlag, app, emit_json, handle_errors, model_json, run_with_runtime, stderr
from rag_service.domain import DEFAULT_TENANT, ROLES
from rag_service.errors import InvalidInputError

if TYPE_CHECKING:
    from rag_service.domain import ApiKeyView
    from rag_service.runtime import Runtime

keys_app = typer.Typer(help="API keys: each has a role (reader, ingester, reviewer, admin) and an optional scope.",
                       no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
@handle_errors
def keys_create(
    role: Annotated[str, typer.Option("--role", "-r", help=f"One of: {', '.join(ROLES)}.")],
    principal: Annotated[list[str] | None, typer.Option(
        "--principal", "-p", help="ACL principal the key holds (repeatable); none: public documents only.")] = None,
    collection: Annotated[list[str] | None, typer.Option(
        "--collection", "-c", help="Collection the key may use (repeatable); none: all.")] = None,
    name: Annotated[str | None, typer.Option(help="A label for listings (who or what uses the key).")] = None,
    tenant: Annotated[str, typer.Option(
        "--tenant", "-t", help="The tenant whose collections the key works in; its collection names are its own. "
                               "Prompts, guidelines and experiments are the default tenant's (the operator's).")
    ] = DEFAULT_TENANT,
    as_json: JsonFlag = False,
) -> None:
    """Create a key and print it, once: only its hash is stored."""
    if role not in ROLES:
        raise InvalidInputError(f"--role must be one of {', '.join(ROLES)}, not {role!r}")

    async def create(runtime: Runtime) -> tuple[ApiKeyView, str]:
        return await runtime.keys.create(role, principal or (), collection or (), name,  # type: ignore[arg-type]
                                         tenant=tenant)

    view, key = run_with_runtime(create)
    if as_json:
        emit_json({"key": key, **view.model_dump(mode="json")})
        return
    named = f" ({view.name})" if view.name else ""
    stderr.print(f"created a {view.role} key {view.id} of tenant {view.tenant}{named}. It is shown this once; "
                 "store it now:", highlight=False)
    typer.echo(key)
    stderr.print(f"use it as: curl -H 'Authorization: Bearer {view.prefix}...' http://HOST:PORT/v1/...",
                 highlight=False)


@keys_app.command("list")
@handle_errors
def keys_list(as_json: JsonFlag = False) -> None:
    """List keys (their prefixes, never the keys), revoked ones marked."""
    from pydantic import BaseModel

    class KeyList(BaseModel):
        data: list[dict[str, Any]]
        count: int

    async def collect(runtime: Runtime) -> KeyList:
        keys = await runtime.keys.list()
        return KeyList(data=[k.model_dump(mode="json") for k in keys], count=len(keys))

    listing = model_json(collect)
    if as_json:
        emit_json(listing)
        return
    # The prefix identifies a key (for `keys revoke`); `--json` has the ids.
    # The tenant column only once there are tenants besides the default one (a narrow terminal
    # would otherwise squeeze every column of a single-tenant listing).
    tenants = any(key["tenant"] != DEFAULT_TENANT for key in listing["data"])
    table = Table("prefix", "status", "role", *(["tenant"] if tenants else []), "name", "principals", "collections",
                  "created", "last used")
    for key in listing["data"]:
        table.add_row(key["prefix"], "revoked" if key["revoked"] else "active", key["role"],
                      *([key["tenant"]] if tenants else []), key["name"] or "",
                      ", ".join(key["principals"]) or "-", ", ".join(key["collections"]) or "all",
                      key["created_at"][:10], (key["last_used_at"] or "")[:16].replace("T", " "))
    Console().print(table)


@keys_app.command("revoke")
@handle_errors
def keys_revoke(
    id_or_prefix: Annotated[str, typer.Argument(help="The key's id or its prefix as listed (rsk_...).")],
    as_json: JsonFlag = False,
) -> None:
    """Revoke a key. A running server stops accepting it within seconds (its cache's lifetime)."""
    revoked = model_json(lambda runtime: runtime.keys.revoke(id_or_prefix))
    if as_json:
        emit_json(revoked)
    else:
        stderr.print(f"revoked {revoked['prefix']} ({revoked['id']}) at {revoked['revoked_at']}", highlight=False)
