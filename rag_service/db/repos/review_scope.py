"""What a reviewer may see of the review queue, and that scope as SQL on ``review_items r``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rag_service.db.tenancy import in_scope_sql
from rag_service.domain import TenantScope


@dataclass(frozen=True)
class ReviewScope:
    """What a reviewer may see: items in the collections of ``collections`` (a tenant's, or some of
    them; None: every tenant's) whose question was asked with principals the reviewer holds too
    (None: any), so a review never shows a reviewer chunks their own key could not retrieve."""

    collections: TenantScope | None = None
    principals: Sequence[str] | None = None


def scope_sql(scope: ReviewScope | None, params: dict[str, Any]) -> str:
    """The WHERE condition (on ``review_items r``) that keeps a query inside ``scope``."""
    if scope is None:
        return "TRUE"
    conditions = [in_scope_sql("r.collection", scope.collections, params)]
    if scope.principals is not None:
        params["scope_principals"] = list(scope.principals)
        conditions.append("(SELECT sq.principals FROM queries sq WHERE sq.id = r.query_id) "
                          "<@ CAST(:scope_principals AS text[])")
    return " AND ".join(conditions)
