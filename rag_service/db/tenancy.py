"""A listing's tenant scope (domain/tenants.py) as SQL, for tables that name a collection key."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, true
from sqlalchemy.sql.elements import ColumnElement

from rag_service.domain import TenantScope


def in_scope(column: ColumnElement[Any], scope: TenantScope | None) -> ColumnElement[bool]:
    """The condition that keeps rows whose collection key ``column`` is inside ``scope`` (None: all)."""
    if scope is None:
        return true()
    condition = func.ragsvc_tenant_of(column) == scope.tenant
    if scope.keys is not None:
        condition = condition & column.in_(scope.keys)
    return condition


def in_scope_sql(column: str, scope: TenantScope | None, params: dict[str, Any]) -> str:
    """``in_scope`` for text SQL: the condition on ``column``, its parameters added to ``params``."""
    if scope is None:
        return "TRUE"
    params["scope_tenant"] = scope.tenant
    condition = f"ragsvc_tenant_of({column}) = :scope_tenant"
    if scope.keys is not None:
        params["scope_keys"] = list(scope.keys)
        condition += f" AND {column} = ANY(CAST(:scope_keys AS text[]))"
    return condition
