"""Tenants: every collection belongs to one, and an API key to one.

A collection is stored under a *key* that holds its tenant: the default tenant's collection
``kb`` is stored as ``kb`` (so a single-tenant installation's data is what it was before tenants
existed), tenant ``acme``'s collection ``kb`` as ``acme/kb``. Collection names cannot contain
``/`` (``COLLECTION_PATTERN``), so the keys of two tenants never collide, and every table that
names a collection (documents, chunks and postings through ``collections``; jobs, queries,
conversations, reviews, traces, eval runs directly) is partitioned by tenant by construction: a
request can only address its own tenant's keys, because the API turns the names it is sent into
keys of the caller's tenant (``api/auth.py``). Listings filter by the key's tenant in SQL with
``ragsvc_tenant_of(collection)``, the migration's twin of ``tenant_of`` below.

Responses show names, never keys: domain fields that hold a collection key are typed
``CollectionKey``, which serialises to JSON as the bare name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import PlainSerializer

DEFAULT_TENANT = "default"
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_\-]{0,62}$"
SEPARATOR = "/"


def collection_key(tenant: str, name: str) -> str:
    """Where tenant's collection ``name`` is stored."""
    return name if tenant == DEFAULT_TENANT else f"{tenant}{SEPARATOR}{name}"


def tenant_of(key: str) -> str:
    """The tenant a stored collection key belongs to (SQL: ``ragsvc_tenant_of``)."""
    tenant, separator, _ = key.partition(SEPARATOR)
    return tenant if separator else DEFAULT_TENANT


def collection_name(key: str) -> str:
    """The collection's name as its tenant knows it (idempotent: a bare name stays itself)."""
    return key.rpartition(SEPARATOR)[2]


def no_such_collection(key: str) -> str:
    """The message of a request naming a collection that does not exist (its name, not its key)."""
    return f"collection {collection_name(key)!r} does not exist; ingest documents into it first"


# A collection key inside the service, its bare name in every JSON response.
CollectionKey = Annotated[str, PlainSerializer(collection_name, return_type=str, when_used="json")]


@dataclass(frozen=True)
class TenantScope:
    """What a listing may show: one tenant's collections, or only some of them (``keys``, stored
    keys; None: all of the tenant's). Applied in SQL by ``db/tenancy.py``."""

    tenant: str
    keys: tuple[str, ...] | None = None

    def covers(self, key: str) -> bool:
        return tenant_of(key) == self.tenant and (self.keys is None or key in self.keys)
