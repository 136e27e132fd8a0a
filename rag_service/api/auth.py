"""Authentication and roles at the edge: ``Authorization: Bearer KEY`` resolved to a Caller.

Every ``/v1`` route declares its role on the decorator (tests/test_auth.py walks the OpenAPI
document and fails on a route without one)::

    @router.post("/reviews/{review_id}/claim", **role("reviewer"))
    async def claim(review_id: uuid.UUID, caller: ReviewerDep, runtime: RuntimeDep) -> ...

``role(r)`` adds the dependency that authenticates the request and checks its grant, and marks the
operation in OpenAPI with ``x-required-role: r`` and a ``bearer`` security requirement whose
scope list is ``[r]`` (so /docs shows the lock). Take ``caller: ReaderDep`` (``IngesterDep``,
``ReviewerDep``, ``AdminDep``) too when the route needs to know who calls: it is the same
dependency and runs once per request. A route with its own ``openapi_extra`` passes it through:
``**role("ingester", openapi_extra={...})``.

Who a request runs as:

- with ``Authorization: Bearer rsk_...``: the key's Caller; an unknown or revoked key is a 401
  whatever else holds;
- without the header, when no key is active and the server is bound to a loopback address
  (``RAGSVC_HOST``): the local admin, unrestricted (logged once per process). ``ragsvc serve``
  refuses a non-loopback address while no key exists (``check_exposure``), and if every key is
  revoked later, requests without one get 401;
- otherwise 401 (with ``WWW-Authenticate: Bearer``). Then 403 when the role lacks the grant
  (``GRANTS``: ingesters and reviewers also read, admins do everything).

A key's tenant and scope are applied by the routes that take a collection or principals: ``scoped``
(query and search requests), ``scoped_collection`` (a collection name to its tenant's key) and
``check_readable`` (a stored thing by id). The MCP endpoint (``api/mcp_http.py``)
authenticates its requests with ``authenticate`` too, and its tools check their role with
``check_grant`` and their scope with the same functions. Key lookups are cached for a few
seconds (db/repos/keys.py), so a key revoked by another process stops working within that time.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import re
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from rag_service.domain import (
    COLLECTION_PATTERN,
    DEFAULT_TENANT,
    GRANTS,
    ROLES,
    Caller,
    QueryRequest,
    Role,
    SearchRequest,
    collection_name,
)
from rag_service.errors import ConfigError, ForbiddenError, InvalidInputError, NotFoundError, UnauthorizedError

log = logging.getLogger(__name__)

LOCAL_ADMIN = Caller(role="admin")
REQUIRED_ROLE = "x-required-role"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "ip6-localhost"})

# Declared for OpenAPI (the scheme, the lock in /docs, the role as the requirement's scope); the
# header itself is read by ``authenticate`` so that a malformed one is a 401, not "no key".
bearer = HTTPBearer(auto_error=False, scheme_name="bearer", bearerFormat="rsk_...",
                    description="An API key made with `ragsvc keys create --role ROLE`.")


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    host = host.strip().strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, any_active_key: bool) -> None:
    """``ragsvc serve`` refuses to listen beyond this machine while no key could be required."""
    if not is_loopback(host) and not any_active_key:
        raise ConfigError(
            f"refusing to serve on {host}: no API key exists, so nobody could call the API. Create one first "
            "with `ragsvc keys create --role admin` (it is printed once), or bind to 127.0.0.1 to run keyless "
            "as the local admin")


def _create_hint(role: Role) -> str:
    return f"send `Authorization: Bearer <key>`; create a key with `ragsvc keys create --role {role}`"


@functools.cache
def _announce_local_admin() -> None:
    log.warning("no API key exists and the server listens on a loopback address: requests without a key run "
                "as the local admin. Create a key (`ragsvc keys create --role admin`) to require keys.")


async def authenticate(request: Request, role: Role) -> Caller:
    """The request's Caller (``role`` only shapes the message of a 401)."""
    runtime = request.app.state.runtime
    header = request.headers.get("authorization")
    if header is not None:
        scheme, _, key = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise UnauthorizedError(f"the Authorization header must read `Bearer <key>`; {_create_hint(role)}")
        caller = await runtime.keys.authenticate(key.strip())
        if caller is None:
            raise UnauthorizedError(f"the API key is unknown or revoked; {_create_hint(role)}")
        return caller
    # A request relayed by a proxy on this machine comes from elsewhere: it is never the local admin.
    relayed = any(h in request.headers for h in ("forwarded", "x-forwarded-for", "x-real-ip"))
    if is_loopback(runtime.settings.host) and not relayed and not await runtime.keys.any_active():
        _announce_local_admin()
        return LOCAL_ADMIN
    raise UnauthorizedError(f"this request needs an API key with the {role} role: {_create_hint(role)}")


def check_grant(caller: Caller, role: Role) -> None:
    """A 403 naming the roles that would do, unless the caller may act as ``role`` (routes through
    ``require``; the MCP tools directly)."""
    if caller.can(role):
        return
    others = [r for r in ROLES if role in GRANTS[r] and r != role]
    needs = f"the {role} role" + (f" (or {' or '.join(others)})" if others else "")
    raise ForbiddenError(f"this needs a key with {needs}; this key is a {caller.role} key. "
                         f"Create one with `ragsvc keys create --role {role}`")


def check_rate(request: Request, caller: Caller) -> None:
    """Count the request against its key's rate (api/limits.py); 429 beyond it."""
    limit = getattr(request.app.state, "rate_limit", None)
    if limit is not None:
        limit.check(caller)


@functools.cache  # one function per role, so FastAPI runs it once per request however often it is declared
def require(role: Role) -> Callable[..., Coroutine[Any, Any, Caller]]:
    """A dependency that authenticates the request and checks it may act as ``role``."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")

    async def dependency(
        request: Request,
        _credentials: HTTPAuthorizationCredentials | None = Security(bearer, scopes=[role]),  # noqa: B008
    ) -> Caller:
        caller = await authenticate(request, role)
        check_grant(caller, role)
        request.state.caller = caller
        check_rate(request, caller)
        return caller

    dependency.__name__ = f"require_{role}"
    return dependency


def role(name: Role, *, openapi_extra: dict[str, Any] | None = None, operator: bool = False) -> dict[str, Any]:
    """Keyword arguments for a route decorator: the role's dependency and its OpenAPI marking;
    ``operator``: the route changes what every tenant shares (``operator_only``)."""
    dependencies = [Depends(require(name))] + ([Depends(operator_only)] if operator else [])
    return {"dependencies": dependencies, "openapi_extra": {**(openapi_extra or {}), REQUIRED_ROLE: name}}


async def operator_only(request: Request) -> None:
    """A router dependency: prompts, guidelines and experiments serve every tenant, so only the
    default tenant's keys (the operator's) read or change them. (The route's own dependency checks
    the role and counts the request against the key's rate.)"""
    caller = await authenticate(request, "reviewer")
    if caller.tenant != DEFAULT_TENANT:
        raise ForbiddenError(f"prompts, guidelines and experiments are shared by every tenant; only keys of the "
                             f"{DEFAULT_TENANT!r} tenant (the operator's) use them; this key is of {caller.tenant!r}")


ReaderDep = Annotated[Caller, Depends(require("reader"))]
IngesterDep = Annotated[Caller, Depends(require("ingester"))]
ReviewerDep = Annotated[Caller, Depends(require("reviewer"))]
AdminDep = Annotated[Caller, Depends(require("admin"))]


# --- scope: a key's tenant, collections and principals -----------------------------------------

def scoped_collection(caller: Caller, collection: str) -> str:
    """The stored key of the caller's collection ``collection`` (domain/tenants.py): a name is
    always read in the caller's own tenant, so no request can address another tenant's data. A
    collection outside the key's collection scope is a 403."""
    if not re.fullmatch(COLLECTION_PATTERN, collection):  # a "/" would address another tenant's key
        raise InvalidInputError(f"{collection[:200]!r} is not a collection name: 1-200 letters, digits, '_', '.' "
                                "or '-', starting with a letter or digit")
    if not caller.may_touch(collection):
        allowed = ", ".join(caller.collections or ())
        raise ForbiddenError(f"this key may only use the collections {allowed}; not {collection!r}")
    return caller.key_for(collection)


def scope_principals(caller: Caller, requested: Sequence[str]) -> list[str]:
    """The principals a search runs with: the key's, or those of them the request names. Naming
    one the key does not hold is a 403 (a request may narrow its key's access, never widen it)."""
    outside = caller.principals_not_held(requested)
    if outside:
        held = ", ".join(caller.principals or ()) or "none (it reads public documents only)"
        raise ForbiddenError(f"this key does not hold the principals {', '.join(outside)}; it holds {held}. "
                             "Leave `principals` out to search as all of the key's")
    return caller.effective_principals(requested)


ScopedRequest = TypeVar("ScopedRequest", QueryRequest, SearchRequest)


def scoped(caller: Caller, request: ScopedRequest) -> ScopedRequest:
    """The request as this caller may run it: its collection the caller's tenant's (checked against
    the key's scope), its principals the effective ones."""
    return request.model_copy(update={"collection": scoped_collection(caller, request.collection),
                                      "principals": scope_principals(caller, request.principals)})


def check_readable(caller: Caller, key: str, acl: Iterable[str], what: str) -> None:
    """A single stored thing (document, job, trace...) in collection ``key`` seen through the
    caller's key: another tenant's does not exist for it (404, so ids reveal nothing); outside the
    key's collections is a 403; a document whose ACL names none of the key's principals, a 404."""
    if not caller.owns(key):
        raise NotFoundError(f"no {what}")
    scoped_collection(caller, collection_name(key))
    acl = [p for p in acl if p != "*"]
    if caller.principals is not None and acl and not set(acl) & set(caller.principals):
        raise NotFoundError(f"no {what}")
