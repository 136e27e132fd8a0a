"""Authentication and roles at the edge: ``Authorization: Bearer KEY`` resolved to a Caller.

SKELETON (being filled in): every request runs as the local admin for now.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Request

from rag_service.domain import Caller, Role

LOCAL_ADMIN = Caller(role="admin")


def require(role: Role) -> Callable[[Request], Coroutine[Any, Any, Caller]]:
    """A dependency that authenticates the request and checks it may act as ``role``."""

    async def dependency(request: Request) -> Caller:
        return LOCAL_ADMIN

    return dependency


ReaderDep = Annotated[Caller, Depends(require("reader"))]
IngesterDep = Annotated[Caller, Depends(require("ingester"))]
ReviewerDep = Annotated[Caller, Depends(require("reviewer"))]
AdminDep = Annotated[Caller, Depends(require("admin"))]
