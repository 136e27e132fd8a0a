"""Who is calling: an API key's role and scope, or the local admin (no key exists, loopback only)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, computed_field

from rag_service.domain.tenants import DEFAULT_TENANT, TenantScope, collection_key, tenant_of

Role = Literal["reader", "ingester", "reviewer", "admin", "monitor"]
ROLES: tuple[Role, ...] = get_args(Role)

# What each role may do beyond its own name: ingesters and reviewers also read; admins do everything;
# a monitor key scrapes /metrics and reads nothing else (a scraper's key gives no access to documents).
GRANTS: dict[Role, frozenset[Role]] = {
    "reader": frozenset({"reader"}),
    "ingester": frozenset({"reader", "ingester"}),
    "reviewer": frozenset({"reader", "reviewer"}),
    "admin": frozenset(ROLES),
    "monitor": frozenset({"monitor"}),
}


class Caller(BaseModel):
    """The identity a request runs as."""

    model_config = ConfigDict(frozen=True)

    key_id: uuid.UUID | None = None  # None: the local admin (no keys exist, loopback server)
    name: str | None = None
    role: Role
    # The tenant whose collections the caller works in (domain/tenants.py); the local admin's is the default.
    tenant: str = DEFAULT_TENANT
    # The ACL principals the caller holds; None means unrestricted (the local admin).
    principals: tuple[str, ...] | None = None
    # Collections the key may touch; None means all.
    collections: tuple[str, ...] | None = None

    def can(self, role: Role) -> bool:
        return role in GRANTS[self.role]

    @property
    def local(self) -> bool:
        return self.key_id is None

    @property
    def label(self) -> str:
        """Who this is, for audit columns (a guideline version's author...)."""
        if self.key_id is None:
            return "local admin"
        return f"{self.name} ({self.key_id})" if self.name else str(self.key_id)

    def may_touch(self, collection: str) -> bool:
        """Whether the key's collection scope covers this collection name (of its own tenant)."""
        return self.collections is None or collection in self.collections

    def key_for(self, collection: str) -> str:
        """The stored key of this caller's tenant's collection ``collection``."""
        return collection_key(self.tenant, collection)

    def owns(self, key: str) -> bool:
        """Whether a stored collection key belongs to this caller's tenant."""
        return tenant_of(key) == self.tenant

    @property
    def scope(self) -> TenantScope:
        """What listings show this caller: its tenant's collections, those in its key's scope."""
        keys = None if self.collections is None else tuple(self.key_for(c) for c in self.collections)
        return TenantScope(self.tenant, keys)

    def principals_not_held(self, requested: Iterable[str]) -> list[str]:
        """The requested principals this caller does not hold (none when it is unrestricted)."""
        if self.principals is None:
            return []
        return sorted(set(requested) - set(self.principals))

    def effective_principals(self, requested: Iterable[str]) -> list[str]:
        """The principals a search runs with: the requested ones narrow the caller's (the caller
        must hold them: see ``principals_not_held``); none requested means all the caller's.
        The local admin's are the request's, as stated."""
        requested = list(dict.fromkeys(requested))
        if self.principals is None or requested:
            return requested
        return list(self.principals)


class ApiKeyView(BaseModel):
    """An API key as listings show it: never the key itself, only its first characters."""

    id: uuid.UUID
    name: str | None
    prefix: str
    role: Role
    tenant: str
    principals: list[str]
    collections: list[str]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None
